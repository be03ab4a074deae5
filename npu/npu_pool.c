/*
 * npu_pool.c -- the kernels' thread pool (npu.h, npu_parallel_for).
 *
 * One pool per process, started on first use: npu_threads() - 1 threads
 * that spin a moment for the next job (POOL_SPIN_S), then sleep on a
 * condition variable. A call publishes a job (fn, ctx, n, an atomic
 * cursor), wakes the pool if a thread sleeps and takes items itself; idle pool
 * threads take items too. So a caller never waits for a busy pool: when
 * both of the scheduler's workers run passes at once, each mostly runs its
 * own items, and when one pass runs alone it gets every core. The caller
 * returns once every item is done and no pool thread still holds the job
 * (the job lives on the caller's stack).
 */
#include "npu.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdbool.h>
#include <time.h>

/* Jobs open at once (concurrent callers); a caller past this runs alone. */
#define POOL_SLOTS 16
/* How long an idle pool thread spins for the next job before it sleeps,
 * and how long a caller spins for its job's last items before it sleeps.
 * Why: a pass makes ~350 npu_parallel_for calls (nano, 330 tokens) with
 * short serial steps between them; a pool thread asleep on the condition
 * variable took ~30 us to wake in the 2-core VM (a futex wake and a
 * reschedule), a call with 60 us of serial work between calls cost 116 us
 * against 84 us spinning (8 small items each, Zen 5). Bounded, so an idle
 * pool sleeps within 0.1 ms and a caller whose pool thread was preempted
 * stops burning its core. */
#define POOL_SPIN_S 100e-6
/* Upper bound of npu_threads(); D3_NPU_THREADS above it is clamped. */
#define POOL_MAX_THREADS 256

typedef struct pool_job {
    void (*fn)(void *ctx, size_t i);
    void         *ctx;
    size_t        n;
    atomic_size_t next;  /* next item to claim */
    atomic_size_t done;  /* items finished */
    atomic_size_t users; /* pool threads inside the job (changed under the lock) */
} pool_job_t;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t  work; /* a job was published */
    pthread_cond_t  idle; /* a job finished or lost a user */
    pool_job_t     *slot[POOL_SLOTS];
    size_t          n_threads; /* npu_threads(): pool threads + the caller */
    size_t          sleepers;  /* pool threads waiting on work (under the lock) */
    atomic_ulong    published; /* jobs published so far: what a spinning thread watches */
} g_pool = {.lock = PTHREAD_MUTEX_INITIALIZER,
            .work = PTHREAD_COND_INITIALIZER,
            .idle = PTHREAD_COND_INITIALIZER};
static pthread_once_t g_pool_once = PTHREAD_ONCE_INIT;

/* Runs items of j until none is left; returns how many it ran. */
static size_t job_run(pool_job_t *j) {
    size_t ran = 0;
    for (;;) {
        size_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->n)
            return ran;
        j->fn(j->ctx, i);
        ran++;
        atomic_fetch_add_explicit(&j->done, 1, memory_order_release);
    }
}

/* A published job with items left, or NULL (under the lock). */
static pool_job_t *job_find(void) {
    for (size_t s = 0; s < POOL_SLOTS; s++) {
        pool_job_t *j = g_pool.slot[s];
        if (j && atomic_load_explicit(&j->next, memory_order_relaxed) < j->n)
            return j;
    }
    return NULL;
}

/* A spin loop's pause (x86 PAUSE: yields the core's pipeline to its
 * sibling and saves power); a plain compiler barrier elsewhere. */
static inline void pool_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

static double pool_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Spins until a job is published after seen or POOL_SPIN_S has passed. */
static void pool_spin(unsigned long seen) {
    double t0 = pool_now();
    for (unsigned k = 1; atomic_load_explicit(&g_pool.published, memory_order_acquire) == seen;
         k++) {
        pool_pause();
        if (k % 64 == 0 && pool_now() - t0 > POOL_SPIN_S)
            return;
    }
}

static void *pool_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g_pool.lock);
    bool spun = false;
    for (;;) {
        pool_job_t *j = job_find();
        if (!j) {
            unsigned long seen = atomic_load_explicit(&g_pool.published, memory_order_relaxed);
            if (!spun) {
                pthread_mutex_unlock(&g_pool.lock);
                spun = true;
                pool_spin(seen);
                pthread_mutex_lock(&g_pool.lock);
                continue;
            }
            g_pool.sleepers++;
            pthread_cond_wait(&g_pool.work, &g_pool.lock);
            g_pool.sleepers--;
            spun = false;
            continue;
        }
        spun = false;
        atomic_fetch_add_explicit(&j->users, 1, memory_order_relaxed);
        pthread_mutex_unlock(&g_pool.lock);
        (void)job_run(j);
        pthread_mutex_lock(&g_pool.lock);
        atomic_fetch_sub_explicit(&j->users, 1, memory_order_release);
        pthread_cond_broadcast(&g_pool.idle);
    }
    return NULL;
}

