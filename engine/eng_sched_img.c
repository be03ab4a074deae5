/*
 * eng_sched_img.c -- the scheduler's image slots (eng_answer_int.h): every
 * distinct image (by the SHA-256 of its bytes) of the requests in flight
 * holds one slot, so that it is encoded once however many questions and
 * requests (the messages of a Kafka batch, concurrent HTTP calls) show it,
 * and its tokens have one id range (ENG_IMAGE_ID(slot, j)) that prefix
 * sharing can compare. A slot is an image under one profile: the fast
 * profile's tower gives other tokens, so the same bytes asked for under
 * both take two slots (and never share a prefix: ids differ).
 *
 * A slot's life: acquire (at submit, with the prepared pixels; further
 * requests with the same bytes take a reference and drop their copy) ->
 * ready (the first worker that needs it runs the tower, others wait) ->
 * release by every request -> free (its pixels and tokens go).
 *
 * Memory: requests together hold at most `soft` slots (the scheduler's
 * max_images), each at most 1,638,400 x 3 bytes of pixels or, encoded,
 * 1,600 x hidden floats for the real package. One request may hold more
 * when no other holds any (as the question bound lets a large request in
 * when the queue is empty), up to the table's ENG_IMGREG_CAP: its images
 * came in one body of at most 8 MB.
 */
#include "eng_answer_int.h"

#include <pthread.h>

typedef enum slot_state {
    SLOT_FREE = 0,
    SLOT_PREPARED, /* pixels held, not encoded yet */
    SLOT_ENCODING, /* a worker runs the tower */
    SLOT_READY,    /* emb holds the tokens */
    SLOT_FAILED,   /* the tower failed: every question showing it fails */
} slot_state_t;

typedef struct slot {
    slot_state_t      state;
    unsigned char     sha[32];
    eng_profile_t     prof;   /* the profile whose tower encodes it */
    size_t            refs;   /* requests holding it */
    size_t            tokens; /* merged tokens */
    eng_image_prep_t *prep;   /* SLOT_PREPARED / SLOT_ENCODING */
    eng_image_emb_t   emb;    /* SLOT_READY */
    svc_err_t         err;    /* SLOT_FAILED */
    char              errstr[256];
} slot_t;

struct eng_imgreg {
    const eng_model_t      *model;
    size_t                  n;     /* the table: ENG_IMGREG_CAP slots */
    size_t                  soft;  /* slots requests together hold at most */
    size_t                  held;  /* slots not free */
    slot_t                 *slots; /* (n) */
    const eng_image_emb_t **ptrs;  /* (n): &slots[i].emb once ready, else NULL */
    eng_media_t             media;
    uint64_t                encodings;
    uint64_t                cleared; /* slots freed again (eng_imgreg_cleared) */
    pthread_mutex_t         mu;
    pthread_cond_t          cv;
};

eng_imgreg_t *eng_imgreg_new(const eng_model_t *m, size_t max_slots) {
    eng_imgreg_t *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->model = m;
    g->n = ENG_IMGREG_CAP;
    g->soft = max_slots < ENG_IMGREG_CAP ? max_slots : ENG_IMGREG_CAP;
    g->slots = calloc(g->n, sizeof *g->slots);
    g->ptrs = calloc(g->n, sizeof *g->ptrs);
    if (!g->slots || !g->ptrs) {
        free(g->slots);
        free(g->ptrs);
        free(g);
        return NULL;
    }
    g->media.slots = g->ptrs;
    g->media.n_slots = g->n;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    return g;
}

static void slot_clear(eng_imgreg_t *g, size_t i) {
    slot_t *sl = &g->slots[i];
    if (sl->state != SLOT_FREE) {
        g->held--;
        g->cleared++;
    }
    eng_image_prep_free(sl->prep);
    eng_image_emb_fini(&sl->emb);
    memset(sl, 0, sizeof *sl);
    g->ptrs[i] = NULL;
}

void eng_imgreg_free(eng_imgreg_t *g) {
    if (!g)
        return;
    for (size_t i = 0; i < g->n; i++)
        slot_clear(g, i);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g->slots);
    free(g->ptrs);
    free(g);
}

/* The live slot of the image with digest sha under profile p, or g->n;
 * *free_at: the first free slot (g->n: none). @locks g->mu held. */
static size_t find_slot(const eng_imgreg_t *g, const unsigned char *sha, eng_profile_t p,
                        size_t *free_at) {
    *free_at = g->n;
    for (size_t i = 0; i < g->n; i++) {
        const slot_t *sl = &g->slots[i];
        if (sl->state == SLOT_FREE)
            *free_at = *free_at < g->n ? *free_at : i;
        else if (memcmp(sl->sha, sha, 32) == 0 && sl->prof == p && sl->state != SLOT_FAILED)
            return i;
    }
    return g->n;
}

