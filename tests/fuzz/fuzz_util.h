/*
 * fuzz_util.h -- what the file-format harnesses share (fuzz_safetensors.c,
 * fuzz_q4nx.c): a failed check that libFuzzer and the replay driver both
 * see as a crash, and the input as a file.
 *
 * The package readers take a path and map it (eng_st_open), so an input
 * must be a file: one memfd per process, rewritten for every input, named
 * through /proc/self/fd. A regular file to fstat() and mmap() like any
 * package file, and no disk traffic.
 */
#ifndef D3STREAM_FUZZ_UTIL_H
#define D3STREAM_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FUZZ_CHECK(x)                                                                              \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #x);                  \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Replaces the process's memfd content with data; path gets its name.
 * Aborts when the kernel refuses: a harness that cannot make its file
 * would otherwise pass every input untested. */
static inline void fuzz_file(const uint8_t *data, size_t size, char *path, size_t path_size) {
    static int fd = -1;
    if (fd < 0)
        fd = memfd_create("fuzz-input", MFD_CLOEXEC);
    FUZZ_CHECK(fd >= 0);
    FUZZ_CHECK(ftruncate(fd, 0) == 0);
    size_t done = 0;
    while (done < size) {
        ssize_t k = pwrite(fd, data + done, size - done, (off_t)done);
        FUZZ_CHECK(k > 0);
        done += (size_t)k;
    }
    snprintf(path, path_size, "/proc/self/fd/%d", fd);
}

/* errstr starts with prefix (the reader and the file) and says something after it. */
static inline void fuzz_check_message(const char *errstr, const char *prefix) {
    size_t n = strlen(prefix);
    if (strncmp(errstr, prefix, n) != 0 || errstr[n] == '\0') {
        fprintf(stderr, "message \"%s\" does not start with \"%s\"\n", errstr, prefix);
        abort();
    }
}

#endif /* D3STREAM_FUZZ_UTIL_H */
