/*
 * ops_http_intake.c -- decision requests off the MHD threads, and their
 * clients watched while they wait (private to ops_http*.c).
 *
 * Why the intake: decoding a request decodes and resizes its images and
 * tokenizes every question's prompt (eng_sched_submit), seconds for a body
 * of large images or of many questions on a long state. On one of MHD's two
 * pool threads that stalled every connection the thread serves, /health
 * and /metrics probes included (measured: /health 11.6 s behind three such
 * bodies). So the handler suspends the connection and queues the request
 * here; HTTP_INTAKE_THREADS threads decode and submit it.
 *
 * Why the watcher: libmicrohttpd watches no suspended socket, so a client
 * that hung up while its request waited here or in the engine was seen
 * only when its answer was written: the engine ran the whole request, held
 * its queue slot and was logged 200. SPEC f.1: "a client disconnect cancels
 * the request (recorded as status 499)". Every WATCH_MS the watcher polls
 * the suspended sockets for a hang-up (POLLRDHUP: the peer closed or shut
 * down its side, which MHD itself also takes as the end of the
 * connection: uvicorn's too); such a request is marked gone (499 in the
 * log and /metrics, and its connection is closed without an answer when it
 * is resumed) and, once the engine has it, withdrawn (eng_sched_cancel),
 * so its questions not yet begun are not run. A hang-up seen while its
 * submit is still decoding is withdrawn on a later round (the socket stays
 * hung up), once the engine has admitted it.
 *
 * Lifetimes: a request is on the watch list from its suspension until just
 * before its connection is resumed (ops_http_unwatch, under h->ilock), and
 * MHD frees it only after the resume, so the watcher may use a request it
 * finds on the list while it holds the lock. It polls without the lock,
 * and afterwards trusts a request only if it is still listed with the same
 * watch number (the address may have been freed and taken again).
 */
#include "ops_http_int.h"

#include <poll.h>
#include <time.h>

#define WATCH_MS 200

/* ------------------------------------------------------------ watching */

static void watch_locked(http_req_t *r) {
    http_t *h = r->h;
    r->wseq = ++h->wseq;
    r->watching = true;
    r->w_prev = NULL;
    r->w_next = h->watched;
    if (h->watched)
        h->watched->w_prev = r;
    h->watched = r;
}

void ops_http_unwatch(http_req_t *r) {
    http_t *h = r->h;
    pthread_mutex_lock(&h->ilock);
    if (r->watching) {
        if (r->w_prev)
            r->w_prev->w_next = r->w_next;
        else
            h->watched = r->w_next;
        if (r->w_next)
            r->w_next->w_prev = r->w_prev;
        r->watching = false;
    }
    pthread_mutex_unlock(&h->ilock);
}

/* r, polled with seq, if it is still on the list as that request. */
static http_req_t *still_watched_locked(http_t *h, const http_req_t *r, uint64_t seq) {
    for (http_req_t *w = h->watched; w; w = w->w_next)
        if (w == r)
            return w->wseq == seq ? w : NULL;
    return NULL;
}

/* One round: polls the suspended sockets, withdraws what hung up. */
static void watch_round(http_t *h, struct pollfd *fds, http_req_t **rs, uint64_t *seqs,
                        size_t cap) {
    size_t n = 0;
    pthread_mutex_lock(&h->ilock);
    for (http_req_t *w = h->watched; w && n < cap; w = w->w_next) {
        if (w->withdrawn || w->fd < 0 || (atomic_load(&w->client_gone) && !w->submitted))
            continue;
        fds[n] = (struct pollfd){.fd = w->fd, .events = POLLRDHUP};
        rs[n] = w;
        seqs[n++] = w->wseq;
    }
    pthread_mutex_unlock(&h->ilock);
    if (n == 0 || poll(fds, n, 0) <= 0)
        return;
    pthread_mutex_lock(&h->ilock);
    for (size_t i = 0; i < n; i++) {
        http_req_t *r;
        if (!(fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) ||
            !(r = still_watched_locked(h, rs[i], seqs[i])))
            continue;
        atomic_store(&r->client_gone, true);
        if (r->submitted) /* in the engine (or on its way): withdrawn; done resumes it */
            r->withdrawn = ops_http_cancel(r);
    }
    pthread_mutex_unlock(&h->ilock);
}

static void *watcher_main(void *arg) {
    http_t        *h = arg;
    size_t         cap = h->o->max_connections ? h->o->max_connections : 1;
    struct pollfd *fds = calloc(cap, sizeof *fds);
    http_req_t   **rs = calloc(cap, sizeof *rs);
    uint64_t      *seqs = calloc(cap, sizeof *seqs);
    pthread_mutex_lock(&h->ilock);
    while (!h->istop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += WATCH_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        (void)pthread_cond_timedwait(&h->wcv, &h->ilock, &ts);
        if (h->istop || !fds || !rs || !seqs)
            continue; /* without its arrays the watcher only waits to stop */
        pthread_mutex_unlock(&h->ilock);
        watch_round(h, fds, rs, seqs, cap);
        pthread_mutex_lock(&h->ilock);
    }
    pthread_mutex_unlock(&h->ilock);
    free(fds);
    free(rs);
    free(seqs);
    return NULL;
}

