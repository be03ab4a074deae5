/*
 * npu.h -- the compute device layer: what the machine offers (CPU vector
 * and matrix extensions; an AMD XDNA NPU and the XRT runtime, found and
 * reported but not used: this build has no XDNA backend), the kernels the
 * engine calls (scalar references and fast CPU paths), and the kernels'
 * thread pool. `d3stream version` and `d3stream devices` tell an operator
 * what runs where.
 *
 * Where an XDNA backend plugs in: "The backend interface" below, after the
 * device discovery (and docs/devices.md).
 *
 * Thread-safety: npu_probe() and npu_devices() may be called from any
 * thread; each result is computed once.
 */
#ifndef D3STREAM_NPU_H
#define D3STREAM_NPU_H

#include "svc.h"

typedef struct npu_features {
    bool avx2;
    bool fma;
    bool avx512f;
    bool avx512bw;
    bool avx512dq;
    bool avx512vl;
    bool avx512_vnni;
    bool avx512_bf16;
    bool avx512_fp16;
    bool amx_tile;
    bool amx_int8;
    bool amx_bf16;
    bool amx_usable;   /* the kernel granted this process the AMX tile state */
    int  n_cpus;       /* CPUs this process may run on (affinity), at most its
                        * cgroup's CPU quota rounded up */
    int    n_affinity; /* CPUs in the affinity mask (before the quota) */
    double cpu_quota;  /* the cgroup's CPU quota in CPUs (the tightest on the
                        * way to the root; cgroup v1 or v2), 0: none */
} npu_features_t;

/* The machine's CPU features, probed once (cpuid, arch_prctl, affinity,
 * cgroup). The NPU is npu_devices()'s. */
const npu_features_t *npu_probe(void);

/* Which features npu_features_describe lists. */
typedef enum npu_feature_kind {
    NPU_FEATURES_ALL,
    NPU_FEATURES_VECTOR, /* AVX2, FMA, AVX-512 and its extensions */
    NPU_FEATURES_MATRIX, /* AMX, and amx_usable */
} npu_feature_kind_t;

/* Writes "avx512f avx512_vnni amx_int8 ..." (the features present), or
 * "none". */
SVC_WUR svc_err_t npu_features_describe(const npu_features_t *f, svc_buf_t *out);
/* The same for one kind of features only. */
SVC_WUR svc_err_t npu_features_describe_kind(const npu_features_t *f, npu_feature_kind_t kind,
                                             svc_buf_t *out);

/* ------------------------------------------------------------------------
 * Devices (npu_devices.c, npu_xrt.c): the AMD XDNA NPU and XRT, found
 *
 * Plain C, no XRT headers: every /dev/accel/accel* node is asked its DRM
 * driver (DRM_IOCTL_VERSION), and an amdxdna node its AIE version, columns
 * and firmware (DRM_IOCTL_AMDXDNA_GET_INFO; the firmware from sysfs where
 * the kernel lacks that query); sysfs gives the PCI id (XDNA1: 1022:1502,
 * Phoenix and Hawk Point; XDNA2: 1022:17f0, Strix, Strix Halo, Krackan) and
 * the node's owner and mode say whether this process may open it (the
 * render group). RLIMIT_MEMLOCK, and XRT's core library (dlopen
 * libxrt_coreutil, its version: XDNA needs XRT 2.17 or later).
 *
 * Every finding carries a reason an operator can act on. This build has no
 * XDNA backend, so npu_device_select() never picks the NPU: the report
 * says exactly what is there and what is missing, nothing more.
 * ------------------------------------------------------------------------ */

#define NPU_ACCEL_MAX  8   /* nodes reported (more are counted, not described) */
#define NPU_REASON_MAX 512 /* a finding's reason, NUL included */

typedef enum npu_xdna_gen {
    NPU_XDNA_NONE = 0, /* not an XDNA device, or a PCI id amdxdna does not name */
    NPU_XDNA1,         /* 1022:1502: Phoenix, Hawk Point (npu1) */
    NPU_XDNA2,         /* 1022:17f0: Strix (npu4), Strix Halo (npu5), Krackan (npu6) */
} npu_xdna_gen_t;

/* A version read from the device or a library; known false: not read. */
typedef struct npu_version {
    bool     known;
    unsigned major, minor, patch, build;
} npu_version_t;

/* One /dev/accel/accel* node. */
typedef struct npu_accel {
    char path[32];                /* "/dev/accel/accel0" */
    char driver[64];              /* the DRM driver's name (DRM_IOCTL_VERSION), else
                                   * the sysfs driver link's; "" unknown */
    npu_version_t driver_version; /* the DRM driver's major.minor.patchlevel */
    bool          amdxdna;        /* the amdxdna driver (or an XDNA PCI id, when
                                   * the node could not be asked) */
    bool           pci_known;     /* vendor, device, revision read from sysfs */
    unsigned       vendor, device, revision;
    npu_xdna_gen_t gen;
    const char    *chip;                   /* static: "Strix (npu4)", ...; NULL unknown */
    char           vbnv[64];               /* the driver's own name for it (sysfs vbnv), "" */
    unsigned       mode;                   /* st_mode of the node (0 when stat failed) */
    unsigned       uid, gid;               /* its owner and group */
    char           group[64];              /* the group's name ("render"), or its number */
    bool           in_group;               /* this process is in that group */
    bool           can_open;               /* open(O_RDWR) succeeded */
    int            open_errno;             /* why not (EACCES, ...); 0 when it opened */
    npu_version_t  aie;                    /* AIE architecture major.minor (GET_INFO) */
    unsigned       cols, rows;             /* AIE array (GET_INFO metadata); 0 unknown */
    npu_version_t  firmware;               /* major.minor.patch.build */
    const char    *firmware_from;          /* static: "ioctl", "sysfs"; NULL unknown */
    bool           ready;                  /* an XDNA backend could use this node */
    char           reason[NPU_REASON_MAX]; /* why ready, or what is missing */
} npu_accel_t;

/* XRT's core library. */
typedef struct npu_xrt {
    bool          found;        /* dlopen succeeded */
    char          library[256]; /* the name that opened; "" */
    npu_version_t version;      /* xrtVersionMajor/Minor/Patch */
    bool          new_enough;   /* version >= NPU_XRT_MIN_MAJOR.NPU_XRT_MIN_MINOR */
    char          reason[NPU_REASON_MAX];
} npu_xrt_t;

/* The first XRT with XDNA support (Debian 12's 2.13 predates it). */
#define NPU_XRT_MIN_MAJOR 2
#define NPU_XRT_MIN_MINOR 17

/* RLIMIT_MEMLOCK: XRT pins the buffers it shares with the NPU. */
typedef struct npu_memlock {
    bool     known;
    bool     unlimited;  /* the soft limit is RLIM_INFINITY */
    uint64_t soft, hard; /* bytes (UINT64_MAX: unlimited) */
    bool     ok;         /* unlimited, as the XDNA stack's set-up asks */
    char     reason[NPU_REASON_MAX];
} npu_memlock_t;

/* Everything found. A plain value (no pointers to free). */
typedef struct npu_devices {
    size_t        n_accel;     /* nodes described in accel[] */
    size_t        n_accel_all; /* nodes found (more than NPU_ACCEL_MAX: not all described) */
    npu_accel_t   accel[NPU_ACCEL_MAX];
    npu_memlock_t memlock;
    npu_xrt_t     xrt;
    bool          present;                /* an amdxdna node was found */
    bool          ready;                  /* a node is ready, XRT is new enough and memlock is ok */
    char          reason[NPU_REASON_MAX]; /* the NPU in one line: what is there, and
                                           * the first thing missing */
} npu_devices_t;

/* The discovery, run once per process by the first call (thread-safe).
 * It opens each accel node (and closes it) and dlopens XRT (and closes it):
 * call it where a report is wanted, not from the kernels. */
const npu_devices_t *npu_devices(void);

/* A fresh discovery into d (caller-owned; no cache): what npu_devices()
 * runs once. */
void npu_devices_scan(npu_devices_t *d);

/* What a command asked for (--device). */
typedef enum npu_device_req {
    NPU_DEVICE_AUTO, /* the best backend this build has for what was found */
    NPU_DEVICE_CPU,
    NPU_DEVICE_NPU, /* the NPU or nothing */
} npu_device_req_t;

/**
 * @brief Where the kernels run for req on what d found.
 * @returns SVC_OK: the CPU (this build's only backend), with why in why
 *   (for auto: why not the NPU); SVC_ERR_UNSUPPORTED for NPU_DEVICE_NPU,
 *   with what is missing in why (the discovery's reason, then "no XDNA
 *   backend in this build").
 */