/* D3_NPU_THREADS=N (>= 1) or the CPUs this process may run on. */
static size_t pool_size(void) {
    const char *env = getenv("D3_NPU_THREADS");
    long        n = 0;
    if (env && *env) {
        char *end;
        n = strtol(env, &end, 10);
        if (*end || n < 1)
            n = 0;
    }
    if (n <= 0)
        n = npu_probe()->n_cpus;
    if (n < 1)
        n = 1;
    return n > POOL_MAX_THREADS ? POOL_MAX_THREADS : (size_t)n;
}

static void pool_start(void) {
    g_pool.n_threads = pool_size();
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    size_t started = 1;
    for (size_t t = 1; t < g_pool.n_threads; t++) {
        pthread_t th;
        /* A thread that cannot be had leaves a smaller pool, not a failure:
         * the caller always runs every item it can claim. */
        if (pthread_create(&th, &attr, pool_main, NULL) == 0)
            started++;
    }
    pthread_attr_destroy(&attr);
    g_pool.n_threads = started;
}

size_t npu_threads(void) {
    pthread_once(&g_pool_once, pool_start);
    return g_pool.n_threads;
}

void npu_parallel_for(size_t n, void (*fn)(void *ctx, size_t i), void *ctx) {
    if (n == 0)
        return;
    if (n == 1 || npu_threads() == 1) {
        for (size_t i = 0; i < n; i++)
            fn(ctx, i);
        return;
    }
    pool_job_t j = {.fn = fn, .ctx = ctx, .n = n};
    atomic_init(&j.next, 0);
    atomic_init(&j.done, 0);
    size_t s = POOL_SLOTS;
    pthread_mutex_lock(&g_pool.lock);
    for (size_t k = 0; k < POOL_SLOTS && s == POOL_SLOTS; k++)
        if (!g_pool.slot[k])
            s = k;
    if (s < POOL_SLOTS) {
        g_pool.slot[s] = &j;
        atomic_fetch_add_explicit(&g_pool.published, 1, memory_order_release);
        if (g_pool.sleepers)
            pthread_cond_broadcast(&g_pool.work);
    }
    pthread_mutex_unlock(&g_pool.lock);
    (void)job_run(&j);
    if (s == POOL_SLOTS)
        return; /* not published: the caller ran every item */
    double t0 = pool_now();
    for (unsigned k = 1; atomic_load_explicit(&j.done, memory_order_acquire) < n ||
                         atomic_load_explicit(&j.users, memory_order_acquire) > 0;
         k++) {
        pool_pause();
        if (k % 64 == 0 && pool_now() - t0 > POOL_SPIN_S)
            break;
    }
    pthread_mutex_lock(&g_pool.lock);
    while (atomic_load_explicit(&j.done, memory_order_acquire) < n || j.users > 0)
        pthread_cond_wait(&g_pool.idle, &g_pool.lock);
    g_pool.slot[s] = NULL;
    pthread_mutex_unlock(&g_pool.lock);
}

/* ---- per-thread scratch ------------------------------------------------------ */

typedef struct scratch {
    void  *p[NPU_SCRATCH_SLOTS];
    size_t n[NPU_SCRATCH_SLOTS];
} scratch_t;

static pthread_key_t  g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *arg) {
    scratch_t *s = arg;
    for (int i = 0; i < NPU_SCRATCH_SLOTS; i++)
        free(s->p[i]);
    free(s);
}

static void scratch_key(void) {
    (void)pthread_key_create(&g_scratch_key, scratch_free);
}

void *npu_scratch(int slot, size_t bytes) {
    SVC_ASSERT(slot >= 0 && slot < NPU_SCRATCH_SLOTS);
    pthread_once(&g_scratch_once, scratch_key);
    scratch_t *s = pthread_getspecific(g_scratch_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s || pthread_setspecific(g_scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->n[slot] >= bytes && s->p[slot])
        return s->p[slot];
    /* Grow to the request rounded up to 64 bytes (aligned_alloc wants a
     * multiple of the alignment); the old block is not needed any more. */
    size_t n = (bytes + 63) / 64 * 64;
    void  *p = aligned_alloc(64, n ? n : 64);
    if (!p)
        return NULL;
    free(s->p[slot]);
    s->p[slot] = p;
    s->n[slot] = n;
    return p;
}
