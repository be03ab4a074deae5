/*
 * eng_vision_int.h -- private: the Qwen3.5 vision tower (eng_vision.c
 * loads and runs it; eng_model.c owns it as eng_model_t.vision).
 *
 * Every weight is owned and fp32 (projections packed for
 * npu_matmul_packed, as the text tower's); eng_vision_free frees them.
 * The tower follows transformers' Qwen3_5VisionModel: patch embedding (the
 * Conv3d as a matmul over the processor's patch rows), the learned
 * position table resampled bilinearly (align_corners) to the patch grid in
 * merge-block order, `depth` ViT blocks (LayerNorm, QKV, axial 2-D rotary,
 * bidirectional attention within the image, GELU-tanh MLP), and the
 * merger (LayerNorm, 2x2 merge, GELU-erf MLP to the text width).
 */
#ifndef D3STREAM_ENG_VISION_INT_H
#define D3STREAM_ENG_VISION_INT_H

#include "eng_image_int.h"
#include "eng_model_int.h"

/* The largest head size the tower runs (its rotary tables are sized for
 * it); eng_vis_cfg_load refuses a config past it. */
#define ENG_VIS_MAX_HEAD_DIM 1024

/* vision_config of config.json (HF keys, or FastFlowLM's QWEN3_5_* keys). */
typedef struct eng_vis_cfg {
    size_t  depth;              /* ViT blocks */
    size_t  hidden;             /* hidden_size (embed dim) */
    size_t  heads;              /* num_heads */
    size_t  head_dim;           /* hidden / heads */
    size_t  inter;              /* intermediate_size of a block's MLP */
    size_t  patch;              /* patch_size */
    size_t  temporal;           /* temporal_patch_size */
    size_t  merge;              /* spatial_merge_size */
    size_t  in_ch;              /* in_channels */
    size_t  out_hidden;         /* out_hidden_size: the text tower's hidden_size */
    size_t  n_pos;              /* num_position_embeddings, a square: side * side */
    size_t  side;               /* sqrt(n_pos) */
    float   theta;              /* rope_parameters.rope_theta (10000) */
    float   eps;                /* LayerNorm epsilon (1e-6) */
    bool    act_tanh;           /* hidden_act gelu_pytorch_tanh (true) or gelu (erf) */
    int32_t image_token_id;     /* config.json image_token_id (248056) */
    bool    image_token_listed; /* config.json has image_token_id */
} eng_vis_cfg_t;

/* Elements of one patch row: in_ch * temporal * patch * patch (1536). */
static inline size_t eng_vis_patch_elems(const eng_vis_cfg_t *c) {
    return c->in_ch * c->temporal * c->patch * c->patch;
}

typedef struct eng_vis_block {
    float       *n1_w, *n1_b; /* norm1 (hidden) */
    float       *n2_w, *n2_b; /* norm2 (hidden) */
    npu_wpack_t *qkv;         /* (3 hidden, hidden): rows q, then k, then v */
    float       *qkv_b;       /* (3 hidden) */
    npu_wpack_t *proj;        /* (hidden, hidden) */
    float       *proj_b;
    npu_wpack_t *fc1; /* (inter, hidden) */
    float       *fc1_b;
    npu_wpack_t *fc2; /* (hidden, inter) */
    float       *fc2_b;
} eng_vis_block_t;

typedef struct eng_vision {
    eng_vis_cfg_t    cfg;
    npu_wpack_t     *patch;       /* (hidden, patch elems): Conv3d weight flattened (c, t, y, x) */
    float           *patch_b;     /* (hidden) */
    float           *pos;         /* (n_pos, hidden) */
    eng_vis_block_t *blocks;      /* (depth) */
    float           *mn_w, *mn_b; /* merger.norm (hidden) */
    npu_wpack_t     *m_fc1;       /* (4 hidden, 4 hidden) */
    float           *m_fc1_b;     /* (4 hidden) */
    npu_wpack_t     *m_fc2;       /* (out_hidden, 4 hidden) */
    float           *m_fc2_b;     /* (out_hidden) */
    uint64_t         n_params;    /* elements of every vision tensor loaded */
    eng_vis_proc_t  *proc;        /* preprocessor_config.json (eng_image_int.h), owned */
} eng_vision_t;

/**
 * @brief Reads config.json's `vision_config` in dir into *c: HF keys
 *        (depth, hidden_size, ...; absent ones take transformers'
 *        Qwen3_5VisionConfig defaults) or FastFlowLM's QWEN3_5_* keys.
 * @param text_hidden the text tower's hidden_size: out_hidden_size must
 *        equal it (FastFlowLM's config may leave it out: then it is this).
 * @param present set to whether config.json has a vision_config at all
 *        (false: *c untouched, SVC_OK).
 * @returns SVC_OK; SVC_ERR_IO, SVC_ERR_FORMAT or SVC_ERR_UNSUPPORTED
 *          (deepstack) with one line naming the file and key.
 */
