/*
 * ops_config.c -- one configuration for `serve` and `http`: a YAML file
 * (--config FILE or D3STREAM_CONFIG), D3STREAM_<NAME> environment
 * variables and the flags, later ones winning; and `d3stream config`, which
 * prints the result with each value's origin and the secrets masked.
 *
 * The commands keep their getopt parsers: the file and the environment
 * become "--name value" pairs (a boolean a bare "--name" when true, nothing
 * when false) put before the real arguments, so the same validation applies
 * and a flag, coming last, wins.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <yaml.h>

#include "ops_int.h"

#define CMD_SERVE 1u
#define CMD_HTTP  2u
#define CMD_BOTH  (CMD_SERVE | CMD_HTTP)

typedef enum cfg_kind { CFG_STR, CFG_NUM, CFG_BOOL } cfg_kind_t;

/* Every option of serve and http but --help and -X (librdkafka: below). */
typedef struct cfg_opt {
    const char *name;
    unsigned    cmds;
    cfg_kind_t  kind;
    const char *def; /* printed by `config`; NULL: unset (null) */
} cfg_opt_t;

static const cfg_opt_t CFG_OPTS[] = {
    {"model", CMD_BOTH, CFG_STR, NULL},
    {"brokers", CMD_SERVE, CFG_STR, NULL},
    {"group", CMD_SERVE, CFG_STR, NULL},
    {"input", CMD_SERVE, CFG_STR, NULL},
    {"output", CMD_SERVE, CFG_STR, NULL},
    {"dlq", CMD_SERVE, CFG_STR, NULL},
    {"format", CMD_SERVE, CFG_STR, "json"},
    {"schema-registry", CMD_SERVE, CFG_STR, NULL},
    {"exactly-once", CMD_SERVE, CFG_BOOL, "false"},
    {"transactional-id", CMD_SERVE, CFG_STR, NULL},
    {"commit-ms", CMD_SERVE, CFG_NUM, "100"},
    {"instance-id", CMD_SERVE, CFG_STR, NULL},
    {"from-beginning", CMD_SERVE, CFG_BOOL, "false"},
    {"stop-at-end", CMD_SERVE, CFG_BOOL, "false"},
    {"no-verify", CMD_BOTH, CFG_BOOL, "false"},
    {"no-golden", CMD_BOTH, CFG_BOOL, "false"},
    {"model-alias", CMD_BOTH, CFG_STR, NULL},
    {"model-aliases", CMD_BOTH, CFG_STR, NULL},
    {"no-default-alias", CMD_BOTH, CFG_BOOL, "false"},
    {"q4nx-layout", CMD_BOTH, CFG_STR, NULL},
    {"profile", CMD_BOTH, CFG_STR, "exact"},
    {"device", CMD_BOTH, CFG_STR, "auto"},
    {"workers", CMD_BOTH, CFG_NUM, NULL},
    {"max-queue", CMD_BOTH, CFG_NUM, "256"},
    {"max-queued-tokens", CMD_BOTH, CFG_NUM, "4194304"},
    {"result-cache-entries", CMD_BOTH, CFG_NUM, "16384"},
    {"result-cache-mib", CMD_BOTH, CFG_NUM, "64"},
    {"max-request-bytes", CMD_BOTH, CFG_NUM, "8388608"},
    {"window", CMD_SERVE, CFG_NUM, "2048"},
    {"window-mib", CMD_SERVE, CFG_NUM, "256"},
    {"metrics-file", CMD_SERVE, CFG_STR, NULL},
    {"http", CMD_SERVE, CFG_STR, NULL},
    {"listen", CMD_HTTP, CFG_STR, "127.0.0.1:52625"},
    {"max-connections", CMD_HTTP, CFG_NUM, "1024"},
    {"timeout", CMD_HTTP, CFG_NUM, "30"},
    {"max-body-memory", CMD_HTTP, CFG_NUM, "256"},
    {"api-key-file", CMD_BOTH, CFG_STR, NULL},
    {"metrics-need-key", CMD_BOTH, CFG_BOOL, "false"},
    {"tls-cert", CMD_BOTH, CFG_STR, NULL},
    {"tls-key", CMD_BOTH, CFG_STR, NULL},
    {"log-level", CMD_BOTH, CFG_STR, "info"},
};
#define CFG_N (sizeof CFG_OPTS / sizeof CFG_OPTS[0])

typedef enum cfg_origin { ORIG_DEFAULT, ORIG_FILE, ORIG_ENV, ORIG_FLAG } cfg_origin_t;
static const char *const ORIGIN_NAME[] = {"default", "file", "env", "flag"};

