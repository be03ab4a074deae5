/*
 * eng_util_int.h -- small file helpers the engine's files share (private:
 * nothing outside engine/ includes it).
 */
#ifndef D3STREAM_ENG_UTIL_INT_H
#define D3STREAM_ENG_UTIL_INT_H

#include <stdbool.h>
#include <stdint.h>

/* "dir/name", malloc'd; NULL when out of memory. */
char *eng_path_join(const char *dir, const char *name);

/* path names a regular file. */
bool eng_is_file(const char *path);

/* dir/name is a regular file (false when out of memory). */
bool eng_dir_has_file(const char *dir, const char *name);

/* Opens path read-only (close-on-exec) when it is a regular file: the
 * descriptor, and *size its length when size is not NULL; else -1 with
 * errno (EINVAL: it exists but is not a regular file). A FIFO in a file's
 * place fails at once instead of blocking the open. */
int eng_open_regular(const char *path, uint64_t *size);

#endif /* D3STREAM_ENG_UTIL_INT_H */