SVC_WUR svc_err_t npu_device_select(const npu_devices_t *d, npu_device_req_t req, char *why,
                                    size_t why_size);

/* ------------------------------------------------------------------------
 * The backend interface: where an XDNA backend plugs in
 *
 * The engine calls the kernels below by their npu_* entry points and never
 * names a device; a backend is a dispatch decision inside this module
 * (npu_fast.c's kernel table and the pack layouts of npu_wpack_new*), so
 * the engine, the scheduler and the contract do not change when one is
 * added. An XDNA backend would have to provide, with the contracts written
 * at each entry point (shapes, aliasing, T = 0, which rows depend on which):
 *  - projections: npu_wpack_new_groups and npu_matmul_packed(_fast, _n) on
 *    the package's own Q4NX tiles (Q4_K/Q4_1 4-bit and Q8 codes with a
 *    scale and a min per group of NPU_GRP_K along K, Q4NX.md), repacked at
 *    load into the NPU's tile layout (npu_wpack_t is opaque for that);
 *    activations fp32 (T, K) row-major in, fp32 (T, N) out;
 *  - attention: npu_attention and npu_attention_lse (GQA, q (Tq, H, D),
 *    k and v (Tk, H_kv, D), non-causal or causal with a prefix, a key
 *    mask, each query's log-sum-exp for npu_attention_merge);
 *  - the Gated DeltaNet: npu_delta_rule (chunks of NPU_DELTA_CHUNK, the
 *    state (H_v, dk, dv) in and out in fp32) and npu_conv1d_causal_silu;
 *  - vision: the tower's matmuls through the same packs, npu_layernorm,
 *    npu_gelu_*, npu_rope_half and npu_attention;
 *  - the norms and activations (npu_rmsnorm*, npu_l2norm, npu_silu_mul,
 *    npu_sigmoid_mul) only where moving a tensor back costs more than them.
 * Each result must stay within the tolerances the tests hold the CPU paths
 * to against the _ref kernels, and the golden check (eng_golden.c) runs on
 * whatever serves before a package is served.
 * How work would split: per call, by size, as the seed runtime
 * (FastFlowLM, D3-NANO-NPU2.md) does: attention on the NPU from 1,536
 * tokens (below that the CPU is faster), the projections where the NPU's
 * measured rate beats the CPU's for that T; the CPU keeps the rest. The
 * scheduler's workers would share the NPU as they share the pool
 * (npu_parallel_for), one context per process.
 * ------------------------------------------------------------------------ */

/* ------------------------------------------------------------------------
 * The kernels' thread pool (npu_pool.c)
 *
 * One per process, started on first use with npu_threads() - 1 threads
 * (D3_NPU_THREADS=N sets npu_threads(), read once; default the CPUs this
 * process may run on). Kernels split their work into items and call
 * npu_parallel_for; the calling thread takes items too, and pool threads
 * that are idle at that moment join in. A call never waits for a busy
 * pool: when several threads (the scheduler's workers) call at once, each
 * runs what the others leave, so there is neither deadlock nor idle time.
 * An idle pool thread, and a caller waiting for its last items, spin for
 * up to 0.1 ms before they sleep (a wake-up cost ~30 us), so a pool busy
 * with passes burns a little CPU between calls and an idle one none.
 * ------------------------------------------------------------------------ */

/* Threads that may run items of one npu_parallel_for (pool + caller). */
size_t npu_threads(void);

/* Runs fn(ctx, i) once for every i in [0, n), in any order and on any of
 * the pool's threads or the caller's, and returns when all have returned
 * (their writes are visible to the caller then). fn must not fail; items
 * must be independent. A fn may itself call npu_parallel_for. Thread-safe. */
void npu_parallel_for(size_t n, void (*fn)(void *ctx, size_t i), void *ctx);

/* Per-thread scratch for kernels: a 64-byte aligned block of at least
 * bytes, kept by the calling thread for its next call with the same slot
 * (grown when too small), freed when the thread exits. Why: a pass calls
 * the matmul ~170 times with multi-MiB buffers, and a malloc/free of that
 * size maps and faults fresh pages every time. The block is the thread's
 * until it asks for the same slot again: a kernel holds a slot only within
 * one call, and nested callers use different slots. NULL when out of
 * memory. Slots: */
#define NPU_SCRATCH_MM_A      0 /* npu_matmul_amx: the row chunk in bf16 */
#define NPU_SCRATCH_MM_C      1 /* npu_matmul_amx: an item's fp32 sums */
#define NPU_SCRATCH_ATTN_KV   2 /* npu_attention_tiled: K and V in tile order */
#define NPU_SCRATCH_ATTN_ITEM 3 /* npu_attention_tiled: one item's Q, S, P, acc */
#define NPU_SCRATCH_CONV      4 /* npu_conv1d_causal_silu: the taps' weights by channel */
#define NPU_SCRATCH_SLOTS     5
void *npu_scratch(int slot, size_t bytes);

/* ------------------------------------------------------------------------
 * Reference kernels (npu_ref.c, npu_ref_delta.c)
 *
 * Scalar fp32 kernels for the Qwen3.5 text tower, written for clarity and
 * accuracy, not speed: the fast paths (AVX-512, AMX, XDNA) are checked
 * against them. The math follows Hugging Face transformers
 * models/qwen3_5/modeling_qwen3_5.py; each function names the function it
 * reproduces.
 *
 * Conventions:
 *  - Tensors are fp32, row-major and contiguous. "x is (T, H, D)" means T
 *    tokens, each H heads of D floats: x[(t * H + h) * D + d].
 *  - Every kernel takes a whole block of T tokens; T may be 0 (no-op).
 *  - Reductions accumulate in double, so a reference result is within a
 *    few fp32 ulps of the exact value; fast kernels need looser tolerances.
 *  - Arguments are not validated beyond SVC_ASSERT on invariants (a wrong
 *    shape is a bug in the caller). Kernels that need scratch memory
 *    malloc it once per call and return SVC_ERR_NOMEM if that fails;
 *    the others return void.
 *  - Outputs must not alias inputs unless the function says they may.
 *  - Thread-safety: all are reentrant (no global state).
 * ------------------------------------------------------------------------ */

/* bf16 <-> fp32. bf16 is the top 16 bits of an IEEE fp32. To bf16 rounds to
 * nearest even, as torch's .to(torch.bfloat16); NaN stays a (quiet) NaN. */
static inline float npu_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float    f;
    memcpy(&f, &u, sizeof f);
    return f;
}
uint16_t npu_f32_to_bf16(float f);

/* RMSNorm over the last dimension (Qwen3_5RMSNorm).
 * x is (T, D), w is (D), out is (T, D); out may equal x.
 * out = x / sqrt(mean(x^2) + eps) * (one_plus_w ? 1 + w : w).
 * Qwen3.5's decoder norms (input_layernorm, post_attention_layernorm, the
 * final norm, q_norm, k_norm) store w zero-centred: pass one_plus_w = true.
 * For q_norm/k_norm pass T = tokens * heads and D = head_dim. */
void npu_rmsnorm_ref(const float *x, const float *w, size_t T, size_t D, float eps, float *out,
                     bool one_plus_w);

/* Gated RMSNorm, the Gated DeltaNet output norm (Qwen3_5RMSNormGated).
 * x, z are (T, D), w is (D), out is (T, D); out may equal x or z.
 * out = x / sqrt(mean(x^2) + eps) * w * silu(z), with the PLAIN weight w
 * (transformers initialises it to ones, not zeros). T = tokens * value
 * heads, D = linear_value_head_dim. */
void npu_rmsnorm_gated_ref(const float *x, const float *z, const float *w, size_t T, size_t D,
                           float eps, float *out);

/* out = x w^T (nn.Linear without bias), double accumulation.
 * x is (T, K), w is (N, K) (torch's Linear.weight layout), out is (T, N). */
void npu_matmul_ref(const float *x, const float *w, size_t T, size_t K, size_t N, float *out);

/* The same with w stored as bf16 rows: w is (N, K) uint16_t bf16 bits. */
void npu_matmul_bf16_ref(const float *x, const uint16_t *w, size_t T, size_t K, size_t N,
                         float *out);

/* Rotary position embedding, in place, HF rotate_half convention with
 * partial rotation (apply_rotary_pos_emb in modeling_qwen3_5.py).
 * x is (T, H, head_dim), pos is (T).
 * Only the first rot_dim (even, <= head_dim) values of each head rotate;
 * with half = rot_dim / 2, for i < half:
 *   inv_freq[i] = theta^(-2i / rot_dim), a = pos * inv_freq[i],
 *   x[i]        = x[i] cos a - x[i + half] sin a,
 *   x[i + half] = x[i + half] cos a + x[i] sin a.
 * Qwen3.5: head_dim 256, partial_rotary_factor 0.25 -> rot_dim 64. */
