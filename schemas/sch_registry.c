/*
 * sch_registry.c -- a Confluent schema-registry client: writer schemas by
 * id, compiled once and kept in a bounded LRU cache.
 *
 * Locking: one mutex guards the cache; it is never held during HTTP, so a
 * slow registry stalls only the callers that miss. Two threads missing the
 * same id may both fetch it; the second insert keeps the first entry (the
 * schemas behind an id never change, so either is right).
 */
#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

#include "sch_avro_int.h"

#define SCHEMA_MAX     ((size_t)4 << 20) /* bytes of one registry answer */
#define CONNECT_MS     5000L
#define TOTAL_MS       10000L
#define REGISTRY_MEDIA "application/vnd.schemaregistry.v1+json"

typedef struct entry {
    uint32_t           id;
    sch_avro_kind_t    kind;
    sch_avro_writer_t *w; /* one reference owned by the cache */
    uint64_t           used;
} entry_t;

struct sch_registry {
    char           *url; /* without a trailing '/'; NULL: no registry */
    long            connect_ms, total_ms;
    pthread_mutex_t mu;
    entry_t        *entries; /* cap slots, n used */
    size_t          n, cap;
    uint64_t        tick;
    atomic_size_t   fetches;
};

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;

/* curl_global_init is not thread-safe before curl 7.84: run it once. */
static void curl_init_once(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

sch_registry_t *sch_registry_new(const char *url, size_t cache_max, char *errstr,
                                 size_t errstr_size) {
    sch_registry_t *reg = calloc(1, sizeof *reg);
    if (!reg) {
        svc_errf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    reg->cap = cache_max ? cache_max : SCH_REGISTRY_CACHE_DEFAULT;
    reg->entries = calloc(reg->cap, sizeof *reg->entries);
    reg->connect_ms = CONNECT_MS;
    reg->total_ms = TOTAL_MS;
    if (url && *url) {
        size_t n = strlen(url);
        while (n > 0 && url[n - 1] == '/')
            n--;
        reg->url = strndup(url, n);
    }
    if (!reg->entries || (url && *url && !reg->url)) {
        svc_errf(errstr, errstr_size, "out of memory");
        free(reg->entries);
        free(reg->url);
        free(reg);
        return NULL;
    }
    pthread_mutex_init(&reg->mu, NULL);
    atomic_init(&reg->fetches, 0);
    pthread_once(&g_curl_once, curl_init_once);
    return reg;
}

void sch_registry_free(sch_registry_t *reg) {
    if (!reg)
        return;
    for (size_t i = 0; i < reg->n; i++)
        sch_avro_writer_free(reg->entries[i].w);
    pthread_mutex_destroy(&reg->mu);
    free(reg->entries);
    free(reg->url);
    free(reg);
}

void sch_registry_set_timeouts(sch_registry_t *reg, long connect_ms, long total_ms) {
    reg->connect_ms = connect_ms;
    reg->total_ms = total_ms;
}

size_t sch_registry_n_fetches(sch_registry_t *reg) {
    return atomic_load(&reg->fetches);
}

/* ---- HTTP ---------------------------------------------------------------- */

static size_t on_body(char *p, size_t size, size_t n, void *ud) {
    svc_buf_t *b = ud;
    /* Returning less than given makes curl stop with CURLE_WRITE_ERROR. */
    return svc_buf_add(b, p, size * n) == SVC_OK ? size * n : 0;
}

/* One request; body may be NULL (GET). On SVC_OK *status is the HTTP status
 * and `resp` the answer; SVC_ERR_IO when no answer came (errstr says why). */
static svc_err_t http(const char *url, const char *body, long connect_ms, long total_ms,
                      long *status, svc_buf_t *resp, char *errstr, size_t errstr_size) {
    CURL *c = curl_easy_init();
    if (!c) {
        svc_errf(errstr, errstr_size, "%s %s: curl_easy_init failed", body ? "POST" : "GET", url);
        return SVC_ERR_NOMEM;
    }
    char               cerr[CURL_ERROR_SIZE] = "";
    struct curl_slist *hdrs = curl_slist_append(NULL, "Accept: " REGISTRY_MEDIA);
    if (body && hdrs)
        hdrs = curl_slist_append(hdrs, "Content-Type: " REGISTRY_MEDIA);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L); /* threads: no SIGALRM for DNS timeouts */
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, total_ms);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, resp);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
    if (body)
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    CURLcode  rc = curl_easy_perform(c);
    svc_err_t err = SVC_OK;
    if (rc != CURLE_OK) {
        svc_errf(errstr, errstr_size, "%s %s failed: %s", body ? "POST" : "GET", url,
                 cerr[0] ? cerr : curl_easy_strerror(rc));
        err = SVC_ERR_IO;
    } else {
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
    }
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(c);
    return err;
}

