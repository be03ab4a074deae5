/*
 * bench_accuracy.c -- how far the fast path's answers are from the fp32
 * path's on one package (issue 7, item 5). Built, never run by ctest: on
 * nano it takes minutes.
 *
 *   bench_accuracy dump --model DIR [--prompts N] [--seed S] OUT
 *       runs N prompts (default 200) of random token ids, 16 to 160 long,
 *       through the text tower and writes each final-norm hidden state at
 *       the last position and the readout's 3-option and 255-option
 *       probabilities (package temperature) to OUT. Run it once with
 *       D3_NPU_KERNELS=avx512 (fp32 everywhere: the reference, same
 *       dequantised weights) and once with the default dispatch.
 *   bench_accuracy compare A B
 *       prints the median and worst cosine of the hidden states and the
 *       worst absolute probability difference, and exits 1 when the median
 *       cosine is below 0.999 or a probability moved by more than 0.01
 *       (issue 7's bounds).
 *
 *   bench_accuracy layers --model DIR [--twin BF16DIR] [--prompts N]
 *                         [--seed S] [--grid GHxGW]
 *       issue 28's per-layer measure, teacher-forced: each text layer's
 *       output from the exact input, the fast profile against exact
 *       (eng_fwd_layer_errors: relative RMS of what the layer adds to the
 *       residual stream, over N prompts (default 8) of random ids, 16 to
 *       160 long); with --twin, the same measure for DIR's weights (exact
 *       kernels) against BF16DIR's (the BF16 package DIR was quantised
 *       from: `make-package` with the same --size and --seed, no
 *       --format), and the ratio fast / Q4 per layer against the bound
 *       1/5. Then each vision block fast against exact over one image of
 *       GH x GW patches of random pixels (default 64x48: a 1024 x 768
 *       image), where DIR has a tower. Exits 1 when a layer's ratio is
 *       over 1/5.
 *
 * Prompts run two at a time on the pool's threads (each pass also splits
 * its products over the pool).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eng_fwd_int.h"
#include "eng_model_int.h"
#include "eng_vision_int.h"
#include "engine.h"
#include "npu.h"

#define MAGIC "D3ACC1\n"

typedef struct job {
    const eng_model_t *m;
    bool               noncausal;
    double             temp;
    size_t             n, H;
    int32_t          **ids;
    size_t            *len;
    float             *hid;   /* (n, H) */
    double            *probs; /* (n, 3 + 255) */
    int                failed;
} job_t;

