/*
 * sch_avro.c -- the Avro plumbing shared by requests and answers: the
 * embedded schemas, writer schemas resolved against them, a bounds check of
 * every body before avro-c sees it, and the Confluent framing.
 *
 * Why the bounds check: avro-c trusts length prefixes -- a string length of
 * 2^62 becomes a malloc of that size, a negative one a leak -- so a corrupt
 * Kafka value could abort the process under a sanitizer or exhaust memory.
 * check_value() walks the writer schema over the bytes first and refuses
 * any length, index or count the bytes cannot back.
 *
 * Why the pruned reader schema: avro-c 1.11's resolvers refuse a reader
 * field the writer lacks even when it has a default ("Reader field b
 * doesn't appear in writer"). We drop such fields (when they have defaults)
 * from a copy of the reader schema; the mappings read a missing field as
 * absent, which is what its null default means.
 */
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

#include "sch_avro_int.h"
#include "sch_int.h"

struct sch_avro_writer {
    atomic_int          refs;
    sch_avro_kind_t     kind;
    avro_schema_t       wschema;  /* the writer's */
    avro_value_iface_t *wclass;   /* generic values of wschema */
    avro_schema_t       rschema;  /* the embedded schema, pruned; NULL when same */
    avro_value_iface_t *resolver; /* wschema -> rschema; NULL when same */
};

/* ---- embedded schemas ---------------------------------------------------- */

typedef struct embedded {
    avro_schema_t       schema;
    avro_value_iface_t *cls;
} embedded_t;

static embedded_t     g_emb[2];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void embedded_init(void) {
    for (int k = 0; k < 2; k++) {
        size_t      len;
        const char *text = sch_avro_schema_text((sch_avro_kind_t)k, &len);
        /* The files are ours and tested: a parse failure is a build bug. */
        SVC_ASSERT(avro_schema_from_json_length(text, len, &g_emb[k].schema) == 0);
        g_emb[k].cls = avro_generic_class_from_schema(g_emb[k].schema);
        SVC_ASSERT(g_emb[k].cls);
    }
}

static const embedded_t *embedded(sch_avro_kind_t kind) {
    pthread_once(&g_once, embedded_init);
    return &g_emb[kind == SCH_AVRO_ANSWER];
}

const char *sch_avro_schema_text(sch_avro_kind_t kind, size_t *len) {
    if (kind == SCH_AVRO_ANSWER) {
        *len = sch_avsc_answer_len;
        return sch_avsc_answer;
    }
    *len = sch_avsc_request_len;
    return sch_avsc_request;
}

svc_err_t sch_av_new_value(sch_avro_kind_t kind, avro_value_t *v, char *errstr,
                           size_t errstr_size) {
    if (avro_generic_value_new(embedded(kind)->cls, v) != 0) {
        svc_errf(errstr, errstr_size, "avro: cannot create a value: %s", avro_strerror());
        return SVC_ERR_NOMEM;
    }
    return SVC_OK;
}

/* ---- pruning the reader schema ------------------------------------------- */

static const char *short_name(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot ? dot + 1 : name;
}

/* The fields of s when it is a record definition (*name its name), else NULL. */
static json_t *record_fields(json_t *s, const char **name) {
    const char *type = json_string_value(json_object_get(s, "type"));
    json_t     *fields = json_object_get(s, "fields");
    *name = json_string_value(json_object_get(s, "name"));
    return type && strcmp(type, "record") == 0 && *name && json_is_array(fields) ? fields : NULL;
}

/* The symbols of s when it is an enum definition (*key "enum:" + its short
 * name, in key), else NULL. */
static json_t *enum_symbols(json_t *s, char *key, size_t size) {
    const char *type = json_string_value(json_object_get(s, "type"));
    const char *name = json_string_value(json_object_get(s, "name"));
    json_t     *symbols = json_object_get(s, "symbols");
    if (!type || strcmp(type, "enum") != 0 || !name || !json_is_array(symbols))
        return NULL;
    snprintf(key, size, "enum:%s", short_name(name));
    return symbols;
}

/* Collects every record definition of a schema: short name -> fields, and
 * every enum's: "enum:" + short name -> symbols. */