SVC_WUR svc_err_t eng_vis_cfg_load(const char *dir, size_t text_hidden, eng_vis_cfg_t *c,
                                   bool *present, char *errstr, size_t errstr_size);

/**
 * @brief Loads the tower's tensors through ld (prefix "model.visual." or
 *        "visual.", or a vision_weight.q4nx) into a new *out.
 * @returns SVC_OK; the loader's errors (missing tensor, shape, dtype).
 */
SVC_WUR svc_err_t eng_vision_load(const eng_ld_t *ld, const eng_vis_cfg_t *c, eng_vision_t **out);
/**
 * @brief Reads dir/preprocessor_config.json (SPEC e.7) into v->proc: the
 *        image processor settings the tower was trained with.
 * @returns SVC_OK; SVC_ERR_IO / SVC_ERR_FORMAT naming the file and key.
 */
SVC_WUR svc_err_t eng_vision_proc_attach(const char *dir, eng_vision_t *v, char *errstr,
                                         size_t errstr_size);

/* Frees everything the tower owns. NULL is a no-op. */
void eng_vision_free(eng_vision_t *v);

/* Block i's tensors through ld into *b (the loader's step; the golden
 * check's reference blocks, with ld->fp32), and their release. */
SVC_WUR svc_err_t eng_vision_load_block(const eng_ld_t *ld, const eng_vis_cfg_t *c, size_t i,
                                        eng_vis_block_t *b);
void              eng_vision_block_free(eng_vis_block_t *b);

/* The golden check's vision reference (eng_vision_reference). */
typedef struct eng_vis_ref {
    /* Fills *b with block i read from the package again (fp32 packs). */
    svc_err_t (*fetch)(void *user, size_t i, eng_vis_block_t *b, char *errstr, size_t errstr_size);
    void (*drop)(void *user, eng_vis_block_t *b); /* after the block ran */
    void *user;
    bool  fast;     /* also the serving blocks under fast (num[1], den[1]) */
    bool  no_exact; /* not the serving blocks under exact (num[0] unused) */
    /* (depth) each: eng_step_error_add's sums, [0] exact, [1] fast */
    double *num[2], *den[2];
} eng_vis_ref_t;

/**
 * @brief The tower's blocks over one image, each block from r->fetch (one
 *        held at a time), with the serving blocks run teacher-forced on
 *        the same inputs and compared (eng_vision_block_errors' measure).
 *        The patch embedding is the serving one; the merger is not run.
 * @returns SVC_OK; SVC_ERR_INVALID (a bad grid), SVC_ERR_NOMEM or fetch's
 *          error, with errstr.
 */
SVC_WUR svc_err_t eng_vision_reference(const eng_vision_t *v, const eng_vis_ref_t *r,
                                       const float *rows, size_t gh, size_t gw, char *errstr,
                                       size_t errstr_size);

/**
 * @brief Runs the tower over one image's patch rows.
 * @param fast the fast profile's kernels (npu_matmul_packed_fast for every
 *        projection, bf16 products in attention); false: exact.
 * @param rows (gh * gw, eng_vis_patch_elems) in the processor's order
 *        (merge-block order, eng_image_int.h).
 * @param gh, gw the patch grid; both multiples of merge.
 * @param out (gh * gw / merge^2, out_hidden): the merged tokens, row-major
 *        over the merged grid.
 * @returns SVC_OK; SVC_ERR_INVALID (a bad grid) or SVC_ERR_NOMEM, with errstr.
 * @remark Memory O(patches * hidden), never patches^2.
 */
SVC_WUR svc_err_t eng_vision_forward(const eng_vision_t *v, bool fast, const float *rows, size_t gh,
                                     size_t gw, float *out, char *errstr, size_t errstr_size);

/**
 * @brief Teacher-forced per-block error of the fast profile's tower against
 *        the exact one's over one image (as eng_fwd_layer_errors for the
 *        text tower): each block's exact input also goes through the block
 *        under fast; num[b] += sum |x_fast - x_exact|^2, den[b] += sum
 *        |x_exact - x_in|^2 over the patches, b < depth.
 * @returns SVC_OK; SVC_ERR_INVALID (a bad grid) or SVC_ERR_NOMEM, with errstr.
 */
SVC_WUR svc_err_t eng_vision_block_errors(const eng_vision_t *v, const float *rows, size_t gh,
                                          size_t gw, double *num, double *den, char *errstr,
                                          size_t errstr_size);

#endif /* D3STREAM_ENG_VISION_INT_H */
