/*
 * test_vision.c -- the vision tower and image prompts (issue 6) against the
 * transformers goldens of tests/tools/gen_vision_golden.py (layout in its
 * docstring): the tiny VL package tests/fixtures/tiny-vl, five images
 * (PNG, JPEG, WebP; upscaled, downscaled, wide), and System One requests
 * with one and two images in both attention modes.
 *
 * Bounds (issue 6): pixels within 1/255 of the reference processor's, the
 * tower's output within 1e-4 relative (max-norm), probabilities within
 * 1e-4. The tower is checked twice: from the reference's own resized
 * pixels (the tower alone) and from the image file (decode + resize +
 * tower, the product's path).
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eng_answer_int.h"
#include "eng_fwd_int.h"
#include "eng_image_int.h"
#include "eng_vision_int.h"
#include "engine.h"
#include "npu.h"
#include "test_cmd.h"
#include "test_rng.h"
#include "test_util.h"

#define PKG  D3_SOURCE_DIR "/tests/fixtures/tiny-vl"
#define GOLD D3_SOURCE_DIR "/tests/golden/vision"

#define TOWER_TOL 1e-4
#define PROB_TOL  1e-4

/* ------------------------------------------------------------ golden files */

static json_t *g_index;

static json_t *index_json(void) {
    if (!g_index) {
        json_error_t e;
        g_index = json_load_file(GOLD "/index.json", 0, &e);
        cr_assert(g_index, "index.json: %s", e.text);
    }
    return g_index;
}

