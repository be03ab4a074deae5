/*
 * ops_http_api.c -- what `d3stream http` answers: POST /v1/systemone (and
 * /v1/decisions) through the shared scheduler, and the GET bodies of
 * /health, /health/live, /v1/models and /v1/systemone/models (SPEC f.1,
 * f.2).
 *
 * A decision request's connection is suspended and the request decoded
 * and submitted on an intake thread (ops_http_intake.c: why); the
 * scheduler's done callback encodes the body on the worker thread and
 * resumes the connection, so a request holds no MHD thread while it is
 * decoded or waits for the engine.
 */
#include "ops_http_int.h"

#include <jansson.h>
#include <math.h>
#include <sys/stat.h>
#include <time.h>
#include <stdarg.h>

void ops_http_error(http_req_t *r, int status, const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *msg = n >= 0 ? malloc((size_t)n + 1) : NULL; /* whole: a cut could split a code point */
    if (msg) {
        va_start(ap, fmt);
        vsnprintf(msg, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    sch_error_t e;
    sch_error_init(&e);
    sch_error_set(&e, status, code, "%s", msg ? msg : "out of memory for the message");
    free(msg);
    svc_buf_reset(&r->out);
    r->status = status;
    if (sch_error_encode(&e, &r->out)) {
        /* Out of memory for a few bytes: an empty 500 still answers. */
        svc_buf_reset(&r->out);
        r->status = 500;
    }
    sch_error_fini(&e);
}

/* One more 429 in /metrics. */
static void count_overloaded(http_t *h) {
    pthread_mutex_lock(&h->lock);
    h->n.overloaded++;
    pthread_mutex_unlock(&h->lock);
}

void ops_http_overloaded(http_req_t *r) {
    ops_http_error(r, 429, "overloaded", "the request queue is full; retry later");
    count_overloaded(r->h);
}

/* An engine failure: the 500 upstream answers for an exception. */
static void internal_error(http_req_t *r, const char *why) {
    ops_http_error(r, 500, "internal_error", "RuntimeError: %s",
                   why && why[0] ? why : "the request could not be answered");
}

/* The scheduler's completion, on a worker thread. */
static void engine_done(void *user, eng_answers_t *ans, svc_err_t err, const char *errstr) {
    http_req_t *r = user;
    http_t     *h = r->h;
    double      t = ops_http_now_s();
    atomic_fetch_sub(&h->in_engine, 1);
    if (err) {
        internal_error(r, errstr && errstr[0] ? errstr : svc_err_name(err));
    } else {
        const eng_answer_stats_t *st = eng_answers_stats(ans);
        r->tokenize_ms = st->tokenize_ms;
        r->queue_ms = st->queue_ms;
        r->forward_ms = st->forward_ms;
        char why[1024] = "";
        int  http = 200; /* ops_ask_encode sets it only when it writes an error */
        svc_buf_reset(&r->out);
        int rc = ops_ask_encode(&h->ask, r->req, ans, &r->out, &http, why, sizeof why);
        if (rc == OPS_EXIT_FAILURE)
            internal_error(r, why);
        else
            r->status = http;
        ops_http_count_answers(h, r->req, ans);
    }
    eng_answers_free(ans);
    sch_request_free(r->req);
    r->req = NULL;
    r->serialize_ms = (ops_http_now_s() - t) * 1000.0;
    ops_http_answer_now(r);
}

bool ops_http_cancel(http_req_t *r) {
    return eng_sched_cancel(r->h->sched, engine_done, r);
}

/* The submit's refusal as r's answer. */
static void refused(http_req_t *r, svc_err_t err, sch_error_t *reject) {
    char why[256];
    if (reject->code) {
        /* the contract's answer the engine gave: an image refused (400), a
         * request too large ever to be queued (429 or 413) */
        svc_buf_reset(&r->out);
        if (sch_error_encode(reject, &r->out))
            internal_error(r, "cannot write the result");
        else
            r->status = reject->status;
        if (reject->status == 429)
            count_overloaded(r->h);
    } else if (err == SVC_ERR_RETRIABLE) {
        ops_http_overloaded(r);
    } else {
        snprintf(why, sizeof why, "the engine refused the request: %s", svc_err_name(err));
        internal_error(r, why);
    }
}

void ops_http_decisions(http_req_t *r) {
    http_t *h = r->h;
    double  t = ops_http_now_s();
    char    why[1024] = "";
    int     http = 500;
    svc_buf_reset(&r->out);
    int rc = ops_decode_request(
        h->ask.pkg, h->ask.dir, OPS_DECODE_ENGINE | ops_decode_vision(h->ask.model),
        r->body.data ? r->body.data : "", r->body.len, &r->req, &r->out, &http, why, sizeof why);
    r->parse_ms = (ops_http_now_s() - t) * 1000.0;
    svc_buf_fini(&r->body); /* the request holds a copy */
    if (rc == OPS_EXIT_VERDICT)
        r->status = http;
    else if (rc != OPS_EXIT_OK)
        internal_error(r, why);
    /* A client gone meanwhile gets no answer (the handler closes it). */
    if (rc != OPS_EXIT_OK || atomic_load(&r->client_gone)) {
        ops_http_answer_now(r);
        return;
    }
    /* Marked before the submit: the watcher may withdraw it from then on
     * (and done may run, and r be freed, before the submit returns). */
    pthread_mutex_lock(&h->ilock);
    r->submitted = true;
    pthread_mutex_unlock(&h->ilock);
    sch_error_t reject;
    sch_error_init(&reject);
    atomic_fetch_add(&h->in_engine, 1);
    svc_err_t err = eng_sched_submit(h->sched, r->req, engine_done, r, &reject);
    if (err == SVC_OK) {
        pthread_mutex_lock(&h->lock);
        h->n.submitted++;
        pthread_mutex_unlock(&h->lock);
        return;
    }
    atomic_fetch_sub(&h->in_engine, 1);
    pthread_mutex_lock(&h->ilock);
    r->submitted = false;
    pthread_mutex_unlock(&h->ilock);
    sch_request_free(r->req);
    r->req = NULL;
    refused(r, err, &reject);
    sch_error_fini(&reject);
    ops_http_answer_now(r);
}

/* ------------------------------------------------------------ GET bodies */

static void set_json(http_req_t *r, int status, json_t *v) {
    char *s = v ? json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(v);
    svc_buf_reset(&r->out);
    if (!s || svc_buf_adds(&r->out, s)) {
        ops_http_error(r, 500, "internal_error", "MemoryError: the response body");
    } else {
        r->status = status;
    }
    free(s);
}

static const char *state_name(int state) {
    return state == HTTP_READY      ? "ready"
           : state == HTTP_STOPPING ? "stopping"
           : state == HTTP_REFUSED  ? "failed"
                                    : "loading";
}

static ops_golden_t golden_of(http_t *h) {
    pthread_mutex_lock(&h->lock);
    ops_golden_t g = h->golden;
    pthread_mutex_unlock(&h->lock);
    return g;
}

/* A refused model's /health: the golden check's reason and numbers. */
static json_t *health_refused(http_t *h) {
    ops_golden_t g = golden_of(h);
    char         reason[700];
    snprintf(reason, sizeof reason, "golden check failed: %s", g.r.reason);
    json_t *j = json_pack("{s:s, s:s, s:s, s:s}", "api_version", HTTP_API_VERSION, "status",
                          "failed", "reason", reason, "model", h->label);
    if (j && !isnan(g.r.max_dp))
        json_object_set_new(j, "golden",
                            json_pack("{s:f, s:f, s:I}", "max_dp", g.r.max_dp, "worst_layer_error",
                                      g.r.layer_err, "worst_layer", (json_int_t)g.r.layer_at));
    return j;
}

void ops_http_health(http_req_t *r, bool live) {
    http_t *h = r->h;
    if (live) {
        set_json(r, 200,
                 json_pack("{s:s, s:s}", "api_version", HTTP_API_VERSION, "status", "alive"));
        return;
    }
    int state = atomic_load(&h->state);
    if (state == HTTP_REFUSED) {
        set_json(r, 503, health_refused(h));
        return;
    }
    set_json(r, state == HTTP_READY ? 200 : 503,
             json_pack("{s:s, s:s, s:s?, s:s}", "api_version", HTTP_API_VERSION, "status",
                       state_name(state), "reason",
                       state == HTTP_READY     ? NULL
                       : state == HTTP_LOADING ? "the model is loading"
                                               : "the runtime is shutting down",
                       "model", h->label));
}

/* The card's modalities and limits (SPEC f.1): image ones only when the
 * loaded model has a vision tower (d3stream reads no videos). */
static void card_media(json_t *card, const eng_model_t *model) {
    bool    vision = model && eng_model_has_vision(model);
    json_t *mod = json_object_get(card, "modalities"), *lim = json_object_get(card, "limits");
    if (!vision)
        return;
    json_array_append_new(mod, json_string("image"));
    json_object_set_new(lim, "image_max_pixels", json_integer(1638400));
    json_object_set_new(lim, "image_source_max_pixels", json_integer(16000000));
    json_object_set_new(lim, "image_max_bytes", json_integer(8000000));
}

/* The worker's model card (SPEC f.1), as far as d3stream knows it. */
static json_t *model_card(http_t *h, int state) {
    json_t *params = json_null();
    bool    loaded = state != HTTP_LOADING && h->ask.model;
    if (loaded) {
        eng_model_info_t mi;
        eng_model_get_info(h->ask.model, &mi);
        params =
            json_integer((json_int_t)(mi.n_params_text + mi.n_params_readout + mi.n_params_vision));
    }
    const char  *sha = h->ask.model_sha256 && h->ask.model_sha256[0] ? h->ask.model_sha256 : NULL;
    ops_golden_t g = golden_of(h);
    _Static_assert(ENG_PROFILE_COUNT == 2, "the card below lists every profile");
    json_t *card = json_pack(
        "{s:s, s:s, s:s, s:s, s:n, s:n, s:s?, s:n, s:[s], s:[s,s,s], s:[s], "
        "s:{s:I, s:i, s:i, s:i, s:i}, s:n, s:s, s:[s,s], s:s, s:s, s:b, s:s, s:s, s:o, s:b, s:s, "
        "s:s?, s:s, s:[]}",
        "id", h->label, "object", "model", "owned_by", "vllm-sr", "family", "decision3", "repo",
        "revision", "model_sha256", sha, "manifest_sha256", "surfaces", "decisions",
        "question_types", "choice", "noul", "score", "modalities", "text", "limits",
        "max_input_tokens", (json_int_t)eng_package_max_length(h->ask.pkg), "min_options", 2,
        "max_options", 255, "min_levels", 2, "max_levels", 10, "licence", "profile",
        eng_profile_name(ops_profile_default()), "profiles", eng_profile_names()[0],
        eng_profile_names()[1], "engine", "d3stream", "accelerator", ops_device_accelerator(),
        "accelerator_validated", g.state == OPS_GOLDEN_PASSED, "device", h->device, "dtype",
        eng_package_readout_bf16(h->ask.pkg) ? "fp32/bf16-readout" : "fp32/fp32-readout",
        "parameters", params, "ready", state == HTTP_READY, "status", state_name(state), "reason",
        state == HTTP_READY ? NULL : "the model is not ready", "golden", ops_golden_name(g.state),
        "plugins");
    json_object_set_new(json_object_get(card, "limits"), "max_request_bytes",
                        json_integer((json_int_t)ops_max_request_bytes()));
    if (card && loaded)
        card_media(card, h->ask.model);
    return card;
}

/* The package's date for the SDK's release_date (YYYY-MM-DD): config.json's
 * modification time, UTC (a package carries no release date of its own). */
static void package_date(const char *dir, char out[11]) {
    char        path[4096];
    struct stat sb;
    struct tm   tm;
    snprintf(path, sizeof path, "%s/config.json", dir);
    time_t t = stat(path, &sb) == 0 ? sb.st_mtime : 0;
    if (!gmtime_r(&t, &tm) || strftime(out, 11, "%Y-%m-%d", &tm) != 10)
        snprintf(out, 11, "1970-01-01");
}

/* The list the official SDK reads (ListModelsResponse: models[].name,
 * description, release_date): the package's name, then every alias. */
static json_t *sdk_models(const http_t *h) {
    const char *const *al;
    size_t             n = ops_model_aliases(&al);
    char               date[11], desc[512];
    package_date(h->ask.dir, date);
    json_t *list = json_array();
    for (size_t i = 0; list && i <= n; i++) {
        const char *name = i == 0 ? h->label : al[i - 1];
        if (i == 0)
            snprintf(desc, sizeof desc, "decision3 package %s served by d3stream", h->label);
        else
            snprintf(desc, sizeof desc, "alias of %s (decision3, served by d3stream)", h->label);
        json_array_append_new(list, json_pack("{s:s, s:s, s:s}", "name", name, "description", desc,
                                              "release_date", date));
    }
    return list;
}

void ops_http_models(http_req_t *r, bool systemone) {
    http_t *h = r->h;
    int     state = atomic_load(&h->state);
    if (systemone) {
        set_json(r, 200,
                 json_pack("{s:s, s:[{s:s, s:s, s:s, s:b}]}", "object", "list", "data", "id",
                           h->label, "object", "model", "api", "systemone", "routing", 0));
        return;
    }
    set_json(r, 200,
             json_pack("{s:s, s:s, s:[o], s:{s:i, s:I}, s:o}", "object", "list", "api_version",
                       HTTP_API_VERSION, "data", model_card(h, state), "limits", "max_bundle_tasks",
                       64, "max_request_bytes", (json_int_t)ops_max_request_bytes(), "models",
                       sdk_models(h)));
}
