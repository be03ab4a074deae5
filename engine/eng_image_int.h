/*
 * eng_image_int.h -- private: a request image as the vision tower reads it.
 *
 * The upstream runtime (vllm_srun families/decision3/images.py) does, per
 * image: PIL Image.open + verify, Image.open + convert("RGB") (nothing else:
 * no EXIF rotation, alpha dropped, not composited), smart_resize to a
 * multiple of patch * merge within 65,536..1,638,400 pixels, torch's CPU
 * uint8 bicubic antialiased resize, (u8 - mean*255) / (std*255) in fp32,
 * then the patch rows in merge-block order with the frame repeated over the
 * temporal patch. This header is that pipeline in C:
 *
 *     eng_image_decode     bytes -> RGB (eng_image.c; zlib, libjpeg, libwebp)
 *     eng_smart_resize     the target size (eng_vis_pre.c)
 *     eng_image_resize     RGB -> RGB, torch's integer-weight bicubic
 *     eng_image_patches    RGB -> fp32 rows
 *     eng_image_preprocess all of it for one sch_image_t
 *
 * Errors a request can cause are SVC_ERR_INVALID with the SPEC a.10 text
 * WITHOUT the `images[<i>]: ` prefix (the caller adds it), e.g.
 * `invalid image data (OSError)`. Every function is reentrant: no globals.
 */
#ifndef D3STREAM_ENG_IMAGE_INT_H
#define D3STREAM_ENG_IMAGE_INT_H

#include "engine.h"

/* The runtime's pixel budget (images.py MIN_PIXELS, MAX_PIXELS); not the
 * processor file's `size`, which the runtime ignores (SPEC e.7). */
#define ENG_IMG_MIN_PIXELS 65536u
#define ENG_IMG_MAX_PIXELS 1638400u
#define ENG_IMG_MAX_ASPECT 200 /* long side / short side, at most */
/* The contract's cap on a source image (SPEC a.10, images.py MAX_SOURCE_PIXELS). */
#define ENG_IMG_MAX_SOURCE_PX 16000000u

/* An 8-bit RGB image, rows top to bottom, pixels R, G, B. */
typedef struct eng_rgb {
    uint32_t w, h;
    uint8_t *px; /* h * w * 3 bytes, owned: free with eng_rgb_fini */
} eng_rgb_t;

/* Frees px and zeroes *im. NULL or an empty image is a no-op. */
void eng_rgb_fini(eng_rgb_t *im);

/**
 * @brief Decodes a validated image (schemas/sch_image.c: format and header
 *        size already checked) to RGB exactly as Pillow's
 *        `Image.open(b).convert("RGB")` does, after Pillow's verify().
 * @param out on SVC_OK the pixels (w, h = img's header size), owned by the
 *        caller; untouched otherwise.
 * @returns SVC_OK; SVC_ERR_INVALID with `invalid image data (<class>)`
 *          (OSError for corrupt or truncated data, SyntaxError for a PNG
 *          Pillow's verify() refuses); SVC_ERR_NOMEM.
 * @remark Memory is bounded by the header size (<= 16,000,000 pixels): the
 *         decoders are capped at it and the pixels are decoded in place.
 */
SVC_WUR svc_err_t eng_image_decode(const sch_image_t *img, eng_rgb_t *out, char *errstr,
                                   size_t errstr_size);

/* preprocessor_config.json (SPEC e.7), the fields the runtime uses. */
typedef struct eng_vis_proc {
    size_t patch;    /* patch_size (16) */
    size_t temporal; /* temporal_patch_size (2) */
    size_t merge;    /* merge_size (2) */
    float  mean[3];  /* image_mean, as torch.tensor() holds it (fp32) */
    float  std[3];   /* image_std, nonzero */
    double rescale;  /* rescale_factor: always 1/255 (checked) */
} eng_vis_proc_t;

/* Elements of one patch row: 3 * temporal * patch * patch (1536). */
static inline size_t eng_vis_proc_row_elems(const eng_vis_proc_t *p) {
    return 3 * p->temporal * p->patch * p->patch;
}

/* Qwen's defaults: patch 16, temporal 2, merge 2, mean = std = 0.5, 1/255. */
void eng_vis_proc_default(eng_vis_proc_t *p);

