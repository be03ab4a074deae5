/*
 * eng_pkgwrite.c -- `make-package`: the shapes, the seeded random weights
 * and the streamed safetensors writer, and eng_package_make itself.
 *
 * The weights are meaningless: they only have the shapes and rough scales
 * of a trained Qwen3.5 text tower (and, eng_pkgwrite_vision.c, its vision
 * tower), so that every code path (loading, forward passes, benchmarks)
 * runs on any machine without downloads.
 *
 * Determinism: every tensor gets its own xoshiro256** stream seeded from
 * (seed, tensor name), and normals are Irwin-Hall sums of four 16-bit
 * uniforms -- integer arithmetic and exact double sums only, no libm -- so
 * one seed gives byte-identical files on every machine and compiler.
 */
#include "eng_pkgwrite_int.h"
#include "eng_st_int.h"

#include <errno.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------------
 * Shapes
 *
 * tiny: tests/fixtures/tiny-upstream (tests/tools/gen_tower_golden.py).
 * nano (Qwen3.5-2B) and lite (Qwen3.5-0.8B): all three sizes share head_dim
 * 256, partial_rotary_factor 0.25, rope_theta 1e7, rms eps 1e-6, the output
 * gate and vocab 248,320.
 *   nano: /work/shared/docs/Q4NX.md section 2.1 and the config table of
 *     section 5 (hidden 2048, 24 layers full iff i % 4 == 3, FFN 6144,
 *     heads 8 / kv 2 / head_dim 256, DeltaNet 16 key + 16 value heads of
 *     dim 128, conv 4, vocab 248320, mrope_section [11, 11, 10],
 *     max_position_embeddings 262144, tied embeddings).
 *   lite: THUDM/slime scripts/models/qwen3.5-0.8B.sh (hidden 1024,
 *     24 layers, ffn 3584, 8 heads / 2 query groups, kv-channels 256,
 *     rotary-percent 0.25, rotary-base 1e7, vocab 248320); the DeltaNet
 *     heads (16, dims 128) from a third-party tutorial that uses "the
 *     Qwen3.5-0.8B Gated DeltaNet layers: 16 heads, d_k = d_v = 128"
 *     -- [unconfirmed: key vs value head counts were not seen in a
 *     config.json]; mrope_section, max_position_embeddings and tying are
 *     taken equal to the 2B's [unconfirmed].
 * max_length: 32,768 for lite/nano (D3-NANO-NPU2.md "up to 32,768 input
 * tokens per question"), 8,192 for tiny (its max_position_embeddings).
 * --------------------------------------------------------------------- */

/* lite and nano differ only in hidden and FFN widths (see above). */
#define QWEN35_SHAPE(name, real, hidden, inter)                                                    \
    {                                                                                              \
        name, real, hidden, 24, inter, 8, 2, 256, 16, 16, 128, 128, 4, 248320, 262144, 32768,      \
            {11, 11, 10}, true, true, NULL                                                         \
    }

static const pw_shape_t SHAPES[] = {
    [ENG_MAKE_TINY] = {"tiny",    "tiny-upstream test fixture",
                       64,        6,
                       128,       4,
                       2,         16,
                       2,         4,
                       16,        16,
                       4,         4048,
                       8192,      8192,
                       {1, 1, 0}, false,
                       false,     NULL},
    [ENG_MAKE_LITE] = QWEN35_SHAPE("lite", "Qwen3.5-0.8B", 1024, 3584),
    [ENG_MAKE_NANO] = QWEN35_SHAPE("nano", "Qwen3.5-2B", 2048, 6144),
};

const pw_shape_t *pw_shape_get(eng_make_size_t size) {
    SVC_ASSERT((size_t)size < sizeof SHAPES / sizeof SHAPES[0]);
    return &SHAPES[size];
}

/* tiny: [lin, lin, lin, full, lin, full] as the fixture. */
bool pw_layer_is_full(const pw_shape_t *s, size_t i) {
    if (s->full)
        return s->full[i];
    return s->every4 ? i % 4 == 3 : (i == 3 || i == 5);
}

bool eng_make_size_parse(const char *s, eng_make_size_t *out) {
    for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++)
        if (strcmp(s, SHAPES[i].name) == 0) {
            *out = (eng_make_size_t)i;
            return true;
        }
    return false;
}

const char *eng_make_size_name(eng_make_size_t size) {
    return pw_shape_get(size)->name;
}

/* ---------------------------------------------------------------------
 * Tensor list (SPEC e.6 names, the shapes eng_model.c checks)
 * --------------------------------------------------------------------- */