void npu_rope_ref(float *x, const int32_t *pos, size_t T, size_t H, size_t head_dim, size_t rot_dim,
                  float theta);

/* Multimodal rope (Qwen3_5TextRotaryEmbedding), in place.
 * x is (T, H, head_dim), pos3 is (T, 3): per token the temporal, height
 * and width position ids (for text all three are equal, and the result is
 * exactly npu_rope_ref). section[3] is mrope_section (Qwen3.5: 11, 11, 10;
 * the sum must be rot_dim / 2). Frequency i (< rot_dim / 2) takes its
 * angle from one of the three position ids:
 *  - interleaved (Qwen3.5, recomposition_frequencies): i % 3 == 1 and
 *    i < 3 * section[1] -> height; i % 3 == 2 and i < 3 * section[2] ->
 *    width; otherwise temporal.
 *  - not interleaved (Qwen2-VL layout): the first section[0] frequencies
 *    temporal, the next section[1] height, the rest width.
 * The rotation itself is as in npu_rope_ref. */
void npu_mrope_ref(float *x, const int32_t *pos3, size_t T, size_t H, size_t head_dim,
                   size_t rot_dim, float theta, const int section[3], bool interleaved);

/* Multi-head attention with grouped KV heads (eager_attention_forward +
 * repeat_kv), softmax(q k^T / sqrt(head_dim)) v, computed with an online
 * softmax over blocks of keys: no Tq x Tk matrix, scratch O(head_dim).
 * q is (Tq, n_heads, head_dim); k, v are (Tk, n_kv_heads, head_dim);
 * out is (Tq, n_heads, head_dim). Query head h uses KV head
 * h / (n_heads / n_kv_heads) (repeat_kv is repeat_interleave).
 * causal: Tq <= Tk, the queries are the LAST Tq of the Tk positions (a
 * shared prefix already in k, v), and query i sees key j iff
 * j <= i + (Tk - Tq); otherwise every query sees every key (any Tq, Tk >=
 * 1). key_mask (Tk) or NULL: key j takes part iff key_mask[j] != 0
 * (padding). A query that sees no key gets zeros.
 * lse (Tq, n_heads) or NULL: receives each query's log-sum-exp of the
 * scaled scores it sees, ln sum_j exp(q k_j / sqrt(head_dim)) (-inf when
 * it sees none): what merging the attention over two key sets takes
 * (npu_attention_merge).
 * Qwen3.5's gated attention multiplies out by sigmoid(gate) afterwards;
 * that is the caller's. Returns SVC_ERR_NOMEM if scratch cannot be had. */
SVC_WUR svc_err_t npu_attention_ref(const float *q, const float *k, const float *v, size_t Tq,
                                    size_t Tk, size_t n_heads, size_t n_kv_heads, size_t head_dim,
                                    bool causal, const uint8_t *key_mask, float *out, float *lse);

/* The same by the textbook formula (a full Tq x Tk score matrix per head).
 * Tests only: memory O(Tq * Tk). */
SVC_WUR svc_err_t npu_attention_naive(const float *q, const float *k, const float *v, size_t Tq,
                                      size_t Tk, size_t n_heads, size_t n_kv_heads, size_t head_dim,
                                      bool causal, const uint8_t *key_mask, float *out);

/* The attention over the union of two disjoint key sets from each set's
 * (out, lse) of npu_attention_lse / _ref: per (row, head) r,
 * o[r] = (e^(lse1[r] - M) o1[r] + e^(lse2[r] - M) o2[r]) / (the two
 * weights), M the larger lse, and lse[r] (NULL: not written) the union's
 * log-sum-exp. A side with lse -inf counts 0; zeros when both are. T rows
 * of (n_heads, head_dim); o may equal o1 or o2 and lse lse1 or lse2.
 * Agrees with one call over both sets to fp32 rounding, not bit for bit.
 * Why: noncausal prefix states (eng_forward.c) keep their rows' attention
 * over their own keys, so that a question sharing the prefix attends
 * those rows only to its own new keys. */
void npu_attention_merge(const float *o1, const float *lse1, const float *o2, const float *lse2,
                         size_t T, size_t n_heads, size_t head_dim, float *o, float *lse);

/* Depthwise causal conv over time, then SiLU: the Gated DeltaNet's conv1d
 * (causal_conv1d_fn: F.conv1d with groups = channels, padding K - 1, the
 * first T outputs kept; Qwen3.5 has bias=False, so there is no bias).
 * x is (T, C), w is (C, K) (conv1d.weight (C, 1, K) squeezed), out is
 * (T, C):  out[t][c] = silu(sum_i w[c][i] * x[t - (K - 1) + i][c]).
 * state_in is (K - 1, C) or NULL: the K - 1 inputs before x[0] (oldest
 * first; NULL = zeros, a fresh sequence). state_out is (K - 1, C) or NULL:
 * receives the last K - 1 inputs of the history + x, for the next block;
 * it may equal state_in. Qwen3.5: K = linear_conv_kernel_dim = 4,
 * C = 2 * key_dim + value_dim (q, k, v channels in that order). */
void npu_conv1d_causal_silu_ref(const float *x, const float *w, size_t T, size_t C, size_t K,
                                const float *state_in, float *state_out, float *out);

/* The output channels of a split conv (npu_conv1d_causal_silu_split):
 * n consecutive blocks of width[i] channels (summing to C), block i
 * written row-major as its own (T, width[i]) array out[i]. */
#define NPU_CONV_SPLIT_MAX 4
typedef struct npu_conv_split {
    size_t n;
    size_t width[NPU_CONV_SPLIT_MAX];
    float *out[NPU_CONV_SPLIT_MAX];
} npu_conv_split_t;

/* The split of an unsplit conv: one block of all C channels into out. */
static inline npu_conv_split_t npu_conv_whole(size_t C, float *out) {
    return (npu_conv_split_t){.n = 1, .width = {C}, .out = {out}};
}

/* As npu_conv1d_causal_silu_ref, the outputs split by sp (the Gated
 * DeltaNet's q, k and v out of the mixed qkv, without a copy). */
void npu_conv1d_causal_silu_split_ref(const float *x, const float *w, size_t T, size_t C, size_t K,
                                      const float *state_in, float *state_out,
                                      const npu_conv_split_t *sp);

/* L2 normalisation per row (l2norm in modeling_qwen3_5.py, as FLA):
 * out = x / sqrt(sum(x^2) + eps). Note eps is added to the SUM of squares
 * (not max(norm, eps)); transformers uses eps = 1e-6.
 * x, out are (T, D); out may equal x. For q or k of the Gated DeltaNet pass
 * T = tokens * linear_num_key_heads, D = linear_key_head_dim. */
void npu_l2norm_ref(const float *x, size_t T, size_t D, float eps, float *out);

/* The MLP activation (Qwen3_5MLP): out = silu(gate) * up.
 * gate, up, out are (T, F); out may equal gate or up. */
void npu_silu_mul_ref(const float *gate, const float *up, size_t T, size_t F, float *out);

/* Qwen3.5's attention output gate: x[i] *= sigmoid(gate[i]) over n values,
 * in place (computed in double here). */
void npu_sigmoid_mul_ref(const float *gate, float *x, size_t n);

/* Gated delta rule, token by token: the oracle, as transformers'
 * torch_recurrent_gated_delta_rule. Per value head h, with state S (dk, dv):
 *   S     = S * exp(g[t][h])
 *   delta = beta[t][h] * (v[t][h] - k^T S)
 *   S     = S + k delta^T
 *   out   = (q / sqrt(dk))^T S
 * q, k are (T, n_k_heads, dk) and must ALREADY be L2-normalised
 * (npu_l2norm_ref, eps 1e-6: Qwen3.5 calls the kernel with
 * use_qk_l2norm_in_kernel=True); the 1/sqrt(dk) query scale is applied
 * here. v is (T, n_v_heads, dv); g (log decay, <= 0) and beta (in (0, 1))
 * are (T, n_v_heads), already computed by the caller
 * (g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)).
 * Grouped value heads: n_v_heads is a multiple of n_k_heads and value head
 * h reads q/k head h / (n_v_heads / n_k_heads) (repeat_interleave).
 * state_in is (n_v_heads, dk, dv) or NULL (zeros); state_out is
 * (n_v_heads, dk, dv) or NULL; it may equal state_in. out is
 * (T, n_v_heads, dv). The state is carried in double inside the call. */
SVC_WUR svc_err_t npu_delta_rule_recurrent_ref(const float *q, const float *k, const float *v,
                                               const float *g, const float *beta, size_t T,
                                               size_t n_k_heads, size_t n_v_heads, size_t dk,
                                               size_t dv, const float *state_in, float *state_out,
                                               float *out);

