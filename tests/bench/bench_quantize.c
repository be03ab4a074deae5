/*
 * bench_quantize.c -- how close `d3stream quantize`'s packages are to the
 * BF16 package they were made from (issue 33's measurements,
 * docs/quantize.md). Built, never run by ctest.
 *
 *   bench_quantize layers --bf16 DIR A [B]
 *                         [--prompts N] [--tokens N] [--seed S]
 *       per text layer, teacher-forced (eng_fwd_layer_errors: the relative
 *       RMS error of what the layer adds to the residual stream), each
 *       quantised package against the BF16 one, over N held-out System
 *       One prompts (eng_calib_generate with seed S, default 1000: never
 *       the calibration's default 0; N default 32, at most --tokens in
 *       all, default 32768); with B, the ratio B / A per layer and over
 *       all layers (sqrt of the summed num / den).
 *
 *   bench_quantize e2e --bf16 DIR A [B] [--passages FILE] [--prompts N]
 *                      [--seed S]
 *       end to end: the final-norm hidden state at the last position
 *       (cosine to BF16's: median, mean, worst) and the readout's top
 *       answer over the 255 codes and over the first 4 (a 4-option
 *       choice) -- agreement with BF16's --, the mean KL divergence of the
 *       255-code distribution from BF16's and the largest change of a
 *       4-option probability, on the prompts of FILE (a
 *       prompts.json of tests/fixtures/trained-tiny: {"prompts": [{"ids":
 *       [...]}]}), else on N generated held-out prompts.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eng_fwd_int.h"
#include "eng_model_int.h"
#include "eng_quant_int.h"
#include "engine.h"

typedef struct pk {
    eng_package_t *pkg;
    eng_model_t   *m;
} pk_t;

static int die(const char *what, const char *why) {
    fprintf(stderr, "bench_quantize: %s: %s\n", what, why);
    exit(3);
}

static void open_pk(const char *dir, pk_t *p) {
    char errstr[1024] = "";
    if (eng_package_open(dir, &p->pkg, errstr, sizeof errstr) ||
        eng_model_load(dir, &p->m, errstr, sizeof errstr))
        die(dir, errstr);
}

typedef struct args {
    const char *bf16, *a, *b, *passages;
    size_t      prompts;
    uint64_t    tokens, seed;
} args_t;

static void parse(int argc, char **argv, args_t *a) {
    *a = (args_t){.prompts = 32, .tokens = 32768, .seed = 1000};
    for (int i = 2; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--bf16") && v)
            a->bf16 = v, i++;
        else if (!strcmp(argv[i], "--prompts") && v)
            a->prompts = strtoull(v, NULL, 10), i++;
        else if (!strcmp(argv[i], "--tokens") && v)
            a->tokens = strtoull(v, NULL, 10), i++;
        else if (!strcmp(argv[i], "--seed") && v)
            a->seed = strtoull(v, NULL, 10), i++;
        else if (!strcmp(argv[i], "--passages") && v)
            a->passages = v, i++;
        else if (!a->a)
            a->a = argv[i];
        else if (!a->b)
            a->b = argv[i];
        else
            die("usage", argv[i]);
    }
    if (!a->bf16 || !a->a)
        die("usage", "bench_quantize layers|e2e --bf16 DIR A [B] [options]");
}

/* The held-out prompts: a prompts.json's, or generated. */
static void prompts(const args_t *a, const pk_t *ref, eng_calib_t *c) {
    char errstr[1024] = "";
    eng_calib_init(c);
    if (!a->passages) {
        if (eng_calib_generate(ref->pkg, a->seed, a->prompts, a->tokens, c, errstr, sizeof errstr))
            die("prompts", errstr);
        return;
    }
    json_error_t je;
    json_t      *root = json_load_file(a->passages, 0, &je);
    json_t      *list = json_object_get(root, "prompts");
    if (!json_is_array(list))
        die(a->passages, root ? "no \"prompts\" array" : je.text);
    c->cap = json_array_size(list);
    c->seqs = calloc(c->cap ? c->cap : 1, sizeof *c->seqs);
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t    *ids = json_object_get(json_array_get(list, i), "ids");
        eng_ids_t *s = &c->seqs[c->n++];
        eng_ids_init(s);
        for (size_t k = 0; k < json_array_size(ids); k++)
            if (eng_ids_push(s, (int32_t)json_integer_value(json_array_get(ids, k))))
                die("prompts", "out of memory");
        c->tokens += s->n;
    }
    json_decref(root);
}

/* The BF16 package, the one or two quantised ones and the held-out prompts
 * both commands compare them on; returns how many quantised ones. */
static int open_all(const args_t *a, pk_t *ref, pk_t q[2], eng_calib_t *c) {
    open_pk(a->bf16, ref);
    int nq = a->b ? 2 : 1;
    for (int i = 0; i < nq; i++)
        open_pk(i ? a->b : a->a, &q[i]);
    prompts(a, ref, c);
    return nq;
}