/**
 * @brief Reads and checks dir/preprocessor_config.json (SPEC e.7: type,
 *        fixed settings, positive integer patch_size / temporal_patch_size /
 *        merge_size, three finite image_mean and image_std, no zero std).
 * @param present NULL: the file must exist. Otherwise set to whether it
 *        exists; a missing file is then SVC_OK with *out untouched.
 * @returns SVC_OK; SVC_ERR_IO (missing or unreadable), SVC_ERR_FORMAT (a
 *          rule broken: errstr names the file and the key), SVC_ERR_NOMEM.
 */
SVC_WUR svc_err_t eng_vis_proc_load(const char *dir, eng_vis_proc_t *out, bool *present,
                                    char *errstr, size_t errstr_size);

/**
 * @brief Transformers' smart_resize as images.py has it: both sides a
 *        multiple of factor, the area within ENG_IMG_MIN/MAX_PIXELS, Python's
 *        float arithmetic and round-half-even.
 * @returns SVC_OK; SVC_ERR_INVALID past the aspect limit with
 *          `absolute aspect ratio must be smaller than 200, got <ratio>`
 *          (the ratio as Python's repr), or for a zero side / factor.
 */
SVC_WUR svc_err_t eng_smart_resize(uint32_t h, uint32_t w, size_t factor, uint32_t *oh,
                                   uint32_t *ow, char *errstr, size_t errstr_size);

/* The same size computation without the aspect check, for any pixel
 * budget (eng_image_tokens counts any size this way). h, w, factor nonzero. */
void eng_smart_resize_dims(uint32_t h, uint32_t w, size_t factor, uint32_t min_pixels,
                           uint32_t max_pixels, uint32_t *oh, uint32_t *ow);

/**
 * @brief torch F.interpolate(u8 NCHW, (oh, ow), "bicubic",
 *        align_corners=False, antialias=True) on the CPU: int16 weights at
 *        torch's computed precision, a horizontal pass to a uint8
 *        intermediate, then a vertical pass; a side that keeps its size is
 *        not resampled, and an unchanged size is a copy.
 * @param out on SVC_OK a new image owned by the caller.
 * @returns SVC_OK; SVC_ERR_NOMEM; SVC_ERR_INVALID for a zero size.
 */
SVC_WUR svc_err_t eng_image_resize(const eng_rgb_t *in, uint32_t oh, uint32_t ow, eng_rgb_t *out);

/**
 * @brief Normalises a resized image and lays it out as patch rows:
 *        (gh * gw, 3 * temporal * patch * patch) fp32, rows in merge-block
 *        order (block row, block column, row in block, column in block),
 *        each row c, t, y, x with the frame repeated over t.
 * @param rows on SVC_OK malloc'd, owned by the caller (free()).
 * @returns SVC_OK; SVC_ERR_INVALID when a side is not a multiple of
 *          patch * merge; SVC_ERR_NOMEM.
 */
SVC_WUR svc_err_t eng_image_patches(const eng_rgb_t *resized, const eng_vis_proc_t *p, float **rows,
                                    size_t *gh, size_t *gw);

/* One image ready for the tower. */
typedef struct eng_vis_input {
    float   *rows;   /* (gh * gw, eng_vis_proc_row_elems), owned */
    size_t   gh, gw; /* the patch grid (grid_t is 1) */
    uint32_t h, w;   /* the resized size: gh * patch x gw * patch */
    size_t   tokens; /* gh * gw / merge^2 input tokens */
} eng_vis_input_t;

/* Frees rows and zeroes *in; NULL is a no-op. */
void eng_vis_input_fini(eng_vis_input_t *in);

/**
 * @brief decode + smart_resize + resize + patches for one request image.
 * @param out on SVC_OK owned by the caller (eng_vis_input_fini).
 * @returns as the steps do; contract errors are SVC_ERR_INVALID with the
 *          SPEC a.10 text (no `images[i]: ` prefix).
 */
SVC_WUR svc_err_t eng_image_preprocess(const sch_image_t *img, const eng_vis_proc_t *p,
                                       eng_vis_input_t *out, char *errstr, size_t errstr_size);

/* The tower's input rows of a prepared image (eng_image_patches on its
 * resized pixels): *rows (gh * gw, patch elems) owned by the caller. The
 * golden check's image. m has a vision tower. */
SVC_WUR svc_err_t eng_image_prep_rows(const eng_model_t *m, const eng_image_prep_t *p, float **rows,
                                      size_t *gh, size_t *gw);

#endif /* D3STREAM_ENG_IMAGE_INT_H */