/* Chunk size of npu_delta_rule_chunked_ref (torch_chunk_gated_delta_rule's
 * default, which Qwen3.5 uses). */
#define NPU_DELTA_CHUNK 64

/* The same result computed in chunks of NPU_DELTA_CHUNK tokens in matrix
 * form, as torch_chunk_gated_delta_rule (UT transform by forward
 * substitution inside a chunk, one state update per chunk). Same arguments
 * and contract as npu_delta_rule_recurrent_ref; agrees with it to ~1e-5
 * relative (intermediates in double). This is the structure the fast
 * kernels follow for prefill. */
SVC_WUR svc_err_t npu_delta_rule_chunked_ref(const float *q, const float *k, const float *v,
                                             const float *g, const float *beta, size_t T,
                                             size_t n_k_heads, size_t n_v_heads, size_t dk,
                                             size_t dv, const float *state_in, float *state_out,
                                             float *out);

/* ------------------------------------------------------------------------
 * Fast kernels (npu_fast.c dispatches; npu_avx512.c implements)
 *
 * The same contracts as the _ref kernels above (shapes, layouts, aliasing,
 * T = 0, NOMEM), computed in fp32 with AVX-512 vectors. Numerically they
 * differ from the references in these ways only:
 *  - sums accumulate in fp32 (several vector lanes, then a tree), not in
 *    double, so a result is within ~1e-6 relative of the reference for the
 *    model's shapes (K <= a few thousand), not within a few ulps;
 *  - exp is a vector polynomial (relative error ~2e-7; 0 below about -87);
 *    silu(x) = x / (1 + exp(-x)) uses it, so does the softmax;
 *  - the summation order differs (blocked K, blocked keys).
 * The tests hold them to the reference within 1e-5 relative (max-norm,
 * matmul, norms, conv, activations) and 1e-4 (attention, delta rule).
 *
 * Dispatch: the first call of any of them picks, once per process
 * (pthread_once, so any thread may be first), the AVX-512 kernels when
 * npu_probe() reports avx512f, avx512bw, avx512dq, avx512vl and fma (what
 * their files are compiled for), else the _ref
 * kernels, but the packed matmul (the bulk of a pass: "packed weights"
 * below), attention and the delta rule on oneDNN's sgemm ("generic",
 * npu_attention_dnnl, npu_delta_rule_dnnl). The environment variable
 * D3_NPU_KERNELS=ref forces the _ref kernels everywhere, packed matmul
 * included (bit-identical to calling them directly); it is read once, at
 * that first call, so set it before. D3_NPU_KERNELS=generic gives what a CPU
 * without AVX-512 gets on any CPU. D3_NPU_KERNELS=avx512 keeps the
 * AVX-512 kernels but takes no AMX tile anywhere (matmul, attention, delta
 * rule all in fp32): the fast path's fp32 twin, for accuracy comparisons
 * (tests/bench/bench_accuracy.c). Other values are ignored. Where the CPU
 * has AMX-BF16, the default runs the projections, the wide-head attention
 * and the delta rule's big products on tiles, in the split-bf16 forms
 * described at each (fp32-level accuracy, see the bounds there).
 *
 * Thread-safety: reentrant, as the references; the only global state is
 * the dispatch table, written once.
 * ------------------------------------------------------------------------ */

/* "avx512", "generic" or "ref": which kernels the npu_* fast entry points below run
 * (makes the dispatch decision if no kernel has been called yet). */
const char *npu_kernels_name(void);

/* out = x w^T as npu_matmul_ref (x (T, K), w (N, K), out (T, N)), fp32
 * accumulation. Register-blocked: 8 rows of x by 2 rows of w, 16 vector
 * dot products along K reduced together at the end; K in blocks of 512
 * (partial sums are added into out between blocks), so a result sums in a
 * different order than the reference. out must not alias x or w. */
void npu_matmul(const float *x, const float *w, size_t T, size_t K, size_t N, float *out);

/* ---- packed weights -------------------------------------------------------
 *
 * A projection weight w (N, K) (torch nn.Linear layout: out = x w^T) in the
 * layout the matmul kernel wants, made once at model load:
 *  - AMX-BF16 (the default where npu_probe() reports amx_bf16, avx512_bf16
 *    and amx_usable): w rounded to bf16 (nearest even) in TDPBF16PS's tile
 *    order (npu_amx_mm.c): npu_amx_pack_elems(N, K) uint16_t, half of the
 *    fp32 copy. npu_matmul_packed splits each activation x into
 *    hi = bf16(x) and lo = bf16(x - hi) and accumulates hi w + lo w in fp32
 *    tiles ("amx-bf16x2"): x is then carried to ~2^-17, and the result is
 *    within ~1e-5 relative of the fp32 product of x with the bf16 weight.
 *    Why two products: one bf16 rounding of x (2^-9) is what GPUs do, but
 *    on the tiny random golden model it moves a probability by 2.5e-2,
 *    past issue 7's 1e-2 cap; with the split it moves it by 3e-5.
 *    D3_NPU_MATMUL=bf16 (read once) keeps one product ("amx-bf16"), about
 *    twice as fast, for packages where that accuracy is enough. Weights of
 *    a BF16 package are exact; others (F32, and Q4/Q8 ones where there is
 *    no AMX-INT8) are rounded once to bf16 (2^-9 relative per weight);
 *  - AMX-INT8 for weights the package stored as 4- or 8-bit groups
 *    (npu_wpack_new_quantised, where npu_probe() also reports amx_int8):
 *    weights per output column and activations per row as 16-bit
 *    integers, each two int8 planes, three int8 products ("amx-int8x3",
 *    npu_amx_i8.c): ~1e-4 relative, where the bf16-rounded weights of a
 *    Q4 package moved the synthetic nano's hidden state to cosine 0.998.
 *    D3_NPU_MATMUL=int8x3 puts every weight there (npu_matmul_name() then
 *    says "amx-int8x3"): on the synthetic nano BF16 package the hidden
 *    state stays at cosine 0.99999 of the fp32 path, but a probability
 *    moves by 4.1e-3 instead of bf16x2's 8.4e-5 (its weights are exact);
 *  - without AMX but with AVX-512 VNNI, weights a q4nx package stored as
 *    4- or 8-bit groups keep the package's codes, one byte each, with
 *    their groups' scales and mins (npu_wpack_new_groups,
 *    "avx512-grp8x2", npu_vnni_grp.c: two VPDPBUSD per 4 of K where
 *    int8x3 takes three, the weights exact; measured 1.2x int8x3's
 *    GFLOP/s at the nano shapes on a Zen 5, 1.25 bytes per weight against
 *    2); other quantised weights (F32 values, D3_NPU_MATMUL=int8x3) take
 *    the int8x3 layout and product on VNNI ("avx512-int8x3",
 *    npu_vnni_i8.c: same bits as amx-int8x3, half the bytes of fp32
 *    panels); D3_NPU_KERNELS=avx512-vnni picks these paths on a CPU with
 *    AMX too (the tests' and benchmarks' switch);
 *  - without usable AMX but with AVX512-BF16 (Zen 4 and 5, Cooper Lake;
 *    D3_NPU_KERNELS=avx512-vnni or avx512-bf16 on a CPU with AMX too):
 *    the AMX-BF16 pack and split, multiplied by VDPBF16PS
 *    ("avx512-bf16x2", "avx512-bf16" with D3_NPU_MATMUL=bf16;
 *    npu_avx512_bf16.c: half the bytes of fp32 weights, as fast as
 *    oneDNN's sgemm where the rows are many and faster where they are few);
 *    D3_NPU_MATMUL=onednn keeps fp32 weights on sgemm there instead;
 *  - fp32 weights where neither kernel is used (a CPU without AVX512-BF16
 *    or AVX-512, D3_NPU_KERNELS=avx512 or generic): w as given, multiplied
 *    by oneDNN's sgemm in blocks of 256 output columns over the pool
 *    ("onednn-f32", npu_dnnl.c: 1.4-1.7x our fp32 panels per thread with
 *    AVX-512, and on every core where the panels took one; ~70x the
 *    scalar reference with AVX2 only). A row's result does not
 *    depend on T with oneDNN's AVX-512 kernels; with its AVX2 ones it
 *    does, to fp32 rounding (npu_dnnl.c);
 *  - with D3_NPU_MATMUL=panels instead (the benchmarks' comparison):
 *    K-major panels of NPU_WPACK_NR output
 *    columns, panel p holding w[p * 32 + c][k] at [k][c] (columns past N
 *    are 0): ceil(N / 32) * 32 * K floats, 64-byte aligned. The plain copy
 *    is freed, so at rest a weight costs what its fp32 copy did (plus the
 *    zero columns of the last panel when N is not a multiple of 32);
 *  - with the references (no AVX-512, valgrind, D3_NPU_KERNELS=ref): the
 *    plain (N, K) array itself, no copy; npu_matmul_packed then calls
 *    npu_matmul_ref, bit-identical to it.
 * The layout follows the dispatch decision, made at the first npu_wpack_new
 * or kernel call (whichever comes first) and fixed for the process
 * (npu_matmul_name() says which).
 * Each output row depends only on its own input row, in a fixed order: a
 * product does not change with T or with how rows are split into calls
 * (prefix sharing relies on this).
 * Thread-safety: a pack is read-only after npu_wpack_new; any number of
 * threads may multiply by it at once. Large products (the AMX layout) are
 * split over the pool (npu_parallel_for). */