static svc_err_t pw_add(pw_list_t *l, const char *suffix, pw_init_t init, size_t rank, uint64_t d0,
                        uint64_t d1, uint64_t d2) {
    if (l->n == l->cap) {
        size_t       cap = l->cap ? l->cap * 2 : 64;
        pw_tensor_t *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return SVC_ERR_NOMEM;
        l->v = v;
        l->cap = cap;
    }
    pw_tensor_t *t = &l->v[l->n++];
    snprintf(t->name, sizeof t->name, PW_TEXT_PREFIX "%s", suffix);
    t->rank = rank;
    t->dims[0] = d0;
    t->dims[1] = d1;
    t->dims[2] = d2;
    t->init = init;
    return SVC_OK;
}

static svc_err_t pw_add_l(pw_list_t *l, size_t i, const char *rest, pw_init_t init, size_t rank,
                          uint64_t d0, uint64_t d1, uint64_t d2) {
    char s[80];
    snprintf(s, sizeof s, "layers.%zu.%s", i, rest);
    return pw_add(l, s, init, rank, d0, d1, d2);
}

static svc_err_t pw_linear_layer(pw_list_t *l, const pw_shape_t *s, size_t i) {
    uint64_t  H = s->hidden, kd = s->lin_nk * s->lin_dk, vd = s->lin_nv * s->lin_dv;
    svc_err_t err;
    if ((err = pw_add_l(l, i, "linear_attn.in_proj_qkv.weight", PW_LINEAR, 2, 2 * kd + vd, H, 0)) ||
        (err = pw_add_l(l, i, "linear_attn.in_proj_z.weight", PW_LINEAR, 2, vd, H, 0)) ||
        (err = pw_add_l(l, i, "linear_attn.in_proj_b.weight", PW_LINEAR, 2, s->lin_nv, H, 0)) ||
        (err = pw_add_l(l, i, "linear_attn.in_proj_a.weight", PW_LINEAR, 2, s->lin_nv, H, 0)) ||
        (err = pw_add_l(l, i, "linear_attn.dt_bias", PW_DT_BIAS, 1, s->lin_nv, 0, 0)) ||
        (err = pw_add_l(l, i, "linear_attn.A_log", PW_A_LOG, 1, s->lin_nv, 0, 0)) ||
        (err = pw_add_l(l, i, "linear_attn.norm.weight", PW_NORM_GATE, 1, s->lin_dv, 0, 0)) ||
        (err = pw_add_l(l, i, "linear_attn.out_proj.weight", PW_LINEAR, 2, H, vd, 0)))
        return err;
    return pw_add_l(l, i, "linear_attn.conv1d.weight", PW_CONV, 3, 2 * kd + vd, 1, s->conv_k);
}

static svc_err_t pw_full_layer(pw_list_t *l, const pw_shape_t *s, size_t i) {
    uint64_t  H = s->hidden, hd = s->head_dim, kvd = s->n_kv * hd;
    svc_err_t err;
    /* q_proj is twice as wide: per head [query, output gate] (attn_output_gate) */
    if ((err =
             pw_add_l(l, i, "self_attn.q_proj.weight", PW_LINEAR, 2, 2 * s->n_heads * hd, H, 0)) ||
        (err = pw_add_l(l, i, "self_attn.k_proj.weight", PW_LINEAR, 2, kvd, H, 0)) ||
        (err = pw_add_l(l, i, "self_attn.v_proj.weight", PW_LINEAR, 2, kvd, H, 0)) ||
        (err = pw_add_l(l, i, "self_attn.o_proj.weight", PW_LINEAR, 2, H, s->n_heads * hd, 0)) ||
        (err = pw_add_l(l, i, "self_attn.q_norm.weight", PW_NORM_1P, 1, hd, 0, 0)))
        return err;
    return pw_add_l(l, i, "self_attn.k_norm.weight", PW_NORM_1P, 1, hd, 0, 0);
}

static int pw_cmp(const void *a, const void *b) {
    return strcmp(((const pw_tensor_t *)a)->name, ((const pw_tensor_t *)b)->name);
}