typedef struct cfg_val {
    char        *v;     /* owned; NULL when unset */
    char        *where; /* owned: the file's line or the variable; NULL for a flag */
    cfg_origin_t origin;
} cfg_val_t;

typedef struct cfg_prop {
    char        *key, *v; /* owned */
    cfg_origin_t origin;
} cfg_prop_t;

/* What the file and the environment (and, for `config`, the flags) say. */
typedef struct cfg_state {
    const char  *cmd; /* "serve" or "http" */
    const char  *who; /* the command named in messages */
    unsigned     bit;
    const char  *file; /* NULL: none */
    cfg_origin_t file_origin;
    cfg_val_t    val[CFG_N];
    cfg_prop_t  *props;
    size_t       n_props;
} cfg_state_t;

static void state_fini(cfg_state_t *st) {
    for (size_t i = 0; i < CFG_N; i++) {
        free(st->val[i].v);
        free(st->val[i].where);
    }
    for (size_t i = 0; i < st->n_props; i++) {
        free(st->props[i].key);
        free(st->props[i].v);
    }
    free(st->props);
}

static const cfg_opt_t *opt_find(const char *name, size_t *idx) {
    for (size_t i = 0; i < CFG_N; i++)
        if (!strcmp(CFG_OPTS[i].name, name)) {
            *idx = i;
            return &CFG_OPTS[i];
        }
    return NULL;
}

static bool set_val(cfg_val_t *val, const char *v, cfg_origin_t origin, const char *where) {
    char *dup = strdup(v), *wdup = where ? strdup(where) : NULL;
    if (!dup || (where && !wdup)) {
        free(dup);
        free(wdup);
        return false;
    }
    free(val->v);
    free(val->where);
    val->v = dup;
    val->where = wdup;
    val->origin = origin;
    return true;
}

/* A librdkafka property; a later one with the same key replaces it. */
static bool set_prop(cfg_state_t *st, const char *key, size_t klen, const char *v,
                     cfg_origin_t origin) {
    for (size_t i = 0; i < st->n_props; i++)
        if (strlen(st->props[i].key) == klen && !strncmp(st->props[i].key, key, klen)) {
            char *dup = strdup(v);
            if (!dup)
                return false;
            free(st->props[i].v);
            st->props[i].v = dup;
            st->props[i].origin = origin;
            return true;
        }
    cfg_prop_t *p = realloc(st->props, (st->n_props + 1) * sizeof *p);
    if (!p)
        return false;
    st->props = p;
    p[st->n_props].key = strndup(key, klen);
    p[st->n_props].v = strdup(v);
    p[st->n_props].origin = origin;
    if (!p[st->n_props].key || !p[st->n_props].v) {
        free(p[st->n_props].key);
        free(p[st->n_props].v);
        return false;
    }
    st->n_props++;
    return true;
}

/* "true"/"false" (and yes/no, on/off, 1/0, any case) -> *out. */
static bool parse_bool(const char *s, bool *out) {
    static const char *const T[] = {"true", "yes", "on", "1"};
    static const char *const F[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < 4; i++) {
        if (!strcasecmp(s, T[i])) {
            *out = true;
            return true;
        }
        if (!strcasecmp(s, F[i])) {
            *out = false;
            return true;
        }
    }
    return false;
}

static bool is_number(const char *s) {
    if (!*s)
        return false;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s))
            return false;
    return true;
}

/* Checks v against o's kind; false after printing "<where>: <why>". A
 * boolean is stored as "true" or "false". */
static bool check_value(const cfg_state_t *st, const cfg_opt_t *o, const char *where, const char *v,
                        const char **norm) {
    bool b;
    *norm = v;
    if (o->kind == CFG_BOOL) {
        if (!parse_bool(v, &b)) {
            ops_fail(st->who, "%s: \"%s\": expected true or false", where, v);
            return false;
        }
        *norm = b ? "true" : "false";
    } else if (o->kind == CFG_NUM && !is_number(v)) {
        ops_fail(st->who, "%s: \"%s\": expected a whole number", where, v);
        return false;
    }
    return true;
}

/* ------------------------------------------------------------ the file */

static const char *node_str(const yaml_node_t *n) {
    return (const char *)n->data.scalar.value;
}

static size_t node_line(const yaml_node_t *n) {
    return n->start_mark.line + 1;
}

/* YAML's null: nothing after the colon, or a plain ~ or null (the core
 * schema's spellings), or a !!null tag. */