static int cmd_layers(const args_t *a) {
    pk_t             ref, q[2];
    eng_calib_t      c;
    int              nq = open_all(a, &ref, q, &c);
    eng_model_info_t info;
    eng_model_get_info(ref.m, &info);
    size_t  L = info.n_layers;
    double *num = calloc(2 * L, sizeof *num), *den = calloc(2 * L, sizeof *den);
    bool    nc = eng_package_noncausal(ref.pkg);
    char    errstr[1024] = "";
    for (size_t p = 0; p < c.n; p++)
        for (int i = 0; i < nq; i++)
            if (eng_fwd_layer_errors(ref.m, q[i].m, c.seqs[p].v, c.seqs[p].n, nc, num + i * L,
                                     den + i * L, errstr, sizeof errstr))
                die("layer errors", errstr);
    printf("held-out prompts: %zu, %llu tokens (%s)\n", c.n, (unsigned long long)c.tokens,
           a->passages ? a->passages : "generated");
    printf("layer  kind  A %-10s%s\n", "", a->b ? "B          B/A" : "");
    double sn[2] = {0}, sd[2] = {0};
    for (size_t l = 0; l < L; l++) {
        double ea = sqrt(num[l] / den[l]), eb = a->b ? sqrt(num[L + l] / den[L + l]) : 0;
        sn[0] += num[l], sd[0] += den[l], sn[1] += num[L + l], sd[1] += den[L + l];
        printf("%5zu  %-4s  %.5f   ", l, eng_model_layer_is_full(ref.m, l) ? "F" : "L", ea);
        if (a->b)
            printf("  %.5f    %.3f", eb, eb / ea);
        printf("\n");
    }
    double ta = sqrt(sn[0] / sd[0]), tb = a->b ? sqrt(sn[1] / sd[1]) : 0;
    printf("all    -     %.5f   ", ta);
    if (a->b)
        printf("  %.5f    %.3f", tb, tb / ta);
    printf("\n");
    free(num), free(den);
    eng_calib_fini(&c);
    return 0;
}

static int by_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static size_t argmax(const double *p, size_t n) {
    size_t k = 0;
    for (size_t i = 1; i < n; i++)
        if (p[i] > p[k])
            k = i;
    return k;
}

/* Final hidden state and probabilities (255 and 4 options) of prompt p. */
static void answer(const pk_t *k, const eng_ids_t *ids, float *h, double *p255, double *p4) {
    char   errstr[512] = "";
    double t = eng_package_temperature(k->pkg);
    if (eng_model_forward(k->m, ids->v, ids->n, eng_package_noncausal(k->pkg), h, NULL, NULL,
                          errstr, sizeof errstr) ||
        eng_readout_probs(k->m, h, ENG_N_CODES, t, p255) || eng_readout_probs(k->m, h, 4, t, p4))
        die("forward", errstr);
}

static int cmd_e2e(const args_t *a) {
    pk_t        ref, q[2];
    eng_calib_t c;
    int         nq = open_all(a, &ref, q, &c);
    size_t      H = eng_model_hidden_size(ref.m);
    float      *h0 = malloc(H * sizeof *h0), *h1 = malloc(H * sizeof *h1);
    double      r255[ENG_N_CODES], r4[4], p255[ENG_N_CODES], p4[4];
    double     *cos = malloc(2 * c.n * sizeof *cos);
    size_t      agree255[2] = {0}, agree4[2] = {0};
    double      dp4[2] = {0}, kl[2] = {0};
    for (size_t p = 0; p < c.n; p++) {
        answer(&ref, &c.seqs[p], h0, r255, r4);
        for (int i = 0; i < nq; i++) {
            answer(&q[i], &c.seqs[p], h1, p255, p4);
            double d = 0, n0 = 0, n1 = 0;
            for (size_t j = 0; j < H; j++)
                d += (double)h0[j] * h1[j], n0 += (double)h0[j] * h0[j],
                    n1 += (double)h1[j] * h1[j];
            cos[i * c.n + p] = d / sqrt(n0 * n1);
            agree255[i] += argmax(p255, ENG_N_CODES) == argmax(r255, ENG_N_CODES);
            agree4[i] += argmax(p4, 4) == argmax(r4, 4);
            for (size_t j = 0; j < 4; j++)
                dp4[i] = fmax(dp4[i], fabs(p4[j] - r4[j]));
            for (size_t j = 0; j < ENG_N_CODES; j++)
                if (r255[j] > 0)
                    kl[i] += r255[j] * log(r255[j] / fmax(p255[j], 1e-300)) / (double)c.n;
        }
    }
    printf("prompts: %zu, %llu tokens (%s)\n", c.n, (unsigned long long)c.tokens,
           a->passages ? a->passages : "generated");
    for (int i = 0; i < nq; i++) {
        double *v = cos + i * c.n, mean = 0;
        for (size_t p = 0; p < c.n; p++)
            mean += v[p] / (double)c.n;
        qsort(v, c.n, sizeof *v, by_double);
        printf("%s %s: final-state cosine median %.5f mean %.5f worst %.5f; top-1 agreement "
               "255 codes %.1f%%, 4 options %.1f%%; mean KL(255) %.4g, max |dp| (4) %.4f\n",
               i ? "B" : "A", i ? a->b : a->a, v[c.n / 2], mean, v[0],
               100.0 * (double)agree255[i] / (double)c.n, 100.0 * (double)agree4[i] / (double)c.n,
               kl[i], dp4[i]);
    }
    free(h0), free(h1), free(cos);
    eng_calib_fini(&c);
    return 0;
}

int main(int argc, char **argv) {
    args_t a;
    if (argc < 2)
        die("usage", "bench_quantize layers|e2e --bf16 DIR A [B] [options]");
    parse(argc, argv, &a);
    if (!strcmp(argv[1], "layers"))
        return cmd_layers(&a);
    if (!strcmp(argv[1], "e2e"))
        return cmd_e2e(&a);
    return die("usage", argv[1]);
}
