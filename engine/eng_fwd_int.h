/*
 * eng_fwd_int.h -- private: the text tower forward pass continued from a
 * per-sequence state, so that a prompt prefix shared by several questions
 * runs once (eng_sched.c). eng_model_forward is the same pass from an empty
 * state.
 *
 * A state is made for one attention mode (SPEC d.3) and holds what the
 * positions run so far leave behind for the ones after them.
 *
 * Causal: every layer's.
 *  - every full-attention layer: the keys (after k_norm and rope) and the
 *    values of those positions, (len, n_kv * head_dim) each;
 *  - every Gated DeltaNet layer: the conv state (K - 1, conv channels) and
 *    the recurrent state (n_v_heads, dk, dv).
 *
 * noncausal_full_attention: the full-attention layers let every position
 * see the later ones, so only the layers before the first full-attention
 * layer F (all Gated DeltaNet: causal, recurrent) are independent of what
 * follows. The state holds
 *  - every layer i < F: its conv and recurrent states (as above);
 *  - the residual stream at layer F's input of every position run,
 *    (len, hidden);
 *  - when a layer follows F: layer F's attention of every position run
 *    over the keys of the positions run, (len, n_heads * head_dim) before
 *    the output gate, and its log-sum-exp per head (len, n_heads).
 * A pass from it runs layers [0, F) on its T new tokens only, continuing
 * the linear states, then layers [F, L) over all len + T rows (plain
 * positions 0..len+T-1, noncausal attention over all of them), except
 * that in layer F the len prefix rows attend only to the T new keys and
 * merge that with the state's attention (npu_attention_merge: the softmax
 * over both key sets, to fp32 rounding). What that saves per question:
 * layer F's attention among the prefix rows, most of that layer's
 * attention (at 4,000 tokens ~1% of a nano pass; the attention's share
 * grows with the length). With F = 0 the state holds the embedding rows
 * and layer 0's attention. A pass with update also extends the state's
 * layer-F attention (its new rows' queries over all keys, and the old
 * rows' over the new keys, merged): it runs layer F's norm and q, k, v
 * projections over all len + T rows.
 *
 * Positions are transformers' get_rope_index: text tokens take plain
 * positions (t = h = w), an image's tokens (negative ids, ENG_IMAGE_ID)
 * take (base, base + row, base + column) of its merged grid and the text
 * after it goes on at base + max(rows, columns). A state keeps the next
 * position (and, noncausal, every kept row's), so prefix + suffix gives
 * the same answer as the whole prompt in one pass, within the kernels'
 * rounding (the delta rule's chunk boundaries move).
 *
 * Thread-safety: a state is not locked. Any number of threads may continue
 * from one state at once with update false (it is only read); a call with
 * update true needs the state to itself.
 */
#ifndef D3STREAM_ENG_FWD_INT_H
#define D3STREAM_ENG_FWD_INT_H

#include "eng_model_int.h"
#include "engine.h"

typedef struct eng_fwd_state eng_fwd_state_t;

/* An empty state (0 positions) for m's passes in the given attention mode;
 * NULL when out of memory. Memory: the linear layers' states at once (all
 * of them, or those before F when noncausal), the KV rows (causal) or the
 * residual rows and layer F's attention rows (noncausal; for nano 2 x 8 KiB
 * per position) as positions are added. */
eng_fwd_state_t *eng_fwd_state_new(const eng_model_t *m, bool noncausal);
/* Frees st. NULL is a no-op. */
void eng_fwd_state_free(eng_fwd_state_t *st);
/* Positions run into st so far. */
size_t eng_fwd_state_len(const eng_fwd_state_t *st);

/* Layers a state keeps per position, so that a prefix token runs through
 * them once: all of m's layers when causal, the layers before the first
 * full-attention layer (F) when noncausal. */
size_t eng_fwd_shared_layers(const eng_model_t *m, bool noncausal);

/**
 * @brief A new state equal to src (so that several suffixes may each
 *        continue from one prefix with update true).
 * @returns the copy, or NULL when out of memory or src is unusable (a
 *          forward with update failed on it).
 */
eng_fwd_state_t *eng_fwd_state_clone(const eng_fwd_state_t *src);

/**
 * @brief Makes dst equal to src (same model and mode), reusing dst's
 *        buffers.
 * @returns SVC_OK; SVC_ERR_NOMEM (dst unchanged); SVC_ERR_INVALID when src
 *          is unusable.
 */