static bool node_is_null(const yaml_node_t *n) {
    if (n->type != YAML_SCALAR_NODE)
        return false;
    if (n->tag && !strcmp((const char *)n->tag, YAML_NULL_TAG))
        return true;
    if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *s = node_str(n);
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

/* A quoted "a\0b" would reach the options cut at its NUL: refused instead. */
static bool node_has_nul(const yaml_node_t *n) {
    return n->type == YAML_SCALAR_NODE && n->data.scalar.length != strlen(node_str(n));
}

/* At the top level, serve: is always a section and http: is one unless a
 * scalar (then it is serve's --http); null is an empty section (every line
 * of it commented out). */
static bool is_section(const char *section, const char *key, const yaml_node_t *v) {
    if (section)
        return false;
    if (!strcmp(key, "serve"))
        return true;
    return !strcmp(key, "http") && (v->type != YAML_SCALAR_NODE || node_is_null(v));
}

/* The line of an earlier pair of map with p's key (and, for http:, the same
 * role), or 0: libyaml keeps every duplicate, and last-wins would hide a
 * typo'd copy. The earlier pairs were checked: their keys are scalars. */
static size_t dup_line(yaml_document_t *doc, const yaml_node_t *map, const yaml_node_pair_t *p,
                       const char *section) {
    yaml_node_t *k = yaml_document_get_node(doc, p->key);
    yaml_node_t *v = yaml_document_get_node(doc, p->value);
    for (const yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++) {
        yaml_node_t *qk = yaml_document_get_node(doc, q->key);
        yaml_node_t *qv = yaml_document_get_node(doc, q->value);
        if (qk->data.scalar.length == k->data.scalar.length &&
            !memcmp(qk->data.scalar.value, k->data.scalar.value, k->data.scalar.length) &&
            is_section(section, node_str(k), qv) == is_section(section, node_str(k), v))
            return node_line(qk);
    }
    return 0;
}

/* A pair's key: a scalar without NUL, given once in its mapping; *where gets
 * "FILE:LINE: [section.]key". False after printing why. */
static bool check_key(const cfg_state_t *st, yaml_document_t *doc, const yaml_node_t *map,
                      const yaml_node_pair_t *p, const char *section, char *where, size_t size) {
    yaml_node_t *k = yaml_document_get_node(doc, p->key);
    yaml_node_t *v = yaml_document_get_node(doc, p->value);
    size_t       line = node_line(k ? k : map);
    if (!k || !v || k->type != YAML_SCALAR_NODE || node_has_nul(k)) {
        ops_fail(st->who, "%s:%zu: %s%sexpected a key: value", st->file, line,
                 section ? section : "", section ? ": " : "");
        return false;
    }
    snprintf(where, size, "%s:%zu: %s%s%s", st->file, line, section ? section : "",
             section ? "." : "", node_str(k));
    size_t first = dup_line(doc, map, p, section);
    if (first) {
        ops_fail(st->who, "%s: given twice (first at line %zu)", where, first);
        return false;
    }
    return true;
}

/* A value that must be one scalar: not null, no NUL. */
static bool check_scalar(const cfg_state_t *st, const yaml_node_t *v, const char *where) {
    if (v->type != YAML_SCALAR_NODE) {
        ops_fail(st->who, "%s: expected a single value, not a %s", where,
                 v->type == YAML_MAPPING_NODE ? "mapping" : "list");
        return false;
    }
    if (node_is_null(v)) {
        ops_fail(st->who, "%s: has no value (give one, or leave the key out)", where);
        return false;
    }
    if (node_has_nul(v)) {
        ops_fail(st->who, "%s: the value holds a NUL byte", where);
        return false;
    }
    return true;
}

/* librdkafka: {property: value, ...}; null is empty (all commented out). */
static bool file_props(cfg_state_t *st, yaml_document_t *doc, yaml_node_t *map,
                       const char *section) {
    char name[64];
    snprintf(name, sizeof name, "%s%slibrdkafka", section ? section : "", section ? "." : "");
    if (node_is_null(map))
        return true;
    if (map->type != YAML_MAPPING_NODE) {
        ops_fail(st->who, "%s:%zu: %s: expected a mapping of property: value", st->file,
                 node_line(map), name);
        return false;
    }
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        char where[1200];
        if (!check_key(st, doc, map, p, name, where, sizeof where))
            return false;
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        yaml_node_t *v = yaml_document_get_node(doc, p->value);
        if (!check_scalar(st, v, where))
            return false;
        if (!set_prop(st, node_str(k), strlen(node_str(k)), node_str(v), ORIG_FILE))
            return false;
    }
    return true;
}

/* serve: or http: at the top level must be a mapping (or null: empty). */
static bool check_section(const cfg_state_t *st, const yaml_node_t *v, const char *key,
                          const char *where) {
    if (v->type == YAML_MAPPING_NODE || node_is_null(v))
        return true;
    ops_fail(st->who, "%s: must be a mapping (the options of %s only)%s", where, key,
             strcmp(key, "http") ? "" : ", or a HOST:PORT (serve's --http)");
    return false;
}