bool eng_imgreg_ref(eng_imgreg_t *g, const unsigned char sha[32], eng_profile_t p, size_t *slot,
                    size_t *tokens) {
    size_t free_at;
    pthread_mutex_lock(&g->mu);
    size_t i = find_slot(g, sha, p, &free_at);
    if (i < g->n) {
        g->slots[i].refs++;
        *slot = i;
        *tokens = g->slots[i].tokens;
    }
    pthread_mutex_unlock(&g->mu);
    return i < g->n;
}

svc_err_t eng_imgreg_acquire(eng_imgreg_t *g, eng_image_prep_t *prep, eng_profile_t p, size_t mine,
                             size_t *slot, size_t *tokens) {
    size_t free_at;
    pthread_mutex_lock(&g->mu);
    size_t i = find_slot(g, eng_image_prep_digest(prep), p, &free_at);
    if (i < g->n) { /* the slot has these pixels already */
        g->slots[i].refs++;
        *slot = i;
        *tokens = g->slots[i].tokens;
        pthread_mutex_unlock(&g->mu);
        eng_image_prep_free(prep);
        return SVC_OK;
    }
    bool others = g->held > mine; /* slots of other requests are held */
    if (free_at == g->n || (g->held >= g->soft && others)) {
        pthread_mutex_unlock(&g->mu);
        eng_image_prep_free(prep);
        return others ? SVC_ERR_RETRIABLE : SVC_ERR_TOO_LARGE;
    }
    slot_t *sl = &g->slots[free_at];
    g->held++;
    sl->state = SLOT_PREPARED;
    memcpy(sl->sha, eng_image_prep_digest(prep), 32);
    sl->prof = p;
    sl->refs = 1;
    sl->tokens = eng_image_prep_tokens(prep);
    sl->prep = prep;
    *slot = free_at;
    *tokens = sl->tokens;
    pthread_mutex_unlock(&g->mu);
    return SVC_OK;
}

void eng_imgreg_release(eng_imgreg_t *g, size_t slot) {
    pthread_mutex_lock(&g->mu);
    slot_t *sl = &g->slots[slot];
    SVC_ASSERT(sl->refs > 0);
    /* an encoding in flight finishes first: its worker still uses the slot */
    if (--sl->refs == 0 && sl->state != SLOT_ENCODING)
        slot_clear(g, slot);
    pthread_mutex_unlock(&g->mu);
}

svc_err_t eng_imgreg_ready(eng_imgreg_t *g, size_t slot, bool *encoded_here, char *errstr,
                           size_t errstr_size) {
    *encoded_here = false;
    pthread_mutex_lock(&g->mu);
    slot_t *sl = &g->slots[slot];
    while (sl->state == SLOT_ENCODING)
        pthread_cond_wait(&g->cv, &g->mu);
    if (sl->state == SLOT_PREPARED) {
        sl->state = SLOT_ENCODING;
        pthread_mutex_unlock(&g->mu);
        eng_image_emb_t emb;
        char            why[256] = "";
        svc_err_t err = eng_image_encode(eng_model_profile(g->model, sl->prof), sl->prep, &emb, why,
                                         sizeof why);
        pthread_mutex_lock(&g->mu);
        eng_image_prep_free(sl->prep);
        sl->prep = NULL;
        if (err) {
            sl->state = SLOT_FAILED;
            sl->err = err;
            snprintf(sl->errstr, sizeof sl->errstr, "%s", why);
        } else {
            sl->state = SLOT_READY;
            sl->emb = emb;
            g->ptrs[slot] = &sl->emb;
            g->encodings++;
            *encoded_here = true;
        }
        if (sl->refs == 0) /* every request let go while it ran */
            slot_clear(g, slot);
        pthread_cond_broadcast(&g->cv);
    }
    svc_err_t err = SVC_OK;
    if (sl->state == SLOT_FAILED) {
        err = sl->err;
        svc_errf(errstr, errstr_size, "vision tower: %s", sl->errstr);
    }
    pthread_mutex_unlock(&g->mu);
    return err;
}

bool eng_imgreg_would_wait(const eng_imgreg_t *g) {
    eng_imgreg_t *m = (eng_imgreg_t *)g; /* the lock is not part of the value */
    pthread_mutex_lock(&m->mu);
    bool full = g->held >= g->soft;
    pthread_mutex_unlock(&m->mu);
    return full;
}

const eng_media_t *eng_imgreg_media(const eng_imgreg_t *g) {
    return &g->media;
}

/* A counter of g's, read under its lock. */
static uint64_t counter(const eng_imgreg_t *g, const uint64_t *field) {
    eng_imgreg_t *m = (eng_imgreg_t *)g; /* the lock is not part of the value */
    pthread_mutex_lock(&m->mu);
    uint64_t n = *field;
    pthread_mutex_unlock(&m->mu);
    return n;
}

uint64_t eng_imgreg_cleared(const eng_imgreg_t *g) {
    return counter(g, &g->cleared);
}

uint64_t eng_imgreg_encodings(const eng_imgreg_t *g) {
    return counter(g, &g->encodings);
}
