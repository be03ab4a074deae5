/*
 * fuzz_image.c -- libFuzzer harness for the image path (ctest replays its
 * saved inputs: fuzz_image):
 * any bytes -> sch_image_probe (the contract's header checks) ->
 * eng_image_decode (libjpeg, libwebp, and our own PNG reader over zlib) ->
 * resize and patches as the vision tower's preprocessor does; never a
 * crash, a leak or undefined behaviour, whatever the bytes.
 *
 * Every decoder the product has is reached: PNG, JPEG and WebP (the
 * formats the contract takes) decode, and every other format's header
 * parser runs in the probe (sch_image_other.c, sch_image_avif.c: BMP,
 * GIF, PPM, AVIF, TIFF, JPEG 2000, ICO, CUR, QOI, TGA), whose verdict is
 * all those formats get. Seeds (tests/fuzz/corpus/image): the golden
 * images and tests/fixtures/image-other.json's cases.
 *
 * Images over 524,288 pixels are skipped after the probe,
 * so that a run spends its time on parsing, not on large decodes.
 */
#include "eng_image_int.h"
#include "sch_int.h"

#define FUZZ_MAX_PIXELS 524288u

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    uint32_t    w, h;
    const char *fail;
    const char *format = sch_image_probe(data, size, &w, &h, &fail);
    if (!format && (!fail || !fail[0]))
        __builtin_trap(); /* a refusal says why */
    if (!format || strcmp(format, "other") == 0 || (uint64_t)w * h > FUZZ_MAX_PIXELS)
        return 0;
    uint32_t big = w > h ? w : h, small = w > h ? h : w;
    if (big / small > 200)
        return 0;
    sch_image_t img = {.bytes = data, .len = size, .format = format, .width = w, .height = h};
    eng_rgb_t   rgb;
    char        errstr[256] = "";
    if (eng_image_decode(&img, &rgb, errstr, sizeof errstr) != SVC_OK) {
        if (!errstr[0])
            __builtin_trap();
        return 0;
    }
    if (rgb.w != w || rgb.h != h)
        __builtin_trap(); /* the decoder must give the probed size */
    /* Touch every pixel: a short buffer shows under ASan. */
    unsigned sum = 0;
    for (size_t i = 0; i < (size_t)w * h * 3; i++)
        sum += rgb.px[i];
    (void)sum;
    eng_rgb_fini(&rgb);
    /* The whole preprocessor: decode again, smart resize, resize, patches. */
    eng_vis_proc_t  proc;
    eng_vis_input_t in;
    eng_vis_proc_default(&proc);
    if (eng_image_preprocess(&img, &proc, &in, errstr, sizeof errstr) == SVC_OK)
        eng_vis_input_fini(&in);
    return 0;
}