static void unknown_key(const cfg_state_t *st, const char *where, const char *section) {
    if (!section)
        ops_fail(st->who,
                 "%s: unknown key (expected an option of serve or http without its dashes, "
                 "librdkafka, or a serve: or http: section; see d3stream %s --help)",
                 where, st->cmd);
    else if (!strcmp(section, "serve"))
        ops_fail(st->who,
                 "%s: unknown key (expected an option of serve without its dashes, or "
                 "librdkafka; see d3stream serve --help)",
                 where);
    else
        ops_fail(st->who,
                 "%s: unknown key (expected an option of http without its dashes; see "
                 "d3stream http --help)",
                 where);
}

/* One pair of the top level (section NULL) or of a serve:/http: section. */
static bool file_pair(cfg_state_t *st, yaml_document_t *doc, yaml_node_t *map,
                      const yaml_node_pair_t *p, const char *section) {
    char where[1200];
    if (!check_key(st, doc, map, p, section, where, sizeof where))
        return false;
    const char  *key = node_str(yaml_document_get_node(doc, p->key));
    yaml_node_t *v = yaml_document_get_node(doc, p->value);
    if (is_section(section, key, v))
        return check_section(st, v, key, where); /* read after the top level: they win */
    if (!strcmp(key, "librdkafka")) {
        if (section && !strcmp(section, "http")) {
            ops_fail(st->who, "%s: unknown key (http has no librdkafka properties)", where);
            return false;
        }
        return !(st->bit & CMD_SERVE) || file_props(st, doc, v, section);
    }
    size_t           idx;
    const cfg_opt_t *o = opt_find(key, &idx);
    unsigned scope = section ? (!strcmp(section, "serve") ? CMD_SERVE : CMD_HTTP) : CMD_BOTH;
    if (!o || !(o->cmds & scope)) {
        unknown_key(st, where, section);
        return false;
    }
    const char *norm;
    if (!check_scalar(st, v, where) || !check_value(st, o, where, node_str(v), &norm))
        return false;
    return !(o->cmds & scope & st->bit) || set_val(&st->val[idx], norm, ORIG_FILE, where);
}

static bool file_map(cfg_state_t *st, yaml_document_t *doc, yaml_node_t *map, const char *section) {
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++)
        if (!file_pair(st, doc, map, p, section))
            return false;
    return true;
}

/* The top level, then the sections (a section's value wins). */
static bool file_root(cfg_state_t *st, yaml_document_t *doc) {
    yaml_node_t *root = yaml_document_get_root_node(doc);
    if (!root || node_is_null(root))
        return true; /* empty, or only comments */
    if (root->type != YAML_MAPPING_NODE) {
        ops_fail(st->who, "%s:%zu: expected a mapping of option: value", st->file, node_line(root));
        return false;
    }
    if (!file_map(st, doc, root, NULL))
        return false;
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        yaml_node_t *v = yaml_document_get_node(doc, p->value);
        if (is_section(NULL, node_str(k), v) && v->type == YAML_MAPPING_NODE &&
            !file_map(st, doc, v, node_str(k)))
            return false;
    }
    return true;
}

/* How the file was named, for messages that cannot name a line. */
static void file_label(const cfg_state_t *st, char *out, size_t size) {
    if (st->file_origin == ORIG_ENV)
        snprintf(out, size, "environment D3STREAM_CONFIG: \"%s\"", st->file);
    else
        snprintf(out, size, "--config \"%s\"", st->file);
}

/* A regular file, or a pipe (--config <(...)): a directory would reach
 * libyaml as a read error ("not YAML: input error"). */
static FILE *file_open(const cfg_state_t *st) {
    char        label[4200];
    struct stat sb;
    FILE       *f = fopen(st->file, "rb");
    file_label(st, label, sizeof label);
    if (!f) {
        ops_fail(st->who, "%s: %s", label, strerror(errno));
        return NULL;
    }
    const char *why = NULL;
    if (fstat(fileno(f), &sb) != 0)
        why = strerror(errno);
    else if (S_ISDIR(sb.st_mode))
        why = "a directory, not a regular file";
    else if (!S_ISREG(sb.st_mode) && !S_ISFIFO(sb.st_mode))
        why = "not a regular file";
    if (why) {
        ops_fail(st->who, "%s: %s", label, why);
        fclose(f);
        return NULL;
    }
    return f;
}

/* The next document of the stream into doc; false after printing why. */
static bool file_parse(const cfg_state_t *st, yaml_parser_t *parser, yaml_document_t *doc) {
    if (yaml_parser_load(parser, doc))
        return true;
    ops_fail(st->who, "%s:%zu: not YAML: %s", st->file, parser->problem_mark.line + 1,
             parser->problem ? parser->problem : "parse error");
    return false;
}