typedef struct npu_wpack npu_wpack_t;

/* Output columns per panel of the AVX-512 layout. */
#define NPU_WPACK_NR 32

/**
 * @brief Packs the weight w (N, K) for npu_matmul_packed.
 * @param w malloc'd (N, K) fp32 array (N or K may be 0: then w may be NULL,
 *   and a product is zeros (K = 0) or empty (N = 0), as npu_matmul_ref).
 * @returns SVC_OK with *out set: w now belongs to the pack (kept or freed:
 *   the caller must not use it again); SVC_ERR_NOMEM with *out NULL: the
 *   caller still owns w.
 * @remark free with npu_wpack_free.
 */
SVC_WUR svc_err_t npu_wpack_new(float *w, size_t N, size_t K, npu_wpack_t **out);

/**
 * @brief As npu_wpack_new, for a weight that bf16 would round: stored
 *   quantised (4- or 8-bit groups, dequantised to w by the loader), or as
 *   F32 / F16 values with more bits than bf16 keeps (the loader's choice:
 *   eng_ld_pack). Where the CPU has AMX-INT8 (and D3_NPU_MATMUL does not
 *   start with "bf16") it is packed
 *   as 16-bit integers with one scale per output column, two int8 planes,
 *   and multiplied on int8 tiles ("amx-int8x3", npu_amx_i8.c: three int8
 *   products where the bf16 split does four bf16 ones, and the weights
 *   kept to 2^-16 of a column's range instead of bf16's 2^-9 of each);
 *   without AMX but with AVX-512 VNNI the same bytes on VNNI
 *   ("avx512-int8x3"); elsewhere exactly npu_wpack_new. Same ownership.
 */
SVC_WUR svc_err_t npu_wpack_new_quantised(float *w, size_t N, size_t K, npu_wpack_t **out);

/**
 * @brief Packs a weight the package stored in groups of NPU_GRP_K along K:
 *   w[n][k] = d[n][g] u[n][k] + m[n][g], g = k / NPU_GRP_K, G = ceil(K /
 *   NPU_GRP_K) groups per row (Q4_1, Q4_K and Q8 tiles, Q4NX.md §3-4).
 *   Where quantised packs run on AVX-512 VNNI (no AMX; npu_matmul_quantised_name()
 *   "avx512-grp8x2") the codes are kept and multiplied as they are
 *   (npu_vnni_grp.c); elsewhere w is dequantised (d u + m in fp32: the
 *   q4nx decoder's values) and packed by npu_wpack_new_quantised.
 * @param u malloc'd (N, K) codes; d and m malloc'd (N, G) fp32.
 * @returns SVC_OK with *out set: u, d and m now belong to the pack (freed);
 *   SVC_ERR_NOMEM with *out NULL: the caller still owns them.
 * @remark free with npu_wpack_free.
 */
SVC_WUR svc_err_t npu_wpack_new_groups(uint8_t *u, float *d, float *m, size_t N, size_t K,
                                       npu_wpack_t **out);

/**
 * @brief As npu_wpack_new, but in fp32 whatever the process's layout:
 *   oneDNN's sgemm on w as given, or where oneDNN refuses the AVX-512 fp32
 *   panels (the references without AVX-512); no fast companion. The
 *   golden check's reference (eng_golden.c): kernels other than those
 *   that serve, on weights other than the serving packs. Same ownership.
 */
SVC_WUR svc_err_t npu_wpack_new_fp32(float *w, size_t N, size_t K, npu_wpack_t **out);

/* ---- the fast profile (SPEC point 6) ----
 * Where npu_fast_usable() (AVX-512 VNNI with BW and VL, the AVX-512
 * kernels in use, D3_NPU_KERNELS not "avx512"), every pack also holds its
 * weight for the `fast` profile: one integer product per weight, the
 * activations one signed byte per value with a scale per row and group of
 * 32 (llama.cpp's Q8 activations; npu_matmul_vnni_grp8). A pack of group
 * codes on VNNI without AMX (npu_wpack_new_groups) serves both profiles
 * from its codes, nothing added; every other pack keeps a companion: the
 * package's codes where the exact pack was dequantised from them (AMX),
 * else the values as Q8_0 codes (d = max |w| / 127 per group of 32,
 * c = round(w / d): 1 byte and 8 bytes a group more per weight, about
 * 1.25 bytes a weight). npu_matmul_packed_fast multiplies by that;
 * without it (npu_fast_usable() false) it is npu_matmul_packed. Each
 * output row depends only on its own input row, as for the exact path. */
bool npu_fast_usable(void);
/* "avx512-grp8" where npu_fast_usable(), else npu_matmul_groups_name(). */
const char *npu_matmul_fast_name(void);
void        npu_matmul_packed_fast(const float *x, const npu_wpack_t *w, size_t T, float *out);
/* npu_matmul_packed_fast of one x by n <= NPU_GRP8_SHARE_MAX packs of the
 * same K, out[i] (T, N of w[i]), bit for bit as n calls; where every pack
 * runs grp8 the activations are quantised once for all
 * (npu_matmul_vnni_grp8_n). */
void npu_matmul_packed_fast_n(const float *x, size_t T, size_t n, const npu_wpack_t *const *w,
                              float *const *out);
/* Qwen3_5MLP under the fast profile: out (T, N) = down(silu(gate(x)) *
 * up(x)), bit for bit as npu_matmul_packed_fast_n of gate and up into
 * ga and ub (T, F each), npu_silu_mul(ga, ub, T, F, ga) and
 * npu_matmul_packed_fast of down. Where all three run grp8 with matching
 * shapes the three are fused (npu_mlp_vnni_grp8) and ga and ub are not
 * touched; elsewhere (AMX or Q8_0 companions of other shapes, no VNNI)
 * it is those three calls, in ga and ub. */
void npu_mlp_fast(const float *x, size_t T, const npu_wpack_t *gate, const npu_wpack_t *up,
                  const npu_wpack_t *down, float *ga, float *ub, float *out);

/* Whether the pack took an int8x3 layout, AMX or VNNI, or the group codes
 * (npu_wpack_new_quantised, npu_wpack_new_groups). */
bool npu_wpack_is_int8(const npu_wpack_t *wp);

/* Test hook (the golden check's test, D3_TEST_CORRUPT_PACK): flips one
 * bit in every 4 KiB of the packed weight and of its fast companion, as a
 * pack damaged in memory after the manifest check would be. Never called
 * by the product otherwise. */
void npu_wpack_test_corrupt(npu_wpack_t *wp);

/* Frees a pack and its weight; NULL is a no-op. */
void npu_wpack_free(npu_wpack_t *wp);

/* The weight's shape: N (rows of w = columns of out) and K. */
size_t npu_wpack_n(const npu_wpack_t *wp);
size_t npu_wpack_k(const npu_wpack_t *wp);

/* Bytes the pack holds at rest (the weight's storage; not its fast
 * companion's). */
size_t npu_wpack_bytes(const npu_wpack_t *wp);

/* out = x w^T as npu_matmul_ref (x (T, K), out (T, N), with N and K those
 * of the pack), fp32 accumulation in K blocks of 256 (partial sums added
 * into out between blocks), in bf16 products with the AMX layout, int32
 * ones with the AMX-INT8 layout (above). out must not alias x. */
void npu_matmul_packed(const float *x, const npu_wpack_t *w, size_t T, float *out);

/* The AMX-INT8 layout's pieces (npu_amx_i8.c), used by
 * npu_wpack_new_quantised where the CPU has amx_int8: weights per column
 * and activations per row as 16-bit integers in two int8 planes, three
 * int8 products ("amx-int8x3"; the file's header has the scheme and its
 * error).
 * npu_amx_i8_pack_bytes: bytes of a packed (N, K) weight (tiles, then the
 * N column scales); npu_amx_i8_pack writes them into dst (64-byte
 * aligned). npu_matmul_amx_i8: out (T, N) = x (T, K) times the packed w^T,
 * for K <= NPU_AMX_I8_MAX_K (the int32 sums cannot overflow below it);
 * calling it without usable AMX-INT8 is a bug. npu_matmul_i8_ref: the
 * same scheme element by element in double (the tests' reference; needs
 * AVX-512F). */