/* The registry's answer body, shortened for a message. */
static const char *snippet(const svc_buf_t *b) {
    return b->data && b->len ? b->data : "(empty)";
}

/* GET {url}/schemas/ids/{id} -> a writer for kind. */
static svc_err_t fetch(sch_registry_t *reg, uint32_t id, sch_avro_kind_t kind,
                       sch_avro_writer_t **w, char *errstr, size_t errstr_size) {
    char      url[2048];
    svc_buf_t resp;
    long      status = 0;
    int       n = snprintf(url, sizeof url, "%s/schemas/ids/%u", reg->url, (unsigned)id);
    if (n < 0 || (size_t)n >= sizeof url) {
        svc_errf(errstr, errstr_size, "schema registry URL \"%s\" is too long", reg->url);
        return SVC_ERR_INVALID;
    }
    svc_buf_init(&resp, SCHEMA_MAX);
    atomic_fetch_add(&reg->fetches, 1);
    svc_err_t err =
        http(url, NULL, reg->connect_ms, reg->total_ms, &status, &resp, errstr, errstr_size);
    if (!err && status != 200) {
        svc_errf(errstr, errstr_size, "GET %s: HTTP %ld: %.200s", url, status, snippet(&resp));
        err = status == 404 ? SVC_ERR_INVALID : SVC_ERR_IO;
    }
    json_t *j = NULL;
    if (!err) {
        json_error_t jerr;
        j = json_loadb(resp.data ? resp.data : "", resp.len, 0, &jerr);
        const char *schema = json_string_value(json_object_get(j, "schema"));
        if (!schema) {
            svc_errf(errstr, errstr_size, "GET %s: HTTP 200 but not {\"schema\": \"...\"}: %.200s",
                     url, snippet(&resp));
            err = SVC_ERR_FORMAT;
        } else {
            char why[512];
            *w = sch_avro_writer_new(kind, schema, json_string_length(json_object_get(j, "schema")),
                                     why, sizeof why);
            if (!*w) {
                svc_errf(errstr, errstr_size, "schema %u from %s: %s", (unsigned)id, url, why);
                err = SVC_ERR_FORMAT;
            }
        }
    }
    json_decref(j);
    svc_buf_fini(&resp);
    return err;
}

/* ---- the cache ------------------------------------------------------------- */

/* @locks reg->mu held by the caller. */
static entry_t *find(sch_registry_t *reg, uint32_t id, sch_avro_kind_t kind) {
    for (size_t i = 0; i < reg->n; i++)
        if (reg->entries[i].id == id && reg->entries[i].kind == kind)
            return &reg->entries[i];
    return NULL;
}

