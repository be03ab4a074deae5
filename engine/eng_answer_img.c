/*
 * eng_answer_img.c -- the images of one request on their way into the
 * prompts (eng_answer_int.h): each is prepared once (decoded, checked and
 * resized; a failure is the request's 400, SPEC a.10) and the prompt's
 * one <|image_pad|> per image is replaced by the image's tokens, as ids
 * ENG_IMAGE_ID(slot, j) that the forward pass embeds from the encoded
 * image in that slot (eng_fwd_int.h).
 */
#include "eng_answer_int.h"

/* SPEC a.10: "images[<index>]: <message>", 400 invalid_request. */
void eng_answer_reject_image(sch_error_t *reject, size_t i, const char *msg, char *errstr,
                             size_t errstr_size) {
    svc_errf(errstr, errstr_size, "images[%zu]: %s", i, msg);
    if (reject)
        sch_error_set(reject, 400, "invalid_request", "images[%zu]: %s", i, msg);
}

svc_err_t eng_answer_refuse_image_tokens(sch_error_t *reject, char *errstr, size_t errstr_size) {
    svc_errf(errstr, errstr_size,
             "the request's distinct images come to more than %u image tokens, the most one "
             "request may show",
             ENG_REQ_MAX_IMAGE_TOKENS);
    if (reject)
        sch_error_set(reject, 413, "request_too_large", "%s", errstr);
    return SVC_ERR_INVALID;
}

svc_err_t eng_answer_pending(const sch_request_t *req, sch_error_t *reject, char *errstr,
                             size_t errstr_size) {
    const sch_error_t *held = sch_request_pending(req);
    if (!held)
        return SVC_OK;
    const char *msg = held->message ? held->message : "";
    svc_errf(errstr, errstr_size, "%s", msg);
    if (reject)
        sch_error_set_bytes(reject, held->status, held->code, msg, held->message_len);
    return SVC_ERR_INVALID;
}

svc_err_t eng_answer_expand(const eng_prompt_t *pr, int32_t pad_id, const size_t *slots,
                            const size_t *tokens, size_t n_images, eng_ids_t *out, char *errstr,
                            size_t errstr_size) {
    size_t n = pr->ids.n - n_images, k = 0;
    for (size_t i = 0; i < n_images; i++)
        n += tokens[i];
    out->n = 0;
    if (n > out->cap) {
        int32_t *v = realloc(out->v, n * sizeof *v);
        if (!v)
            return SVC_ERR_NOMEM;
        out->v = v;
        out->cap = n;
    }
    for (size_t t = 0; t < pr->ids.n; t++) {
        if (pr->ids.v[t] != pad_id) {
            out->v[out->n++] = pr->ids.v[t];
            continue;
        }
        if (k == n_images)
            break;
        SVC_ASSERT(slots[k] < ENG_IMAGE_MAX_SLOTS && tokens[k] <= ENG_IMAGE_MAX_TOKENS);
        for (size_t j = 0; j < tokens[k]; j++)
            out->v[out->n++] = ENG_IMAGE_ID(slots[k], j);
        k++;
    }
    if (k != n_images || out->n != n) {
        /* the decoder refuses literal placeholders when images come (SPEC a.10) */
        svc_errf(errstr, errstr_size, "the prompt holds %zu image placeholders for %zu images", k,
                 n_images);
        return SVC_ERR_INTERNAL;
    }
    return SVC_OK;
}

/* ---- the plain path (eng_answer_request): a table of its own ----------- */

/* Image i (of its part) as ri's image k: the earlier one with the same
 * bytes (no decode), else prepared and encoded here. *tokens counts the
 * distinct images' tokens against ENG_REQ_MAX_IMAGE_TOKENS (the 413 the
 * scheduler gives, eng_sched.c), from the header before any decode. */
static svc_err_t req_image(const eng_package_t *pkg, const eng_model_t *model,
                           const sch_image_t *img, size_t i, size_t k, eng_req_images_t *ri,
                           size_t *tokens, sch_error_t *reject, char *errstr, size_t errstr_size) {
    eng_image_digest(img, ri->sha[k]);
    for (size_t o = 0; o < k; o++)
        if (ri->ptrs[o] && memcmp(ri->sha[o], ri->sha[k], 32) == 0) {
            ri->tokens[k] = ri->tokens[o];
            ri->slots[k] = o;
            return SVC_OK;
        }
    if (*tokens + eng_package_image_tokens(pkg, img->width, img->height) > ENG_REQ_MAX_IMAGE_TOKENS)
        return eng_answer_refuse_image_tokens(reject, errstr, errstr_size);
    eng_image_prep_t *prep = NULL;
    char              msg[384];
    svc_err_t         err = eng_image_prepare(model, img, &prep, msg, sizeof msg);
    if (err == SVC_ERR_INVALID) {
        eng_answer_reject_image(reject, i, msg, errstr, errstr_size);
        return err;
    }
    if (err) {
        svc_errf(errstr, errstr_size, "images[%zu]: %s", i, msg);
        return err;
    }
    ri->tokens[k] = eng_image_prep_tokens(prep);
    ri->slots[k] = k;
    *tokens += ri->tokens[k];
    if (*tokens > ENG_REQ_MAX_IMAGE_TOKENS) {
        eng_image_prep_free(prep);
        return eng_answer_refuse_image_tokens(reject, errstr, errstr_size);
    }
    err = eng_image_encode(model, prep, &ri->embs[k], errstr, errstr_size);
    ri->ptrs[k] = &ri->embs[k];
    ri->n_encoded++;
    eng_image_prep_free(prep);
    return err;
}

svc_err_t eng_req_images_load(const eng_package_t *pkg, const eng_model_t *model,
                              const sch_request_t *req, eng_req_images_t *ri, sch_error_t *reject,
                              char *errstr, size_t errstr_size) {
    memset(ri, 0, sizeof *ri);
    size_t n = 0;
    for (size_t p = 0; p < sch_request_n_parts(req); p++)
        n += sch_request_part(req, p)->n_images;
    ri->n = n;
    if (!n)
        return SVC_OK;
    ri->embs = calloc(n, sizeof *ri->embs);
    ri->ptrs = calloc(n, sizeof *ri->ptrs);
    ri->slots = calloc(n, sizeof *ri->slots);
    ri->tokens = calloc(n, sizeof *ri->tokens);
    ri->sha = calloc(n, sizeof *ri->sha);
    ri->first = calloc(sch_request_n_parts(req) + 1, sizeof *ri->first);
    if (!ri->embs || !ri->ptrs || !ri->slots || !ri->tokens || !ri->sha || !ri->first)
        return SVC_ERR_NOMEM;
    size_t k = 0, tokens = 0;
    for (size_t p = 0; p < sch_request_n_parts(req); p++) {
        const sch_part_t *part = sch_request_part(req, p);
        ri->first[p] = k;
        for (size_t i = 0; i < part->n_images; i++, k++) {
            svc_err_t err = req_image(pkg, model, &part->images[i], i, k, ri, &tokens, reject,
                                      errstr, errstr_size);
            if (err)
                return err;
        }
    }
    ri->first[sch_request_n_parts(req)] = k;
    ri->media.slots = ri->ptrs;
    ri->media.n_slots = n;
    return SVC_OK;
}

void eng_req_images_fini(eng_req_images_t *ri) {
    for (size_t k = 0; ri->embs && k < ri->n; k++)
        eng_image_emb_fini(&ri->embs[k]);
    free(ri->embs);
    free(ri->ptrs);
    free(ri->slots);
    free(ri->tokens);
    free(ri->sha);
    free(ri->first);
    memset(ri, 0, sizeof *ri);
}