SVC_WUR svc_err_t eng_fwd_state_copy(eng_fwd_state_t *dst, const eng_fwd_state_t *src);

/**
 * @brief Runs ids[0..T-1] at positions P..P+T-1, P = eng_fwd_state_len(st),
 *        continuing from st: the same contract as eng_model_forward
 *        otherwise (trace sees only the T new rows).
 * @param st optional (NULL: an empty state, nothing kept).
 * @param update true: st takes in the T positions (KV rows or residual
 *        rows appended, linear states replaced); false: st is only read.
 * @param noncausal the attention mode (SPEC d.3); must be st's mode.
 * @param final_last optional: (hidden) final-norm output at the last
 *        position. A noncausal pass with update, no final_last and no
 *        trace runs only layers [0, F): it just extends st.
 * @returns SVC_OK; SVC_ERR_INVALID (T == 0, an id outside the vocabulary,
 *          a state of the other mode, an unusable state) or SVC_ERR_NOMEM,
 *          with errstr. After a failure with update true, st is unusable
 *          (every later call on it returns SVC_ERR_INVALID); free it.
 */
SVC_WUR svc_err_t eng_model_forward_from(const eng_model_t *m, eng_fwd_state_t *st, bool update,
                                         const int32_t *ids, size_t T, bool noncausal,
                                         float *final_last, eng_trace_fn trace, void *user,
                                         char *errstr, size_t errstr_size);

/**
 * @brief eng_model_forward_from over ids that may hold image tokens:
 *        ENG_IMAGE_ID(slot, j) is row j of md->slots[slot] (its merged
 *        tokens, row-major), embedded as that row and placed at the
 *        multimodal rotary positions above. A state continued with media
 *        must be continued with the same table for the ids it holds (the
 *        scheduler's slots stay put while a question refers to them).
 * @param md optional (NULL: text only; an image id is then an error).
 * @returns as eng_model_forward_from; SVC_ERR_INVALID also for an image
 *          id outside md or of another width.
 */
SVC_WUR svc_err_t eng_model_forward_media(const eng_model_t *m, eng_fwd_state_t *st, bool update,
                                          const int32_t *ids, size_t T, const eng_media_t *md,
                                          bool noncausal, float *final_last, eng_trace_fn trace,
                                          void *user, char *errstr, size_t errstr_size);

/* Tokens per chunk of a layer: a pass runs its norms, projections and MLP
 * over at most this many rows at once (a multiple of the delta rule's
 * chunk of 64, so that a pass's delta-rule chunks fall where one call's
 * would). */
#define ENG_FWD_CHUNK 512

/* One sequence of a batched pass (eng_model_forward_batch). */
typedef struct eng_fwd_seq {
    const eng_fwd_state_t *st;         /* optional (NULL: empty), only read */
    const int32_t         *ids;        /* (T) its new tokens, borrowed */
    size_t                 T;          /* >= 1 */
    float                 *final_last; /* (hidden) receives its final-norm output at
                                          its last position; required */
} eng_fwd_seq_t;

/**
 * @brief Several read-only passes at once: seqs[i] gives what
 *        eng_model_forward_media(m, st, false, ids, T, md, noncausal,
 *        final_last, ...) would, bit for bit. Their rows run as one stream
 *        through the projections and MLPs, so each weight is read once per
 *        chunk of ENG_FWD_CHUNK rows for all of them instead of once per
 *        question (what matters for short prompts, which are
 *        weight-bound); conv, delta rule and attention run per sequence,
 *        each on its own state, cut where a pass of its own would be.
 *        Sequences may continue different states (of one mode).
 * @param md optional, as eng_model_forward_media's (one table for all).
 * @remark Memory: the activations of one pass over the sum of the T (for
 *         noncausal states, of P + T), plus one (P + T) key/value copy of
 *         the longest causal prefix and each sequence's linear states
 *         (~1 MiB each on nano): bound the batch by rows (eng_sched.c).
 * @returns SVC_OK; SVC_ERR_INVALID (a sequence's ids or state, errstr
 *          names which: nothing ran); SVC_ERR_NOMEM with errstr. n == 0
 *          is SVC_OK.
 */
SVC_WUR svc_err_t eng_model_forward_batch(const eng_model_t *m, const eng_fwd_seq_t *seqs, size_t n,
                                          const eng_media_t *md, bool noncausal, char *errstr,
                                          size_t errstr_size);

