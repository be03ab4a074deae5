/*
 * bench_model.h -- what the engine benchmarks share (bench_batch.c,
 * bench_share.c, bench_sched.c): opening a package and loading its model.
 */
#ifndef D3_BENCH_MODEL_H
#define D3_BENCH_MODEL_H

#include <stdio.h>

#include "engine.h"

/* Opens the package in dir and loads its model into *pkg and *m (the
 * caller's, freed with eng_package_free / eng_model_free); on failure says
 * why on stderr, prefixed with prog, and returns 1 with nothing held. */
static inline int bench_open_model(const char *prog, const char *dir, eng_package_t **pkg,
                                   eng_model_t **m) {
    char err[1024];
    *pkg = NULL;
    *m = NULL;
    if (eng_package_open(dir, pkg, err, sizeof err) || eng_model_load(dir, m, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", prog, err);
        eng_package_free(*pkg);
        *pkg = NULL;
        return 1;
    }
    return 0;
}

#endif
