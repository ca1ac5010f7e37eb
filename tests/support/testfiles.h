/* testfiles.h — writing small data files for tests. */
#ifndef TS_TEST_TESTFILES_H
#define TS_TEST_TESTFILES_H

#include <stddef.h>
#include <stdint.h>

/* A version-1.0 .npy file of n rows (cols == 0: a vector of n) of `elem`
 * bytes each, with descr such as "<f4" or "<i8"; the last `cut` bytes of
 * the data are left out (0 for a whole file, > 0 for a truncated one). */
void tf_write_npy(const char *path, const char *descr, int64_t n, int64_t cols, const void *data,
                  size_t elem, size_t cut);

/* The same for any shape: rank dims (rank >= 1), the whole data. */
void tf_write_npy_dims(const char *path, const char *descr, int rank, const int64_t *dims,
                       const void *data, size_t elem);

/* dir/name in one of 4 rotating buffers: up to 4 results can be used at
 * once (enough for a call that takes several paths). */
const char *tf_path(const char *dir, const char *name);

#endif