/**
 * @brief Teacher-forced per-layer error of alt's layers against ref's, for
 *        accuracy measurements (issue 28; tests/bench/bench_accuracy.c
 *        `layers`): ref's pass over ids runs layer by layer; each layer's
 *        input x_in (ref's own, exact) also goes through alt's same layer,
 *        and the two outputs are compared. alt is another profile's view of
 *        ref (eng_model_profile) or another model of the same shape (a
 *        q4nx package's BF16 twin).
 * @param num, den (n_layers): per layer, adds sum |x_alt - x_ref|^2 to
 *        num[l] and sum |x_ref - x_in|^2 (the layer's contribution to the
 *        residual stream) to den[l] over the T rows, so that over any
 *        number of prompts sqrt(num / den) is the relative RMS error of what
 *        the layer adds.
 * @returns SVC_OK; SVC_ERR_INVALID (models of different shapes, bad ids) or
 *          SVC_ERR_NOMEM, with errstr.
 */
SVC_WUR svc_err_t eng_fwd_layer_errors(const eng_model_t *ref, const eng_model_t *alt,
                                       const int32_t *ids, size_t T, bool noncausal, double *num,
                                       double *den, char *errstr, size_t errstr_size);

/* At most this many models compared layer by layer in one
 * eng_fwd_reference (the golden check's two profiles). */
#define ENG_FWD_REF_ALTS 2

/* Where eng_fwd_reference takes its layers from, and what it compares. */
typedef struct eng_fwd_ref {
    /* Fills *l with layer li (its kind m's): the golden check's fp32
     * layers read from the package one at a time; drop frees what fetch
     * made, right after the layer ran. */
    svc_err_t (*fetch)(void *user, size_t li, eng_layer_t *l, char *errstr, size_t errstr_size);
    void (*drop)(void *user, eng_layer_t *l);
    void *user;
    /* Optional: models of m's shape (another profile's view, a twin) run
     * teacher-forced on each layer's reference input; per layer li,
     * num[a][li] and den[a][li] get eng_step_error_add's sums. */
    const eng_model_t *alt[ENG_FWD_REF_ALTS];
    double            *num[ENG_FWD_REF_ALTS], *den[ENG_FWD_REF_ALTS];
    size_t             n_alt;
    /* Optional (NULL): sees the input of the reference layers' projections
     * (not the alt models'), chunk by chunk, before it is multiplied: w is
     * the first pack of those multiplied with that input (in_qkv for
     * in_qkv/in_b/in_a/in_z; k_proj for k and v, then q_proj for q, on the
     * same rows; out_proj, o_proj, mlp_gate for gate/up, mlp_down), x is
     * (T, npu_wpack_k(w)), valid during the call (`quantize`'s Hessians,
     * eng_quantize.c). Called on the pass's thread. */
    void (*tap)(void *user, const npu_wpack_t *w, const float *x, size_t T);
    void *tap_user;
    /* Optional (0, NULL): the pass starts at layer first (<= n_layers)
     * from x0, the residual stream after layer first - 1 of a pass over
     * the same seqs ((sum of T) x hidden, the sequences' rows in order, as
     * done below saw it), in place of the embedding: a pass cut after a
     * layer goes on bit for bit (`quantize --resume`). x0 is read before
     * the first fetch only: the caller may free it from then on. */
    size_t       first;
    const float *x0;
    /* Optional (NULL): called after layer li ran and was dropped with its
     * output x ((sum of T) x hidden, as x0 above), valid during the call;
     * an error stops the pass and is returned (errstr set by done). */
    svc_err_t (*done)(void *user, size_t li, const float *x, size_t rows, char *errstr,
                      size_t errstr_size);
} eng_fwd_ref_t;

/**
 * @brief eng_model_forward_batch's read-only pass over seqs (no prefix
 *        states), with each layer li taken from r->fetch instead of m
 *        (m gives the embedding, the final norm and the shape), one layer
 *        held at a time; and, where r has alt models, their layers run on
 *        the same input and compared (eng_fwd_layer_errors' measure).
 * @returns SVC_OK (every final_last written); SVC_ERR_INVALID (bad ids, a
 *          state given, a fetched layer of another kind, first past the
 *          layers or without x0), SVC_ERR_NOMEM or fetch's or done's
 *          error, with errstr.
 */
SVC_WUR svc_err_t eng_fwd_reference(const eng_model_t *m, const eng_fwd_ref_t *r,
                                    const eng_fwd_seq_t *seqs, size_t n, const eng_media_t *md,
                                    bool noncausal, char *errstr, size_t errstr_size);

#endif /* D3STREAM_ENG_FWD_INT_H */