#define NPU_AMX_I8_MAX_K 65536
size_t npu_amx_i8_pack_bytes(size_t N, size_t K);
void   npu_amx_i8_pack(const float *w, size_t N, size_t K, void *dst);
void   npu_matmul_amx_i8(const float *x, const void *pk, size_t T, size_t K, size_t N, float *out);
void   npu_matmul_i8_ref(const float *x, const void *pk, size_t T, size_t K, size_t N, float *out);
/* The same product with AVX-512 VNNI instead of tiles ("avx512-int8x3",
 * npu_vnni_i8.c: what quantised packs run on a CPU with avx512_vnni but no
 * AMX), on the same pack, bit for bit npu_matmul_amx_i8's result. Calling
 * it without avx512_vnni, avx512bw and avx512vl is a bug. */
void npu_matmul_vnni_i8(const float *x, const void *pk, size_t T, size_t K, size_t N, float *out);

/* The group layout's pieces (npu_vnni_grp.c, "avx512-grp8x2"), used by
 * npu_wpack_new_groups where the CPU has AVX-512 VNNI but no AMX: the
 * package's codes u (one byte each) with d and m per output column and
 * group of NPU_GRP_K along K, w = d u + m; activations per row as the
 * int8x3 scheme's 16-bit integers, two VPDPBUSD per 4 of K (the file's
 * header has the scheme and its error).
 * npu_grp_pack_bytes: bytes of a packed (N, K) weight (a multiple of 64);
 * npu_grp_pack: u (N, K), d and m (N, G = ceil(K / NPU_GRP_K)) into dst
 * (64-byte aligned); npu_grp_pack_at: the pack's w[n][k], d u + m in fp32.
 * npu_matmul_vnni_grp: out (T, N) = x (T, K) times the packed w^T (needs
 * avx512_vnni, avx512bw and avx512vl; never fails: one row at a time if
 * its scratch cannot be had). npu_matmul_grp_ref: the same integers and
 * fp32 operations in scalar code, bit for bit the kernel's result (the
 * tests' reference; any CPU). */
#define NPU_GRP_K 32
size_t npu_grp_pack_bytes(size_t N, size_t K);
void  npu_grp_pack(const uint8_t *u, const float *d, const float *m, size_t N, size_t K, void *dst);
float npu_grp_pack_at(const void *pk, size_t K, size_t n, size_t k);
void  npu_matmul_vnni_grp(const float *x, const void *pk, size_t T, size_t K, size_t N, float *out);
void  npu_matmul_grp_ref(const float *x, const void *pk, size_t T, size_t K, size_t N, float *out);
/* The same pack with one signed byte per activation and a scale per row
 * and group of 32 (max |x| / 127), one VPDPBUSD per 4 of K, the scales
 * applied per group: out = sum_g s (d A + m I) ("avx512-grp8",
 * D3_NPU_MATMUL=grp8; llama.cpp's Q8 activations). Faster, and coarser:
 * the activations keep 2^-8 of their group's largest value instead of
 * 2^-16 of their row's (docs/performance.md: what that costs). npu_matmul_grp8_ref: its
 * scalar reference, bit for bit. */
void npu_matmul_vnni_grp8(const float *x, const void *pk, size_t T, size_t K, size_t N, float *out);
/* Weights a grp8 call may share one quantisation of x among. */
#define NPU_GRP8_SHARE_MAX 4
/* npu_matmul_vnni_grp8 of the same x (T, K) by n <= NPU_GRP8_SHARE_MAX
 * packs pk[i] (N[i], K) into out[i], bit for bit as n separate calls: x
 * is quantised once per row chunk for all of them, and their column
 * panels run as one set of items. */
void npu_matmul_vnni_grp8_n(const float *x, size_t T, size_t K, size_t n, const void *const *pk,
                            const size_t *N, float *const *out);
void npu_matmul_grp8_ref(const float *x, const void *pk, size_t T, size_t K, size_t N, float *out);
/* Qwen3_5MLP on grp8 packs, fused: out (T, N) = down(silu(gate(x)) *
 * up(x)), x (T, K), gate and up (F, K), down (N, F), bit for bit as
 * npu_matmul_vnni_grp8_n of gate and up, npu_silu_mul and
 * npu_matmul_vnni_grp8 of down, without the (T, F) fp32 intermediates:
 * each row chunk's gate and up panels go through silu * up and grp8's
 * quantisation in their epilogue, straight into the down projection's
 * activations (npu_vnni_grp.c, "the fused MLP"). False, with nothing
 * written, for a shape with a zero or when its scratch cannot be had:
 * the caller runs the three calls. Needs what npu_matmul_vnni_grp8 needs. */
bool npu_mlp_vnni_grp8(const float *x, size_t T, size_t K, size_t F, size_t N, const void *gate,
                       const void *up, const void *down, float *out);

/* Whether the fast kernels use AMX tiles in this process: the CPU has
 * amx_bf16 and avx512_bf16, the process may use the tiles, the AVX-512
 * kernels are in use and D3_NPU_KERNELS is neither "avx512" nor
 * "avx512-vnni". Decided once. */
bool npu_amx_enabled(void);

/* "amx-bf16x2", "amx-bf16", "amx-int8x3" (D3_NPU_MATMUL=int8x3),
 * "onednn-f32", "avx512-f32" (D3_NPU_MATMUL=panels) or "ref-f32"
 * (D3_NPU_KERNELS=ref): the packed matmul's layout and precision
 * (above). */
const char *npu_matmul_name(void);

/* The layout of quantised packs (npu_wpack_new_quantised): "amx-int8x3",
 * "avx512-int8x3" (VNNI, no AMX), or npu_matmul_name() where they take
 * the same layout as the others. */
const char *npu_matmul_quantised_name(void);

/* The layout of group-coded packs (npu_wpack_new_groups): "avx512-grp8x2"
 * where they keep their codes (VNNI, no AMX, D3_NPU_MATMUL not int8x3),
 * "avx512-grp8" there with D3_NPU_MATMUL=grp8 (npu_matmul_vnni_grp8),
 * else npu_matmul_quantised_name(). */
const char *npu_matmul_groups_name(void);

/* The AMX-BF16 layout's pieces (npu_amx_mm.c), for the pack, tests and
 * benchmarks. Calling the matmul on a CPU or process without usable AMX
 * is undefined (SIGILL): check npu_probe().
 * npu_amx_pack_elems: uint16_t of a packed (N, K) weight (N rounded up to
 * 32, K to 32). npu_amx_pack_bf16: writes that many into dst.
 * npu_matmul_amx: out (T, N) = x (T, K) times the packed w^T, x rounded to
 * bf16 (split false) or split into bf16 hi + lo (split true), fp32
 * accumulation; split over the pool above ~2 M multiply-adds; needs about
 * (1 or 2) x 512 x K bf16 per call and 1 MiB per item of work, and computes
 * one product at a time instead if an allocation fails (never fails).
 * npu_matmul_amx_bf16 is npu_matmul_amx with split false.
 * npu_amx_pack_at: the bf16 value of w[n][k] in such a pack (any CPU: the
 * kernels' fallbacks without scratch). */
size_t npu_amx_pack_elems(size_t N, size_t K);
float  npu_amx_pack_at(const uint16_t *pk, size_t K, size_t n, size_t k);
void   npu_amx_pack_bf16(const float *w, size_t N, size_t K, uint16_t *dst);
void   npu_matmul_amx_bf16(const float *x, const uint16_t *pk, size_t T, size_t K, size_t N,
                           float *out);
void   npu_matmul_amx(const float *x, const uint16_t *pk, size_t T, size_t K, size_t N, bool split,
                      float *out);

/* The same product on AVX512-BF16's VDPBF16PS, for a CPU without usable
 * AMX (npu_avx512_bf16.c, "avx512-bf16x2"): the AMX-BF16 pack
 * (npu_amx_pack_bf16), x rounded to bf16 or split into hi + lo as
 * npu_matmul_amx does, fp32 accumulation, a row's result independent of
 * the other rows; not the same bits as the tiles. Needs about (1 or 2) x
 * 516 x K bf16 of scratch per call (one product at a time without it;
 * never fails). Undefined without avx512_bf16 (check npu_probe()). */
void npu_matmul_bf16_avx512(const float *x, const uint16_t *pk, size_t T, size_t K, size_t N,
                            bool split, float *out);