/* ------------------------------------------------------------ the intake */

bool ops_http_intake_push(http_req_t *r) {
    http_t *h = r->h;
    if (!h->intake_on)
        return false;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->con, MHD_CONNECTION_INFO_CONNECTION_FD);
    r->fd = ci ? ci->connect_fd : -1;
    /* Under the lock with the stop: nothing is queued after the release,
     * which would leave its connection suspended when MHD stops. */
    pthread_mutex_lock(&h->ilock);
    if (h->istop || !h->watcher_on) {
        pthread_mutex_unlock(&h->ilock);
        return false;
    }
    atomic_store(&r->phase, HTTP_P_ENGINE);
    atomic_fetch_add(&h->in_intake, 1);
    MHD_suspend_connection(r->con);
    watch_locked(r);
    r->iq_next = NULL;
    if (h->iq_tail)
        h->iq_tail->iq_next = r;
    else
        h->iq_head = r;
    h->iq_tail = r;
    pthread_cond_signal(&h->icv);
    pthread_mutex_unlock(&h->ilock);
    return true;
}

/* r answered without the engine (r->out set): it goes back to MHD. */
void ops_http_answer_now(http_req_t *r) {
    ops_http_unwatch(r);
    atomic_store(&r->phase, HTTP_P_DONE);
    MHD_resume_connection(r->con);
}

static void *intake_main(void *arg) {
    http_t *h = arg;
    pthread_mutex_lock(&h->ilock);
    for (;;) {
        while (!h->iq_head && !h->istop)
            pthread_cond_wait(&h->icv, &h->ilock);
        if (h->istop)
            break; /* what is still queued is answered by ops_http_release_engine */
        http_req_t *r = h->iq_head;
        h->iq_head = r->iq_next;
        if (!h->iq_head)
            h->iq_tail = NULL;
        pthread_mutex_unlock(&h->ilock);
        if (atomic_load(&r->client_gone)) {
            /* Nobody to answer: not decoded; closed on resume, recorded 499. */
            ops_http_answer_now(r);
        } else {
            ops_http_decisions(r); /* r may be freed when it returns */
        }
        atomic_fetch_sub(&h->in_intake, 1);
        pthread_mutex_lock(&h->ilock);
    }
    pthread_mutex_unlock(&h->ilock);
    return NULL;
}

bool ops_http_intake_start(http_t *h) {
    pthread_mutex_init(&h->ilock, NULL);
    pthread_cond_init(&h->icv, NULL);
    pthread_cond_init(&h->wcv, NULL);
    h->intake_on = true;
    for (size_t i = 0; i < HTTP_INTAKE_THREADS; i++) {
        if (pthread_create(&h->intake[i], NULL, intake_main, h) != 0)
            break;
        h->n_intake++;
    }
    h->watcher_on = h->n_intake > 0 && pthread_create(&h->watcher, NULL, watcher_main, h) == 0;
    return h->watcher_on;
}

void ops_http_release_engine(http_t *h) {
    if (!h->intake_on)
        return;
    pthread_mutex_lock(&h->ilock);
    h->istop = true;
    pthread_cond_broadcast(&h->icv);
    pthread_cond_broadcast(&h->wcv);
    pthread_mutex_unlock(&h->ilock);
    /* An intake thread inside a submit finishes it first: only then may
     * the scheduler be freed. */
    for (size_t i = 0; i < h->n_intake; i++)
        pthread_join(h->intake[i], NULL);
    pthread_mutex_lock(&h->ilock);
    bool watcher = h->watcher_on;
    h->watcher_on = false;
    pthread_mutex_unlock(&h->ilock);
    if (watcher)
        pthread_join(h->watcher, NULL);
    h->n_intake = 0;
    for (;;) {
        pthread_mutex_lock(&h->ilock);
        http_req_t *r = h->iq_head;
        if (r)
            h->iq_head = r->iq_next;
        if (!h->iq_head)
            h->iq_tail = NULL;
        pthread_mutex_unlock(&h->ilock);
        if (!r)
            break;
        ops_http_error(r, 503, "not_ready", "the runtime is shutting down");
        atomic_fetch_sub(&h->in_intake, 1);
        ops_http_answer_now(r);
    }
}

void ops_http_intake_free(http_t *h) {
    if (!h->intake_on)
        return;
    ops_http_release_engine(h);
    pthread_cond_destroy(&h->wcv);
    pthread_cond_destroy(&h->icv);
    pthread_mutex_destroy(&h->ilock);
    h->intake_on = false;
}