static void collect_records(json_t *s, json_t *records) {
    if (json_is_array(s)) {
        size_t  i;
        json_t *b;
        json_array_foreach(s, i, b) collect_records(b, records);
        return;
    }
    if (!json_is_object(s))
        return;
    char        key[300];
    json_t     *symbols = enum_symbols(s, key, sizeof key);
    const char *name;
    json_t     *fields = record_fields(s, &name);
    if (symbols) {
        json_object_set(records, key, symbols);
        return;
    }
    if (fields) {
        json_object_set(records, short_name(name), fields);
        size_t  i;
        json_t *f;
        json_array_foreach(fields, i, f) collect_records(json_object_get(f, "type"), records);
        return;
    }
    collect_records(json_object_get(s, "type"), records);
    collect_records(json_object_get(s, "items"), records);
    collect_records(json_object_get(s, "values"), records);
}

static bool has_field(json_t *fields, const char *name) {
    size_t  i;
    json_t *f;
    json_array_foreach(fields, i, f) {
        const char *n = json_string_value(json_object_get(f, "name"));
        if (n && strcmp(n, name) == 0)
            return true;
    }
    return false;
}

/* Removes from the reader's records the fields the writer's same-named
 * records lack; false (errstr set) for such a field without a default.
 * A reader enum takes the symbols of the writer's same-named enum, in the
 * writer's order: avro-c's resolved reader passes the writer's index
 * through unchanged (it matches enums by name only), so the index must
 * name the same symbol in both. A symbol the writer has and the embedded
 * enum has not then decodes as that name, which the contract refuses as
 * any unknown question type. */
static bool prune(json_t *s, json_t *wrecords, char *errstr, size_t errstr_size) {
    if (json_is_array(s)) {
        size_t  i;
        json_t *b;
        json_array_foreach(s, i, b) if (!prune(b, wrecords, errstr, errstr_size)) return false;
        return true;
    }
    if (!json_is_object(s))
        return true;
    char key[300];
    if (enum_symbols(s, key, sizeof key)) {
        json_t *ws = json_object_get(wrecords, key);
        return !ws || json_object_set(s, "symbols", ws) == 0;
    }
    const char *name;
    json_t     *fields = record_fields(s, &name);
    if (fields) {
        json_t *wf = json_object_get(wrecords, short_name(name));
        for (size_t i = 0; wf && i < json_array_size(fields);) {
            json_t     *f = json_array_get(fields, i);
            const char *fname = json_string_value(json_object_get(f, "name"));
            if (fname && !has_field(wf, fname)) {
                if (!json_object_get(f, "default")) {
                    svc_errf(errstr, errstr_size,
                             "writer schema: record %s lacks field \"%s\", which has no default",
                             name, fname);
                    return false;
                }
                json_array_remove(fields, i);
                continue;
            }
            if (!prune(json_object_get(f, "type"), wrecords, errstr, errstr_size))
                return false;
            i++;
        }
        return true;
    }
    return prune(json_object_get(s, "type"), wrecords, errstr, errstr_size) &&
           prune(json_object_get(s, "items"), wrecords, errstr, errstr_size) &&
           prune(json_object_get(s, "values"), wrecords, errstr, errstr_size);
}

/* The embedded schema of kind without the fields the writer lacks. */
static avro_schema_t pruned_reader(sch_avro_kind_t kind, const char *wjson, size_t wlen,
                                   char *errstr, size_t errstr_size) {
    size_t        rlen;
    const char   *rtext = sch_avro_schema_text(kind, &rlen);
    json_error_t  jerr;
    json_t       *r = json_loadb(rtext, rlen, 0, &jerr);
    json_t       *w = json_loadb(wjson, wlen, JSON_DECODE_ANY, &jerr);
    json_t       *wrec = json_object();
    avro_schema_t out = NULL;
    if (!r || !w || !wrec) {
        svc_errf(errstr, errstr_size, "writer schema: not JSON: %s", jerr.text);
        goto done;
    }
    collect_records(w, wrec);
    if (!prune(r, wrec, errstr, errstr_size))
        goto done;
    char *text = json_dumps(r, JSON_COMPACT);
    if (!text || avro_schema_from_json_length(text, strlen(text), &out) != 0) {
        svc_errf(errstr, errstr_size, "reader schema: %s", avro_strerror());
        out = NULL;
    }
    free(text);
done:
    json_decref(r);
    json_decref(w);
    json_decref(wrec);
    return out;
}

