/*
 * eng_util.c -- small file helpers the engine's files share.
 */
#include "eng_util_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

bool eng_dir_has_file(const char *dir, const char *name) {
    char *path = eng_path_join(dir, name);
    bool  ok = path && eng_is_file(path);
    free(path);
    return ok;
}
