/*
 * ops_http_keys.c -- API keys at the HTTP edge (issue 30): the keys of
 * --api-key-file, one per line (blank lines and '#' comments skipped),
 * loaded at start and again on SIGHUP, and the check of a request's
 * `Authorization: Bearer KEY` or `Api-Key: KEY` against them.
 *
 * A key is kept only as its SHA-256; a presented key is hashed and
 * compared with every kept digest by CRYPTO_memcmp, all of them, so the
 * time depends neither on where the keys differ nor on which key matched
 * nor on their lengths. Keys are never logged: the access log names the
 * one that matched by its 1-based position among the file's keys.
 */
#include "ops_http_int.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define KEY_MAX_LEN 4096 /* bytes of one key, past which a line is refused */

struct http_keys {
    pthread_mutex_t lock;     /* the set: swapped whole by a reload */
    unsigned char (*sha)[32]; /* (n) */
    size_t n;
    char  *path;
};

static bool key_sha(const char *key, size_t n, unsigned char out[32]) {
    unsigned int len = 0;
    return EVP_Digest(key, n, out, &len, EVP_sha256(), NULL) == 1 && len == 32;
}

/* The file's keys into *sha (malloc'd) and *n; false with why. */
static bool keys_read(const char *path, unsigned char (**sha)[32], size_t *n, char *why,
                      size_t why_size) {
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(why, why_size, "--api-key-file \"%s\": cannot read it", path);
        return false;
    }
    char  *line = NULL;
    size_t cap = 0, cap_keys = 0, lineno = 0;
    bool   ok = true;
    *sha = NULL;
    *n = 0;
    ssize_t got;
    while (ok && (got = getline(&line, &cap, f)) >= 0) {
        lineno++;
        char  *k = line + strspn(line, " \t");
        size_t len = strcspn(k, "\r\n");
        while (len && (k[len - 1] == ' ' || k[len - 1] == '\t'))
            len--;
        if (!len || k[0] == '#')
            continue;
        if (len > KEY_MAX_LEN || memchr(k, ' ', len) || memchr(k, '\t', len)) {
            snprintf(why, why_size, "--api-key-file \"%s\": line %zu is not one key", path, lineno);
            ok = false;
            break;
        }
        if (*n == cap_keys) {
            size_t nc = cap_keys ? 2 * cap_keys : 8;
            void  *p = realloc(*sha, nc * sizeof **sha);
            if (!p) {
                snprintf(why, why_size, "out of memory reading --api-key-file");
                ok = false;
                break;
            }
            *sha = p;
            cap_keys = nc;
        }
        ok = key_sha(k, len, (*sha)[(*n)++]);
    }
    if (ok && ferror(f)) {
        snprintf(why, why_size, "--api-key-file \"%s\": read error", path);
        ok = false;
    }
    if (ok && !*n) {
        snprintf(why, why_size, "--api-key-file \"%s\": no key in it", path);
        ok = false;
    }
    fclose(f);
    free(line);
    if (!ok) {
        free(*sha);
        *sha = NULL;
        *n = 0;
    }
    return ok;
}

http_keys_t *ops_http_keys_new(const char *path, char *why, size_t why_size) {
    http_keys_t *k = calloc(1, sizeof *k);
    if (!k || !(k->path = strdup(path))) {
        free(k);
        snprintf(why, why_size, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&k->lock, NULL);
    if (!keys_read(path, &k->sha, &k->n, why, why_size)) {
        ops_http_keys_free(k);
        return NULL;
    }
    return k;
}

bool ops_http_keys_reload(http_keys_t *k, size_t *n, char *why, size_t why_size) {
    unsigned char(*sha)[32];
    size_t count;
    if (!keys_read(k->path, &sha, &count, why, why_size))
        return false; /* the old keys stay */
    pthread_mutex_lock(&k->lock);
    unsigned char(*old)[32] = k->sha;
    k->sha = sha;
    k->n = count;
    pthread_mutex_unlock(&k->lock);
    free(old);
    *n = count;
    return true;
}

size_t ops_http_keys_count(http_keys_t *k) {
    pthread_mutex_lock(&k->lock);
    size_t n = k->n;
    pthread_mutex_unlock(&k->lock);
    return n;
}

void ops_http_keys_free(http_keys_t *k) {
    if (!k)
        return;
    pthread_mutex_destroy(&k->lock);
    free(k->sha);
    free(k->path);
    free(k);
}

/* The key a request presents: "Authorization: Bearer KEY" (scheme in any
 * case), else "Api-Key: KEY"; NULL when neither. */
static const char *presented(struct MHD_Connection *con, size_t *len) {
    const char *a = MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Authorization");
    const char *key = NULL;
    if (a && strncasecmp(a, "Bearer ", 7) == 0)
        key = a + 7;
    else
        key = MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Api-Key");
    if (!key)
        return NULL;
    key += strspn(key, " \t");
    *len = strlen(key);
    while (*len && (key[*len - 1] == ' ' || key[*len - 1] == '\t'))
        (*len)--;
    return *len ? key : NULL;
}

int ops_http_keys_check(http_keys_t *k, struct MHD_Connection *con) {
    size_t        len = 0;
    const char   *key = presented(con, &len);
    unsigned char sha[32];
    int           found = 0;
    if (!key || len > KEY_MAX_LEN || !key_sha(key, len, sha))
        return 0;
    pthread_mutex_lock(&k->lock);
    for (size_t i = 0; i < k->n; i++) { /* every one: no early exit */
        int hit = CRYPTO_memcmp(k->sha[i], sha, 32) == 0;
        found = found ? found : hit * (int)(i + 1);
    }
    pthread_mutex_unlock(&k->lock);
    return found;
}
