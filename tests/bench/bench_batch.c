/*
 * bench_batch.c -- what running short questions together saves (issue 7,
 * item 2: questions of different requests batched so that weights are
 * read once per batch). Built, never run by ctest.
 *
 *   bench_batch DIR [--questions N] [--runs R] [T ...]
 *
 * For each T (default 8 32 64 128 330): N (default 16) prompts of T random
 * token ids, run as N passes of their own (eng_model_forward) and as one
 * batched pass (eng_model_forward_batch), alternately R times (default 2)
 * so that the VM's drifting speed hits both alike; prints the best time of
 * each, tokens/s and the ratio, and checks that the batch gave the same
 * bits as the passes of their own.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eng_fwd_int.h"
#include "engine.h"
#include "npu.h"
#include "bench_model.h"

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int usage(void) {
    fputs("usage: bench_batch DIR [--questions N] [--runs R] [T ...]\n", stderr);
    return 2;
}

typedef struct job {
    const eng_model_t *m;
    bool               noncausal;
    size_t             n, T, H;
    int32_t           *ids;  /* (n, T) */
    float             *own;  /* (n, H) from passes of their own */
    float             *bat;  /* (n, H) from the batch */
    eng_fwd_seq_t     *seqs; /* (n) */
} job_t;

static int run_own(job_t *j, double *ms) {
    char   err[512];
    double t0 = now_ms();
    for (size_t q = 0; q < j->n; q++)
        if (eng_model_forward(j->m, j->ids + q * j->T, j->T, j->noncausal, j->own + q * j->H, NULL,
                              NULL, err, sizeof err)) {
            fprintf(stderr, "bench_batch: %s\n", err);
            return 1;
        }
    *ms = now_ms() - t0;
    return 0;
}

static int run_batch(job_t *j, double *ms) {
    char   err[512];
    double t0 = now_ms();
    if (eng_model_forward_batch(j->m, j->seqs, j->n, NULL, j->noncausal, err, sizeof err)) {
        fprintf(stderr, "bench_batch: %s\n", err);
        return 1;
    }
    *ms = now_ms() - t0;
    return 0;
}

/* One row: R alternations of the two ways, best of each. */
static int row(job_t *j, size_t runs) {
    uint64_t x = 0x9e3779b97f4a7c15u ^ j->T;
    size_t   V = eng_model_vocab_size(j->m);
    for (size_t i = 0; i < j->n * j->T; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        j->ids[i] = (int32_t)(x % V);
    }
    for (size_t q = 0; q < j->n; q++)
        j->seqs[q] = (eng_fwd_seq_t){NULL, j->ids + q * j->T, j->T, j->bat + q * j->H};
    double best_own = 1e300, best_bat = 1e300, ms;
    for (size_t r = 0; r < runs; r++) {
        /* alternate which goes first */
        for (int k = 0; k < 2; k++) {
            bool batch = (k == 0) == (r % 2 == 1);
            if (batch ? run_batch(j, &ms) : run_own(j, &ms))
                return 1;
            if (batch && ms < best_bat)
                best_bat = ms;
            if (!batch && ms < best_own)
                best_own = ms;
        }
    }
    bool   same = memcmp(j->own, j->bat, j->n * j->H * sizeof *j->own) == 0;
    double tok = (double)(j->n * j->T);
    printf("%zu x %zu tokens: own passes %.0f ms (%.1f tokens/s), one batch %.0f ms (%.1f "
           "tokens/s): %.2fx%s\n",
           j->n, j->T, best_own, tok / best_own * 1e3, best_bat, tok / best_bat * 1e3,
           best_own / best_bat, same ? "" : "  BITS DIFFER");
    fflush(stdout);
    return same ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc < 2 || argv[1][0] == '-')
        return usage();
    size_t n = 16, runs = 2, Ts[32], nT = 0;
    for (int a = 2; a < argc; a++) {
        if (strcmp(argv[a], "--questions") == 0 && a + 1 < argc)
            n = strtoul(argv[++a], NULL, 10);
        else if (strcmp(argv[a], "--runs") == 0 && a + 1 < argc)
            runs = strtoul(argv[++a], NULL, 10);
        else if (argv[a][0] != '-' && nT < 32)
            Ts[nT++] = strtoul(argv[a], NULL, 10);
        else
            return usage();
    }
    static const size_t DEF[] = {8, 32, 64, 128, 330};
    if (nT == 0)
        for (nT = 0; nT < 5; nT++)
            Ts[nT] = DEF[nT];
    if (n == 0 || runs == 0)
        return usage();
    eng_package_t *pkg;
    eng_model_t   *m;
    if (bench_open_model("bench_batch", argv[1], &pkg, &m))
        return 1;
    size_t H = eng_model_hidden_size(m), maxT = 0;
    for (size_t i = 0; i < nT; i++)
        maxT = Ts[i] > maxT ? Ts[i] : maxT;
    job_t j = {m,
               eng_package_noncausal(pkg),
               n,
               0,
               H,
               malloc(n * maxT * sizeof *j.ids),
               malloc(n * H * sizeof *j.own),
               malloc(n * H * sizeof *j.bat),
               malloc(n * sizeof *j.seqs)};
    int   rc = j.ids && j.own && j.bat && j.seqs ? 0 : 1;
    printf("bench_batch: %s, %s attention, matmul %s, %zu threads\n", argv[1],
           j.noncausal ? "non-causal" : "causal", npu_matmul_name(), npu_threads());
    for (size_t i = 0; !rc && i < nT; i++) {
        j.T = Ts[i];
        rc = j.T ? row(&j, runs) : usage();
    }
    free(j.ids);
    free(j.own);
    free(j.bat);
    free(j.seqs);
    eng_model_free(m);
    eng_package_free(pkg);
    return rc;
}