svc_err_t sch_registry_writer(sch_registry_t *reg, uint32_t id, sch_avro_kind_t kind,
                              sch_avro_writer_t **w, char *errstr, size_t errstr_size) {
    pthread_mutex_lock(&reg->mu);
    entry_t *e = find(reg, id, kind);
    if (e) {
        e->used = ++reg->tick;
        *w = sch_avro_writer_keep(e->w);
    }
    pthread_mutex_unlock(&reg->mu);
    if (e)
        return SVC_OK;

    sch_avro_writer_t *nw = NULL;
    svc_err_t          err = SVC_OK;
    if (reg->url) {
        err = fetch(reg, id, kind, &nw, errstr, errstr_size);
    } else if ((kind == SCH_AVRO_REQUEST && id == SCH_AVRO_ID_REQUEST) ||
               (kind == SCH_AVRO_ANSWER && id == SCH_AVRO_ID_ANSWER)) {
        nw = sch_avro_writer_new(kind, NULL, 0, errstr, errstr_size);
        err = nw ? SVC_OK : SVC_ERR_NOMEM;
    } else {
        svc_errf(errstr, errstr_size,
                 "schema id %u is unknown: no schema registry is configured, and without one "
                 "only id %u (request.avsc) and id %u (answer.avsc) are known",
                 (unsigned)id, SCH_AVRO_ID_REQUEST, SCH_AVRO_ID_ANSWER);
        err = SVC_ERR_INVALID;
    }
    if (err)
        return err;

    pthread_mutex_lock(&reg->mu);
    e = find(reg, id, kind);
    if (e) { /* another thread got there first */
        sch_avro_writer_free(nw);
        nw = e->w;
    } else {
        if (reg->n == reg->cap) { /* evict the least recently used */
            size_t lru = 0;
            for (size_t i = 1; i < reg->n; i++)
                if (reg->entries[i].used < reg->entries[lru].used)
                    lru = i;
            sch_avro_writer_free(reg->entries[lru].w);
            reg->entries[lru] = reg->entries[--reg->n];
        }
        e = &reg->entries[reg->n++];
        e->id = id;
        e->kind = kind;
        e->w = nw;
    }
    e->used = ++reg->tick;
    *w = sch_avro_writer_keep(nw);
    pthread_mutex_unlock(&reg->mu);
    return SVC_OK;
}

/* ---- registration ------------------------------------------------------------ */

svc_err_t sch_registry_register(const char *url, const char *subject, const char *schema_json,
                                uint32_t *id, char *errstr, size_t errstr_size) {
    pthread_once(&g_curl_once, curl_init_once);
    char *esc = curl_easy_escape(NULL, subject, 0);
    char  full[2048];
    int   n = esc ? snprintf(full, sizeof full, "%s/subjects/%s/versions", url, esc) : -1;
    curl_free(esc);
    if (n < 0 || (size_t)n >= sizeof full) {
        svc_errf(errstr, errstr_size, "schema registry URL \"%s\" is too long", url);
        return SVC_ERR_INVALID;
    }
    json_t *req = json_pack("{s:s}", "schema", schema_json);
    char   *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (!body) {
        svc_errf(errstr, errstr_size, "POST %s: cannot build the body", full);
        return SVC_ERR_NOMEM;
    }
    svc_buf_t resp;
    long      status = 0;
    svc_buf_init(&resp, SCHEMA_MAX);
    svc_err_t err = http(full, body, CONNECT_MS, TOTAL_MS, &status, &resp, errstr, errstr_size);
    free(body);
    if (!err && status != 200) {
        svc_errf(errstr, errstr_size, "POST %s: HTTP %ld: %.200s", full, status, snippet(&resp));
        err = SVC_ERR_IO;
    }
    if (!err) {
        json_error_t jerr;
        json_t      *j = json_loadb(resp.data ? resp.data : "", resp.len, 0, &jerr);
        json_t      *jid = json_object_get(j, "id");
        if (!json_is_integer(jid) || json_integer_value(jid) < 0 ||
            json_integer_value(jid) > (json_int_t)UINT32_MAX) {
            svc_errf(errstr, errstr_size, "POST %s: HTTP 200 but no \"id\": %.200s", full,
                     snippet(&resp));
            err = SVC_ERR_FORMAT;
        } else {
            *id = (uint32_t)json_integer_value(jid);
        }
        json_decref(j);
    }
    svc_buf_fini(&resp);
    return err;
}
