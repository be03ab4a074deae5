/*
 * eng_util.c -- small file helpers the engine's files share.
 */
#include "eng_util_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char *eng_path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char  *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

bool eng_is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int eng_open_regular(const char *path, uint64_t *size) {
    /* O_NONBLOCK: open() of a FIFO would wait for a writer. Reads and
     * mappings of a regular file do not heed the flag. */
    int         fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    if (fd < 0)
        return -1;
    int e = fstat(fd, &st) != 0 ? errno : S_ISREG(st.st_mode) ? 0 : EINVAL;
    if (e) {
        close(fd);
        errno = e;
        return -1;
    }
    if (size)
        *size = (uint64_t)st.st_size;
    return fd;
}

bool eng_dir_has_file(const char *dir, const char *name) {
    char *path = eng_path_join(dir, name);
    bool  ok = path && eng_is_file(path);
    free(path);
    return ok;
}

void eng_step_error_add(const float *got, const float *ref, const float *in, size_t n, double *num,
                        double *den) {
    for (size_t i = 0; i < n; i++) {
        double e = (double)got[i] - ref[i], c = (double)ref[i] - in[i];
        *num += e * e;
        *den += c * c;
    }
}