/* ---- writers ------------------------------------------------------------- */

sch_avro_writer_t *sch_avro_writer_new(sch_avro_kind_t kind, const char *schema_json, size_t len,
                                       char *errstr, size_t errstr_size) {
    const embedded_t  *emb = embedded(kind);
    sch_avro_writer_t *w = calloc(1, sizeof *w);
    if (!w) {
        svc_errf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    atomic_init(&w->refs, 1);
    w->kind = kind;
    if (!schema_json) {
        w->wschema = avro_schema_incref(emb->schema);
        w->wclass = avro_value_iface_incref(emb->cls);
        return w;
    }
    if (avro_schema_from_json_length(schema_json, len, &w->wschema) != 0) {
        svc_errf(errstr, errstr_size, "writer schema: %s", avro_strerror());
        w->wschema = NULL;
        goto fail;
    }
    w->wclass = avro_generic_class_from_schema(w->wschema);
    w->rschema = pruned_reader(kind, schema_json, len, errstr, errstr_size);
    if (!w->wclass || !w->rschema)
        goto fail;
    w->resolver = avro_resolved_reader_new(w->wschema, w->rschema);
    if (!w->resolver) {
        svc_errf(errstr, errstr_size, "writer schema does not resolve to %s.avsc: %s",
                 kind == SCH_AVRO_ANSWER ? "answer" : "request", avro_strerror());
        goto fail;
    }
    return w;
fail:
    sch_avro_writer_free(w);
    return NULL;
}

sch_avro_writer_t *sch_avro_writer_keep(sch_avro_writer_t *w) {
    atomic_fetch_add(&w->refs, 1);
    return w;
}

void sch_avro_writer_free(sch_avro_writer_t *w) {
    if (!w || atomic_fetch_sub(&w->refs, 1) != 1)
        return;
    if (w->resolver)
        avro_value_iface_decref(w->resolver);
    if (w->wclass)
        avro_value_iface_decref(w->wclass);
    if (w->rschema)
        avro_schema_decref(w->rschema);
    if (w->wschema)
        avro_schema_decref(w->wschema);
    free(w);
}

/* ---- the bounds check ------------------------------------------------------ */

typedef struct cursor {
    const unsigned char *p;
    size_t               len;
    size_t               at;
    size_t               items;  /* array/map items so far */
    size_t               values; /* values of any kind so far */
    const char          *why;    /* static reason on failure */
} cursor_t;

static bool fail(cursor_t *c, const char *why) {
    c->why = why;
    return false;
}

/* A zig-zag varint long (Avro spec "Binary Encoding"). */
static bool read_long(cursor_t *c, int64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (c->at >= c->len)
            return fail(c, "truncated");
        unsigned char b = c->p[c->at++];
        if (shift == 63 && b > 1)
            return fail(c, "varint longer than 64 bits");
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
            return true;
        }
    }
    return fail(c, "varint longer than 10 bytes");
}

static bool skip_bytes(cursor_t *c, int64_t n) {
    if (n < 0)
        return fail(c, "negative length");
    if ((uint64_t)n > c->len - c->at)
        return fail(c, "truncated (a length runs past the end)");
    c->at += (size_t)n;
    return true;
}

static bool check_value(avro_schema_t s, cursor_t *c, int depth);

/* Array and map blocks: counts, optional byte sizes, then the items. */
static bool check_blocks(avro_schema_t items, bool is_map, cursor_t *c, int depth) {
    for (;;) {
        int64_t n;
        if (!read_long(c, &n))
            return false;
        if (n == 0)
            return true;
        if (n < 0) {
            int64_t size;
            if (n == INT64_MIN)
                return fail(c, "bad block count");
            n = -n;
            if (!read_long(c, &size) || size < 0 || (uint64_t)size > c->len - c->at)
                return fail(c, "bad block size");
        }
        if ((uint64_t)n > SCH_AVRO_MAX_ITEMS - c->items)
            return fail(c, "more array or map items than allowed");
        c->items += (size_t)n;
        for (int64_t i = 0; i < n; i++) {
            int64_t klen;
            if (is_map && !(read_long(c, &klen) && skip_bytes(c, klen)))
                return false;
            if (!check_value(items, c, depth + 1))
                return false;
        }
    }
}

