/*
 * ops_http_multipart.c -- image uploads as the official SDK sends them
 * (issue 30): a multipart/form-data body (RFC 7578) whose part `request`
 * is the System One JSON with an `assets` object, each entry
 * {"type": "image", "part": "<part name>"}, and one part per image with
 * its raw bytes. Turned into the contract's own request: `assets` removed,
 * the images as `images` data URLs in the order of `assets`, so that every
 * rule of SPEC a.10 (formats, sizes, pixels, aspect) applies to them as to
 * any data URL. The SDK's references in text ("<image:" 32 hex ">") become
 * "[image N]", N the image's position; other asset names are left as the
 * client wrote them.
 *
 * Bounded: the multipart body is held whole (under the request limit, as
 * any body), and the JSON made from it must fit that limit too (its images
 * base64-encoded, 4/3 of their bytes): past it, 413 as for any body.
 * jansson reads the `request` part (a library's JSON suffices here: the
 * rewritten body goes through the contract's own reader after).
 */
#include "ops_http_int.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MP_MAX_PARTS 64

typedef struct mp_part {
    char        name[128];
    char        type[128];
    const char *data;
    size_t      len;
    bool        claimed;
} mp_part_t;

/* The boundary of a Content-Type value, or false. */
bool ops_http_multipart_boundary(const char *type, char *out, size_t out_size) {
    if (!type || strncasecmp(type, "multipart/form-data", 19) != 0)
        return false;
    const char *b = strcasestr(type, "boundary=");
    if (!b)
        return false;
    b += 9;
    bool   quoted = *b == '"';
    size_t n = quoted ? strcspn(b + 1, "\"") : strcspn(b, "; \t");
    if (quoted)
        b++;
    if (n == 0 || n > 70 || n + 1 > out_size)
        return false;
    memcpy(out, b, n);
    out[n] = '\0';
    return true;
}

static const char *find(const char *p, const char *end, const char *s, size_t n) {
    return n && (size_t)(end - p) >= n ? memmem(p, (size_t)(end - p), s, n) : NULL;
}

/* A header's parameter ("name" of Content-Disposition) into out. */
static void header_param(const char *h, const char *hend, const char *key, char *out,
                         size_t out_size) {
    char pat[32];
    snprintf(pat, sizeof pat, "%s=\"", key);
    const char *p = find(h, hend, pat, strlen(pat));
    out[0] = '\0';
    if (!p)
        return;
    p += strlen(pat);
    const char *q = memchr(p, '"', (size_t)(hend - p));
    if (q && (size_t)(q - p) < out_size) {
        memcpy(out, p, (size_t)(q - p));
        out[q - p] = '\0';
    }
}

/* One part's headers [h, hend): its name and Content-Type. */
static void part_headers(const char *h, const char *hend, mp_part_t *pt) {
    for (const char *line = h; line < hend;) {
        const char *eol = find(line, hend, "\r\n", 2);
        eol = eol ? eol : hend;
        if ((size_t)(eol - line) > 20 && strncasecmp(line, "Content-Disposition:", 20) == 0)
            header_param(line, eol, " name", pt->name, sizeof pt->name);
        else if ((size_t)(eol - line) > 13 && strncasecmp(line, "Content-Type:", 13) == 0) {
            const char *v = line + 13 + strspn(line + 13, " \t");
            size_t      n =
                (size_t)(eol - v) < sizeof pt->type - 1 ? (size_t)(eol - v) : sizeof pt->type - 1;
            memcpy(pt->type, v, n);
            pt->type[n] = '\0';
        }
        line = eol + 2;
    }
}

/* The parts of body; false with why. */
static bool split(const char *body, size_t len, const char *boundary, mp_part_t *parts, size_t *n,
                  char *why, size_t why_size) {
    char        delim[80];
    size_t      dn = (size_t)snprintf(delim, sizeof delim, "--%s", boundary);
    const char *end = body + len, *p = find(body, end, delim, dn);
    *n = 0;
    while (p) {
        p += dn;
        if (end - p >= 2 && p[0] == '-' && p[1] == '-')
            return true; /* the closing delimiter */
        if (end - p < 2 || p[0] != '\r' || p[1] != '\n')
            break;
        p += 2;
        const char *hend = find(p, end, "\r\n\r\n", 4);
        if (!hend)
            break;
        char        next_delim[84];
        size_t      nn = (size_t)snprintf(next_delim, sizeof next_delim, "\r\n%s", delim);
        const char *next = find(hend + 4, end, next_delim, nn);
        if (!next)
            break;
        if (*n == MP_MAX_PARTS) {
            snprintf(why, why_size, "the multipart body has more than %d parts", MP_MAX_PARTS);
            return false;
        }
        mp_part_t *pt = &parts[(*n)++];
        memset(pt, 0, sizeof *pt);
        part_headers(p, hend, pt);
        pt->data = hend + 4;
        pt->len = (size_t)(next - pt->data);
        p = next + 2;
    }
    snprintf(why, why_size, "the multipart/form-data body is malformed (boundary \"%s\")",
             boundary);
    return false;
}

static mp_part_t *part_named(mp_part_t *parts, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(parts[i].name, name) == 0)
            return &parts[i];
    return NULL;
}

/* "data:<type>;base64,<b64>" of a part (its Content-Type, else
 * application/octet-stream: SPEC a.10 then refuses it by its bytes). */
