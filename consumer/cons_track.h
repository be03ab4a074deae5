/*
 * cons_track.h -- the consumer's offset tracker (internal to consumer/).
 *
 * Per assigned partition it keeps the offsets handed to the owner, in the
 * order they were consumed, and says when the contiguous prefix of finished
 * ones grows: only then may "last finished offset + 1" be stored. Work
 * finishes out of order, so a message done early waits here until every
 * earlier message of its partition is done too.
 *
 * Pure data structure: no librdkafka, no locks, no clock. cons.c serialises
 * every call under its own lock; tests/test_consumer.c drives it directly.
 *
 * Offsets need not be contiguous integers (compacted topics, transaction
 * markers leave gaps): the prefix runs over the offsets that were added.
 */
#ifndef D3STREAM_CONS_TRACK_H
#define D3STREAM_CONS_TRACK_H

#include "svc.h"

typedef struct cons_track cons_track_t;

/* What cons_track_done() did with a finished message. */
typedef enum cons_track_res {
    CONS_TRACK_KEPT = 0,     /* recorded; the storable offset did not move */
    CONS_TRACK_ADVANCED = 1, /* *next is the new offset to store */
    CONS_TRACK_STALE = 2,    /* partition revoked (or reassigned since): drop it */
} cons_track_res_t;

/**
 * @brief A tracker with no partitions.
 * @returns NULL when out of memory. @remark Free with cons_track_free().
 */
cons_track_t *cons_track_new(void);

/** @brief Frees the tracker and every partition; NULL is a no-op. */
void cons_track_free(cons_track_t *ct);

/**
 * @brief Starts tracking topic/partition (an assignment).
 * @param gen Out: the assignment's generation, to pass to add/done; a
 *            partition revoked and assigned again gets a new one, so messages
 *            of the old assignment are recognised as stale.
 * @returns SVC_OK, SVC_ERR_NOMEM. Assigning a tracked partition again keeps
 *          its state and returns its current generation.
 * @remark topic is copied.
 */
SVC_WUR svc_err_t cons_track_assign(cons_track_t *ct, const char *topic, int32_t partition,
                                    uint64_t *gen);

/**
 * @brief Stops tracking topic/partition (a revoke); nothing of it is stored
 *        afterwards. Unknown partitions are ignored.
 * @returns How many of its messages were still in flight (now orphaned).
 */
size_t cons_track_revoke(cons_track_t *ct, const char *topic, int32_t partition);

/**
 * @brief Records that offset of topic/partition was handed to the owner.
 * @param gen Out: the generation to pass to cons_track_done().
 * @returns SVC_OK; SVC_ERR_INVALID when the partition is not tracked or the
 *          offset is not above every offset added so far (a re-delivery
 *          within one assignment: its first copy is the one tracked);
 *          SVC_ERR_NOMEM.
 */
SVC_WUR svc_err_t cons_track_add(cons_track_t *ct, const char *topic, int32_t partition,
                                 int64_t offset, uint64_t *gen);

/**
 * @brief Marks offset finished.
 * @param delivered true: its result was delivered, the offset may be stored.
 *        false: abandoned; the storable offset of the partition never passes
 *        it (the message is consumed again after the next assignment).
 * @param next Out, set on CONS_TRACK_ADVANCED: last offset of the done
 *        prefix + 1, the value for rd_kafka_offsets_store().
 */
cons_track_res_t cons_track_done(cons_track_t *ct, const char *topic, int32_t partition,
                                 uint64_t gen, int64_t offset, bool delivered, int64_t *next);

/** @brief Messages added and not yet done, over all tracked partitions. */
size_t cons_track_in_flight(const cons_track_t *ct);

/** @brief Messages added and not yet done in one partition (0 if untracked). */
size_t cons_track_part_in_flight(const cons_track_t *ct, const char *topic, int32_t partition);

/** @brief The current generation of topic/partition, 0 when untracked. */
uint64_t cons_track_gen(const cons_track_t *ct, const char *topic, int32_t partition);

/** @brief The first offset added in the current generation, -1 when none. */
int64_t cons_track_first(const cons_track_t *ct, const char *topic, int32_t partition);

/** @brief Number of tracked partitions. */
size_t cons_track_parts(const cons_track_t *ct);

/** @brief Whether topic/partition is tracked (assigned). */
bool cons_track_has(const cons_track_t *ct, const char *topic, int32_t partition);

#endif