/* Only one document is read: a second one (or garbage after the first)
 * would otherwise be ignored without a word. */
static bool file_single(const cfg_state_t *st, yaml_parser_t *parser) {
    yaml_document_t next;
    if (!file_parse(st, parser, &next))
        return false;
    yaml_node_t *root = yaml_document_get_root_node(&next);
    bool         ok = !root;
    if (root)
        ops_fail(st->who, "%s:%zu: a second YAML document (the file must hold one)", st->file,
                 node_line(root));
    yaml_document_delete(&next);
    return ok;
}

static bool file_load(cfg_state_t *st) {
    FILE *f = file_open(st);
    if (!f)
        return false;
    yaml_parser_t   parser;
    yaml_document_t doc;
    bool            ok = false;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    if (file_parse(st, &parser, &doc)) {
        ok = file_single(st, &parser) && file_root(st, &doc);
        yaml_document_delete(&doc);
    }
    yaml_parser_delete(&parser);
    fclose(f);
    return ok;
}

/* ------------------------------------------------------------ the environment */

static void env_name(const char *opt, char *out, size_t size) {
    size_t n = (size_t)snprintf(out, size, "D3STREAM_");
    for (; *opt && n + 1 < size; opt++)
        out[n++] = *opt == '-' ? '_' : (char)toupper((unsigned char)*opt);
    out[n] = '\0';
}

/* D3STREAM_<NAME> for each option of the command; an empty one is unset. */
static bool env_load(cfg_state_t *st) {
    for (size_t i = 0; i < CFG_N; i++) {
        const cfg_opt_t *o = &CFG_OPTS[i];
        char             name[64], where[128];
        if (!(o->cmds & st->bit))
            continue;
        env_name(o->name, name, sizeof name);
        const char *v = getenv(name);
        if (!v || !*v)
            continue;
        const char *norm;
        snprintf(where, sizeof where, "environment %s", name);
        if (!check_value(st, o, where, v, &norm) || !set_val(&st->val[i], norm, ORIG_ENV, where))
            return false;
    }
    return true;
}

/* ------------------------------------------------------------ entry */

/* Finds --config FILE / --config=FILE in argv (the last wins) and copies the
 * other arguments to rest (argv[0] first); false on a --config without FILE. */
static bool split_config(const char *cmd, int argc, char **argv, const char **file, char **rest,
                         int *n_rest) {
    *n_rest = 0;
    rest[(*n_rest)++] = argv[0];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) {
            while (i < argc)
                rest[(*n_rest)++] = argv[i++];
            break;
        }
        if (!strncmp(argv[i], "--config=", 9)) {
            *file = argv[i] + 9;
        } else if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) {
                ops_fail(cmd, "--config needs a FILE");
                return false;
            }
            *file = argv[++i];
        } else {
            rest[(*n_rest)++] = argv[i];
        }
    }
    return true;
}

static bool wants_help(int argc, char **argv) {
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return true;
    return false;
}

/* The file and the environment into st; false after printing why. */
static bool state_load(cfg_state_t *st, const char *who, const char *cmd, const char *file) {
    memset(st, 0, sizeof *st);
    st->cmd = cmd;
    st->who = who;
    st->bit = !strcmp(cmd, "serve") ? CMD_SERVE : CMD_HTTP;
    st->file_origin = ORIG_FLAG;
    if (!file) {
        file = getenv("D3STREAM_CONFIG");
        st->file_origin = ORIG_ENV;
        if (file && !*file)
            file = NULL;
    }
    st->file = file;
    return (!file || file_load(st)) && env_load(st);
}

/* where: what set s (kept for ops_config_origin), for an owned s. */
static bool push(ops_config_t *cfg, char *s, bool owned, const char *where) {
    if (!s)
        return false;
    cfg->argv[cfg->argc++] = s;
    if (owned) {
        cfg->where[cfg->n_owned] = where;
        cfg->owned[cfg->n_owned++] = s;
    }
    return true;
}

/* s, owned by cfg from here on, not an argument. */
static bool push_owned(ops_config_t *cfg, char *s) {
    cfg->where[cfg->n_owned] = NULL;
    cfg->owned[cfg->n_owned++] = s;
    return true;
}

const char *ops_config_origin(const ops_config_t *cfg, const char *arg) {
    for (size_t i = 0; arg && i < cfg->n_owned; i++)
        if (cfg->owned[i] == arg)
            return cfg->where[i];
    return NULL;
}

void ops_config_blame(const ops_config_t *cfg, const char *cmd, int rc, const char *arg) {
    const char *where = rc == OPS_EXIT_USAGE ? ops_config_origin(cfg, arg) : NULL;
    if (where)
        ops_fail(cmd, "that value comes from %s", where);
}