/* Every text-tower tensor, sorted by name (the safetensors convention). */
svc_err_t pw_tensors(const pw_shape_t *s, size_t vocab, pw_list_t *l) {
    uint64_t  H = s->hidden, I = s->inter;
    svc_err_t err = pw_add(l, "embed_tokens.weight", PW_EMBED, 2, vocab, H, 0);
    if (!err)
        err = pw_add(l, "norm.weight", PW_NORM_1P, 1, H, 0, 0);
    for (size_t i = 0; !err && i < s->n_layers; i++) {
        if ((err = pw_add_l(l, i, "input_layernorm.weight", PW_NORM_1P, 1, H, 0, 0)) ||
            (err = pw_add_l(l, i, "post_attention_layernorm.weight", PW_NORM_1P, 1, H, 0, 0)) ||
            (err = pw_add_l(l, i, "mlp.gate_proj.weight", PW_LINEAR, 2, I, H, 0)) ||
            (err = pw_add_l(l, i, "mlp.up_proj.weight", PW_LINEAR, 2, I, H, 0)) ||
            (err = pw_add_l(l, i, "mlp.down_proj.weight", PW_LINEAR, 2, H, I, 0)))
            break;
        err = pw_layer_is_full(s, i) ? pw_full_layer(l, s, i) : pw_linear_layer(l, s, i);
    }
    if (!err)
        qsort(l->v, l->n, sizeof *l->v, pw_cmp);
    return err;
}

uint64_t pw_numel(const pw_tensor_t *t) {
    uint64_t n = 1;
    for (size_t i = 0; i < t->rank; i++)
        n *= t->dims[i];
    return n;
}

uint64_t eng_make_text_params(eng_make_size_t size, size_t vocab) {
    const pw_shape_t *s = pw_shape_get(size);
    pw_list_t         l = {0};
    uint64_t          n = 0;
    if (pw_tensors(s, vocab ? vocab : s->vocab, &l) == SVC_OK)
        for (size_t i = 0; i < l.n; i++)
            n += pw_numel(&l.v[i]);
    free(l.v);
    return n;
}

/* ---------------------------------------------------------------------
 * Seeded random numbers (splitmix64 seeding, xoshiro256**)
 * --------------------------------------------------------------------- */

typedef struct pw_rng {
    uint64_t s[4];
} pw_rng_t;

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(pw_rng_t *r) {
    uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

/* A stream per (seed, name): FNV-1a of the name mixed into the seed, so a
 * tensor's values do not depend on which tensors come before it. */
static void rng_seed(pw_rng_t *r, uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    uint64_t x = seed ^ h;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

/* N(0, 1) approximately: the sum of four U(0,1) (16 bits each) has mean 2
 * and variance 1/3. Exact in double, hence the same everywhere. */
static double rng_normal(pw_rng_t *r) {
    uint64_t x = rng_next(r);
    double   sum = 0;
    for (int i = 0; i < 4; i++, x >>= 16)
        sum += ((double)(x & 0xffff) + 0.5) / 65536.0;
    return (sum - 2.0) * 1.7320508075688772; /* sqrt(3) */
}

static double rng_uniform(pw_rng_t *r, double lo, double hi) {
    return lo + (hi - lo) * ((double)(rng_next(r) >> 11) / 9007199254740992.0); /* 2^53 */
}

/* f32 -> bf16, round to nearest even (NaN cannot occur here). */
static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* 0.9 / sqrt(in) without libm: Newton's iteration is exact enough and
 * the same everywhere (only + * / on doubles). */
static double inv_sqrt(double x) {
    double y = 1.0;
    while (y * y * x > 1.0)
        y *= 0.5;
    for (int i = 0; i < 60; i++)
        y = y * (1.5 - 0.5 * x * y * y);
    return y;
}

/* 0.9 / sqrt(in) of a PW_LINEAR tensor [out, in...]: in is the product of
 * the other dims (patch_embed's Conv3d sees 3 x T x P x P inputs). */
static double pw_lin_std(const pw_tensor_t *t) {
    if (t->rank < 2)
        return 0;
    double in = 1;
    for (size_t i = 1; i < t->rank; i++)
        in *= (double)t->dims[i];
    return 0.9 * inv_sqrt(in);
}

/* lin_std: pw_lin_std(t), computed once per tensor. */
static double pw_value(pw_rng_t *r, const pw_tensor_t *t, double lin_std) {
    switch (t->init) {
    case PW_LINEAR:
        return lin_std * rng_normal(r);
    case PW_EMBED:
    case PW_NORM_1P:
        return 0.1 * rng_normal(r);
    case PW_NORM_GATE:
        return 1.0 + 0.1 * rng_normal(r);
    case PW_CONV:
        return 0.3 * rng_normal(r);
    case PW_A_LOG:
        return rng_uniform(r, -0.69, 2.08);
    case PW_DT_BIAS:
        return rng_uniform(r, -1.5, 1.0);
    case PW_BIAS:
        return 0.02 * rng_normal(r);
    case PW_LN_GAIN:
        return 1.0 + 0.1 * rng_normal(r);
    }
    return 0;
}

/* ---------------------------------------------------------------------
 * Files
 * --------------------------------------------------------------------- */

typedef struct pw_out {
    FILE       *f;
    char       *path;
    const char *name;
    uint64_t    done, total, next_report;
} pw_out_t;

static svc_err_t pw_open(const pw_ctx_t *c, const char *name, pw_out_t *o) {
    o->name = name;
    o->path = eng_path_join(c->opts->out_dir, name);
    if (!o->path)
        return SVC_ERR_NOMEM;
    o->f = fopen(o->path, "wb");
    if (!o->f) {
        svc_errf(c->errstr, c->errstr_size, "open() \"%s\" failed: %s", o->path, strerror(errno));
        free(o->path);
        return SVC_ERR_IO;
    }
    return SVC_OK;
}

/* Closes o; on an earlier or a close error the message names the file. */
static svc_err_t pw_close(const pw_ctx_t *c, pw_out_t *o, svc_err_t err) {
    bool bad = ferror(o->f) != 0;
    if (fclose(o->f) != 0)
        bad = true;
    if (!err && bad) {
        svc_errf(c->errstr, c->errstr_size, "write() \"%s\" failed: %s", o->path, strerror(errno));
        err = SVC_ERR_IO;
    }
    free(o->path);
    return err;
}

static svc_err_t pw_put(const pw_ctx_t *c, pw_out_t *o, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, o->f) != n) {
        svc_errf(c->errstr, c->errstr_size, "write() \"%s\" failed: %s", o->path, strerror(errno));
        return SVC_ERR_IO;
    }
    o->done += n;
    if (c->opts->progress && o->done >= o->next_report) {
        c->opts->progress(o->done, o->total, c->opts->progress_user);
        o->next_report += o->total / 20 ? o->total / 20 : 1; /* every 5% */
    }
    return SVC_OK;
}

