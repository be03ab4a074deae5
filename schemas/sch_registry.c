/*
 * sch_registry.c -- a Confluent schema-registry client: writer schemas by
 * id, compiled once and kept in a bounded LRU cache, and the registration
 * of the schema our answers are written with.
 *
 * Locking: one mutex guards the cache; it is never held during HTTP, so a
 * slow registry stalls only the callers that miss. Two threads missing the
 * same id may both fetch it; the second insert keeps the first entry (the
 * schemas behind an id never change, so either is right).
 *
 * Verdicts: only the registry's own "schema not found" (HTTP 404 with
 * error_code 40403) says an id does not exist, and only that sends a record
 * to the dead letters. Any other 404 (a proxy, a wrong base path) would
 * otherwise dead-letter a whole stream over a typo in the URL; it counts as
 * "the registry cannot be asked", like 5xx and network failures, which are
 * tried TRIES times before the caller hears of them.
 *
 * The URL may hold credentials (http://user:pass@host): curl uses them, and
 * every message shows the URL with the password masked, since messages end
 * up in error answers and dead letters that any producer can read.
 */
#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "sch_avro_int.h"

/* Bytes of one registry answer. request.avsc is 4 KB; a writer schema
 * compiles to ~30 times its text in avro-c, and 256 of them are cached:
 * 4 MiB answers could hold ~27 GiB. */
#define SCHEMA_MAX     ((size_t)256 << 10)
#define URL_MAX        2048u
#define CONNECT_MS     5000L
#define TOTAL_MS       10000L
#define TRIES          3    /* for 5xx and network failures */
#define BACKOFF_MS     250L /* before the second try; x4 per try after */
#define MISSING_TTL_S  30.0 /* an id the registry has not, remembered */
#define REGISTRY_MEDIA "application/vnd.schemaregistry.v1+json"

typedef struct entry {
    uint32_t           id;
    sch_avro_kind_t    kind;
    sch_avro_writer_t *w;     /* one reference owned by the cache; NULL: missing */
    double             until; /* missing: the answer holds until then */
    uint64_t           used;
} entry_t;

struct sch_registry {
    char           *url;   /* without a trailing '/'; NULL: no registry */
    char           *shown; /* url with the password masked, for messages */
    long            connect_ms, total_ms, backoff_ms;
    pthread_mutex_t mu;
    entry_t        *entries; /* cap slots, n used */
    size_t          n, cap;
    uint64_t        tick;
    atomic_size_t   fetches;
};

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static CURLcode       g_curl_init = CURLE_FAILED_INIT;

/* curl_global_init is not thread-safe before curl 7.84: run it once. */
static void curl_init_once(void) {
    g_curl_init = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *strip_slashes(const char *s) {
    size_t n = strlen(s);
    while (n > 0 && s[n - 1] == '/')
        n--;
    return strndup(s, n);
}

/* Checks url (http or https, parseable) and sets reg->url and reg->shown. */
static svc_err_t set_url(sch_registry_t *reg, const char *url, char *errstr, size_t errstr_size) {
    if (strlen(url) > URL_MAX - 64) {
        svc_errf(errstr, errstr_size, "the schema registry URL is longer than %u bytes",
                 URL_MAX - 64);
        return SVC_ERR_INVALID;
    }
    CURLU    *u = curl_url();
    char     *scheme = NULL, *pass = NULL, *shown = NULL;
    svc_err_t err = SVC_OK;
    CURLUcode uc = u ? curl_url_set(u, CURLUPART_URL, url, 0) : CURLUE_OUT_OF_MEMORY;
    if (uc == CURLUE_OUT_OF_MEMORY) {
        svc_errf(errstr, errstr_size, "out of memory");
        err = SVC_ERR_NOMEM;
    } else if (uc || curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) ||
               (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0)) {
        /* The URL itself is not shown: it may hold a password. */
        svc_errf(errstr, errstr_size,
                 "the schema registry URL is not an http:// or https:// URL (%s)",
                 uc ? curl_url_strerror(uc) : "another scheme");
        err = SVC_ERR_INVALID;
    } else if ((curl_url_get(u, CURLUPART_PASSWORD, &pass, 0) == CURLUE_OK &&
                curl_url_set(u, CURLUPART_PASSWORD, "****", 0)) ||
               curl_url_get(u, CURLUPART_URL, &shown, 0)) {
        svc_errf(errstr, errstr_size, "out of memory");
        err = SVC_ERR_NOMEM;
    } else {
        reg->url = strip_slashes(url);
        reg->shown = strip_slashes(shown);
        if (!reg->url || !reg->shown) {
            svc_errf(errstr, errstr_size, "out of memory");
            err = SVC_ERR_NOMEM;
        }
    }
    curl_free(scheme);
    curl_free(pass);
    curl_free(shown);
    curl_url_cleanup(u);
    return err;
}

