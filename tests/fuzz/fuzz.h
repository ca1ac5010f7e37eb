/* fuzz.h — what every fuzz harness in tests/fuzz shares.
 *
 * A harness defines LLVMFuzzerTestOneInput and feeds the input to one of
 * tessel's readers through its real entry point (the readers take paths,
 * so the bytes go to a file in a directory private to the process first):
 *
 *     int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
 *         const char *p = fuzz_file("in.npy", data, size);
 *         ts_array a;
 *         if (p && ts_data_read_npy(p, TS_F32, &a) == TS_OK) ts_array_free(&a);
 *         return 0;
 *     }
 *
 * Built with -DTESSEL_FUZZ=ON (clang, `make fuzz`) it links libFuzzer;
 * in the ordinary build it links driver.c, which runs it once over every
 * file of its seed corpus (the ctest fuzz/<target>), so the harnesses keep
 * compiling and the seeds keep passing without clang's fuzzer runtime. */
#ifndef TS_FUZZ_H
#define TS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The process's scratch directory (made on first use, removed at exit). */
const char *fuzz_dir(void);
/* Writes data to fuzz_dir()/name, replacing it; returns the path (valid
 * until the next call with the same name), or NULL if it cannot. */
const char *fuzz_file(const char *name, const void *data, size_t size);

#endif
