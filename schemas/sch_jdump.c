/*
 * sch_jdump.c -- the compact writer of response bodies (",", ":"), built on
 * the public accessors so it shares the string and number spelling of
 * sch_json.c.
 */
#include "schemas.h"

static svc_err_t dump_compact(const sch_json_t *v, svc_buf_t *out);

static svc_err_t dump_int(const sch_json_t *v, svc_buf_t *out) {
    size_t      len;
    const char *t = sch_json_int_text(v, &len);
    /* Python's int("-0") is 0. */
    if (len == 2 && t[0] == '-' && t[1] == '0')
        return svc_buf_addc(out, '0');
    return svc_buf_add(out, t, len);
}

static svc_err_t dump_array(const sch_json_t *v, svc_buf_t *out) {
    svc_err_t err = svc_buf_addc(out, '[');
    for (size_t i = 0; i < sch_json_size(v) && !err; i++) {
        if (i)
            err = svc_buf_addc(out, ',');
        if (!err)
            err = dump_compact(sch_json_at(v, i), out);
    }
    return err ? err : svc_buf_addc(out, ']');
}

static svc_err_t dump_object(const sch_json_t *v, svc_buf_t *out) {
    svc_err_t err = svc_buf_addc(out, '{');
    for (size_t i = 0; i < sch_json_size(v) && !err; i++) {
        size_t      klen;
        const char *key = sch_json_key_at(v, i, &klen);
        if (i)
            err = svc_buf_addc(out, ',');
        if (!err)
            err = sch_json_write_string(out, key, klen);
        if (!err)
            err = svc_buf_addc(out, ':');
        if (!err)
            err = dump_compact(sch_json_at(v, i), out);
    }
    return err ? err : svc_buf_addc(out, '}');
}

/* Depth is bounded by the parser (SCH_JSON_MAX_DEPTH), so recursion is too. */
static svc_err_t dump_compact(const sch_json_t *v, svc_buf_t *out) {
    size_t      len;
    const char *s;
    switch (sch_json_type(v)) {
    case SCH_JSON_NULL:
        return svc_buf_adds(out, "null");
    case SCH_JSON_BOOL:
        return svc_buf_adds(out, sch_json_bool(v) ? "true" : "false");
    case SCH_JSON_INT:
        return dump_int(v, out);
    case SCH_JSON_REAL:
        return sch_json_write_double(out, sch_json_number(v));
    case SCH_JSON_STRING:
        s = sch_json_string(v, &len);
        return sch_json_write_string(out, s, len);
    case SCH_JSON_ARRAY:
        return dump_array(v, out);
    case SCH_JSON_OBJECT:
        return dump_object(v, out);
    }
    return SVC_ERR_INTERNAL;
}

svc_err_t sch_json_dump_compact(const sch_json_t *v, svc_buf_t *out) {
    return dump_compact(v, out);
}
