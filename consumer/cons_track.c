/*
 * cons_track.c -- per-partition in-flight offsets and the contiguous done
 * prefix (see cons_track.h).
 *
 * A partition keeps its not-yet-storable offsets in an array sorted by offset
 * (offsets are added in increasing order), used as a deque: the front is the
 * oldest message whose offset has not been stored. Finishing a message is a
 * binary search; the prefix advances by popping done entries off the front.
 * Partitions live in a chained hash table keyed by (topic, partition).
 */
#include "cons_track.h"

enum { ENT_IN_FLIGHT = 0, ENT_DONE = 1 };

typedef struct ent {
    int64_t offset;
    int     state;
} ent_t;

typedef struct part {
    struct part *next; /* hash chain */
    char        *topic;
    int32_t      partition;
    uint64_t     gen;
    ent_t       *ent; /* live entries are ent[head .. head + len) */
    size_t       head, len, cap;
    size_t       in_flight;
    int64_t      last_added;  /* -1 before the first add */
    int64_t      first_added; /* -1 before the first add */
    int64_t      stuck_at;    /* lowest abandoned offset; INT64_MAX when none */
} part_t;

struct cons_track {
    part_t **bucket;
    size_t   n_bucket; /* a power of two */
    size_t   n_part;
    size_t   in_flight;
    uint64_t gen_next;
};

static uint64_t part_hash(const char *topic, int32_t partition) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)topic; *p; p++)
        h = (h ^ *p) * 1099511628211ULL;
    h = (h ^ (uint32_t)partition) * 1099511628211ULL;
    return h ^ (h >> 29);
}

static part_t **part_slot(const cons_track_t *ct, const char *topic, int32_t partition) {
    part_t **pp = &ct->bucket[part_hash(topic, partition) & (ct->n_bucket - 1)];
    while (*pp && ((*pp)->partition != partition || strcmp((*pp)->topic, topic) != 0))
        pp = &(*pp)->next;
    return pp;
}

static part_t *part_find(const cons_track_t *ct, const char *topic, int32_t partition) {
    return *part_slot(ct, topic, partition);
}

static void part_free(part_t *p) {
    free(p->topic);
    free(p->ent);
    free(p);
}

cons_track_t *cons_track_new(void) {
    cons_track_t *ct = calloc(1, sizeof *ct);
    if (!ct)
        return NULL;
    ct->n_bucket = 64;
    ct->bucket = calloc(ct->n_bucket, sizeof *ct->bucket);
    if (!ct->bucket) {
        free(ct);
        return NULL;
    }
    ct->gen_next = 1; /* 0 means "untracked" to cons.c */
    return ct;
}

void cons_track_free(cons_track_t *ct) {
    if (!ct)
        return;
    for (size_t i = 0; i < ct->n_bucket; i++) {
        part_t *p = ct->bucket[i];
        while (p) {
            part_t *next = p->next;
            part_free(p);
            p = next;
        }
    }
    free(ct->bucket);
    free(ct);
}

/* Doubles the bucket array once partitions outnumber buckets, so lookups
 * stay O(1) with thousands of partitions. Failure only costs speed. */
static void grow_buckets(cons_track_t *ct) {
    size_t   n = ct->n_bucket * 2;
    part_t **b = calloc(n, sizeof *b);
    if (!b)
        return;
    for (size_t i = 0; i < ct->n_bucket; i++) {
        part_t *p = ct->bucket[i];
        while (p) {
            part_t *next = p->next;
            size_t  j = part_hash(p->topic, p->partition) & (n - 1);
            p->next = b[j];
            b[j] = p;
            p = next;
        }
    }
    free(ct->bucket);
    ct->bucket = b;
    ct->n_bucket = n;
}

svc_err_t cons_track_assign(cons_track_t *ct, const char *topic, int32_t partition, uint64_t *gen) {
    part_t *p = part_find(ct, topic, partition);
    if (p) {
        *gen = p->gen;
        return SVC_OK;
    }
    p = calloc(1, sizeof *p);
    if (!p)
        return SVC_ERR_NOMEM;
    p->topic = strdup(topic);
    if (!p->topic) {
        free(p);
        return SVC_ERR_NOMEM;
    }
    p->partition = partition;
    p->gen = ct->gen_next++;
    p->last_added = -1;
    p->first_added = -1;
    p->stuck_at = INT64_MAX;
    part_t **slot = &ct->bucket[part_hash(topic, partition) & (ct->n_bucket - 1)];
    p->next = *slot;
    *slot = p;
    ct->n_part++;
    if (ct->n_part > ct->n_bucket)
        grow_buckets(ct);
    *gen = p->gen;
    return SVC_OK;
}