int ops_config_argv(const char *cmd, int argc, char **argv, ops_config_t *cfg) {
    memset(cfg, 0, sizeof *cfg);
    size_t cap = (size_t)argc + 2 * CFG_N + 1;
    cfg->argv = calloc(cap, sizeof *cfg->argv);
    cfg->owned = calloc(cap + CFG_N, sizeof *cfg->owned); /* + each value's origin */
    cfg->where = calloc(cap + CFG_N, sizeof *cfg->where);
    char      **rest = calloc((size_t)argc + 1, sizeof *rest);
    const char *file = NULL;
    int         n_rest = 0, rc = -1;
    cfg_state_t st;
    memset(&st, 0, sizeof st);
    if (!cfg->argv || !cfg->owned || !cfg->where || !rest) {
        rc = OPS_EXIT_FAILURE;
        goto out;
    }
    if (!split_config(cmd, argc, argv, &file, rest, &n_rest)) {
        rc = OPS_EXIT_USAGE;
        goto out;
    }
    bool help = wants_help(argc, argv);
    if (!help && !state_load(&st, cmd, cmd, file)) {
        rc = OPS_EXIT_USAGE;
        goto out;
    }
    /* Props from the file become -X pairs too: each is its own argument, and
     * the flags' -X come later, so a flag's value for the same key wins. */
    size_t n_x = st.n_props;
    char **grown = realloc(cfg->argv, (cap + 2 * n_x) * sizeof *grown);
    char **owned = grown ? realloc(cfg->owned, (cap + CFG_N + 2 * n_x) * sizeof *owned) : NULL;
    if (grown)
        cfg->argv = grown;
    if (owned)
        cfg->owned = owned;
    const char **where =
        owned ? realloc(cfg->where, (cap + CFG_N + 2 * n_x) * sizeof *where) : NULL;
    if (!grown || !owned || !where) {
        rc = OPS_EXIT_FAILURE;
        goto out;
    }
    cfg->where = where;
    push(cfg, rest[0], false, NULL);
    for (size_t i = 0; i < CFG_N; i++) {
        const cfg_val_t *v = &st.val[i];
        char             flag[64];
        if (!v->v)
            continue;
        if (CFG_OPTS[i].kind == CFG_BOOL && strcmp(v->v, "true") != 0)
            continue; /* false: the flag is left out (it is off by default) */
        snprintf(flag, sizeof flag, "--%s", CFG_OPTS[i].name);
        /* The value's origin outlives st: it moves to cfg. */
        bool ok = push(cfg, strdup(flag), true, NULL);
        if (ok && CFG_OPTS[i].kind != CFG_BOOL) {
            ok = push(cfg, strdup(v->v), true, v->where);
            if (ok && v->where)
                ok = push_owned(cfg, v->where);
            if (ok)
                st.val[i].where = NULL;
        }
        if (!ok) {
            rc = OPS_EXIT_FAILURE;
            goto out;
        }
    }
    for (size_t i = 0; i < n_x; i++) {
        size_t kl = strlen(st.props[i].key), vl = strlen(st.props[i].v);
        char  *kv = malloc(kl + vl + 2);
        if (!kv || !push(cfg, strdup("-X"), true, NULL)) {
            free(kv);
            rc = OPS_EXIT_FAILURE;
            goto out;
        }
        memcpy(kv, st.props[i].key, kl);
        kv[kl] = '=';
        memcpy(kv + kl + 1, st.props[i].v, vl + 1);
        push(cfg, kv, true, NULL);
    }
    for (int i = 1; i < n_rest; i++)
        push(cfg, rest[i], false, NULL);
    cfg->argv[cfg->argc] = NULL;
out:
    state_fini(&st);
    free(rest);
    if (rc >= 0)
        ops_config_fini(cfg);
    return rc;
}

void ops_config_fini(ops_config_t *cfg) {
    for (size_t i = 0; i < cfg->n_owned; i++)
        free(cfg->owned[i]);
    free(cfg->owned);
    free(cfg->where);
    free(cfg->argv);
    memset(cfg, 0, sizeof *cfg);
}

/* ------------------------------------------------------------ d3stream config */