static bool check_value(avro_schema_t s, cursor_t *c, int depth) {
    if (depth > SCH_AVRO_MAX_DEPTH)
        return fail(c, "nested too deep");
    if (++c->values > SCH_AVRO_MAX_VALUES)
        return fail(c, "more values than allowed");
    int64_t n;
    switch (avro_typeof(s)) {
    case AVRO_NULL:
        return true;
    case AVRO_BOOLEAN:
        if (c->at >= c->len)
            return fail(c, "truncated");
        return c->p[c->at++] <= 1 ? true : fail(c, "boolean byte not 0 or 1");
    case AVRO_INT32:
        if (!read_long(c, &n))
            return false;
        return n >= INT32_MIN && n <= INT32_MAX ? true : fail(c, "int out of range");
    case AVRO_INT64:
        return read_long(c, &n);
    case AVRO_FLOAT:
        return skip_bytes(c, 4);
    case AVRO_DOUBLE:
        return skip_bytes(c, 8);
    case AVRO_STRING:
    case AVRO_BYTES:
        return read_long(c, &n) && skip_bytes(c, n);
    case AVRO_FIXED:
        return skip_bytes(c, avro_schema_fixed_size(s));
    case AVRO_ENUM:
        if (!read_long(c, &n))
            return false;
        return n >= 0 && n < avro_schema_enum_number_of_symbols(s) ? true
                                                                   : fail(c, "bad enum index");
    case AVRO_RECORD:
        for (size_t i = 0; i < avro_schema_record_size(s); i++)
            if (!check_value(avro_schema_record_field_get_by_index(s, (int)i), c, depth + 1))
                return false;
        return true;
    case AVRO_UNION:
        if (!read_long(c, &n))
            return false;
        if (n < 0 || (uint64_t)n >= avro_schema_union_size(s))
            return fail(c, "bad union branch");
        return check_value(avro_schema_union_branch(s, (int)n), c, depth + 1);
    case AVRO_ARRAY:
        return check_blocks(avro_schema_array_items(s), false, c, depth);
    case AVRO_MAP:
        return check_blocks(avro_schema_map_values(s), true, c, depth);
    case AVRO_LINK:
        return check_value(avro_schema_link_target(s), c, depth + 1);
    }
    return fail(c, "unknown schema type");
}

/* ---- decoding and encoding ------------------------------------------------ */

svc_err_t sch_av_decode(sch_avro_kind_t kind, const sch_avro_writer_t *w, const void *body,
                        size_t len, sch_av_decoded_t *d, char *errstr, size_t errstr_size) {
    const embedded_t   *emb = embedded(kind);
    avro_schema_t       ws = w ? w->wschema : emb->schema;
    avro_value_iface_t *wc = w ? w->wclass : emb->cls;
    const char         *what = kind == SCH_AVRO_ANSWER ? "answer" : "request";
    memset(d, 0, sizeof *d);
    cursor_t c = {body, len, 0, 0, 0, NULL};
    if (!check_value(ws, &c, 0)) {
        svc_errf(errstr, errstr_size, "avro %s body (%zu bytes): %s at byte %zu", what, len, c.why,
                 c.at);
        return SVC_ERR_FORMAT;
    }
    if (c.at != len) {
        svc_errf(errstr, errstr_size, "avro %s body: %zu bytes left over after byte %zu", what,
                 len - c.at, c.at);
        return SVC_ERR_FORMAT;
    }
    if (avro_generic_value_new(wc, &d->src) != 0) {
        svc_errf(errstr, errstr_size, "avro: cannot create a value: %s", avro_strerror());
        return SVC_ERR_NOMEM;
    }
    d->has_src = true;
    avro_reader_t rd = avro_reader_memory(body, (int64_t)len);
    int           rc = rd ? avro_value_read(rd, &d->src) : ENOMEM;
    if (rd)
        avro_reader_free(rd);
    if (rc != 0) {
        svc_errf(errstr, errstr_size, "avro %s body: %s", what, avro_strerror());
        sch_av_decoded_fini(d);
        return SVC_ERR_FORMAT;
    }
    if (!w || !w->resolver) {
        d->view = d->src;
        return SVC_OK;
    }
    if (avro_resolved_reader_new_value(w->resolver, &d->view) != 0) {
        svc_errf(errstr, errstr_size, "avro: cannot resolve: %s", avro_strerror());
        sch_av_decoded_fini(d);
        return SVC_ERR_NOMEM;
    }
    d->has_view = true;
    avro_resolved_reader_set_source(&d->view, &d->src);
    return SVC_OK;
}

