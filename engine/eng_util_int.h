/*
 * eng_util_int.h -- small helpers the engine's files share (private:
 * nothing outside engine/ includes it).
 */
#ifndef D3STREAM_ENG_UTIL_INT_H
#define D3STREAM_ENG_UTIL_INT_H

#include <stdbool.h>
#include <stddef.h>
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

/* The teacher-forced error measures (eng_fwd_layer_errors,
 * eng_vision_block_errors): *num += sum |got - ref|^2 and *den += sum
 * |ref - in|^2 over n values, in double. */
void eng_step_error_add(const float *got, const float *ref, const float *in, size_t n, double *num,
                        double *den);

#endif /* D3STREAM_ENG_UTIL_INT_H */
