/*
 * bench_share.c -- what a shared prompt prefix saves per question (issue
 * 7, item 2), measured as one question alone against the same question
 * continued from the prefix's state, alternately in one process. Built,
 * never run by ctest.
 *
 *   bench_share DIR [--questions N] [--runs R] [--suffix S] [P ...]
 *
 * For each P (default 3936: with S = 64, the "16 x 4,000 shared" row of
 * `d3stream bench`): P random token ids run once into a prefix state
 * (eng_fwd_int.h, update), then R times (default 2) one whole prompt of
 * P + S ids alone (eng_model_forward) and its last S ids from the state
 * (read-only), in alternating order. Prints the best wall time of each and
 * the process CPU time of every run (all threads; this VM's steal shows
 * in wall time, less in CPU time), the suffix / whole ratio, and what N
 * questions (default 16) on that prefix cost against N alone:
 * (prefix + N x suffix) / (N x whole), from the single runs (the
 * scheduler's row runs them for real). Fails if the suffix's final hidden
 * state is off the whole pass's by more than 1e-3 relative.
 * Noncausal packages share the layers before the first full-attention
 * layer F and layer F's attention among the prefix rows; causal ones all.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "eng_fwd_int.h"
#include "engine.h"
#include "npu.h"
#include "bench_model.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* CPU seconds of every thread of the process so far. */
static double cpu_s(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec * 1e-6 +
           (double)u.ru_stime.tv_sec + (double)u.ru_stime.tv_usec * 1e-6;
}

static int usage(void) {
    fputs("usage: bench_share DIR [--questions N] [--runs R] [--suffix S] [P ...]\n", stderr);
    return 2;
}

typedef struct times {
    double wall, cpu;
} times_t;

typedef struct job {
    const eng_model_t *m;
    bool               noncausal;
    size_t             P, S, H;
    int32_t           *ids; /* (P + S) */
    eng_fwd_state_t   *st;
    float             *whole, *part; /* (H) final hidden states */
} job_t;

/* One pass: from st (read-only) over ids[from..P + S), or alone over all. */
static int pass(job_t *j, bool from_state, times_t *t) {
    char   err[512];
    size_t from = from_state ? j->P : 0;
    double w0 = now_s(), c0 = cpu_s();
    if (eng_model_forward_from(j->m, from_state ? j->st : NULL, false, j->ids + from,
                               j->P + j->S - from, j->noncausal, from_state ? j->part : j->whole,
                               NULL, NULL, err, sizeof err)) {
        fprintf(stderr, "bench_share: %s\n", err);
        return 1;
    }
    t->wall = now_s() - w0;
    t->cpu = cpu_s() - c0;
    return 0;
}

static double rel_diff(const float *a, const float *b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static int row(job_t *j, size_t n_q, size_t runs) {
    uint64_t x = 0x9e3779b97f4a7c15u ^ j->P;
    size_t   V = eng_model_vocab_size(j->m);
    for (size_t i = 0; i < j->P + j->S; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        j->ids[i] = (int32_t)(x % V);
    }
    char   err[512];
    double w0 = now_s(), c0 = cpu_s();
    j->st = eng_fwd_state_new(j->m, j->noncausal);
    if (!j->st || eng_model_forward_from(j->m, j->st, true, j->ids, j->P, j->noncausal, NULL, NULL,
                                         NULL, err, sizeof err)) {
        fprintf(stderr, "bench_share: prefix of %zu: %s\n", j->P, j->st ? err : "out of memory");
        return 1;
    }
    times_t pre = {now_s() - w0, cpu_s() - c0}, best[2] = {{1e300, 1e300}, {1e300, 1e300}}, t;
    printf("prefix %zu tokens once: %.2f s wall, %.2f s CPU\n", j->P, pre.wall, pre.cpu);
    for (size_t r = 0; r < runs; r++)
        for (int k = 0; k < 2; k++) {
            bool from_state = (k == 0) == (r % 2 == 1); /* alternate which goes first */
            if (pass(j, from_state, &t))
                return 1;
            printf("  run %zu: %s %.2f s wall, %.2f s CPU\n", r,
                   from_state ? "suffix from the state" : "whole prompt alone  ", t.wall, t.cpu);
            fflush(stdout);
            best[from_state].wall = t.wall < best[from_state].wall ? t.wall : best[from_state].wall;
            best[from_state].cpu = t.cpu < best[from_state].cpu ? t.cpu : best[from_state].cpu;
        }
    double d = rel_diff(j->part, j->whole, j->H), N = (double)n_q;
    printf("%zu + %zu tokens: whole %.2f s (CPU %.2f), suffix %.2f s (CPU %.2f): %.3f of a whole "
           "(CPU %.3f); %zu questions on the prefix: %.3f of %zu alone (CPU %.3f); final hidden "
           "rel diff %.2g\n",
           j->P, j->S, best[0].wall, best[0].cpu, best[1].wall, best[1].cpu,
           best[1].wall / best[0].wall, best[1].cpu / best[0].cpu, n_q,
           (pre.wall + N * best[1].wall) / (N * best[0].wall), n_q,
           (pre.cpu + N * best[1].cpu) / (N * best[0].cpu), d);
    fflush(stdout);
    eng_fwd_state_free(j->st);
    j->st = NULL;
    return d <= 1e-3 ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc < 2 || argv[1][0] == '-')
        return usage();
    size_t n_q = 16, runs = 2, S = 64, Ps[32], nP = 0;
    for (int a = 2; a < argc; a++) {
        if (strcmp(argv[a], "--questions") == 0 && a + 1 < argc)
            n_q = strtoul(argv[++a], NULL, 10);
        else if (strcmp(argv[a], "--runs") == 0 && a + 1 < argc)
            runs = strtoul(argv[++a], NULL, 10);
        else if (strcmp(argv[a], "--suffix") == 0 && a + 1 < argc)
            S = strtoul(argv[++a], NULL, 10);
        else if (argv[a][0] != '-' && nP < 32)
            Ps[nP++] = strtoul(argv[a], NULL, 10);
        else
            return usage();
    }
    if (nP == 0)
        Ps[nP++] = 3936;
    if (n_q == 0 || runs == 0 || S == 0)
        return usage();
    eng_package_t *pkg;
    eng_model_t   *m;
    if (bench_open_model("bench_share", argv[1], &pkg, &m))
        return 1;
    size_t maxP = 0;
    for (size_t i = 0; i < nP; i++)
        maxP = Ps[i] > maxP ? Ps[i] : maxP;
    job_t j = {.m = m,
               .noncausal = eng_package_noncausal(pkg),
               .S = S,
               .H = eng_model_hidden_size(m),
               .ids = malloc((maxP + S) * sizeof *j.ids)};
    j.whole = malloc(j.H * sizeof *j.whole);
    j.part = malloc(j.H * sizeof *j.part);
    int rc = j.ids && j.whole && j.part ? 0 : 1;
    printf("bench_share: %s, %s attention, matmul %s, %zu threads, %zu of %zu layers shared\n",
           argv[1], j.noncausal ? "non-causal" : "causal", npu_matmul_name(), npu_threads(),
           eng_fwd_shared_layers(m, j.noncausal), eng_fwd_shared_layers(m, false));
    for (size_t i = 0; !rc && i < nP; i++) {
        j.P = Ps[i];
        rc = j.P ? row(&j, n_q, runs) : usage();
    }
    free(j.ids);
    free(j.whole);
    free(j.part);
    eng_model_free(m);
    eng_package_free(pkg);
    return rc;
}