void sch_av_decoded_fini(sch_av_decoded_t *d) {
    if (d->has_view)
        avro_value_decref(&d->view);
    if (d->has_src)
        avro_value_decref(&d->src);
    d->has_view = d->has_src = false;
}

svc_err_t sch_av_write(avro_value_t *v, svc_buf_t *out, char *errstr, size_t errstr_size) {
    size_t size = 0;
    if (avro_value_sizeof(v, &size) != 0) {
        svc_errf(errstr, errstr_size, "avro: %s", avro_strerror());
        return SVC_ERR_INTERNAL;
    }
    svc_err_t err = svc_buf_reserve(out, size);
    if (err)
        return err;
    avro_writer_t wr = avro_writer_memory(out->data + out->len, (int64_t)size);
    if (!wr)
        return SVC_ERR_NOMEM;
    int rc = avro_value_write(wr, v);
    avro_writer_free(wr);
    if (rc != 0) {
        svc_errf(errstr, errstr_size, "avro: %s", avro_strerror());
        return SVC_ERR_INTERNAL;
    }
    out->len += size;
    out->data[out->len] = '\0';
    return SVC_OK;
}

/* ---- value helpers -------------------------------------------------------- */

bool sch_av_field(avro_value_t *rec, const char *name, avro_value_t *out) {
    return avro_value_get_by_name(rec, name, out, NULL) == 0;
}

int sch_av_branch(avro_value_t *u, avro_value_t *branch, avro_type_t *type, const char **name) {
    int rc = avro_value_get_current_branch(u, branch);
    if (rc)
        return rc;
    *type = avro_value_get_type(branch);
    *name = NULL;
    if (*type == AVRO_RECORD || *type == AVRO_ENUM) {
        avro_schema_t s = avro_value_get_schema(branch);
        if (s && avro_typeof(s) == AVRO_LINK)
            s = avro_schema_link_target(s);
        const char *n = s ? avro_schema_name(s) : NULL;
        *name = n ? short_name(n) : NULL;
    }
    return 0;
}

int sch_av_set_branch(avro_value_t *u, avro_type_t t, const char *name, avro_value_t *branch) {
    avro_schema_t s = avro_value_get_schema(u);
    for (size_t i = 0; i < avro_schema_union_size(s); i++) {
        avro_schema_t b = avro_schema_union_branch(s, (int)i);
        if (avro_typeof(b) == AVRO_LINK)
            b = avro_schema_link_target(b);
        if (avro_typeof(b) != t)
            continue;
        if (name && strcmp(short_name(avro_schema_name(b)), name) != 0)
            continue;
        return avro_value_set_branch(u, (int)i, branch);
    }
    return EINVAL;
}

int sch_av_set_str(avro_value_t *v, const char *s, size_t len) {
    /* avro-c's length counts the terminator; the copy keeps inner NULs. */
    char *copy = malloc(len + 1);
    if (!copy)
        return ENOMEM;
    memcpy(copy, s, len);
    copy[len] = '\0';
    int rc = avro_value_set_string_len(v, copy, len + 1);
    free(copy);
    return rc;
}

int sch_av_get_str(avro_value_t *v, const char **s, size_t *len) {
    size_t size = 0;
    int    rc = avro_value_get_string(v, s, &size);
    if (rc)
        return rc;
    *len = size ? size - 1 : 0;
    return 0;
}

int sch_av_set_opt_str(avro_value_t *u, const char *s, size_t len) {
    avro_value_t b;
    if (!s)
        return sch_av_set_branch(u, AVRO_NULL, NULL, &b);
    return sch_av_set_branch(u, AVRO_STRING, NULL, &b) || sch_av_set_str(&b, s, len);
}

/* ---- JSON <-> Avro mapping helpers ------------------------------------------ */

bool sch_av_key_in(const char *k, size_t n, const char *const *names) {
    for (size_t i = 0; names[i]; i++)
        if (sch_str_is(k, n, names[i]))
            return true;
    return false;
}

