/*
 * eng_answer_int.h -- test hook of eng_answer.c: the clock that
 * options.deadline_ms (SPEC a.8, b.6) is measured with.
 *
 * eng_answer_request reads this clock exactly once when it starts and, when
 * the request has options.deadline_ms, once before each forward pass (after
 * the question's length check) until the deadline has passed, and nowhere
 * else; so a test can make the deadline expire after a chosen number of
 * questions without depending on how fast the machine is.
 */
#ifndef D3STREAM_ENG_ANSWER_INT_H
#define D3STREAM_ENG_ANSWER_INT_H

#include "engine.h"

/* Milliseconds on some monotonic clock. */
typedef double (*eng_answer_clock_fn)(void);

/* Replaces the deadline clock (NULL restores CLOCK_MONOTONIC) and returns
 * the previous one. Not thread-safe: for single-threaded tests only. */
eng_answer_clock_fn eng_answer_set_clock(eng_answer_clock_fn fn);

#endif
