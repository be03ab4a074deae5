/*
 * bench_vision.c -- the vision tower alone on a package (e.g. make-package
 * --size nano): one synthetic PNG per size, prepared (decode + resize) and
 * encoded (patch rows + tower), with the tower's FLOPs and GFLOP/s. Built,
 * never run by ctest.
 *
 *   bench_vision DIR [WxH ...]   sizes (default 1024x768 2000x1500)
 *
 * FLOPs: the projections 2 N (3 H^2 + H^2 + 2 H I) per block, the
 * attention 4 N^2 H per block, the patch embedding 2 N H E and the merger
 * 2 (N / m^2) (m^2 H)(m^2 H + O); N patches, H width, I MLP, E patch row.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int one(const eng_model_t *m, uint32_t w, uint32_t h) {
    unsigned char *png = NULL;
    size_t         len = 0;
    char           errstr[512] = "";
    if (eng_image_synth_png(w, h, 1, &png, &len)) {
        fprintf(stderr, "cannot make a %ux%u PNG\n", w, h);
        return 1;
    }
    sch_image_t       img = {png, len, "png", w, h};
    eng_image_prep_t *prep = NULL;
    double            t0 = now_s();
    if (eng_image_prepare(m, &img, &prep, errstr, sizeof errstr)) {
        fprintf(stderr, "%ux%u: %s\n", w, h, errstr);
        free(png);
        return 1;
    }
    double          t1 = now_s();
    eng_image_emb_t emb;
    if (eng_image_encode(m, prep, &emb, errstr, sizeof errstr)) {
        fprintf(stderr, "%ux%u: %s\n", w, h, errstr);
        eng_image_prep_free(prep);
        free(png);
        return 1;
    }
    double           t2 = now_s();
    eng_model_info_t mi;
    eng_model_get_info(m, &mi);
    double N = (double)emb.gh * emb.gw * mi.vis_merge * mi.vis_merge, H = (double)mi.vis_hidden;
    double I = (double)mi.vis_inter, E = 3.0 * 2 * mi.vis_patch * mi.vis_patch;
    double M = H * mi.vis_merge * mi.vis_merge, O = (double)emb.hidden;
    double proj = 2 * N * (4 * H * H + 2 * H * I) * (double)mi.vis_depth;
    double attn = 4 * N * N * H * (double)mi.vis_depth;
    double rest = 2 * N * H * E + 2 * (N / (mi.vis_merge * mi.vis_merge)) * M * (M + O);
    printf("%ux%u: %zu tokens (%.0f patches), prepare %.3f s, encode %.3f s, %.2f TFLOP "
           "(projections %.2f, attention %.2f), %.1f GFLOP/s\n",
           w, h, eng_image_prep_tokens(prep), N, t1 - t0, t2 - t1, (proj + attn + rest) / 1e12,
           proj / 1e12, attn / 1e12, (proj + attn + rest) / (t2 - t1) / 1e9);
    eng_image_emb_fini(&emb);
    eng_image_prep_free(prep);
    free(png);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_vision DIR [WxH ...]\n");
        return 2;
    }
    eng_model_t *m = NULL;
    char         errstr[1024] = "";
    if (eng_model_load(argv[1], &m, errstr, sizeof errstr)) {
        fprintf(stderr, "%s\n", errstr);
        return 1;
    }
    if (!eng_model_has_vision(m)) {
        fprintf(stderr, "%s has no vision tower\n", argv[1]);
        eng_model_free(m);
        return 1;
    }
    static const char *const dflt[] = {"1024x768", "2000x1500"};
    int                      rc = 0;
    for (int i = 0; i < (argc > 2 ? argc - 2 : 2) && !rc; i++) {
        unsigned w = 0, h = 0;
        if (sscanf(argc > 2 ? argv[i + 2] : dflt[i], "%ux%u", &w, &h) != 2) {
            fprintf(stderr, "bad size %s\n", argv[i + 2]);
            rc = 2;
            break;
        }
        rc = one(m, w, h);
    }
    eng_model_free(m);
    return rc;
}