static json_t *data_url(const mp_part_t *pt) {
    svc_buf_t b;
    svc_buf_init(&b, SIZE_MAX / 2);
    bool ok =
        !svc_buf_addf(&b, "data:%s;base64,", pt->type[0] ? pt->type : "application/octet-stream") &&
        !ops_base64_add(&b, (const unsigned char *)pt->data, pt->len);
    json_t *j = ok ? json_stringn(b.data, b.len) : NULL;
    svc_buf_fini(&b);
    return j;
}

/* Whether s[0..] is an SDK reference "<image:" + 32 hex + ">". */
static bool sdk_ref(const char *s) {
    if (strncmp(s, "<image:", 7) != 0)
        return false;
    for (int i = 7; i < 39; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return s[39] == '>';
}

/* Every string under v with the SDK references of refs (n names, in image
 * order) as "[image N]". */
static void rename_refs(json_t *v, const char *const *refs, size_t n) {
    if (json_is_object(v)) {
        const char *k;
        json_t     *x;
        json_object_foreach(v, k, x) rename_refs(x, refs, n);
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            rename_refs(json_array_get(v, i), refs, n);
    } else if (json_is_string(v) && strstr(json_string_value(v), "<image:")) {
        const char *s = json_string_value(v);
        size_t      len = json_string_length(v);
        char       *out = malloc(len + 1);
        size_t      o = 0;
        if (!out)
            return;
        for (size_t i = 0; i < len;) {
            size_t k = n;
            if (s[i] == '<' && len - i >= 40 && sdk_ref(s + i))
                for (k = 0; k < n && strncmp(refs[k], s + i, 40) != 0; k++)
                    ;
            if (k < n) { /* "[image N]" is never longer than the 40-byte reference */
                o += (size_t)snprintf(out + o, 40, "[image %zu]", k + 1);
                i += 40;
            } else
                out[o++] = s[i++];
        }
        json_string_setn(v, out, o);
        free(out);
    }
}

/* The request part's JSON with its assets as `images`; NULL with why. */
static json_t *rewrite(mp_part_t *parts, size_t n, char *why, size_t why_size) {
    mp_part_t *req = part_named(parts, n, "request");
    if (!req) {
        snprintf(why, why_size, "the multipart body has no part named \"request\"");
        return NULL;
    }
    req->claimed = true;
    json_error_t je;
    json_t      *root = json_loadb(req->data, req->len, JSON_REJECT_DUPLICATES, &je);
    json_t      *assets = json_object_get(root, "assets");
    if (!json_is_object(root) || !json_is_object(assets) || json_object_get(root, "images")) {
        snprintf(why, why_size, "%s",
                 !root                             ? "the request part is not JSON"
                 : !json_is_object(root)           ? "the request part must be a JSON object"
                 : json_object_get(root, "images") ? "a request with assets cannot have images too"
                                                   : "the request part has no assets object");
        json_decref(root);
        return NULL;
    }
    json_t     *images = json_array();
    const char *refs[MP_MAX_PARTS];
    size_t      n_refs = 0;
    const char *key;
    json_t     *a;
    json_object_foreach(assets, key, a) {
        const char *pn = json_string_value(json_object_get(a, "part"));
        const char *ty = json_string_value(json_object_get(a, "type"));
        mp_part_t  *pt = pn ? part_named(parts, n, pn) : NULL;
        if (!ty || strcmp(ty, "image") != 0 || !pt || pt->claimed) {
            snprintf(why, why_size,
                     !ty || strcmp(ty, "image") != 0
                         ? "assets[\"%.64s\"]: only {\"type\": \"image\", \"part\": ...} assets"
                     : !pt ? "assets[\"%.64s\"]: its part is not in the body"
                           : "assets[\"%.64s\"]: its part is claimed twice",
                     key);
            json_decref(images);
            json_decref(root);
            return NULL;
        }
        pt->claimed = true;
        refs[n_refs++] = key;
        json_array_append_new(images, data_url(pt));
    }
    for (size_t i = 0; i < n; i++)
        if (!parts[i].claimed) {
            snprintf(why, why_size, "the multipart part \"%.64s\" belongs to no asset",
                     parts[i].name);
            json_decref(images);
            json_decref(root);
            return NULL;
        }
    rename_refs(root, refs, n_refs);
    json_object_del(root, "assets");
    json_object_set_new(root, "images", images);
    return root;
}

int ops_http_multipart(const char *boundary, svc_buf_t *body, size_t limit, char *why,
                       size_t why_size) {
    mp_part_t *parts = calloc(MP_MAX_PARTS, sizeof *parts);
    size_t     n = 0;
    if (!parts) {
        snprintf(why, why_size, "out of memory for the multipart body");
        return 500;
    }
    json_t *root =
        split(body->data ? body->data : "", body->len, boundary, parts, &n, why, why_size)
            ? rewrite(parts, n, why, why_size)
            : NULL;
    char *text = root ? json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
    int   status = root ? 0 : 400;
    if (root && !text) {
        snprintf(why, why_size, "out of memory for the multipart body");
        status = 500;
    } else if (text && strlen(text) > limit) {
        snprintf(why, why_size, "the request body exceeds %zu bytes", limit);
        status = 413;
    } else if (text) {
        svc_buf_reset(body);
        if (svc_buf_add(body, text, strlen(text))) {
            snprintf(why, why_size, "out of memory for the multipart body");
            status = 500;
        }
    }
    free(text);
    json_decref(root);
    free(parts);
    return status;
}