svc_err_t pw_write_file(const pw_ctx_t *c, const char *name, const void *p, size_t n) {
    pw_out_t o = {0};
    o.next_report = UINT64_MAX; /* no progress for small files */
    svc_err_t err = pw_open(c, name, &o);
    if (err)
        return err;
    return pw_close(c, &o, fwrite(p, 1, n, o.f) == n ? SVC_OK : SVC_ERR_IO);
}

/* The safetensors header: u64 LE length, then the JSON object, padded
 * with spaces so that the data region starts 8-byte aligned. */
static svc_err_t st_header(const pw_tensor_t *v, size_t n, const char *dtype, size_t esize,
                           svc_buf_t *b) {
    uint64_t  off = 0;
    svc_err_t err = svc_buf_add(b, "\0\0\0\0\0\0\0\0", 8);
    if (!err)
        err = svc_buf_addf(b, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < n && !err; i++) {
        uint64_t bytes = pw_numel(&v[i]) * esize;
        err = svc_buf_addf(b, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", v[i].name, dtype);
        for (size_t d = 0; d < v[i].rank && !err; d++)
            err = svc_buf_addf(b, "%s%llu", d ? "," : "", (unsigned long long)v[i].dims[d]);
        if (!err)
            err = svc_buf_addf(b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                               (unsigned long long)(off + bytes));
        off += bytes;
    }
    if (!err)
        err = svc_buf_addc(b, '}');
    while (!err && (b->len - 8) % 8)
        err = svc_buf_addc(b, ' ');
    uint64_t hl = b->len - 8;
    for (int i = 0; !err && i < 8; i++)
        b->data[i] = (char)(uint8_t)(hl >> (8 * i));
    return err;
}

#define PW_CHUNK 65536 /* elements generated and written at a time */

/* One tensor's values, generated and written chunk by chunk. */
static svc_err_t st_tensor(const pw_ctx_t *c, pw_out_t *o, const pw_tensor_t *t, bool f32,
                           double scale, uint8_t *buf) {
    pw_rng_t r;
    rng_seed(&r, c->opts->seed, t->name);
    uint64_t  left = pw_numel(t);
    size_t    es = f32 ? 4 : 2;
    double    lin_std = pw_lin_std(t);
    svc_err_t err = SVC_OK;
    while (left && !err) {
        size_t k = left < PW_CHUNK ? (size_t)left : PW_CHUNK;
        for (size_t i = 0; i < k; i++) {
            float    v = (float)(scale * (f32 ? rng_normal(&r) : pw_value(&r, t, lin_std)));
            uint32_t u;
            memcpy(&u, &v, sizeof u);
            if (!f32)
                u = f32_to_bf16(v);
            for (size_t j = 0; j < es; j++)
                buf[i * es + j] = (uint8_t)(u >> (8 * j)); /* little-endian */
        }
        err = pw_put(c, o, buf, k * es);
        left -= k;
    }
    return err;
}

/* One tensor from fill, whole, written as F32 in chunks. */
static svc_err_t st_tensor_filled(const pw_ctx_t *c, pw_out_t *o, const pw_tensor_t *t,
                                  const pw_fill_t *fill, uint8_t *buf) {
    uint64_t n = pw_numel(t);
    float   *x = malloc((size_t)n * sizeof *x);
    if (!x)
        return SVC_ERR_NOMEM;
    svc_err_t err = fill->fn(t, x, fill->user, c->errstr, c->errstr_size);
    for (uint64_t at = 0; at < n && !err; at += PW_CHUNK) {
        size_t k = n - at < PW_CHUNK ? (size_t)(n - at) : PW_CHUNK;
        for (size_t i = 0; i < k; i++) {
            uint32_t u;
            memcpy(&u, &x[at + i], sizeof u);
            for (size_t j = 0; j < 4; j++)
                buf[i * 4 + j] = (uint8_t)(u >> (8 * j)); /* little-endian */
        }
        err = pw_put(c, o, buf, k * 4);
    }
    free(x);
    return err;
}

svc_err_t pw_st_write(const pw_ctx_t *c, const char *name, const pw_tensor_t *v, size_t n, bool f32,
                      double scale, const pw_fill_t *fill) {
    svc_buf_t hdr;
    svc_buf_init(&hdr, (size_t)ENG_ST_MAX_HEADER + 8);
    f32 = f32 || fill;
    svc_err_t err = st_header(v, n, f32 ? "F32" : "BF16", f32 ? 4 : 2, &hdr);
    uint8_t  *buf = malloc(PW_CHUNK * 4);
    pw_out_t  o = {0};
    if (!err && !buf)
        err = SVC_ERR_NOMEM;
    if (!err)
        err = pw_open(c, name, &o);
    if (err) {
        free(buf);
        svc_buf_fini(&hdr);
        return err;
    }
    setvbuf(o.f, NULL, _IOFBF, 1u << 22);
    o.total = hdr.len;
    for (size_t i = 0; i < n; i++)
        o.total += pw_numel(&v[i]) * (f32 ? 4 : 2);
    o.next_report = f32 ? UINT64_MAX : 0;
    err = pw_put(c, &o, hdr.data, hdr.len);
    for (size_t i = 0; i < n && !err; i++)
        err = fill ? st_tensor_filled(c, &o, &v[i], fill, buf)
                   : st_tensor(c, &o, &v[i], f32, scale, buf);
    free(buf);
    svc_buf_fini(&hdr);
    return pw_close(c, &o, err);
}

svc_err_t pw_readout(const pw_ctx_t *c) {
    /* readout `weight` [255, hidden] f32 (SPEC d.5); 1/sqrt(hidden) keeps
     * the logits of a unit-RMS final hidden state near N(0, 1). */
    pw_tensor_t ro = {"weight", 2, {ENG_N_CODES, c->shape->hidden, 0}, PW_LINEAR};
    return pw_st_write(c, "readout.safetensors", &ro, 1, true, inv_sqrt((double)c->shape->hidden),
                       NULL);
}

/* model.safetensors: the text tower, then the vision tower ("model.visual."
 * sorts after "model.language_model.", so the list stays sorted). */
svc_err_t pw_weights(const pw_ctx_t *c) {
    pw_list_t l = {0};
    svc_err_t err = pw_tensors(c->shape, c->vocab, &l);
    if (!err)
        err = pw_vision_tensors(pw_vision_get(c->opts->size), &l);
    if (!err)
        err = pw_st_write(c, "model.safetensors", l.v, l.n, false, 1.0, NULL);
    free(l.v);
    return err ? err : pw_readout(c);
}

void pw_gen_f32(const pw_ctx_t *c, const pw_tensor_t *t, float *out) {
    pw_rng_t r;
    rng_seed(&r, c->opts->seed, t->name);
    uint64_t n = pw_numel(t);
    double   lin_std = pw_lin_std(t);
    for (uint64_t i = 0; i < n; i++) {
        /* the same draws and rounding as st_tensor's BF16 path */
        uint32_t u = (uint32_t)f32_to_bf16((float)pw_value(&r, t, lin_std)) << 16;
        memcpy(&out[i], &u, sizeof u);
    }
}

/* ---------------------------------------------------------------------
 * eng_package_make
 * --------------------------------------------------------------------- */

/* mkdir -p */
svc_err_t pw_mkdirs(const char *dir, char *errstr, size_t n) {
    char  *p = strdup(dir);
    size_t len = p ? strlen(p) : 0;
    if (!p)
        return SVC_ERR_NOMEM;
    for (size_t i = 1; i <= len; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        char keep = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            svc_errf(errstr, n, "mkdir() \"%s\" failed: %s", p, strerror(errno));
            free(p);
            return SVC_ERR_IO;
        }
        p[i] = keep;
    }
    free(p);
    return SVC_OK;
}