static const char CONFIG_HELP[] =
    "Usage: d3stream config [--config FILE] serve|http [options...]\n"
    "\n"
    "Prints the configuration `d3stream serve` or `d3stream http` would run with,\n"
    "as YAML: every option with its value and, as a trailing comment, where it came\n"
    "from (default, file, env or flag). The sources, later ones winning: the file\n"
    "(--config FILE, else $D3STREAM_CONFIG), the environment (D3STREAM_<OPTION>,\n"
    "e.g. D3STREAM_BROKERS, D3STREAM_EXACTLY_ONCE=true), the flags. Secrets are\n"
    "masked: librdkafka properties whose name contains password, secret, ssl.key or\n"
    "sasl.oauthbearer.config, and the password of a URL (https://user:****@host).\n"
    "Needs no package and no broker; options are checked for their type only.\n"
    "\n"
    "File layout (YAML): the options' long names as keys (model, brokers,\n"
    "exactly-once: true, workers: 2, ...), librdkafka: a mapping of -X properties,\n"
    "and optional serve: and http: mappings whose keys apply to that command only.\n"
    "One document; each key once in its mapping; a key without a value (key:, ~,\n"
    "null) is an error, but a section or librdkafka: without one is empty.\n"
    "\n"
    "Exit status: 0 printed, 2 usage (an unknown, repeated or empty key, a wrong\n"
    "type, an unreadable file).\n";

static bool is_secret_prop(const char *key) {
    static const char *const S[] = {"password", "secret", "sasl.oauthbearer.config", "ssl.key"};
    for (size_t i = 0; i < sizeof S / sizeof S[0]; i++)
        if (strstr(key, S[i]))
            return true;
    return false;
}

static const char *last_of(const char *s, size_t n, char ch) {
    const char *hit = NULL;
    for (size_t i = 0; i < n; i++)
        if (s[i] == ch)
            hit = s + i;
    return hit;
}

/* v with the password of scheme://user:pass@host masked, as a new string
 * (NULL: out of memory). The authority ends at the first '/', '?' or '#';
 * its userinfo at the authority's last '@' (a password may hold an '@'),
 * the user at the userinfo's first ':'. An unencoded '/' in the password
 * ends the authority early ("u:pa" of https://u:pa/ss@h): when the
 * authority has no '@' but the path has, the authority's first ':' up to
 * the path's last '@' is masked, as showing too little beats showing a
 * secret. */
static char *mask_url(const char *v) {
    size_t      n = strlen(v);
    const char *scheme = strstr(v, "://");
    const char *colon = NULL, *at = NULL;
    if (scheme) {
        const char *auth = scheme + 3;
        size_t      n_auth = strcspn(auth, "/?#");
        at = last_of(auth, n_auth, '@');
        if (!at)
            at = last_of(auth, strcspn(auth, "?#"), '@');
        if (at)
            colon = memchr(auth, ':', (size_t)(at - auth) < n_auth ? (size_t)(at - auth) : n_auth);
    }
    char *out = malloc(n + sizeof "****");
    if (!out)
        return NULL;
    if (colon)
        snprintf(out, n + sizeof "****", "%.*s****%s", (int)(colon + 1 - v), v, at);
    else
        memcpy(out, v, n + 1);
    return out;
}

/* A YAML scalar: bare when a plain word or number, else double-quoted. */
static void put_scalar(const char *v) {
    bool plain = *v != '\0';
    for (const char *s = v; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("._/-", *s))
            plain = false;
    if (plain && strcmp(v, "null") != 0 && strcmp(v, "true") != 0 && strcmp(v, "false") != 0 &&
        (strcmp(v, "yes") && strcmp(v, "no") && strcmp(v, "on") && strcmp(v, "off"))) {
        fputs(v, stdout);
        return;
    }
    putchar('"');
    for (const char *s = v; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f)
            printf("\\x%02x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

/* A string with any URL password masked; false when out of memory. */
static bool put_masked(const char *v) {
    char *masked = mask_url(v);
    if (!masked)
        return false;
    put_scalar(masked);
    free(masked);
    return true;
}

static bool put_value(const cfg_opt_t *o, const cfg_val_t *v) {
    const char *s = v->v ? v->v : o->def;
    if (!s) {
        fputs("null", stdout);
        return true;
    }
    if (o->kind != CFG_STR) {
        fputs(s, stdout); /* checked: a number, true or false */
        return true;
    }
    return put_masked(s);
}

/* The flags of `config serve|http ...` into st (origin flag). */
static int flags_load(cfg_state_t *st, int argc, char **argv) {
    struct option lo[CFG_N + 2];
    size_t        n = 0, idx;
    for (size_t i = 0; i < CFG_N; i++)
        if (CFG_OPTS[i].cmds & st->bit)
            lo[n++] = (struct option){
                CFG_OPTS[i].name, CFG_OPTS[i].kind == CFG_BOOL ? no_argument : required_argument,
                NULL, 256 + (int)i};
    lo[n++] = (struct option){"help", no_argument, NULL, 'h'};
    lo[n] = (struct option){NULL, 0, NULL, 0};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, st->bit & CMD_SERVE ? "m:X:h" : "m:h", lo, NULL)) != -1) {
        if (c == 'h') {
            fputs(CONFIG_HELP, stdout);
            return OPS_EXIT_OK;
        }
        if (c == 'X') {
            const char *eq = strchr(optarg, '=');
            if (!eq) {
                ops_fail("config", "-X \"%s\": expected key=value", optarg);
                return OPS_EXIT_USAGE;
            }
            if (!set_prop(st, optarg, (size_t)(eq - optarg), eq + 1, ORIG_FLAG))
                return OPS_EXIT_FAILURE;
            continue;
        }
        if (c == 'm')
            c = 256 + (int)(opt_find("model", &idx) - CFG_OPTS);
        if (c < 256 || c >= 256 + (int)CFG_N) {
            fputs(CONFIG_HELP, stderr);
            return OPS_EXIT_USAGE;
        }
        const cfg_opt_t *o = &CFG_OPTS[c - 256];
        char             where[80];
        const char      *norm = "true";
        snprintf(where, sizeof where, "--%s", o->name);
        if (o->kind != CFG_BOOL && !check_value(st, o, where, optarg, &norm))
            return OPS_EXIT_USAGE;
        if (!set_val(&st->val[c - 256], norm, ORIG_FLAG, NULL))
            return OPS_EXIT_FAILURE;
    }
    if (optind != argc) {
        ops_fail("config", "unexpected operand \"%s\": see d3stream config --help", argv[optind]);
        return OPS_EXIT_USAGE;
    }
    return -1;
}

