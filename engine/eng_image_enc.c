/*
 * eng_image_enc.c -- one request image from its bytes to the text tower's
 * input rows (engine.h): eng_image_prepare decodes and resizes it (the
 * contract's checks: a bad image is the request's 400), eng_image_encode
 * cuts the patch rows and runs the vision tower. They are apart so that a
 * scheduler can check an image at submit, hold only its resized pixels
 * (at most 1,638,400 x 3 bytes) while it waits, and run the tower on a
 * worker once for every question (and every request) that shows it.
 */
#include "eng_image_int.h"
#include "eng_model_int.h"
#include "eng_vision_int.h"

#include <openssl/sha.h>

struct eng_image_prep {
    eng_rgb_t     px;      /* resized to the tower's grid */
    size_t        tokens;  /* merged tokens */
    unsigned char sha[32]; /* SHA-256 of the encoded bytes (the upstream digest) */
};

bool eng_model_has_vision(const eng_model_t *m) {
    return m && m->vision != NULL;
}

int32_t eng_model_image_token_id(const eng_model_t *m) {
    return m->vision ? m->vision->cfg.image_token_id : -1;
}

svc_err_t eng_model_check_package(const eng_model_t *m, const eng_package_t *pkg, char *errstr,
                                  size_t errstr_size) {
    static const char PAD[] = "<|image_pad|>";
    if (!m->vision)
        return SVC_OK;
    int32_t id = eng_tokenizer_token_id(eng_package_tokenizer(pkg), PAD, sizeof PAD - 1);
    if (m->vision->cfg.image_token_listed && id == m->vision->cfg.image_token_id)
        return SVC_OK;
    /* upstream's words (family.py load): a config without the id differs too */
    if (m->vision->cfg.image_token_listed)
        svc_errf(errstr, errstr_size,
                 "the tokenizer's image token differs from config.json (%s is %d, "
                 "image_token_id %d)",
                 PAD, (int)id, (int)m->vision->cfg.image_token_id);
    else
        svc_errf(errstr, errstr_size,
                 "the tokenizer's image token differs from config.json (%s is %d, "
                 "config.json has no image_token_id)",
                 PAD, (int)id);
    return SVC_ERR_FORMAT;
}

svc_err_t eng_image_prepare(const eng_model_t *m, const sch_image_t *img, eng_image_prep_t **out,
                            char *errstr, size_t errstr_size) {
    *out = NULL;
    if (!m->vision) {
        svc_errf(errstr, errstr_size, "the model has no vision tower");
        return SVC_ERR_UNSUPPORTED;
    }
    const eng_vis_proc_t *p = m->vision->proc;
    eng_image_prep_t     *pr = calloc(1, sizeof *pr);
    if (!pr)
        return SVC_ERR_NOMEM;
    eng_rgb_t src = {0};
    uint32_t  oh = 0, ow = 0;
    svc_err_t err = eng_image_decode(img, &src, errstr, errstr_size);
    if (!err)
        err = eng_smart_resize(src.h, src.w, p->patch * p->merge, &oh, &ow, errstr, errstr_size);
    if (!err)
        err = eng_image_resize(&src, oh, ow, &pr->px);
    eng_rgb_fini(&src);
    if (err) {
        if (err == SVC_ERR_NOMEM)
            svc_errf(errstr, errstr_size, "out of memory preparing an image");
        eng_image_prep_free(pr);
        return err;
    }
    pr->tokens = (size_t)(oh / p->patch) * (ow / p->patch) / (p->merge * p->merge);
    eng_image_digest(img, pr->sha);
    *out = pr;
    return SVC_OK;
}

void eng_image_digest(const sch_image_t *img, unsigned char sha[32]) {
    SHA256(img->bytes, img->len, sha);
}

size_t eng_image_prep_tokens(const eng_image_prep_t *p) {
    return p->tokens;
}

const unsigned char *eng_image_prep_digest(const eng_image_prep_t *p) {
    return p->sha;
}

void eng_image_prep_free(eng_image_prep_t *p) {
    if (!p)
        return;
    eng_rgb_fini(&p->px);
    free(p);
}

svc_err_t eng_image_encode(const eng_model_t *m, const eng_image_prep_t *p, eng_image_emb_t *out,
                           char *errstr, size_t errstr_size) {
    memset(out, 0, sizeof *out);
    const eng_vision_t *v = m->vision;
    float              *rows = NULL;
    size_t              gh = 0, gw = 0;
    svc_err_t           err = eng_image_patches(&p->px, v->proc, &rows, &gh, &gw);
    if (err) {
        svc_errf(errstr, errstr_size, "%s",
                 err == SVC_ERR_NOMEM ? "out of memory for patch rows"
                                      : "image not on the patch grid");
        return err;
    }
    size_t M = v->cfg.merge, n = gh * gw / (M * M);
    if (n > ENG_IMAGE_MAX_TOKENS) {
        free(rows);
        svc_errf(errstr, errstr_size, "an image of %zu tokens is over the %u a pass can place", n,
                 ENG_IMAGE_MAX_TOKENS);
        return SVC_ERR_INVALID;
    }
    out->rows = malloc(n * v->cfg.out_hidden * sizeof *out->rows);
    err = out->rows ? eng_vision_forward(v, m->fast, rows, gh, gw, out->rows, errstr, errstr_size)
                    : SVC_ERR_NOMEM;
    free(rows);
    if (err) {
        if (err == SVC_ERR_NOMEM)
            svc_errf(errstr, errstr_size, "out of memory for an image's %zu tokens", n);
        eng_image_emb_fini(out);
        return err;
    }
    out->gh = gh / M;
    out->gw = gw / M;
    out->hidden = v->cfg.out_hidden;
    return SVC_OK;
}

void eng_image_emb_fini(eng_image_emb_t *e) {
    if (!e)
        return;
    free(e->rows);
    memset(e, 0, sizeof *e);
}

svc_err_t eng_image_prep_rows(const eng_model_t *m, const eng_image_prep_t *p, float **rows,
                              size_t *gh, size_t *gw) {
    return eng_image_patches(&p->px, m->vision->proc, rows, gh, gw);
}