sch_registry_t *sch_registry_new(const char *url, size_t cache_max, char *errstr,
                                 size_t errstr_size) {
    pthread_once(&g_curl_once, curl_init_once);
    if (g_curl_init != CURLE_OK) {
        svc_errf(errstr, errstr_size, "curl_global_init: %s", curl_easy_strerror(g_curl_init));
        return NULL;
    }
    sch_registry_t *reg = calloc(1, sizeof *reg);
    if (!reg) {
        svc_errf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    reg->cap = cache_max ? cache_max : SCH_REGISTRY_CACHE_DEFAULT;
    reg->entries = calloc(reg->cap, sizeof *reg->entries);
    reg->connect_ms = CONNECT_MS;
    reg->total_ms = TOTAL_MS;
    reg->backoff_ms = BACKOFF_MS;
    svc_err_t err = SVC_OK;
    if (!reg->entries) {
        svc_errf(errstr, errstr_size, "out of memory");
        err = SVC_ERR_NOMEM;
    } else if (url && *url) {
        err = set_url(reg, url, errstr, errstr_size);
    }
    if (err) {
        free(reg->entries);
        free(reg->url);
        free(reg->shown);
        free(reg);
        return NULL;
    }
    pthread_mutex_init(&reg->mu, NULL);
    atomic_init(&reg->fetches, 0);
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
    free(reg->shown);
    free(reg);
}

void sch_registry_set_timeouts(sch_registry_t *reg, long connect_ms, long total_ms,
                               long backoff_ms) {
    reg->connect_ms = connect_ms;
    reg->total_ms = total_ms;
    reg->backoff_ms = backoff_ms;
}

size_t sch_registry_n_fetches(sch_registry_t *reg) {
    return atomic_load(&reg->fetches);
}

/* ---- HTTP ---------------------------------------------------------------- */

typedef struct body {
    svc_buf_t buf;
    bool      over; /* the answer passed SCHEMA_MAX */
} body_t;

static size_t on_body(char *p, size_t size, size_t n, void *ud) {
    body_t *b = ud;
    if (svc_buf_add(&b->buf, p, size * n) == SVC_OK)
        return size * n;
    b->over = true;
    return 0; /* less than given: curl stops with CURLE_WRITE_ERROR */
}

/* One exchange with the registry at path ("/schemas/ids/7"); body NULL: a
 * GET. On SVC_OK *status is the HTTP status and resp the answer;
 * SVC_ERR_IO when no answer came, SVC_ERR_FORMAT when it was too long
 * (errstr says which). */
static svc_err_t http_once(sch_registry_t *reg, const char *path, const char *body, long *status,
                           body_t *resp, char *errstr, size_t errstr_size) {
    const char *verb = body ? "POST" : "GET";
    char        url[URL_MAX];
    snprintf(url, sizeof url, "%s%s", reg->url, path); /* fits: set_url bounds reg->url */
    CURL *c = curl_easy_init();
    if (!c) {
        svc_errf(errstr, errstr_size, "%s %s%s: curl_easy_init failed", verb, reg->shown, path);
        return SVC_ERR_NOMEM;
    }
    char               cerr[CURL_ERROR_SIZE] = "";
    struct curl_slist *hdrs = curl_slist_append(NULL, "Accept: " REGISTRY_MEDIA);
    if (body && hdrs)
        hdrs = curl_slist_append(hdrs, "Content-Type: " REGISTRY_MEDIA);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L); /* threads: no SIGALRM for DNS timeouts */
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, reg->connect_ms);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, reg->total_ms);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, resp);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
    if (body)
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    CURLcode  rc = curl_easy_perform(c);
    svc_err_t err = SVC_OK;
    if (rc != CURLE_OK && resp->over) {
        svc_errf(errstr, errstr_size, "%s %s%s: the registry's answer exceeds %zu bytes", verb,
                 reg->shown, path, SCHEMA_MAX);
        err = SVC_ERR_FORMAT;
    } else if (rc != CURLE_OK) {
        /* curl's buffer may quote the URL, credentials and all. */
        svc_errf(errstr, errstr_size, "%s %s%s failed: %s", verb, reg->shown, path,
                 curl_easy_strerror(rc));
        err = SVC_ERR_IO;
    } else {
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
    }
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(c);
    return err;
}