/* False when out of memory. */
static bool config_print(const cfg_state_t *st) {
    printf("# d3stream %s: the effective configuration (file < env < flag)\n", st->cmd);
    if (st->file)
        printf("# file: %s (from %s)\n", st->file,
               st->file_origin == ORIG_FLAG ? "--config" : "D3STREAM_CONFIG");
    for (size_t i = 0; i < CFG_N; i++) {
        const cfg_opt_t *o = &CFG_OPTS[i];
        if (!(o->cmds & st->bit))
            continue;
        printf("%s: ", o->name);
        if (!put_value(o, &st->val[i]))
            return false;
        printf("  # %s\n", ORIGIN_NAME[st->val[i].v ? st->val[i].origin : ORIG_DEFAULT]);
    }
    if (!(st->bit & CMD_SERVE))
        return true;
    printf("librdkafka:%s\n", st->n_props ? "" : " {}");
    for (size_t i = 0; i < st->n_props; i++) {
        fputs("  ", stdout);
        put_scalar(st->props[i].key);
        fputs(": ", stdout);
        if (is_secret_prop(st->props[i].key))
            put_scalar("****");
        else if (!put_masked(st->props[i].v))
            return false;
        printf("  # %s\n", ORIGIN_NAME[st->props[i].origin]);
    }
    return true;
}

int ops_cmd_config(int argc, char **argv) {
    const char *file = NULL;
    int         i = 1;
    while (i < argc && (!strcmp(argv[i], "--config") || !strncmp(argv[i], "--config=", 9))) {
        if (argv[i][8] == '=') {
            file = argv[i] + 9;
        } else if (i + 1 < argc) {
            file = argv[++i];
        } else {
            ops_fail("config", "--config needs a FILE");
            return OPS_EXIT_USAGE;
        }
        i++;
    }
    if (i < argc && (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))) {
        fputs(CONFIG_HELP, stdout);
        return OPS_EXIT_OK;
    }
    if (i >= argc || (strcmp(argv[i], "serve") != 0 && strcmp(argv[i], "http") != 0)) {
        fputs(CONFIG_HELP, stderr);
        return OPS_EXIT_USAGE;
    }
    const char *cmd = argv[i];
    int         n = argc - i, n_rest = 0;
    char      **rest = calloc((size_t)n + 1, sizeof *rest);
    if (!rest)
        return OPS_EXIT_FAILURE;
    if (!split_config(cmd, n, argv + i, &file, rest, &n_rest)) {
        free(rest);
        return OPS_EXIT_USAGE;
    }
    /* As serve --help and http --help: a broken file must not hide the help. */
    if (wants_help(n_rest, rest)) {
        free(rest);
        fputs(CONFIG_HELP, stdout);
        return OPS_EXIT_OK;
    }
    cfg_state_t st;
    int         rc = OPS_EXIT_USAGE;
    if (state_load(&st, "config", cmd, file)) {
        rc = flags_load(&st, n_rest, rest);
        if (rc < 0)
            rc = config_print(&st) && fflush(stdout) == 0 ? OPS_EXIT_OK : OPS_EXIT_FAILURE;
    }
    state_fini(&st);
    free(rest);
    return rc;
}