/* Attention as npu_attention_ref (online softmax, GQA, causal with the
 * Tq <= Tk prefix offset, key_mask, zeros for a query that sees no key).
 * head_dim <= 32: each KV head's keys are transposed into blocks of 16
 * (d-major) so that 16 scores are D broadcast FMAs; up to 8 queries (the
 * GQA heads of a KV head, then consecutive tokens) share each block; all
 * scores of a query are computed before its max is taken (two passes, no
 * rescaling), npu_attention_small_avx512. Larger heads: the tiled kernel,
 * npu_attention_tiled_mode (npu_attn_fast.c), in NPU_ATTN_BF16X3 on AMX
 * (agrees with the reference to ~1.5e-5) or NPU_ATTN_FP32 without it,
 * spread over the pool's threads. (npu_attention_avx512, the former
 * per-query fp32 path for large heads, is kept for benchmarks.) The
 * references: as D3_NPU_KERNELS=ref says. */
SVC_WUR svc_err_t npu_attention(const float *q, const float *k, const float *v, size_t Tq,
                                size_t Tk, size_t n_heads, size_t n_kv_heads, size_t head_dim,
                                bool causal, const uint8_t *key_mask, float *out);
/* npu_attention for the fast profile (npu_matmul_packed_fast's
 * companion): heads wider than 32 in NPU_ATTN_BF16 (q, k, v and the
 * softmax's p rounded to bf16, fp32 sums; ~7e-3 max-norm error against
 * npu_attention's ~1e-5, at about half its time without AMX) where
 * npu_fast_usable() and the CPU has bf16 products; else npu_attention. */
SVC_WUR svc_err_t npu_attention_fast(const float *q, const float *k, const float *v, size_t Tq,
                                     size_t Tk, size_t n_heads, size_t n_kv_heads, size_t head_dim,
                                     bool causal, const uint8_t *key_mask, float *out);
/* npu_attention, noncausal, with each query's log-sum-exp into lse
 * (Tq, n_heads; required): npu_attention_ref's lse. Tk may be 0 (zeros,
 * lse -inf). */
SVC_WUR svc_err_t npu_attention_lse(const float *q, const float *k, const float *v, size_t Tq,
                                    size_t Tk, size_t n_heads, size_t n_kv_heads, size_t head_dim,
                                    const uint8_t *key_mask, float *out, float *lse);

/* Gated delta rule as npu_delta_rule_chunked_ref (same arguments; state_out
 * may equal state_in). With the AVX-512 kernels, from 8 tokens on and for
 * heads of 64 and more: the chunked form (chunks of NPU_DELTA_CHUNK, UT
 * transform, one state update per chunk) as register-blocked fp32 matrix
 * products (the two biggest, q/k times the state and the state update, on
 * AMX-BF16 tiles as three bf16 products of hi/lo-split operands where the
 * CPU has AMX and dk, dv are multiples of 32; D3_NPU_DELTA=f32 keeps them
 * in fp32), runs of value heads split over npu_parallel_for
 * (npu_delta_rule_chunked_avx512); below 8 tokens (decode) or for small
 * heads (the tiny model's 16) the recurrent form, token by token on one
 * thread (npu_delta_rule_avx512), which is faster there. Both keep the
 * state in fp32 and agree with the references to ~1e-6 (fp32 products) or
 * ~1e-5 (AMX) relative for T up to a few thousand. Scratch: the states plus O(threads * chunk * d)
 * floats, never O(T). */
SVC_WUR svc_err_t npu_delta_rule(const float *q, const float *k, const float *v, const float *g,
                                 const float *beta, size_t T, size_t n_k_heads, size_t n_v_heads,
                                 size_t dk, size_t dv, const float *state_in, float *state_out,
                                 float *out);
/* The fast profile's delta rule (same contract): npu_delta_rule_bf16_avx512
 * where the AVX-512 kernels run, npu_fast_usable() and
 * npu_delta_bf16_usable(); else npu_delta_rule. ~1e-3 of the references
 * instead of ~1e-6 (tests/test_npu_delta.c); on AMX it is npu_delta_rule
 * (the split tile products are fast already). */
SVC_WUR svc_err_t npu_delta_rule_fast(const float *q, const float *k, const float *v,
                                      const float *g, const float *beta, size_t T, size_t n_k_heads,
                                      size_t n_v_heads, size_t dk, size_t dv, const float *state_in,
                                      float *state_out, float *out);

/* As npu_conv1d_causal_silu_ref, 16 channels at a time. Kernel widths
 * K > 16 fall back to the reference. */
void npu_conv1d_causal_silu(const float *x, const float *w, size_t T, size_t C, size_t K,
                            const float *state_in, float *state_out, float *out);
/* As npu_conv1d_causal_silu, the outputs split by sp: each value is the
 * same sum as the unsplit call's, so the bits are its. */
void npu_conv1d_causal_silu_split(const float *x, const float *w, size_t T, size_t C, size_t K,
                                  const float *state_in, float *state_out,
                                  const npu_conv_split_t *sp);

/* As npu_rmsnorm_ref (out may equal x), fp32 sum of squares. */
void npu_rmsnorm(const float *x, const float *w, size_t T, size_t D, float eps, float *out,
                 bool one_plus_w);

/* As npu_rmsnorm_gated_ref (out may equal x or z). */
void npu_rmsnorm_gated(const float *x, const float *z, const float *w, size_t T, size_t D,
                       float eps, float *out);

/* As npu_l2norm_ref (out may equal x). */
void npu_l2norm(const float *x, size_t T, size_t D, float eps, float *out);

/* As npu_silu_mul_ref (out may equal gate or up). */
void npu_silu_mul(const float *gate, const float *up, size_t T, size_t F, float *out);
/* As npu_sigmoid_mul_ref, in fp32 with the vectorised exp (relative error
 * ~1e-7 of the gate). */
void npu_sigmoid_mul(const float *gate, float *x, size_t n);
/* x += y elementwise (the residual adds), over the pool when n is large;
 * x and y must not overlap. Each element is one fp32 add, so the bits are
 * the plain loop's. */
void npu_add(float *x, const float *y, size_t n);

/* ---- Vision tower (npu_vision.c) ---------------------------------------- */

/* nn.LayerNorm over the last dimension: x, out (T, D) (out may equal x),
 * w, b (D); biased variance, sums in double. Rows spread over the pool. */
void npu_layernorm(const float *x, const float *w, const float *b, size_t T, size_t D, float eps,
                   float *out);
/* x (T, N) += b (N) on every row. */
void npu_add_bias(float *x, const float *b, size_t T, size_t N);
/* In place: F.gelu(x, approximate="tanh") (fp32; the AVX-512 path as
 * x * sigmoid(2u), within ~2 ulp of torch's), and F.gelu(x) (erf). */
void npu_gelu_tanh(float *x, size_t n);
void npu_gelu_erf(float *x, size_t n);
/* apply_rotary_pos_emb_vision on x (T, H, D) in place: x * cos +
 * rotate_half(x) * sin, rotate_half(x) = [-x[D/2:], x[:D/2]], with the
 * per-token tables cos_t, sin_t (T, D) shared by the H heads. */
void npu_rope_half(float *x, const float *cos_t, const float *sin_t, size_t T, size_t H, size_t D);

/* The AVX-512 implementations behind the entry points above, for tests and
 * benchmarks that want one regardless of D3_NPU_KERNELS. Calling one on a
 * CPU without avx512f/bw/vl is undefined (SIGILL): check npu_probe(). */
void npu_matmul_avx512(const float *x, const float *w, size_t T, size_t K, size_t N, float *out);
/* The former attention kernel (small-head path, else one query at a time
 * in fp32, single thread): no longer behind npu_attention for head_dim >
 * 32 (npu_attention_tiled_mode is), kept as the benchmarks' baseline. */
svc_err_t npu_attention_avx512(const float *q, const float *k, const float *v, size_t Tq, size_t Tk,
                               size_t n_heads, size_t n_kv_heads, size_t head_dim, bool causal,
                               const uint8_t *key_mask, float *out);
/* The head_dim <= 32 path of npu_attention_avx512 (asserts head_dim <= 32). */
svc_err_t npu_attention_small_avx512(const float *q, const float *k, const float *v, size_t Tq,
                                     size_t Tk, size_t n_heads, size_t n_kv_heads, size_t head_dim,
                                     bool causal, const uint8_t *key_mask, float *out, float *lse);

/* Arithmetic of npu_attention_tiled_mode. */
typedef enum npu_attn_mode {
    NPU_ATTN_FP32,   /* AVX-512 fp32 FMAs throughout */
    NPU_ATTN_BF16,   /* q, k, v and p rounded to bf16, fp32 accumulation: AMX tiles,
                      * or AVX512_BF16 vectors (VDPBF16PS) without AMX */
    NPU_ATTN_BF16X3, /* AMX: each value split hi + lo bf16, three products */
} npu_attn_mode_t;

