/*
 * fuzz_tokenize.c -- libFuzzer harness for the tokenizer at run time
 * (ctest replays its saved inputs: fuzz_tokenize): any bytes -> eng_tokenizer_encode with Qwen3's
 * tokenizer.json (pcre2 pre-tokenizer, NFC, byte-level BPE, added tokens);
 * invalid UTF-8 is refused, anything else gives ids in range. Never a
 * crash, a leak or undefined behaviour.
 *
 * D3_QWEN3_DIR names the fetched tokenizer
 * (tests/tools/fetch_qwen3_tokenizer.sh); tests/fuzz/run.sh builds and
 * runs it when that holds tokenizer.json.
 */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

static eng_tokenizer_t *tok;

static void load(void) {
    const char *dir = getenv("D3_QWEN3_DIR");
    char        path[4096], err[512];
    if (!dir) {
        fprintf(stderr, "fuzz_tokenize: set D3_QWEN3_DIR\n");
        abort();
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (eng_tokenizer_load(path, NULL, ENG_TOK_AS_IS, &tok, err, sizeof err) != SVC_OK) {
        fprintf(stderr, "fuzz_tokenize: %s\n", err);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    if (!tok)
        load(); /* kept for the process: LeakSanitizer ignores what stays reachable */
    eng_ids_t ids;
    eng_ids_init(&ids);
    svc_err_t err = eng_tokenizer_encode(tok, (const char *)data, size, &ids);
    if (err != SVC_OK && err != SVC_ERR_INVALID)
        abort();
    size_t n = eng_tokenizer_n_ids(tok);
    for (size_t i = 0; i < ids.n; i++)
        if (ids.v[i] < 0 || (size_t)ids.v[i] >= n)
            abort();
    if (err == SVC_OK && size > 0 && ids.n == 0)
        abort(); /* valid non-empty text always has at least one token */
    eng_ids_fini(&ids);
    return 0;
}
