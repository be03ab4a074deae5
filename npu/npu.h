/*
 * npu.h -- the compute device layer. In this first slice: what the machine
 * offers (CPU vector and matrix extensions, an AMD XDNA NPU if one is
 * present), so that kernels of later issues can be chosen at run time and so
 * that `d3stream version` tells an operator what will run where.
 *
 * Thread-safety: npu_probe() may be called from any thread; the result is
 * computed once.
 */
#ifndef D3STREAM_NPU_H
#define D3STREAM_NPU_H

#include "svc.h"

typedef struct npu_features {
    bool avx2;
    bool fma;
    bool avx512f;
    bool avx512bw;
    bool avx512vl;
    bool avx512_vnni;
    bool avx512_bf16;
    bool avx512_fp16;
    bool amx_tile;
    bool amx_int8;
    bool amx_bf16;
    bool amx_usable;  /* the kernel granted this process the AMX tile state */
    int  n_cpus;      /* online CPUs this process may run on */
    bool xdna_device; /* an AMD XDNA accelerator node (/dev/accel/accel*) exists */
} npu_features_t;

/* The machine's features, probed once (cpuid, arch_prctl, /dev/accel). */
const npu_features_t *npu_probe(void);

/* Writes "avx512f avx512_vnni amx_int8 ..." (the features present). */
SVC_WUR svc_err_t npu_features_describe(const npu_features_t *f, svc_buf_t *out);

#endif /* D3STREAM_NPU_H */