/* Tiled (flash-attention) attention, npu_attn_fast.c, any head_dim: as
 * npu_attention_ref (same contract). Items of 64 (token, GQA head) query
 * rows of one KV head run on the pool (npu_parallel_for); each walks the
 * keys in blocks of 64: scores as a matrix product, online softmax with
 * running max and sum (the accumulator rescaled when the max grows), then
 * P V as a matrix product. Scratch per item ~64 * (64 + head_dim) floats;
 * K and V are repacked once per call into tile order (scratch of half
 * the fp32 size of K and V in BF16, all of it in BF16X3; FP32 repacks K
 * only, transposed). npu_attention_tiled is NPU_ATTN_BF16. Measured error
 * (max-norm, relative to max |ref|, random q, k in [-2, 2], v in [-1, 1],
 * T <= 2048, head_dim 40..256, tests/test_npu_attn.c): FP32 3.4e-6,
 * BF16X3 1.4e-5, BF16 6.9e-3 (the tests hold them to 1e-4, 1e-4 and
 * 1.5e-2). BF16X3 takes ~2-2.5x BF16's time, FP32 3-5x.
 * Speed, d3-nano's shape (8/2 heads x 256, non-causal), 2 threads of
 * this machine: see tests/bench/bench_kernels.c. */
svc_err_t npu_attention_tiled(const float *q, const float *k, const float *v, size_t Tq, size_t Tk,
                              size_t n_heads, size_t n_kv_heads, size_t head_dim, bool causal,
                              const uint8_t *key_mask, float *out);
/* The same with the arithmetic chosen: BF16X3 falls back to FP32 when
 * npu_attention_amx_usable() is false, BF16 when
 * npu_attention_bf16_usable() is (AMX where usable, else vectors). */
svc_err_t npu_attention_tiled_mode(const float *q, const float *k, const float *v, size_t Tq,
                                   size_t Tk, size_t n_heads, size_t n_kv_heads, size_t head_dim,
                                   bool causal, const uint8_t *key_mask, float *out, float *lse,
                                   npu_attn_mode_t mode);
/* amx_tile, amx_bf16 and amx_usable, and avx512_bf16 (the AMX modes). */
bool npu_attention_amx_usable(void);
/* avx512_bf16 with F, BW and VL: NPU_ATTN_BF16 on vectors. */
bool npu_attention_bf16_usable(void);
/* NULL when oneDNN's sgemm runs here, else why not (its kernels are
 * written at run time, then executed: MemoryDenyWriteExecute= and
 * PR_SET_MDWE refuse that). Probed once with a checked product; the
 * dispatch then takes the references instead of the generic kernels, and
 * our fp32 panels or the reference instead of the onednn-f32 layout.
 * Static string. */
const char *npu_dnnl_refusal(void);
/* out (T, N) = x (T, K) w^T with w (N, K) as given, on oneDNN's sgemm
 * over the pool (npu_dnnl.c: blocking, threads, bits); fp32 accumulation;
 * never fails (the reference takes a block oneDNN refuses). out must not
 * alias x or w. */
void npu_matmul_dnnl(const float *x, const float *w, size_t T, size_t K, size_t N, float *out);
/* c (M, N) = alpha a b^T + beta c, a (M, K) and b (N, K) row-major with
 * row strides lda, ldb, c with ldc: blocks of larger matrices (the
 * quantizer's Hessians, Cholesky and error feedback, engine/eng_gptq.c).
 * oneDNN's sgemm in blocks of 256 x 256 of c over the pool, fp32
 * accumulation; a block it refuses takes a double-accumulating loop, so
 * it never fails. beta 0 ignores c's values (NaN included). c must not
 * overlap a or b. */
void npu_sgemm_nt(size_t M, size_t N, size_t K, float alpha, const float *a, size_t lda,
                  const float *b, size_t ldb, float beta, float *c, size_t ldc);
/* Attention as npu_attention_ref (same contract, fp32), as a tiled
 * online softmax whose block products are oneDNN sgemms over the pool
 * (npu_dnnl.c): what a CPU without AVX-512 runs (D3_NPU_KERNELS=generic).
 * SVC_ERR_UNSUPPORTED when an sgemm is refused (npu_dnnl_refusal; out is
 * then not written), SVC_ERR_NOMEM if scratch cannot be had. */
SVC_WUR svc_err_t npu_attention_dnnl(const float *q, const float *k, const float *v, size_t Tq,
                                     size_t Tk, size_t n_heads, size_t n_kv_heads, size_t head_dim,
                                     bool causal, const uint8_t *key_mask, float *out, float *lse);
/* The delta rule as npu_delta_rule_chunked_ref (same contract and
 * chunks), in fp32 with each chunk's products on oneDNN sgemms, one value
 * head per item of the pool (npu_dnnl.c): what a CPU without AVX-512 runs
 * (D3_NPU_KERNELS=generic). SVC_ERR_NOMEM if scratch cannot be had,
 * SVC_ERR_UNSUPPORTED when an sgemm is refused (npu_dnnl_refusal; out and
 * state_out are then not all written). */
SVC_WUR svc_err_t npu_delta_rule_dnnl(const float *q, const float *k, const float *v,
                                      const float *g, const float *beta, size_t T, size_t n_k_heads,
                                      size_t n_v_heads, size_t dk, size_t dv, const float *state_in,
                                      float *state_out, float *out);
/* The packed matmul on the panel layout above: panels holds
 * ceil(N / 32) panels of K * 32 floats. */
void npu_matmul_panels_avx512(const float *x, const float *panels, size_t T, size_t K, size_t N,
                              float *out);
svc_err_t npu_delta_rule_avx512(const float *q, const float *k, const float *v, const float *g,
                                const float *beta, size_t T, size_t n_k_heads, size_t n_v_heads,
                                size_t dk, size_t dv, const float *state_in, float *state_out,
                                float *out);
/* The chunked delta rule (npu_delta_fast.c), any T (0 included) and head
 * sizes; and what npu_delta_rule runs with the AVX-512 kernels: it, or
 * npu_delta_rule_avx512 above where that is faster (T < 8, dk or dv < 64). */
svc_err_t npu_delta_rule_chunked_avx512(const float *q, const float *k, const float *v,
                                        const float *g, const float *beta, size_t T,
                                        size_t n_k_heads, size_t n_v_heads, size_t dk, size_t dv,
                                        const float *state_in, float *state_out, float *out);
/* Whether npu_delta_rule_bf16_avx512 takes these sizes on this CPU:
 * AVX512-BF16, the chunked form's range (T >= 8, dk and dv >= 64) and dk,
 * dv multiples of 16. */
bool npu_delta_bf16_usable(size_t T, size_t dk, size_t dv);
/* npu_delta_rule_chunked_avx512 with [k; q] S and the state update (3 of
 * a chunk's ~4 dk dv C multiply-adds) as one bf16 product each
 * (VDPBF16PS: the operands rounded to bf16, 2^-9 relative, sums and the
 * state in fp32), about twice the FMA rate; where the CPU has AMX, the
 * split tile products as npu_delta_rule_chunked_avx512. Requires
 * npu_delta_bf16_usable(T, dk, dv). */
svc_err_t npu_delta_rule_bf16_avx512(const float *q, const float *k, const float *v, const float *g,
                                     const float *beta, size_t T, size_t n_k_heads,
                                     size_t n_v_heads, size_t dk, size_t dv, const float *state_in,
                                     float *state_out, float *out);
svc_err_t npu_delta_rule_pick_avx512(const float *q, const float *k, const float *v, const float *g,
                                     const float *beta, size_t T, size_t n_k_heads,
                                     size_t n_v_heads, size_t dk, size_t dv, const float *state_in,
                                     float *state_out, float *out);
void npu_conv1d_causal_silu_avx512(const float *x, const float *w, size_t T, size_t C, size_t K,
                                   const float *state_in, float *state_out, float *out);
void npu_conv1d_causal_silu_split_avx512(const float *x, const float *w, size_t T, size_t C,
                                         size_t K, const float *state_in, float *state_out,
                                         const npu_conv_split_t *sp);
void npu_rmsnorm_avx512(const float *x, const float *w, size_t T, size_t D, float eps, float *out,
                        bool one_plus_w);
void npu_rmsnorm_gated_avx512(const float *x, const float *z, const float *w, size_t T, size_t D,
                              float eps, float *out);
void npu_l2norm_avx512(const float *x, size_t T, size_t D, float eps, float *out);
void npu_silu_mul_avx512(const float *gate, const float *up, size_t T, size_t F, float *out);
void npu_sigmoid_mul_avx512(const float *gate, float *x, size_t n);

#endif /* D3STREAM_NPU_H */