/* The registry's answer body, shortened for a message. */
static const char *snippet(const body_t *b) {
    return b->buf.data && b->buf.len ? b->buf.data : "(empty)";
}

/* http_once, tried again after network failures and 5xx answers. */
static svc_err_t http(sch_registry_t *reg, const char *path, const char *body, long *status,
                      body_t *resp, char *errstr, size_t errstr_size) {
    svc_err_t err = SVC_OK;
    long      wait_ms = reg->backoff_ms;
    for (int t = 1; t <= TRIES; t++, wait_ms *= 4) {
        svc_buf_reset(&resp->buf);
        resp->over = false;
        *status = 0;
        err = http_once(reg, path, body, status, resp, errstr, errstr_size);
        if ((err != SVC_ERR_IO && (err || *status < 500)) || t == TRIES)
            break;
        struct timespec ts = {wait_ms / 1000, (wait_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (!err && *status >= 500)
        svc_errf(errstr, errstr_size, "%s %s%s: HTTP %ld (%d tries): %.200s", body ? "POST" : "GET",
                 reg->shown, path, *status, TRIES, snippet(resp));
    else if (err == SVC_ERR_IO)
        svc_errf(errstr + strlen(errstr), errstr_size - strlen(errstr), " (%d tries)", TRIES);
    return err;
}

/* An answer that is not 200, as an error: SVC_ERR_INVALID for the
 * registry's own "not found" (error_code `not_found`), SVC_ERR_IO else. */
static svc_err_t status_error(const sch_registry_t *reg, const char *verb, const char *path,
                              long status, const body_t *resp, long not_found, char *errstr,
                              size_t errstr_size) {
    json_t *j = json_loadb(resp->buf.data ? resp->buf.data : "", resp->buf.len, 0, NULL);
    long    code = (long)json_integer_value(json_object_get(j, "error_code"));
    json_decref(j);
    if (status == 404 && code == not_found) {
        svc_errf(errstr, errstr_size, "%s %s%s: HTTP 404: %.200s", verb, reg->shown, path,
                 snippet(resp));
        return SVC_ERR_INVALID;
    }
    if (status >= 500) /* http() said so already */
        return SVC_ERR_IO;
    const char *hint = status == 401 || status == 403
                           ? " (the registry refused the credentials of --schema-registry)"
                       : status == 404 ? " (not the registry's own \"not found\": is the URL the "
                                         "registry's base URL?)"
                                       : "";
    svc_errf(errstr, errstr_size, "%s %s%s: HTTP %ld%s: %.200s", verb, reg->shown, path, status,
             hint, snippet(resp));
    return SVC_ERR_IO;
}

/* GET {url}/schemas/ids/{id} -> a writer for kind. */
static svc_err_t fetch(sch_registry_t *reg, uint32_t id, sch_avro_kind_t kind,
                       sch_avro_writer_t **w, char *errstr, size_t errstr_size) {
    char   path[32];
    body_t resp;
    long   status = 0;
    snprintf(path, sizeof path, "/schemas/ids/%u", (unsigned)id);
    svc_buf_init(&resp.buf, SCHEMA_MAX);
    atomic_fetch_add(&reg->fetches, 1);
    svc_err_t err = http(reg, path, NULL, &status, &resp, errstr, errstr_size);
    if (!err && status != 200)
        err = status_error(reg, "GET", path, status, &resp, 40403, errstr, errstr_size);
    json_t *j = NULL;
    if (!err) {
        j = json_loadb(resp.buf.data ? resp.buf.data : "", resp.buf.len, 0, NULL);
        const char *schema = json_string_value(json_object_get(j, "schema"));
        if (!schema) {
            svc_errf(errstr, errstr_size,
                     "GET %s%s: HTTP 200 but not {\"schema\": \"...\"}: %.200s", reg->shown, path,
                     snippet(&resp));
            err = SVC_ERR_FORMAT;
        } else {
            char why[512];
            *w = sch_avro_writer_new(kind, schema, json_string_length(json_object_get(j, "schema")),
                                     why, sizeof why);
            if (!*w) {
                svc_errf(errstr, errstr_size, "schema %u from %s: %s", (unsigned)id, reg->shown,
                         why);
                err = SVC_ERR_FORMAT;
            }
        }
    }
    json_decref(j);
    svc_buf_fini(&resp.buf);
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

/* A slot for (id, kind): its entry (a missing one is replaced), else a free
 * one, else the least recently used one's. @locks reg->mu held. */
static entry_t *slot(sch_registry_t *reg, uint32_t id, sch_avro_kind_t kind) {
    entry_t *e = find(reg, id, kind);
    if (!e && reg->n == reg->cap) {
        e = &reg->entries[0];
        for (size_t i = 1; i < reg->n; i++)
            if (reg->entries[i].used < e->used)
                e = &reg->entries[i];
    } else if (!e) {
        e = &reg->entries[reg->n++];
    }
    sch_avro_writer_free(e->w);
    *e = (entry_t){.id = id, .kind = kind};
    return e;
}

/* The cached answer for (id, kind), if any: true with *err SVC_OK and *w,
 * or SVC_ERR_INVALID (a remembered "not found"); false: ask the registry. */
static bool cached(sch_registry_t *reg, uint32_t id, sch_avro_kind_t kind, sch_avro_writer_t **w,
                   svc_err_t *err, char *errstr, size_t errstr_size) {
    bool hit = false;
    pthread_mutex_lock(&reg->mu);
    entry_t *e = find(reg, id, kind);
    if (e && e->w) {
        e->used = ++reg->tick;
        *w = sch_avro_writer_keep(e->w);
        *err = SVC_OK;
        hit = true;
    } else if (e && now_s() < e->until) {
        e->used = ++reg->tick;
        svc_errf(errstr, errstr_size,
                 "the registry at %s has no schema %u (it answered HTTP 404, error 40403, "
                 "less than %.0f s ago)",
                 reg->shown, (unsigned)id, MISSING_TTL_S);
        *err = SVC_ERR_INVALID;
        hit = true;
    }
    pthread_mutex_unlock(&reg->mu);
    return hit;
}

/* Keeps nw (NULL: id is missing) for (id, kind); *w: the entry's writer. */
static void remember(sch_registry_t *reg, uint32_t id, sch_avro_kind_t kind, sch_avro_writer_t *nw,
                     sch_avro_writer_t **w) {
    pthread_mutex_lock(&reg->mu);
    entry_t *e = find(reg, id, kind);
    if (e && e->w) { /* another thread got there first */
        sch_avro_writer_free(nw);
    } else {
        e = slot(reg, id, kind);
        e->w = nw;
        e->until = nw ? 0 : now_s() + MISSING_TTL_S;
    }
    e->used = ++reg->tick;
    if (w)
        *w = sch_avro_writer_keep(e->w);
    pthread_mutex_unlock(&reg->mu);
}

/* Without a registry: the embedded schemas under their fixed ids. */
static svc_err_t fixed(uint32_t id, sch_avro_kind_t kind, sch_avro_writer_t **w, char *errstr,
                       size_t errstr_size) {
    if ((kind == SCH_AVRO_REQUEST && id == SCH_AVRO_ID_REQUEST) ||
        (kind == SCH_AVRO_ANSWER && id == SCH_AVRO_ID_ANSWER)) {
        *w = sch_avro_writer_new(kind, NULL, 0, errstr, errstr_size);
        return *w ? SVC_OK : SVC_ERR_NOMEM;
    }
    svc_errf(errstr, errstr_size,
             "schema id %u is unknown: no schema registry is configured, and without one "
             "only id %u (request.avsc) and id %u (answer.avsc) are known",
             (unsigned)id, SCH_AVRO_ID_REQUEST, SCH_AVRO_ID_ANSWER);
    return SVC_ERR_INVALID;
}

svc_err_t sch_registry_writer(sch_registry_t *reg, uint32_t id, sch_avro_kind_t kind,
                              sch_avro_writer_t **w, char *errstr, size_t errstr_size) {
    svc_err_t err = SVC_OK;
    if (cached(reg, id, kind, w, &err, errstr, errstr_size))
        return err;
    sch_avro_writer_t *nw = NULL;
    err = reg->url ? fetch(reg, id, kind, &nw, errstr, errstr_size)
                   : fixed(id, kind, &nw, errstr, errstr_size);
    if (err == SVC_ERR_INVALID && reg->url)
        remember(reg, id, kind, NULL, NULL);
    if (err)
        return err;
    remember(reg, id, kind, nw, w);
    return SVC_OK;
}

/* ---- registration ------------------------------------------------------------ */

svc_err_t sch_registry_register(sch_registry_t *reg, const char *subject, const char *schema,
                                size_t schema_len, uint32_t *id, char *errstr, size_t errstr_size) {
    if (!reg->url) {
        svc_errf(errstr, errstr_size, "no schema registry is configured");
        return SVC_ERR_INVALID;
    }
    char *esc = curl_easy_escape(NULL, subject, 0);
    char  path[512];
    int   n = esc ? snprintf(path, sizeof path, "/subjects/%s/versions", esc) : -1;
    curl_free(esc);
    if (n < 0 || (size_t)n >= sizeof path) {
        svc_errf(errstr, errstr_size, "the subject \"%.100s\" is too long", subject);
        return SVC_ERR_INVALID;
    }
    json_t *req = json_pack("{s:s%}", "schema", schema, schema_len);
    char   *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (!body) {
        svc_errf(errstr, errstr_size, "POST %s%s: cannot build the body", reg->shown, path);
        return SVC_ERR_NOMEM;
    }
    body_t resp;
    long   status = 0;
    svc_buf_init(&resp.buf, SCHEMA_MAX);
    svc_err_t err = http(reg, path, body, &status, &resp, errstr, errstr_size);
    free(body);
    if (!err && status != 200) {
        /* No "not found" here (-1 is no error_code): every refusal is IO. */
        err = status_error(reg, "POST", path, status, &resp, -1, errstr, errstr_size);
    }
    if (!err) {
        json_t *j = json_loadb(resp.buf.data ? resp.buf.data : "", resp.buf.len, 0, NULL);
        json_t *jid = json_object_get(j, "id");
        if (!json_is_integer(jid) || json_integer_value(jid) < 0 ||
            json_integer_value(jid) > (json_int_t)UINT32_MAX) {
            svc_errf(errstr, errstr_size, "POST %s%s: HTTP 200 but no \"id\": %.200s", reg->shown,
                     path, snippet(&resp));
            err = SVC_ERR_FORMAT;
        } else {
            *id = (uint32_t)json_integer_value(jid);
        }
        json_decref(j);
    }
    svc_buf_fini(&resp.buf);
    return err;
}