static void *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(len > 0 ? (size_t)len : 1);
    cr_assert(p);
    cr_assert_eq(fread(p, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return p;
}

/* Array `name` of index.json: its bytes and element count. */
static void *array(const char *name, size_t elem, size_t *count) {
    const json_t *arrs = json_object_get(index_json(), "arrays");
    for (size_t i = 0; i < json_array_size(arrs); i++) {
        const json_t *a = json_array_get(arrs, i);
        if (strcmp(json_string_value(json_object_get(a, "name")), name) != 0)
            continue;
        char path[512];
        snprintf(path, sizeof path, GOLD "/%s", json_string_value(json_object_get(a, "file")));
        size_t n;
        void  *p = read_file(path, &n);
        cr_assert_eq(n % elem, 0);
        *count = n / elem;
        return p;
    }
    cr_assert_fail("no array %s", name);
    return NULL;
}

static const json_t *image_case(const char *name) {
    const json_t *imgs = json_object_get(index_json(), "images");
    for (size_t i = 0; i < json_array_size(imgs); i++)
        if (strcmp(json_string_value(json_object_get(json_array_get(imgs, i), "name")), name) == 0)
            return json_array_get(imgs, i);
    cr_assert_fail("no image %s", name);
    return NULL;
}

static size_t jint(const json_t *o, const char *k, size_t i) {
    return (size_t)json_integer_value(json_array_get(json_object_get(o, k), i));
}

static const char *role(const json_t *c, const char *r) {
    return json_string_value(json_object_get(json_object_get(c, "arrays"), r));
}

/* The image file of a case as sch_image validated it. */
static void image_bytes(const json_t *c, sch_image_t *img, unsigned char **owned) {
    char path[512];
    snprintf(path, sizeof path, GOLD "/%s", json_string_value(json_object_get(c, "file")));
    size_t n;
    *owned = read_file(path, &n);
    const char *fmt = json_string_value(json_object_get(c, "format"));
    img->bytes = *owned;
    img->len = n;
    img->format = strcmp(fmt, "PNG") == 0 ? "png" : strcmp(fmt, "JPEG") == 0 ? "jpeg" : "webp";
    img->height = (uint32_t)jint(c, "source_size", 0);
    img->width = (uint32_t)jint(c, "source_size", 1);
}

static loaded_t g_l;

static void setup(void) {
    load(PKG, &g_l);
}

static void teardown(void) {
    unload(&g_l);
    json_decref(g_index);
    g_index = NULL;
}

TestSuite(vision, .init = setup, .fini = teardown, .timeout = 600);

/* ------------------------------------------------------------ package */

Test(vision, package_has_a_tower) {
    cr_assert(eng_model_has_vision(g_l.model));
    cr_assert_eq(eng_model_image_token_id(g_l.model), 4041);
    char errstr[512] = "";
    cr_assert_eq(eng_model_check_parameters(g_l.model, PKG, errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
    cr_assert_eq(eng_model_check_package(g_l.model, g_l.pkg, errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
}

/* SPEC e.7: the tokenizer's <|image_pad|> must be config.json's
 * image_token_id, which a (BF16) config must give; else the images would
 * be placed at another token's positions, or never. */
Test(vision, image_token_must_match_the_tokenizer) {
    static const struct {
        const char *sed, *says;
    } cases[] = {
        {"s/\"image_token_id\": 4041/\"image_token_id\": 4038/", "image_token_id 4038"},
        {"/\"image_token_id\"/d", "config.json has no image_token_id"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char dir[] = "/tmp/d3stream-imgtok-XXXXXX", cmd[1024];
        cr_assert(mkdtemp(dir));
        snprintf(cmd, sizeof cmd, "cp -r '%s'/. '%s' && sed -i '%s' '%s/config.json'", PKG, dir,
                 cases[k].sed, dir);
        cr_assert_eq(system(cmd), 0);
        loaded_t l;
        load(dir, &l);
        char errstr[512] = "";
        cr_assert_eq(eng_model_check_package(l.model, l.pkg, errstr, sizeof errstr),
                     SVC_ERR_FORMAT);
        cr_assert(strstr(errstr, "the tokenizer's image token differs from config.json") &&
                      strstr(errstr, "<|image_pad|> is 4041") && strstr(errstr, cases[k].says),
                  "%s", errstr);
        unload(&l);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        cr_assert_eq(system(cmd), 0);
    }
}

/* ------------------------------------------------------------ tower */

/* The tower on the reference's resized pixels: the patch rows (sampled)
 * and the merged tokens. */
static void tower_from_pixels(const char *name) {
    const json_t *c = image_case(name);
    size_t        H = jint(c, "resized", 0), W = jint(c, "resized", 1), n;
    eng_rgb_t     rgb = {(uint32_t)W, (uint32_t)H, array(role(c, "resized_u8"), 1, &n)};
    cr_assert_eq(n, H * W * 3);
    const eng_vision_t *v = g_l.model->vision;
    float              *rows = NULL;
    size_t              gh, gw;
    cr_assert_eq(eng_image_patches(&rgb, v->proc, &rows, &gh, &gw), SVC_OK);
    cr_assert_eq(gh, jint(c, "grid", 1));
    cr_assert_eq(gw, jint(c, "grid", 2));
    size_t        E = eng_vis_patch_elems(&v->cfg), R;
    float        *ref_rows = array(role(c, "pixel_rows"), 4, &R);
    const json_t *idx = json_object_get(c, "pixel_rows");
    R /= E;
    cr_assert_eq(R, json_array_size(idx));
    for (size_t k = 0; k < R; k++) {
        size_t r = (size_t)json_integer_value(json_array_get(idx, k));
        double e = rel_err(rows + r * E, ref_rows + k * E, E);
        cr_expect(e <= 1e-6, "%s: patch row %zu: %.3g", name, r, e);
    }
    size_t T = gh * gw / 4, m;
    float *out = nans(T * v->cfg.out_hidden);
    float *ref = array(role(c, "tower"), 4, &m);
    cr_assert_eq(m, T * v->cfg.out_hidden);
    char errstr[512] = "";
    cr_assert_eq(eng_vision_forward(v, false, rows, gh, gw, out, errstr, sizeof errstr), SVC_OK,
                 "%s", errstr);
    double e = rel_err(out, ref, m);
    cr_log_info("%s: tower from the reference pixels: %.3g", name, e);
    cr_expect(e <= TOWER_TOL, "%s: tower %.3g", name, e);
    free(out);
    free(ref);
    free(ref_rows);
    free(rows);
    free(rgb.px);
}

Test(vision, tower_png_64x48) {
    tower_from_pixels("png_64x48");
}
Test(vision, tower_jpeg_300x200) {
    tower_from_pixels("jpeg_300x200");
}
Test(vision, tower_webp_200x300) {
    tower_from_pixels("webp_200x300");
}
Test(vision, tower_png_900x96) {
    tower_from_pixels("png_900x96");
}

/* The product's path from the file: prepare (decode, smart resize,
 * resize) and encode, against the reference's pixels and tower. */
static void tower_from_file(const char *name) {
    const json_t     *c = image_case(name);
    sch_image_t       img;
    unsigned char    *bytes;
    eng_image_prep_t *prep = NULL;
    char              errstr[512] = "";
    image_bytes(c, &img, &bytes);
    cr_assert_eq(eng_image_prepare(g_l.model, &img, &prep, errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
    cr_assert_eq(eng_image_prep_tokens(prep),
                 (size_t)json_integer_value(json_object_get(c, "tokens")));
    eng_image_emb_t emb;
    cr_assert_eq(eng_image_encode(g_l.model, prep, &emb, errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
    size_t m;
    float *ref = array(role(c, "tower"), 4, &m);
    cr_assert_eq(m, emb.gh * emb.gw * emb.hidden);
    cr_assert_eq(emb.gh * 2, jint(c, "grid", 1));
    double e = rel_err(emb.rows, ref, m);
    cr_log_info("%s: tower from the file: %.3g", name, e);
    cr_expect(e <= TOWER_TOL, "%s: tower from the file %.3g", name, e);
    free(ref);
    eng_image_emb_fini(&emb);
    eng_image_prep_free(prep);
    free(bytes);
}

Test(vision, file_png_64x48) {
    tower_from_file("png_64x48");
}
Test(vision, file_jpeg_300x200) {
    tower_from_file("jpeg_300x200");
}
Test(vision, file_webp_200x300) {
    tower_from_file("webp_200x300");
}
Test(vision, file_png_900x96) {
    tower_from_file("png_900x96");
}
Test(vision, file_jpeg_1400x1300_downscaled) {
    tower_from_file("jpeg_1400x1300");
}

/* ------------------------------------------------------------ full model */

/* The golden's expanded ids with each image's run of pads as image k's
 * ids (slot k), the images encoded from their files. */
typedef struct rec_in {
    int32_t               *ids;
    size_t                 T;
    eng_image_emb_t        embs[4];
    const eng_image_emb_t *ptrs[4];
    eng_media_t            media;
} rec_in_t;

static const json_t *request_case(const char *name) {
    const json_t *rs = json_object_get(index_json(), "requests");
    for (size_t i = 0; i < json_array_size(rs); i++)
        if (strcmp(json_string_value(json_object_get(json_array_get(rs, i), "name")), name) == 0)
            return json_array_get(rs, i);
    cr_assert_fail("no request %s", name);
    return NULL;
}

static void rec_in(const json_t *rec, rec_in_t *in) {
    memset(in, 0, sizeof *in);
    const json_t *rq = request_case(json_string_value(json_object_get(rec, "request")));
    const json_t *names = json_object_get(rq, "images");
    char          errstr[512] = "";
    for (size_t k = 0; k < json_array_size(names); k++) {
        const json_t     *c = image_case(json_string_value(json_array_get(names, k)));
        sch_image_t       img;
        unsigned char    *bytes;
        eng_image_prep_t *prep = NULL;
        image_bytes(c, &img, &bytes);
        cr_assert_eq(eng_image_prepare(g_l.model, &img, &prep, errstr, sizeof errstr), SVC_OK);
        cr_assert_eq(eng_image_encode(g_l.model, prep, &in->embs[k], errstr, sizeof errstr), SVC_OK,
                     "%s", errstr);
        in->ptrs[k] = &in->embs[k];
        eng_image_prep_free(prep);
        free(bytes);
    }
    in->media.slots = in->ptrs;
    in->media.n_slots = json_array_size(names);
    in->ids = array(role(rec, "input_ids"), 4, &in->T);
    const json_t *spans = json_object_get(rec, "image_token_spans");
    for (size_t k = 0; k < json_array_size(spans); k++) {
        const json_t *sp = json_array_get(spans, k);
        size_t        at = (size_t)json_integer_value(json_array_get(sp, 0));
        size_t        n = (size_t)json_integer_value(json_array_get(sp, 1));
        cr_assert_eq(n, in->embs[k].gh * in->embs[k].gw);
        for (size_t j = 0; j < n; j++) {
            cr_assert_eq(in->ids[at + j], 4041);
            in->ids[at + j] = ENG_IMAGE_ID(k, j);
        }
    }
}

static void rec_fini(rec_in_t *in) {
    for (size_t k = 0; k < 4; k++)
        eng_image_emb_fini(&in->embs[k]);
    free(in->ids);
}

/* One record: the forward over its ids (its attention mode) against the
 * final hidden state and the probabilities. */
static void record_forward(const json_t *rec) {
    const char *name = json_string_value(json_object_get(rec, "name"));
    bool     noncausal = strcmp(json_string_value(json_object_get(rec, "mode")), "noncausal") == 0;
    rec_in_t in;
    rec_in(rec, &in);
    size_t H = eng_model_hidden_size(g_l.model), m;
    float *h = nans(H);
    char   errstr[512] = "";
    cr_assert_eq(eng_model_forward_media(g_l.model, NULL, false, in.ids, in.T, &in.media, noncausal,
                                         h, NULL, NULL, errstr, sizeof errstr),
                 SVC_OK, "%s: %s", name, errstr);
    float *ref = array(role(rec, "final_last"), 4, &m);
    double e = rel_err(h, ref, H);
    cr_expect(e <= TOWER_TOL, "%s: final hidden %.3g", name, e);
    size_t        n = (size_t)json_integer_value(json_object_get(rec, "n_options"));
    double        probs[8];
    const json_t *pf = json_object_get(rec, "probs_f64");
    cr_assert_eq(eng_readout_probs(g_l.model, h, n, eng_package_temperature(g_l.pkg), probs),
                 SVC_OK);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(probs[i] - json_number_value(json_array_get(pf, i)));
        worst = d > worst ? d : worst;
    }
    cr_log_info("%s: final hidden %.3g, probabilities %.3g", name, e, worst);
    cr_expect(worst <= PROB_TOL, "%s: probabilities off by %.3g", name, worst);
    free(ref);
    free(h);
    rec_fini(&in);
}

Test(vision, records_forward) {
    const json_t *recs = json_object_get(index_json(), "records");
    cr_assert(json_array_size(recs) >= 8);
    for (size_t i = 0; i < json_array_size(recs); i++)
        record_forward(json_array_get(recs, i));
}

/* ------------------------------------------------------------ requests */

/* A request of the golden set, decoded for the VL package. */
/* A valid request body, decoded against the vision package (what: for
 * the failure message). */
static sch_request_t *decode_for_package(const char *body, size_t len, const char *what) {
    const char      *names[2] = {eng_package_model_id(g_l.pkg), PKG};
    sch_model_info_t info = {
        .names = names, .n_names = 2, .label = eng_package_model_id(g_l.pkg), .has_vision = true};
    sch_limits_t   limits = {SCH_DEFAULT_MAX_REQUEST_BYTES};
    sch_request_t *req = NULL;
    sch_error_t    e;
    sch_error_init(&e);
    cr_assert_eq(sch_request_decode(body, len, &limits, &info, &req, &e), SVC_OK, "%s: %s", what,
                 e.message ? e.message : "?");
    sch_error_fini(&e);
    return req;
}

static sch_request_t *golden_request(const char *name) {
    const json_t *rq = request_case(name);
    char         *body = json_dumps(json_object_get(rq, "request"), JSON_COMPACT);
    cr_assert(body);
    sch_request_t *req = decode_for_package(body, strlen(body), name);
    free(body);
    return req;
}

/* The golden record of request rq, question q, in the package's mode. */
static const json_t *record_of(const char *rq, const char *q) {
    const json_t *recs = json_object_get(index_json(), "records");
    const char   *mode = eng_package_noncausal(g_l.pkg) ? "noncausal" : "causal";
    for (size_t i = 0; i < json_array_size(recs); i++) {
        const json_t *r = json_array_get(recs, i);
        if (!strcmp(json_string_value(json_object_get(r, "request")), rq) &&
            !strcmp(json_string_value(json_object_get(r, "question")), q) &&
            !strcmp(json_string_value(json_object_get(r, "mode")), mode))
            return r;
    }
    cr_assert_fail("no record %s/%s/%s", rq, q, mode);
    return NULL;
}

static void expect_golden_probs(const char *rq, const sch_request_t *req,
                                const eng_answers_t *ans) {
    const sch_part_t          *part = sch_request_part(req, 0);
    const sch_result_t *const *res = eng_answers_results(ans);
    for (size_t i = 0; i < part->n_questions; i++) {
        char id[64];
        snprintf(id, sizeof id, "%.*s", (int)part->questions[i].id_len, part->questions[i].id);
        const json_t *pf = json_object_get(record_of(rq, id), "probs_f64");
        cr_assert(res[0][i].probs, "%s/%s: no probabilities (%s)", rq, id,
                  res[0][i].error_code ? res[0][i].error_code : "-");
        for (size_t k = 0; k < json_array_size(pf); k++) {
            double d = fabs(res[0][i].probs[k] - json_number_value(json_array_get(pf, k)));
            cr_expect(d <= PROB_TOL, "%s/%s: option %zu off by %.3g", rq, id, k, d);
        }
    }
}

/* eng_answer_request: the request's images decoded and encoded once each,
 * its prompts expanded, the package's mode; probabilities and usage. */
Test(vision, answer_request_matches_golden) {
    static const char *const names[] = {"one_image", "two_images", "wide_image"};
    for (size_t n = 0; n < 3; n++) {
        sch_request_t *req = golden_request(names[n]);
        eng_answers_t *ans = NULL;
        char           errstr[512] = "";
        cr_assert_eq(eng_answer_request(g_l.pkg, g_l.model, req, &ans, NULL, errstr, sizeof errstr),
                     SVC_OK, "%s: %s", names[n], errstr);
        expect_golden_probs(names[n], req, ans);
        const json_t *rq = request_case(names[n]);
        cr_expect_eq(eng_answers_stats(ans)->images_encoded,
                     json_array_size(json_object_get(rq, "images")));
        /* usage counts the expanded prompts (SPEC b.5, c.7) */
        const sch_part_t *part = sch_request_part(req, 0);
        size_t            want = 0;
        for (size_t i = 0; i < part->n_questions; i++) {
            char id[64];
            snprintf(id, sizeof id, "%.*s", (int)part->questions[i].id_len, part->questions[i].id);
            want +=
                (size_t)json_integer_value(json_object_get(record_of(names[n], id), "n_tokens"));
        }
        cr_expect_eq(eng_answers_input_tokens(ans)[0], want, "%s: usage", names[n]);
        eng_answers_free(ans);
        sch_request_free(req);
    }
}

typedef struct done_slot {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int             n;
    eng_answers_t  *ans[4];
    svc_err_t       err;
} done_slot_t;

typedef struct done_ref {
    done_slot_t *d;
    int          i;
} done_ref_t;

static void on_done(void *user, eng_answers_t *ans, svc_err_t err, const char *errstr) {
    done_ref_t *r = user;
    pthread_mutex_lock(&r->d->mu);
    r->d->ans[r->i] = ans;
    if (err) {
        r->d->err = err;
        cr_log_error("request %d failed: %s", r->i, errstr ? errstr : "?");
    }
    r->d->n++;
    pthread_cond_broadcast(&r->d->cv);
    pthread_mutex_unlock(&r->d->mu);
}

/* The scheduler: one_image twice (two requests, the same image bytes) and
 * two_images: every answer as the golden's, and the vision tower ran once
 * per image, not per question (6 runs): 3 when the second one_image
 * arrives while the first still holds its slot (the usual case), 4 when
 * the first was already done and its slot freed. The exact sharing is
 * image_slots_share_by_content's. */
Test(vision, scheduler_encodes_each_image_once) {
    eng_sched_t     *s = NULL;
    eng_sched_conf_t conf = {.n_workers = 2};
    char             errstr[512] = "";
    cr_assert_eq(eng_sched_new(g_l.pkg, g_l.model, &conf, &s, errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
    static const char *const names[] = {"one_image", "one_image", "two_images"};
    sch_request_t           *reqs[3];
    done_slot_t              d = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    done_ref_t               refs[3];
    for (int i = 0; i < 3; i++) {
        reqs[i] = golden_request(names[i]);
        refs[i] = (done_ref_t){&d, i};
        cr_assert_eq(eng_sched_submit(s, reqs[i], on_done, &refs[i], NULL), SVC_OK);
    }
    pthread_mutex_lock(&d.mu);
    while (d.n < 3)
        pthread_cond_wait(&d.cv, &d.mu);
    pthread_mutex_unlock(&d.mu);
    cr_assert_eq(d.err, SVC_OK);
    eng_sched_stats_t st;
    eng_sched_stats(s, &st);
    cr_expect(st.images_encoded == 3 || st.images_encoded == 4, "%llu encodings for 4 images",
              (unsigned long long)st.images_encoded);
    for (int i = 0; i < 3; i++) {
        expect_golden_probs(names[i], reqs[i], d.ans[i]);
        eng_answers_free(d.ans[i]);
        sch_request_free(reqs[i]);
    }
    eng_sched_free(s);
}

/* image_body's request, decoded as serve and http decode it. */
static sch_request_t *image_request(uint32_t w, uint32_t h, bool cut, const char *state) {
    svc_buf_t b;
    svc_buf_init(&b, SCH_DEFAULT_MAX_REQUEST_BYTES);
    image_body(&b, w, h, cut, state);
    const char      *names[1] = {eng_package_model_id(g_l.pkg)};
    sch_model_info_t info = {.names = names,
                             .n_names = 1,
                             .label = names[0],
                             .has_vision = true,
                             .engine_decodes = true};
    sch_limits_t     limits = {SCH_DEFAULT_MAX_REQUEST_BYTES};
    sch_request_t   *req = NULL;
    sch_error_t      e;
    sch_error_init(&e);
    cr_assert_eq(sch_request_decode(b.data, b.len, &limits, &info, &req, &e), SVC_OK, "%s",
                 e.message ? e.message : "?");
    sch_error_fini(&e);
    svc_buf_fini(&b);
    return req;
}

/* A refused request's reject: status, code, and a message that is want
 * (or holds it, when part). */
static void expect_reject(const sch_error_t *reject, int status, const char *code, const char *want,
                          bool part) {
    cr_expect_eq(reject->status, status);
    cr_expect_str_eq(reject->code, code);
    if (part)
        cr_expect(strstr(reject->message, want), "%s", reject->message);
    else
        cr_expect_str_eq(reject->message, want);
}

/* req refused at submit to s (as expect_reject), and no done. */
static void refused_by_scheduler(eng_sched_t *s, const sch_request_t *req, int status,
                                 const char *code, const char *want, bool part) {
    sch_error_t reject;
    sch_error_init(&reject);
    done_slot_t d = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    done_ref_t  ref = {&d, 0};
    cr_assert_eq(eng_sched_submit(s, req, on_done, &ref, &reject), SVC_ERR_INVALID);
    expect_reject(&reject, status, code, want, part);
    sch_error_fini(&reject);
    cr_expect_eq(d.n, 0, "done ran for a refused request");
}

/* req refused by the plain path (eng_answer_request) the same way. */
static void refused_by_plain_path(const sch_request_t *req, int status, const char *code,
                                  const char *want, bool part) {
    eng_answers_t *ans = NULL;
    sch_error_t    reject;
    char           errstr[512] = "";
    sch_error_init(&reject);
    cr_assert_eq(eng_answer_request(g_l.pkg, g_l.model, req, &ans, &reject, errstr, sizeof errstr),
                 SVC_ERR_INVALID);
    cr_expect_null(ans);
    expect_reject(&reject, status, code, want, part);
    sch_error_fini(&reject);
}

static eng_sched_t *one_worker_scheduler(void) {
    eng_sched_t     *s = NULL;
    eng_sched_conf_t conf = {.n_workers = 1};
    char             errstr[512] = "";
    cr_assert_eq(eng_sched_new(g_l.pkg, g_l.model, &conf, &s, errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
    return s;
}

/* One request through s (answered); its answers. */
static eng_answers_t *answered(eng_sched_t *s, const sch_request_t *req) {
    done_slot_t d = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    done_ref_t  ref = {&d, 0};
    cr_assert_eq(eng_sched_submit(s, req, on_done, &ref, NULL), SVC_OK);
    pthread_mutex_lock(&d.mu);
    while (d.n < 1)
        pthread_cond_wait(&d.cv, &d.mu);
    pthread_mutex_unlock(&d.mu);
    cr_assert_eq(d.err, SVC_OK);
    return d.ans[0];
}

/* The result cache keys the images a question sees: the same request
 * again is a hit (the same probabilities, no pass, no tower run); the
 * same state and question with other image bytes is a miss, computed. */
Test(vision, result_cache_keys_the_images) {
    eng_sched_t     *s = NULL;
    eng_sched_conf_t conf = {.n_workers = 1, .cache_entries = 16};
    char             errstr[512] = "";
    cr_assert_eq(eng_sched_new(g_l.pkg, g_l.model, &conf, &s, errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
    sch_request_t *a = image_request(64, 48, false, "\"x\""),
                  *b = image_request(48, 64, false, "\"x\"");
    eng_answers_t    *a1 = answered(s, a);
    eng_sched_stats_t st0, st1;
    eng_sched_stats(s, &st0);
    eng_answers_t *a2 = answered(s, a);
    eng_sched_stats(s, &st1);
    cr_assert_eq(st1.cache_hits, st0.cache_hits + 1);
    cr_assert_eq(st1.questions, st0.questions);
    cr_assert_eq(st1.images_encoded, st0.images_encoded, "a hit needs no tower");
    const double *p1 = eng_answers_results(a1)[0][0].probs,
                 *p2 = eng_answers_results(a2)[0][0].probs;
    cr_assert(p1 && p2);
    cr_assert_eq(memcmp(p1, p2, 2 * sizeof *p1), 0);
    eng_answers_t *b1 = answered(s, b);
    eng_sched_stats(s, &st0);
    cr_assert_eq(st0.cache_hits, st1.cache_hits, "other image bytes hit");
    cr_assert_eq(st0.questions, st1.questions + 1);
    cr_assert_neq(memcmp(eng_answers_results(b1)[0][0].probs, p1, 2 * sizeof *p1), 0);
    eng_answers_free(a1);
    eng_answers_free(a2);
    eng_answers_free(b1);
    sch_request_free(a);
    sch_request_free(b);
    eng_sched_free(s);
}

/* The same 400 invalid_request on the scheduler and on the plain path. */
static void expect_reject_both_ways(const sch_request_t *req, const char *want) {
    eng_sched_t *s = one_worker_scheduler();
    refused_by_scheduler(s, req, 400, "invalid_request", want, false);
    eng_sched_free(s);
    refused_by_plain_path(req, 400, "invalid_request", want, false);
}

/* SPEC a.3: images are decoded before the state is checked, so an image
 * that does not decode answers before a bad state; with the image whole,
 * the state's error (held by the decoder) answers once it decoded. */
Test(vision, image_decode_errors_come_before_the_state) {
    sch_request_t *req = image_request(64, 48, true, "null");
    cr_assert(sch_request_pending(req));
    expect_reject_both_ways(req, "images[0]: invalid image data (OSError)");
    sch_request_free(req);
    req = image_request(64, 48, false, "null");
    expect_reject_both_ways(req, "state must be text, an object, or an array");
    sch_request_free(req);
}

/* The aspect ratio is checked when the image is resized, after its decode
 * (images.py's smart_resize): data cut short answers first. */
Test(vision, aspect_ratio_after_the_decode) {
    sch_request_t *req = image_request(201, 1, true, "\"s\"");
    cr_assert_null(sch_request_pending(req));
    expect_reject_both_ways(req, "images[0]: invalid image data (OSError)");
    sch_request_free(req);
    req = image_request(1, 201, false, "null");
    expect_reject_both_ways(req, "images[0]: absolute aspect ratio must be smaller than 200, got "
                                 "201.0");
    sch_request_free(req);
}

/* Standard base64 of n bytes, appended to b. */
/* Distinct images past ENG_REQ_MAX_IMAGE_TOKENS (1,025 4x4 PNGs, 64
 * tokens each after the resize to 256x256): its 413 at submit, not a 500
 * nor gigabytes of held pixels, and no done. */
Test(vision, scheduler_refuses_too_many_images) {
    enum { N = ENG_REQ_MAX_IMAGE_TOKENS / 64 + 1 };
    svc_buf_t b;
    svc_buf_init(&b, SCH_DEFAULT_MAX_REQUEST_BYTES);
    cr_assert_eq(svc_buf_addf(&b, "{\"state\": \"many\", \"images\": ["), SVC_OK);
    for (unsigned i = 0; i < N; i++) {
        unsigned char *png;
        size_t         n;
        cr_assert_eq(eng_image_synth_png(4, 4, 1000 + i, &png, &n), SVC_OK);
        cr_assert_eq(svc_buf_addf(&b, "%s\"data:image/png;base64,", i ? ", " : ""), SVC_OK);
        b64_add(&b, png, n);
        cr_assert_eq(svc_buf_add(&b, "\"", 1), SVC_OK);
        free(png);
    }
    cr_assert_eq(svc_buf_addf(&b, "], \"questions\": {\"n\": {\"type\": \"noul\", "
                                  "\"instructions\": \"Is it?\"}}}"),
                 SVC_OK);
    sch_request_t *req = decode_for_package(b.data, b.len, "1,025 images");
    svc_buf_fini(&b);

    eng_sched_t *s = one_worker_scheduler();
    refused_by_scheduler(s, req, 413, "request_too_large", "more than 65536 image tokens", true);
    /* The plain path counts the same way, from the headers, before it
     * decodes the image that would pass the bound. */
    refused_by_plain_path(req, 413, "request_too_large", "more than 65536 image tokens", true);
    done_slot_t d = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    done_ref_t  ref = {&d, 0};
    /* Nothing was kept: a request of one image goes in after it. */
    sch_request_t *one = golden_request("one_image");
    cr_assert_eq(eng_sched_submit(s, one, on_done, &ref, NULL), SVC_OK);
    pthread_mutex_lock(&d.mu);
    while (d.n < 1)
        pthread_cond_wait(&d.cv, &d.mu);
    pthread_mutex_unlock(&d.mu);
    cr_assert_eq(d.err, SVC_OK);
    eng_answers_free(d.ans[0]);
    sch_request_free(one);
    sch_request_free(req);
    eng_sched_free(s);
}

/* The scheduler's slots: equal bytes share one slot and one encoding;
 * other bytes take another; a slot freed by its last reference is reused. */
Test(vision, image_slots_share_by_content) {
    eng_imgreg_t *g = eng_imgreg_new(g_l.model, 2);
    cr_assert(g);
    const json_t     *a = image_case("png_64x48"), *b = image_case("jpeg_300x200");
    sch_image_t       ia, ib;
    unsigned char    *ba, *bb;
    char              errstr[512] = "";
    eng_image_prep_t *p[4] = {NULL};
    image_bytes(a, &ia, &ba);
    image_bytes(b, &ib, &bb);
    for (int k = 0; k < 4; k++)
        cr_assert_eq(eng_image_prepare(g_l.model, k == 2 ? &ib : &ia, &p[k], errstr, sizeof errstr),
                     SVC_OK, "%s", errstr);
    size_t s0, s1, s2, t;
    cr_assert_eq(eng_imgreg_acquire(g, p[0], ENG_PROFILE_EXACT, 0, &s0, &t), SVC_OK);
    cr_assert_eq(t, 70);
    cr_assert_eq(eng_imgreg_acquire(g, p[1], ENG_PROFILE_EXACT, 1, &s1, &t), SVC_OK);
    cr_assert_eq(s1, s0, "the same bytes share a slot");
    cr_assert_eq(eng_imgreg_acquire(g, p[2], ENG_PROFILE_EXACT, 1, &s2, &t), SVC_OK);
    cr_assert_neq(s2, s0);
    cr_assert_eq(eng_imgreg_acquire(g, p[3], ENG_PROFILE_EXACT, 2, &t, &t),
                 SVC_OK); /* shares s0 again */
    bool enc = false;
    cr_assert_eq(eng_imgreg_ready(g, s0, &enc, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    cr_assert(enc);
    cr_assert_eq(eng_imgreg_ready(g, s1, &enc, errstr, sizeof errstr), SVC_OK);
    cr_assert(!enc, "encoded once");
    cr_assert_eq(eng_imgreg_encodings(g), 1);
    const eng_media_t *md = eng_imgreg_media(g);
    cr_assert(md->slots[s0] && md->slots[s0]->gh * md->slots[s0]->gw == 70);
    cr_assert_null(md->slots[s2], "not encoded until a worker needs it");
    /* both slots held by "another request" (mine = 0): a third image
     * waits (backpressure); the request holding them alone may go past */
    eng_image_prep_t *p4 = NULL;
    const json_t     *c = image_case("webp_200x300");
    sch_image_t       ic;
    unsigned char    *bc;
    image_bytes(c, &ic, &bc);
    cr_assert_eq(eng_image_prepare(g_l.model, &ic, &p4, errstr, sizeof errstr), SVC_OK);
    size_t s4;
    cr_assert(eng_imgreg_would_wait(g), "the submit waits before decoding");
    cr_assert_eq(eng_imgreg_acquire(g, p4, ENG_PROFILE_EXACT, 0, &s4, &t), SVC_ERR_RETRIABLE);
    cr_assert_eq(eng_image_prepare(g_l.model, &ic, &p4, errstr, sizeof errstr), SVC_OK);
    cr_assert_eq(eng_imgreg_acquire(g, p4, ENG_PROFILE_EXACT, 2, &s4, &t), SVC_OK,
                 "alone: past the soft bound");
    eng_imgreg_release(g, s4);
    /* three references on s0, one on s2: releasing s2 frees its slot */
    eng_imgreg_release(g, s2);
    cr_assert_eq(eng_image_prepare(g_l.model, &ic, &p4, errstr, sizeof errstr), SVC_OK);
    cr_assert_eq(eng_imgreg_acquire(g, p4, ENG_PROFILE_EXACT, 1, &s4, &t), SVC_OK);
    for (int k = 0; k < 3; k++)
        eng_imgreg_release(g, s0);
    cr_assert_null(md->slots[s0], "the last reference frees the tokens");
    eng_imgreg_release(g, s4);
    cr_assert(!eng_imgreg_would_wait(g));
    eng_imgreg_free(g);
    free(ba);
    free(bb);
    free(bc);
}

/* The same bytes under the two profiles are two slots and two encodings:
 * the fast tower's tokens are its own (never an exact request's), close to
 * the exact ones. */
Test(vision, image_slots_per_profile) {
    eng_imgreg_t *g = eng_imgreg_new(g_l.model, 4);
    cr_assert(g);
    sch_image_t       ia;
    unsigned char    *ba;
    char              errstr[512] = "";
    eng_image_prep_t *p[3] = {NULL};
    image_bytes(image_case("png_64x48"), &ia, &ba);
    for (int k = 0; k < 3; k++)
        cr_assert_eq(eng_image_prepare(g_l.model, &ia, &p[k], errstr, sizeof errstr), SVC_OK, "%s",
                     errstr);
    size_t se, sf, s2, t;
    cr_assert_eq(eng_imgreg_acquire(g, p[0], ENG_PROFILE_EXACT, 0, &se, &t), SVC_OK);
    cr_assert_eq(eng_imgreg_acquire(g, p[1], ENG_PROFILE_FAST, 1, &sf, &t), SVC_OK);
    cr_assert_neq(sf, se, "another profile, another slot");
    cr_assert_eq(eng_imgreg_acquire(g, p[2], ENG_PROFILE_FAST, 2, &s2, &t), SVC_OK);
    cr_assert_eq(s2, sf, "the same profile shares it");
    unsigned char sha[32];
    size_t        ref;
    eng_image_digest(&ia, sha);
    cr_assert(eng_imgreg_ref(g, sha, ENG_PROFILE_EXACT, &ref, &t) && ref == se);
    eng_imgreg_release(g, ref);
    bool enc = false;
    cr_assert_eq(eng_imgreg_ready(g, se, &enc, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    cr_assert_eq(eng_imgreg_ready(g, sf, &enc, errstr, sizeof errstr), SVC_OK, "%s", errstr);
    cr_assert(enc);
    cr_assert_eq(eng_imgreg_encodings(g), 2);
    const eng_media_t     *md = eng_imgreg_media(g);
    const eng_image_emb_t *e = md->slots[se], *f = md->slots[sf];
    size_t                 n = e->gh * e->gw * e->hidden;
    double                 num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)f->rows[i] - e->rows[i]) * ((double)f->rows[i] - e->rows[i]);
        den += (double)e->rows[i] * e->rows[i];
    }
    double rel = sqrt(num / den);
    cr_log_info("fast tower against exact: relative rms %.3g (%s)", rel, npu_matmul_fast_name());
    cr_assert_lt(rel, 0.05, "the fast tower's tokens are near the exact ones: %g", rel);
    if (npu_fast_usable())
        cr_assert_gt(rel, 0.0, "and its own: another kernel ran");
    else
        cr_assert_eq(rel, 0.0, "no fast kernels here: the exact ones");
    for (int k = 0; k < 2; k++)
        eng_imgreg_release(g, sf);
    eng_imgreg_release(g, se);
    eng_imgreg_free(g);
    free(ba);
}

/* ------------------------------------------------------------ q4nx */

/* make-package's D3-Nano-NPU2 layout (vision_weight.q4nx: BF16, the
 * matmul weights in Q4NX.md §5 tiles, FastFlowLM's vision_config) and its
 * safetensors twin: the same tower, so the same tokens for an image, and
 * answers that agree. */
Test(vision, q4nx_vision_weight_equals_its_twin) {
    char dir[] = "/tmp/d3vision-XXXXXX";
    cr_assert(mkdtemp(dir));
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s' make-package --size tiny --format q4nx --seed 5 --out '%s/q' --twin '%s/t' "
             ">/dev/null 2>&1",
             binary(), dir, dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    char q[64], t[64];
    snprintf(q, sizeof q, "%s/q", dir);
    snprintf(t, sizeof t, "%s/t", dir);
    loaded_t          lq, lt;
    const json_t     *c = image_case("webp_200x300");
    sch_image_t       img;
    unsigned char    *bytes;
    char              errstr[512] = "";
    eng_image_prep_t *prep = NULL;
    load(q, &lq);
    load(t, &lt);
    cr_assert(eng_model_has_vision(lq.model) && eng_model_has_vision(lt.model));
    image_bytes(c, &img, &bytes);
    cr_assert_eq(eng_image_prepare(lq.model, &img, &prep, errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
    eng_image_emb_t eq, et;
    cr_assert_eq(eng_image_encode(lq.model, prep, &eq, errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
    cr_assert_eq(eng_image_encode(lt.model, prep, &et, errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
    cr_assert_eq(eq.gh * eq.gw, 70);
    cr_assert_eq(memcmp(eq.rows, et.rows, eq.gh * eq.gw * eq.hidden * sizeof *eq.rows), 0,
                 "q4nx and twin towers differ");
    cr_assert_eq(eng_model_check_parameters(lt.model, t, errstr, sizeof errstr), SVC_OK, "%s",
                 errstr);
    eng_image_emb_fini(&eq);
    eng_image_emb_fini(&et);
    eng_image_prep_free(prep);
    free(bytes);
    unload(&lq);
    unload(&lt);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* ------------------------------------------------------------ config */

/* config.json with this vision_config in a new directory; *dir is its path. */
static void vision_config_dir(const char *vc, char dir[32]) {
    snprintf(dir, 32, "/tmp/d3viscfg-XXXXXX");
    cr_assert(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fprintf(f, "{\"vision_config\": %s}", vc);
    cr_assert_eq(fclose(f), 0);
}

static void vision_config_rm(const char *dir) {
    char path[64];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(rmdir(dir), 0);
}

/* The tower's rotary tables hold head sizes up to ENG_VIS_MAX_HEAD_DIM:
 * a config past it is refused while loading (not an abort on the first
 * image), in both key layouts. */
Test(vision_config, head_size_is_bounded) {
    static const struct {
        const char *vc;
        bool        ok;
        const char *says;
    } cases[] = {
        {"{\"hidden_size\": 1024, \"num_heads\": 1, \"out_hidden_size\": 64}", true, NULL},
        {"{\"hidden_size\": 1032, \"num_heads\": 1, \"out_hidden_size\": 64}", false,
         "vision_config.hidden_size 1032 over num_heads 1 gives a head size of 1032, over the "
         "1024 supported"},
        {"{\"hidden_size\": 4128, \"num_heads\": 2, \"out_hidden_size\": 64}", false,
         "head size of 2064"},
        {"{\"QWEN3_5_PATCH_SIZE\": 16, \"QWEN3_5_SPATIAL_MERGE_SIZE\": 2, "
         "\"QWEN3_5_TEMPORAL_PATCH_SIZE\": 2, \"QWEN3_5_VISION_EMBED_DIM\": 1032, "
         "\"QWEN3_5_VISION_NUM_HEADS\": 1}",
         false, "over the 1024 supported"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char          dir[32], errstr[512] = "";
        eng_vis_cfg_t c;
        bool          present = false;
        vision_config_dir(cases[k].vc, dir);
        svc_err_t err = eng_vis_cfg_load(dir, 64, &c, &present, errstr, sizeof errstr);
        if (cases[k].ok) {
            cr_expect_eq(err, SVC_OK, "%s: %s", cases[k].vc, errstr);
            cr_expect(present && c.head_dim == ENG_VIS_MAX_HEAD_DIM);
        } else {
            cr_expect_eq(err, SVC_ERR_FORMAT, "%s", cases[k].vc);
            cr_expect(strstr(errstr, cases[k].says) != NULL, "%s: %s", cases[k].vc, errstr);
        }
        vision_config_rm(dir);
    }
}
