/*
 * replay.c -- runs a libFuzzer harness over saved inputs without libFuzzer,
 * so that the ordinary and the sanitizer builds (gcc, ctest) replay every
 * seed and every input that once crashed (tests/CMakeLists.txt links one
 * per harness: fuzz_replay_<name>).
 *
 *     fuzz_replay_json tests/fuzz/corpus/json [tests/fuzz/regress/json ...]
 *
 * Each argument is a file or a directory of files (its dotfiles skipped).
 * The first must hold at least one input: an empty or missing seed corpus
 * would pass with nothing tested. Later ones may be missing (a harness
 * with no kept crash has no regress/ directory). Each input is read into a
 * buffer of exactly its size, as libFuzzer does, so that ASan sees a read
 * past its end. A failed check aborts; the name printed last is the input.
 */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* Defined by the harnesses that need set-up, as libFuzzer allows. */
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int replay_file(const char *path) {
    FILE       *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) != 0) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        if (f)
            fclose(f);
        return -1;
    }
    size_t   n = (size_t)st.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    bool     ok = buf && fread(buf, 1, n, f) == n;
    fclose(f);
    if (!ok) {
        fprintf(stderr, "replay: %s: cannot read %zu bytes\n", path, n);
        free(buf);
        return -1;
    }
    printf("replay %s (%zu bytes)\n", path, n);
    fflush(stdout);
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

/* Every file of dir, in name order; how many, or -1. */
static int replay_dir(const char *dir) {
    struct dirent **names;
    int             n = scandir(dir, &names, NULL, alphasort), done = 0;
    if (n < 0)
        return -1;
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
        struct stat st;
        if (names[i]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            if (replay_file(path) != 0)
                done = -1;
            else if (done >= 0)
                done++;
        }
        free(names[i]);
    }
    free(names);
    return done;
}

/* Inputs under path (a file or a directory), -1 on error, 0 if missing. */
static int replay_path(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0)
        return 0;
    if (S_ISDIR(st.st_mode))
        return replay_dir(path);
    return replay_file(path) == 0 ? 1 : -1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS [MORE ...]\n", argv[0]);
        return 2;
    }
    if (LLVMFuzzerInitialize)
        LLVMFuzzerInitialize(&argc, &argv);
    int total = 0;
    for (int i = 1; i < argc; i++) {
        int n = replay_path(argv[i]);
        if (n < 0 || (i == 1 && n == 0)) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], n < 0 ? "unreadable" : "no inputs");
            return 1;
        }
        printf("replay: %d inputs from %s\n", n, argv[i]);
        total += n;
    }
    printf("replay: %d inputs, no failure\n", total);
    return 0;
}