/* Makes both directories and refuses one directory named twice ("p" and
 * "p/", "./p", a link): the twin would overwrite the package's config.json
 * and README.md and break its MANIFEST.sha256. Identity, not spelling,
 * decides, so the directories must exist first. */
static svc_err_t pw_make_dirs(const eng_make_opts_t *opts, char *errstr, size_t n) {
    svc_err_t err = pw_mkdirs(opts->out_dir, errstr, n);
    if (err || !opts->twin_dir)
        return err;
    err = pw_mkdirs(opts->twin_dir, errstr, n);
    struct stat a, b;
    if (err)
        return err;
    if (stat(opts->out_dir, &a) != 0 || stat(opts->twin_dir, &b) != 0) {
        svc_errf(errstr, n, "stat() of \"%s\" or \"%s\" failed: %s", opts->out_dir, opts->twin_dir,
                 strerror(errno));
        return SVC_ERR_IO;
    }
    if (a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
        svc_errf(errstr, n, "the twin \"%s\" is the package's own directory \"%s\"", opts->twin_dir,
                 opts->out_dir);
        return SVC_ERR_INVALID;
    }
    return SVC_OK;
}

svc_err_t eng_package_make(const eng_make_opts_t *opts, char *errstr, size_t errstr_size) {
    if (errstr_size)
        errstr[0] = '\0';
    if (opts->twin_dir && opts->format != ENG_MAKE_Q4NX) {
        svc_errf(errstr, errstr_size, "a twin package is written for --format q4nx only");
        return SVC_ERR_INVALID;
    }
    const eng_make_q4nx_t *q = &opts->q4nx;
    if ((q->tiles || q->raster_a || q->embed_bf16 || q->alpha_tiles) &&
        opts->format != ENG_MAKE_Q4NX) {
        svc_errf(errstr, errstr_size, "a model.q4nx layout is written for --format q4nx only");
        return SVC_ERR_INVALID;
    }
    if ((unsigned)q->tiles > ENG_MAKE_TILES_Q4_0) {
        svc_errf(errstr, errstr_size, "model.q4nx tiles %d: not a kind", (int)q->tiles);
        return SVC_ERR_INVALID;
    }
    pw_ctx_t  c = {.opts = opts,
                   .shape = pw_shape_get(opts->size),
                   .errstr = errstr,
                   .errstr_size = errstr_size};
    svc_err_t err = pw_make_dirs(opts, errstr, errstr_size);
    if (!err)
        err = pw_tokenizer(&c);
    if (!err)
        err = pw_vision_tokens(&c);
    if (!err) {
        /* the real vocabulary is a floor: nano/lite keep the checkpoint's
         * embedding size even with our small tokenizer (ids past the
         * tokenizer are never looked up). */
        size_t n_ids = eng_tokenizer_n_ids(c.tok);
        c.vocab = opts->size == ENG_MAKE_TINY || n_ids > c.shape->vocab ? n_ids : c.shape->vocab;
        err = opts->format == ENG_MAKE_Q4NX ? pw_q4nx_package(&c) : pw_weights(&c);
    }
    if (!err && opts->format != ENG_MAKE_Q4NX)
        err = pw_meta(&c);
    if (!err && opts->format != ENG_MAKE_Q4NX)
        err = pw_manifest(&c);
    if (err == SVC_ERR_NOMEM && errstr_size && !errstr[0])
        svc_errf(errstr, errstr_size, "out of memory writing \"%s\"", opts->out_dir);
    eng_tokenizer_free(c.tok);
    return err;
}