size_t cons_track_revoke(cons_track_t *ct, const char *topic, int32_t partition) {
    part_t **pp = part_slot(ct, topic, partition);
    part_t  *p = *pp;
    if (!p)
        return 0;
    size_t orphaned = p->in_flight;
    *pp = p->next;
    ct->n_part--;
    ct->in_flight -= orphaned;
    part_free(p);
    return orphaned;
}

uint64_t cons_track_gen(const cons_track_t *ct, const char *topic, int32_t partition) {
    const part_t *p = part_find(ct, topic, partition);
    return p ? p->gen : 0;
}

int64_t cons_track_first(const cons_track_t *ct, const char *topic, int32_t partition) {
    const part_t *p = part_find(ct, topic, partition);
    return p ? p->first_added : -1;
}

svc_err_t cons_track_add(cons_track_t *ct, const char *topic, int32_t partition, int64_t offset,
                         uint64_t *gen) {
    part_t *p = part_find(ct, topic, partition);
    if (!p || offset < 0 || offset <= p->last_added)
        return SVC_ERR_INVALID;
    if (p->head + p->len == p->cap) {
        if (p->head > 0) {
            /* Slide back to the front instead of growing: the deque's size
             * is what is in flight, not what has ever passed through. */
            memmove(p->ent, p->ent + p->head, p->len * sizeof *p->ent);
            p->head = 0;
        } else {
            size_t cap = p->cap ? p->cap * 2 : 16;
            ent_t *e = realloc(p->ent, cap * sizeof *e);
            if (!e)
                return SVC_ERR_NOMEM;
            p->ent = e;
            p->cap = cap;
        }
    }
    p->ent[p->head + p->len] = (ent_t){.offset = offset, .state = ENT_IN_FLIGHT};
    p->len++;
    if (p->first_added < 0)
        p->first_added = offset;
    p->last_added = offset;
    p->in_flight++;
    ct->in_flight++;
    *gen = p->gen;
    return SVC_OK;
}

/* Index (from head) of offset in p's deque, or p->len when absent. */
static size_t ent_find(const part_t *p, int64_t offset) {
    const ent_t *e = p->ent + p->head;
    size_t       lo = 0, hi = p->len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (e[mid].offset < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < p->len && e[lo].offset == offset ? lo : p->len;
}

/* Removes every done entry above stuck_at: they can never be stored, so
 * keeping them would only grow memory while the partition stays assigned. */
static void drop_unstorable(part_t *p) {
    ent_t *e = p->ent + p->head;
    size_t w = 0;
    for (size_t r = 0; r < p->len; r++)
        if (e[r].state == ENT_IN_FLIGHT || e[r].offset < p->stuck_at)
            e[w++] = e[r];
    p->len = w;
}

cons_track_res_t cons_track_done(cons_track_t *ct, const char *topic, int32_t partition,
                                 uint64_t gen, int64_t offset, bool delivered, int64_t *next) {
    part_t *p = part_find(ct, topic, partition);
    if (!p || p->gen != gen)
        return CONS_TRACK_STALE;
    size_t i = ent_find(p, offset);
    if (i == p->len || p->ent[p->head + i].state != ENT_IN_FLIGHT)
        return CONS_TRACK_STALE; /* already done, or never added */
    p->ent[p->head + i].state = ENT_DONE;
    p->in_flight--;
    ct->in_flight--;
    if (!delivered || offset > p->stuck_at) {
        if (!delivered && offset < p->stuck_at)
            p->stuck_at = offset;
        drop_unstorable(p);
        return CONS_TRACK_KEPT;
    }
    int64_t last = -1;
    while (p->len > 0 && p->ent[p->head].state == ENT_DONE &&
           p->ent[p->head].offset < p->stuck_at) {
        last = p->ent[p->head].offset;
        p->head++;
        p->len--;
    }
    if (p->len == 0)
        p->head = 0;
    if (last < 0)
        return CONS_TRACK_KEPT;
    *next = last + 1;
    return CONS_TRACK_ADVANCED;
}

size_t cons_track_in_flight(const cons_track_t *ct) {
    return ct->in_flight;
}

size_t cons_track_part_in_flight(const cons_track_t *ct, const char *topic, int32_t partition) {
    const part_t *p = part_find(ct, topic, partition);
    return p ? p->in_flight : 0;
}

size_t cons_track_parts(const cons_track_t *ct) {
    return ct->n_part;
}

bool cons_track_has(const cons_track_t *ct, const char *topic, int32_t partition) {
    return part_find(ct, topic, partition) != NULL;
}
