/*
 * eng_st_int.h -- private: a validating reader for .safetensors files
 * (Q4NX.md section 1; Hugging Face safetensors format).
 *
 * Layout: u64 LE header length N, N bytes of JSON object (may end in
 * spaces), then the data region; every tensor's data_offsets [b, e) are
 * relative to the start of the data region.
 *
 * The file is mapped read-only and every header field is checked before a
 * pointer into the mapping is handed out, so a descriptor's data/nbytes are
 * always inside the file. Tensor data is only 2-byte aligned at best: read
 * it with memcpy or byte loads, never by casting to float *.
 *
 * Usage:
 *     eng_st_t *st = NULL;
 *     if (eng_st_open(path, &st, errstr, sizeof errstr))
 *         ... report errstr ...
 *     const eng_st_tensor_t *t = eng_st_find(st, "model.norm.weight");
 *     ... eng_st_to_f32(t, out) ...
 *     eng_st_close(st);
 */
#ifndef D3STREAM_ENG_ST_INT_H
#define D3STREAM_ENG_ST_INT_H

#include "svc.h"

#define ENG_ST_MAX_RANK 8
/* Same cap as the reference library: a larger header is an attack, not a model. */
#define ENG_ST_MAX_HEADER 100000000u

/* Element types. Names are the safetensors spellings (eng_dtype_name). */
typedef enum eng_dtype {
    ENG_DT_BOOL,
    ENG_DT_U8,
    ENG_DT_I8,
    ENG_DT_I16,
    ENG_DT_U16,
    ENG_DT_F16,
    ENG_DT_BF16,
    ENG_DT_I32,
    ENG_DT_U32,
    ENG_DT_F32,
    ENG_DT_I64,
    ENG_DT_U64,
    ENG_DT_F64,
    ENG_DT_COUNT
} eng_dtype_t;

const char *eng_dtype_name(eng_dtype_t dt);
size_t      eng_dtype_size(eng_dtype_t dt);

/* One tensor. All pointers belong to the eng_st_t and live until
 * eng_st_close; data points into the read-only mapping. */
typedef struct eng_st_tensor {
    const char *name;
    eng_dtype_t dtype;
    uint32_t    rank; /* 0..ENG_ST_MAX_RANK; rank 0 is a scalar (1 element) */
    uint64_t    shape[ENG_ST_MAX_RANK];
    const void *data;   /* nbytes bytes, read-only, possibly unaligned */
    size_t      nbytes; /* == eng_st_numel * eng_dtype_size (checked at open) */
} eng_st_tensor_t;

typedef struct eng_st eng_st_t;

/**
 * @brief Maps and validates a safetensors file.
 * @returns SVC_OK with *out set (free with eng_st_close); SVC_ERR_IO when the
 *   file cannot be opened/mapped, SVC_ERR_FORMAT/SVC_ERR_TOO_LARGE/
 *   SVC_ERR_UNSUPPORTED for a bad file, SVC_ERR_NOMEM. errstr gets one line
 *   naming the file, the tensor and what was expected.
 * @remark The file must not be truncated while it is open: the mapping
 *   would fault (SIGBUS). Package files are treated as immutable.
 */
SVC_WUR svc_err_t eng_st_open(const char *path, eng_st_t **out, char *errstr, size_t errstr_size);
/* Unmaps and frees; every descriptor from st dies with it. NULL is a no-op. */
void eng_st_close(eng_st_t *st);

const char *eng_st_path(const eng_st_t *st);
size_t      eng_st_count(const eng_st_t *st);
/* Tensors by index 0..count-1, in name (byte) order. */
const eng_st_tensor_t *eng_st_at(const eng_st_t *st, size_t i);
/* NULL when absent. */
const eng_st_tensor_t *eng_st_find(const eng_st_t *st, const char *name);
/* A __metadata__ string, or NULL; owned by st. */
const char *eng_st_metadata(const eng_st_t *st, const char *key);

/* Product of the shape (1 for rank 0); fits: checked at open. */
uint64_t eng_st_numel(const eng_st_tensor_t *t);

/* Scalar conversions (exact: every bf16/f16 value is a float). */
float eng_bf16_to_f32(uint16_t h);
float eng_f16_to_f32(uint16_t h);

/* n little-endian bf16/f16 values at src (any alignment) -> dst. */
void eng_bf16_row_to_f32(const void *src, float *dst, size_t n);
void eng_f16_row_to_f32(const void *src, float *dst, size_t n);

/**
 * @brief Converts a whole BF16, F16 or F32 tensor to float.
 * @param out room for eng_st_numel(t) floats, owned by the caller.
 * @returns SVC_OK, or SVC_ERR_UNSUPPORTED for any other dtype.
 */
SVC_WUR svc_err_t eng_st_to_f32(const eng_st_tensor_t *t, float *out);

/* ----------------------------------------------------------------------
 * A set of safetensors files read as one (eng_st_set.c): a package's
 * model.safetensors, or model.safetensors.index.json and the shards its
 * weight_map names (SPEC e.1), or any other single file.
 * ---------------------------------------------------------------------- */

typedef struct eng_st_set eng_st_set_t;

/* dir/file alone, as eng_st_open (same errors). */
SVC_WUR svc_err_t eng_st_set_open_file(const char *dir, const char *file, eng_st_set_t **out,
                                       char *errstr, size_t errstr_size);
/**
 * @brief Reads dir/index ({"metadata": ..., "weight_map": {tensor: shard}})
 *   and opens every shard it names once.
 * @returns SVC_OK with *out (free with eng_st_set_close); SVC_ERR_FORMAT for
 *   a bad index, a shard name that is not a plain file name in dir (a '/'
 *   or ".."), or a bad shard; SVC_ERR_IO when a shard cannot be opened;
 *   SVC_ERR_NOMEM. errstr names the index, and the tensor and shard at fault.
 */
SVC_WUR svc_err_t eng_st_set_open_index(const char *dir, const char *index, eng_st_set_t **out,
                                        char *errstr, size_t errstr_size);
/* Closes every file; descriptors from the set die with it. NULL is a no-op. */
void eng_st_set_close(eng_st_set_t *s);

/* The file opened (the single file or the index), its name and path. */
const char *eng_st_set_file(const eng_st_set_t *s);
const char *eng_st_set_path(const eng_st_set_t *s);
/* Every tensor of every file, 0..count-1 (mapped or not). */
size_t                 eng_st_set_count(const eng_st_set_t *s);
const eng_st_tensor_t *eng_st_set_at(const eng_st_set_t *s, size_t i);

/**
 * @brief Looks name up: in the file, or through the weight_map in its shard.
 * @param shard, shard_path set to the file that holds (or should hold) it,
 *   owned by s, for messages about the tensor itself.
 * @returns SVC_OK with *t; SVC_ERR_FORMAT when it is missing (from the file,
 *   from the weight_map, or from the shard the map names), errstr naming
 *   the file (the index when sharded), the tensor and the shard.
 */
SVC_WUR svc_err_t eng_st_set_find(const eng_st_set_t *s, const char *name,
                                  const eng_st_tensor_t **t, const char **shard,
                                  const char **shard_path, char *errstr, size_t errstr_size);

#endif /* D3STREAM_ENG_ST_INT_H */