bool sch_av_keys_within(const sch_json_t *o, const char *const *names) {
    if (sch_json_type(o) != SCH_JSON_OBJECT)
        return false;
    for (size_t i = 0; i < sch_json_size(o); i++) {
        size_t      n;
        const char *k = sch_json_key_at(o, i, &n);
        if (!sch_av_key_in(k, n, names))
            return false;
    }
    return true;
}

svc_err_t sch_av_parse_body(const char *json, size_t len, const char *kind, sch_jdoc_t **doc,
                            char *errstr, size_t errstr_size) {
    sch_jfail_t fail;
    char        msg[256];
    *doc = sch_json_parse(json, len, &fail, msg, sizeof msg);
    if (*doc)
        return SVC_OK;
    svc_errf(errstr, errstr_size, "%s is not JSON: %s", kind, msg);
    return fail == SCH_JFAIL_NOMEM ? SVC_ERR_NOMEM : SVC_ERR_INVALID;
}

svc_err_t sch_av_encode_end(svc_err_t err, avro_value_t *rec, sch_jdoc_t *doc, svc_buf_t *out,
                            char *errstr, size_t errstr_size) {
    if (!err)
        err = sch_av_write(rec, out, errstr, errstr_size);
    avro_value_decref(rec);
    sch_jdoc_free(doc);
    return err;
}

svc_err_t sch_av_bad(sch_av_dec_t *d, const char *what, const char *why) {
    svc_errf(d->errstr, d->errstr_size, "avro %s field %s: %s", d->kind, what, why);
    return SVC_ERR_FORMAT;
}

svc_err_t sch_av_w_key(sch_av_dec_t *d, bool *first, const char *key, size_t n) {
    svc_err_t err = *first ? SVC_OK : svc_buf_addc(d->out, ',');
    *first = false;
    if (!err)
        err = sch_json_write_string(d->out, key, n);
    return err ? err : svc_buf_addc(d->out, ':');
}

svc_err_t sch_av_w_str(sch_av_dec_t *d, avro_value_t *v, const char *what) {
    const char *s;
    size_t      n;
    return sch_av_get_str(v, &s, &n) ? sch_av_bad(d, what, "not a string")
                                     : sch_json_write_string(d->out, s, n);
}

svc_err_t sch_av_decode_end(svc_err_t err, sch_av_dec_t *d, size_t start, sch_av_decoded_t *dv) {
    if (!err)
        err = svc_buf_addc(d->out, '}');
    if (err) {
        d->out->len = start; /* no half-written body */
        if (d->out->data)
            d->out->data[start] = '\0';
    }
    sch_av_decoded_fini(dv);
    return err;
}

/* ---- Confluent framing ------------------------------------------------------ */

svc_err_t sch_frame_parse(const void *bytes, size_t len, uint32_t *schema_id, const void **body,
                          size_t *body_len, char *errstr, size_t errstr_size) {
    const unsigned char *p = bytes;
    if (len < SCH_FRAME_HEADER) {
        svc_errf(errstr, errstr_size,
                 "not a Confluent Avro value: %zu bytes, shorter than the 5-byte header "
                 "(magic 0 + schema id)",
                 len);
        return SVC_ERR_FORMAT;
    }
    if (p[0] != SCH_FRAME_MAGIC) {
        svc_errf(errstr, errstr_size,
                 "not a Confluent Avro value: magic byte is 0x%02x, expected 0x00", p[0]);
        return SVC_ERR_FORMAT;
    }
    *schema_id = (uint32_t)p[1] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 8 | p[4];
    *body = p + SCH_FRAME_HEADER;
    *body_len = len - SCH_FRAME_HEADER;
    return SVC_OK;
}

svc_err_t sch_frame_write(uint32_t schema_id, const void *body, size_t len, svc_buf_t *out) {
    unsigned char h[SCH_FRAME_HEADER] = {SCH_FRAME_MAGIC, (unsigned char)(schema_id >> 24),
                                         (unsigned char)(schema_id >> 16),
                                         (unsigned char)(schema_id >> 8), (unsigned char)schema_id};
    svc_err_t     err = svc_buf_add(out, h, sizeof h);
    return err ? err : svc_buf_add(out, body, len);
}
