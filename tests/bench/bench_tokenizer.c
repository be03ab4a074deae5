/*
 * bench_tokenizer.c -- encode throughput of the tokenizer on mixed text
 * (English prose, C code, CJK, emoji, numbers, special tokens).
 *
 *     bench_tokenizer [TOKENIZER_DIR] [MB] [RUNS]
 *
 * TOKENIZER_DIR defaults to $D3_QWEN3_DIR. The text is generated from word
 * pools with a fixed seed, so repeated words hit the BPE cache about as
 * often as real prompts do. Before timing, the result of a cold cache is
 * checked against a warm one and against chunked encoding of the same text.
 */
#include "engine.h"

#include <time.h>

static const char *prose[] = {
    "The",         " quick",   " brown",   " fox",     " jumps", " over",     " the",
    " lazy",       " dog",     ".",        " It's",    " what",  " they'll",  " never",
    " expect",     ",",        " and",     " we're",   " ready", " for",      " tokenization",
    " benchmarks", " in",      " 2025",    "!",        "\n",     " Semantic", " routing",
    " decisions",  " require", " careful", " reading",
};
static const char *code[] = {
    "int",          " main",
    "(void)",       " {",
    "\n    ",       "return",
    " 0;",          "\n}",
    "\n",           "for (size_t i = 0;",
    " i < n;",      " i++)",
    " x->y",        " += ",
    "0x7f",         ";",
    "  // comment", "#include <stdio.h>",
};
static const char *cjk[] = {"你好",   "世界", "，",       "这是",   "一个", "测试",   "。",
                            "日本語", "の",   "テキスト", "한국어", "문장", "입니다", "\n"};
static const char *emoji[] = {"😀",  "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", " ",
                              "🎉🎉", "✨"};
static const char *special[] = {"<|im_start|>", "<|im_end|>", "user\n", "assistant\n"};

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint32_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

#define PICK(a) (a)[rng() % (sizeof(a) / sizeof((a)[0]))]

static svc_err_t make_text(svc_buf_t *b, size_t bytes) {
    svc_err_t err = SVC_OK;
    while (b->len < bytes && !err) {
        uint32_t r = rng() % 100;
        if (r < 55)
            err = svc_buf_adds(b, PICK(prose));
        else if (r < 75)
            err = svc_buf_adds(b, PICK(code));
        else if (r < 90)
            err = svc_buf_adds(b, PICK(cjk));
        else if (r < 97)
            err = svc_buf_adds(b, PICK(emoji));
        else if (r < 98)
            err = svc_buf_adds(b, PICK(special));
        else
            err = svc_buf_addf(b, " %u", rng() % 100000);
    }
    return err;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static bool same_ids(const eng_ids_t *a, const eng_ids_t *b) {
    return a->n == b->n && memcmp(a->v, b->v, a->n * sizeof *a->v) == 0;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : getenv("D3_QWEN3_DIR");
    double      mb = argc > 2 ? strtod(argv[2], NULL) : 8.0;
    long        runs = argc > 3 ? strtol(argv[3], NULL, 10) : 5;
    if (!dir || mb <= 0 || runs <= 0 || runs > 1000) {
        fprintf(stderr, "usage: bench_tokenizer [TOKENIZER_DIR] [MB] [RUNS]\n");
        return 2;
    }
    char json[1024], cfg[1024], err[512];
    snprintf(json, sizeof json, "%s/tokenizer.json", dir);
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    eng_tokenizer_t *tok = NULL;
    double           t0 = now_s();
    if (eng_tokenizer_load(json, cfg, ENG_TOK_UPSTREAM, &tok, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    printf("load: %.3f s\n", now_s() - t0);
    svc_buf_t text;
    svc_buf_init(&text, (size_t)(mb * 1048576) + 4096);
    if (make_text(&text, (size_t)(mb * 1048576))) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    /* Validate: cold vs warm cache, and the first 64 KiB on its own (a
     * prefix ending at a newline encodes to a prefix of the ids). */
    eng_ids_t cold, warm, part;
    eng_ids_init(&cold);
    eng_ids_init(&warm);
    eng_ids_init(&part);
    size_t cut = 65536;
    while (cut < text.len && text.data[cut - 1] != '\n')
        cut++;
    t0 = now_s();
    if (eng_tokenizer_encode(tok, text.data, text.len, &cold) ||
        eng_tokenizer_encode(tok, text.data, text.len, &warm) ||
        eng_tokenizer_encode(tok, text.data, cut, &part)) {
        fprintf(stderr, "encode failed\n");
        return 1;
    }
    bool ok = same_ids(&cold, &warm) && part.n <= cold.n &&
              memcmp(part.v, cold.v, part.n * sizeof *part.v) == 0;
    printf("validate: %s (%zu tokens, %.2f MB)\n", ok ? "ok" : "MISMATCH", cold.n,
           (double)text.len / 1048576);
    if (!ok)
        return 1;
    double *secs = calloc((size_t)runs, sizeof *secs);
    for (long r = 0; r < runs && secs; r++) {
        warm.n = 0;
        t0 = now_s();
        if (eng_tokenizer_encode(tok, text.data, text.len, &warm))
            return 1;
        secs[r] = now_s() - t0;
    }
    if (!secs)
        return 1;
    qsort(secs, (size_t)runs, sizeof *secs, cmp_double);
    double p50 = secs[runs / 2], p99 = secs[(runs * 99) / 100];
    printf("encode: p50 %.3f s (%.2f MB/s, %.2f Mtok/s), p99 %.3f s, 1 thread, %ld runs\n", p50,
           (double)text.len / 1048576 / p50, (double)warm.n / 1e6 / p50, p99, runs);
    free(secs);
    eng_ids_fini(&cold);
    eng_ids_fini(&warm);
    eng_ids_fini(&part);
    svc_buf_fini(&text);
    eng_tokenizer_free(tok);
    return 0;
}