static void run_one(void *ctx, size_t i) {
    job_t *j = ctx;
    char   err[256] = "";
    float *h = j->hid + i * j->H;
    if (eng_model_forward(j->m, j->ids[i], j->len[i], j->noncausal, h, NULL, NULL, err,
                          sizeof err) != SVC_OK ||
        eng_readout_probs(j->m, h, 3, j->temp, j->probs + i * 258) != SVC_OK ||
        eng_readout_probs(j->m, h, ENG_N_CODES, j->temp, j->probs + i * 258 + 3) != SVC_OK) {
        fprintf(stderr, "bench_accuracy: prompt %zu: %s\n", i, err);
        j->failed = 1;
    }
    if (i % 20 == 19)
        fprintf(stderr, "bench_accuracy: %zu prompts\n", i + 1);
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

/* n prompts of 16 to 160 random ids below vocab, from seed. */
static int32_t **random_prompts(size_t n, uint64_t seed, size_t vocab, size_t **len) {
    int32_t **ids = calloc(n, sizeof *ids);
    *len = calloc(n, sizeof **len);
    uint64_t s = seed | 1;
    for (size_t i = 0; ids && *len && i < n; i++) {
        (*len)[i] = 16 + rng_next(&s) % 145;
        if (!(ids[i] = malloc((*len)[i] * sizeof *ids[i])))
            return NULL;
        for (size_t t = 0; t < (*len)[i]; t++)
            ids[i][t] = (int32_t)(rng_next(&s) % vocab);
    }
    return ids && *len ? ids : NULL;
}

static int dump(const char *dir, size_t n, uint64_t seed, const char *out) {
    char           err[512] = "";
    eng_package_t *pkg = NULL;
    eng_model_t   *m = NULL;
    if (eng_package_open(dir, &pkg, err, sizeof err) || eng_model_load(dir, &m, err, sizeof err)) {
        fprintf(stderr, "bench_accuracy: %s\n", err);
        eng_package_free(pkg);
        return 3;
    }
    job_t j = {.m = m,
               .noncausal = eng_package_noncausal(pkg),
               .temp = eng_package_temperature(pkg),
               .n = n,
               .H = eng_model_hidden_size(m)};
    j.ids = random_prompts(n, seed, eng_model_vocab_size(m), &j.len);
    j.hid = calloc(n * j.H, sizeof *j.hid);
    j.probs = calloc(n * 258, sizeof *j.probs);
    if (!j.ids || !j.hid || !j.probs)
        return 3;
    fprintf(stderr,
            "bench_accuracy: %zu prompts, matmul %s (quantised weights %s, q4nx group codes %s), "
            "kernels %s\n",
            n, npu_matmul_name(), npu_matmul_quantised_name(), npu_matmul_groups_name(),
            npu_kernels_name());
    npu_parallel_for(n, run_one, &j);
    FILE *f = fopen(out, "wb");
    int   rc = j.failed ? 3 : 0;
    if (!f || fwrite(MAGIC, 1, strlen(MAGIC), f) != strlen(MAGIC) ||
        fwrite(&j.n, sizeof j.n, 1, f) != 1 || fwrite(&j.H, sizeof j.H, 1, f) != 1 ||
        fwrite(j.hid, sizeof *j.hid, n * j.H, f) != n * j.H ||
        fwrite(j.probs, sizeof *j.probs, n * 258, f) != n * 258) {
        fprintf(stderr, "bench_accuracy: cannot write %s\n", out);
        rc = 3;
    }
    if (f)
        fclose(f);
    for (size_t i = 0; i < n; i++)
        free(j.ids[i]);
    free(j.ids), free(j.len), free(j.hid), free(j.probs);
    eng_model_free(m);
    eng_package_free(pkg);
    return rc;
}

typedef struct acc {
    size_t  n, H;
    float  *hid;
    double *probs;
} acc_t;

static int load(const char *path, acc_t *a) {
    FILE *f = fopen(path, "rb");
    char  magic[sizeof MAGIC];
    if (!f || fread(magic, 1, strlen(MAGIC), f) != strlen(MAGIC) ||
        memcmp(magic, MAGIC, strlen(MAGIC)) != 0 || fread(&a->n, sizeof a->n, 1, f) != 1 ||
        fread(&a->H, sizeof a->H, 1, f) != 1 || a->n > (1u << 20) || a->H > (1u << 20)) {
        fprintf(stderr, "bench_accuracy: %s is not a dump\n", path);
        if (f)
            fclose(f);
        return -1;
    }
    a->hid = malloc(a->n * a->H * sizeof *a->hid);
    a->probs = malloc(a->n * 258 * sizeof *a->probs);
    int ok = a->hid && a->probs && fread(a->hid, sizeof *a->hid, a->n * a->H, f) == a->n * a->H &&
             fread(a->probs, sizeof *a->probs, a->n * 258, f) == a->n * 258;
    fclose(f);
    return ok ? 0 : -1;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static int compare(const char *pa, const char *pb) {
    acc_t a, b;
    if (load(pa, &a) || load(pb, &b) || a.n != b.n || a.H != b.H) {
        fprintf(stderr, "bench_accuracy: the dumps do not match\n");
        return 2;
    }
    double *cos = malloc(a.n * sizeof *cos), dp3 = 0, dp255 = 0;
    if (!cos)
        return 3;
    for (size_t i = 0; i < a.n; i++) {
        double dot = 0, na = 0, nb = 0;
        for (size_t k = 0; k < a.H; k++) {
            double x = a.hid[i * a.H + k], y = b.hid[i * a.H + k];
            dot += x * y, na += x * x, nb += y * y;
        }
        cos[i] = dot / sqrt(na * nb);
        for (size_t k = 0; k < 258; k++) {
            double d = fabs(a.probs[i * 258 + k] - b.probs[i * 258 + k]);
            if (k < 3)
                dp3 = d > dp3 ? d : dp3;
            else
                dp255 = d > dp255 ? d : dp255;
        }
    }
    qsort(cos, a.n, sizeof *cos, cmp_double);
    double med = cos[a.n / 2], worst = cos[0];
    printf("prompts %zu  hidden cosine median %.6f worst %.6f  max |dp| 3 options %.2e, 255 "
           "options %.2e\n",
           a.n, med, worst, dp3, dp255);
    int ok = med >= 0.999 && dp3 <= 0.01 && dp255 <= 0.01;
    printf("%s (bounds: median cosine >= 0.999, |dp| <= 0.01)\n", ok ? "within" : "OUTSIDE");
    free(cos), free(a.hid), free(a.probs), free(b.hid), free(b.probs);
    return ok ? 0 : 1;
}

static double rel_rms(double num, double den) {
    return den > 0 ? sqrt(num / den) : 0.0;
}

/* The vision blocks' fast-against-exact table over one image of random
 * pixels (normalised values in [-1, 1]). */
static int vision_layers(const eng_model_t *m, size_t gh, size_t gw, uint64_t seed) {
    const eng_vision_t *v = m->vision;
    size_t              depth = v->cfg.depth, pe = eng_vis_patch_elems(&v->cfg);
    double             *num = calloc(depth, sizeof *num), *den = calloc(depth, sizeof *den);
    float              *rows = malloc(gh * gw * pe * sizeof *rows);
    char                err[512] = "";
    if (!num || !den || !rows)
        return 3;
    uint64_t s = seed | 1;
    for (size_t i = 0; i < gh * gw * pe; i++)
        rows[i] = (float)((double)(rng_next(&s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    int rc = 0;
    if (eng_vision_block_errors(v, rows, gh, gw, num, den, err, sizeof err)) {
        fprintf(stderr, "bench_accuracy: %s\n", err);
        rc = 3;
    } else {
        printf("\nvision blocks, one image of %zu x %zu patches, teacher-forced, relative RMS of "
               "what each block adds\nblock  fast/exact\n",
               gh, gw);
        double worst = 0;
        for (size_t b = 0; b < depth; b++) {
            double e = rel_rms(num[b], den[b]);
            worst = e > worst ? e : worst;
            printf("%5zu  %.3e\n", b, e);
        }
        printf("worst %.3e\n", worst);
    }
    free(num), free(den), free(rows);
    return rc;
}

static int layers(const char *dir, const char *twin, size_t n, uint64_t seed, size_t gh,
                  size_t gw) {
    char           err[512] = "";
    eng_package_t *pkg = NULL;
    eng_model_t   *m = NULL, *t = NULL;
    if (eng_package_open(dir, &pkg, err, sizeof err) || eng_model_load(dir, &m, err, sizeof err) ||
        (twin && eng_model_load(twin, &t, err, sizeof err))) {
        fprintf(stderr, "bench_accuracy: %s\n", err);
        return 3;
    }
    bool      noncausal = eng_package_noncausal(pkg);
    size_t    L = m->cfg.n_layers, *len = NULL;
    int32_t **ids = random_prompts(n, seed, eng_model_vocab_size(m), &len);
    double   *acc = calloc(4 * L, sizeof *acc); /* fast num, den; q4 num, den */
    if (!ids || !acc)
        return 3;
    fprintf(stderr, "bench_accuracy: %zu prompts, fast projections %s, exact %s\n", n,
            npu_matmul_fast_name(), npu_matmul_groups_name());
    const eng_model_t *fast = eng_model_profile(m, ENG_PROFILE_FAST);
    for (size_t i = 0; i < n; i++) {
        if (eng_fwd_layer_errors(m, fast, ids[i], len[i], noncausal, acc, acc + L, err,
                                 sizeof err) ||
            (t && eng_fwd_layer_errors(t, m, ids[i], len[i], noncausal, acc + 2 * L, acc + 3 * L,
                                       err, sizeof err))) {
            fprintf(stderr, "bench_accuracy: prompt %zu: %s\n", i, err);
            return 3;
        }
        fprintf(stderr, "bench_accuracy: %zu/%zu prompts\n", i + 1, n);
    }
    printf("text layers, %zu prompts, teacher-forced, relative RMS of what each layer adds\n"
           "layer  kind    fast/exact%s\n",
           n, t ? "  q4/bf16     fast/q4 (bound 0.2)" : "");
    double worst = 0, worst_ratio = 0;
    for (size_t l = 0; l < L; l++) {
        double ef = rel_rms(acc[l], acc[L + l]);
        worst = ef > worst ? ef : worst;
        printf("%5zu  %-6s  %.3e", l, m->layers[l].kind == ENG_LAYER_LINEAR ? "linear" : "full",
               ef);
        if (t) {
            double eq = rel_rms(acc[2 * L + l], acc[3 * L + l]), r = eq > 0 ? ef / eq : INFINITY;
            worst_ratio = r > worst_ratio ? r : worst_ratio;
            printf("   %.3e   %.3f", eq, r);
        }
        printf("\n");
    }
    printf("worst fast/exact %.3e", worst);
    if (t)
        printf(", worst fast/q4 %.3f: %s", worst_ratio, worst_ratio <= 0.2 ? "within" : "OUTSIDE");
    printf("\n");
    int rc = t && worst_ratio > 0.2 ? 1 : 0;
    if (m->vision && gh && gw) {
        int vr = vision_layers(m, gh, gw, seed);
        rc = vr ? vr : rc;
    }
    for (size_t i = 0; i < n; i++)
        free(ids[i]);
    free(ids), free(len), free(acc);
    eng_model_free(t);
    eng_model_free(m);
    eng_package_free(pkg);
    return rc;
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "layers") == 0) {
        const char *dir = NULL, *twin = NULL;
        size_t      n = 8, gh = 64, gw = 48;
        uint64_t    seed = 7;
        bool        ok = true;
        for (int i = 2; i < argc && ok; i++) {
            if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
                dir = argv[++i];
            else if (strcmp(argv[i], "--twin") == 0 && i + 1 < argc)
                twin = argv[++i];
            else if (strcmp(argv[i], "--prompts") == 0 && i + 1 < argc)
                n = (size_t)strtoul(argv[++i], NULL, 10);
            else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
                seed = strtoull(argv[++i], NULL, 10);
            else if (strcmp(argv[i], "--grid") == 0 && i + 1 < argc)
                ok = sscanf(argv[++i], "%zux%zu", &gh, &gw) == 2;
            else
                ok = false;
        }
        if (ok && dir && n > 0)
            return layers(dir, twin, n, seed, gh, gw);
    }
    if (argc == 4 && strcmp(argv[1], "compare") == 0)
        return compare(argv[2], argv[3]);
    if (argc >= 5 && strcmp(argv[1], "dump") == 0) {
        const char *dir = NULL, *out = NULL;
        size_t      n = 200;
        uint64_t    seed = 7;
        for (int i = 2; i < argc; i++) {
            if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
                dir = argv[++i];
            else if (strcmp(argv[i], "--prompts") == 0 && i + 1 < argc)
                n = (size_t)strtoul(argv[++i], NULL, 10);
            else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
                seed = strtoull(argv[++i], NULL, 10);
            else
                out = argv[i];
        }
        if (dir && out && n > 0)
            return dump(dir, n, seed, out);
    }
    fprintf(stderr, "usage: bench_accuracy dump --model DIR [--prompts N] [--seed S] OUT\n"
                    "       bench_accuracy compare A B\n"
                    "       bench_accuracy layers --model DIR [--twin BF16DIR] [--prompts N] "
                    "[--seed S] [--grid GHxGW]\n");
    return 2;
}
