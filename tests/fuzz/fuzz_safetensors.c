/* safetensors reader: the input is the file (ts_st_open, then every tensor
 * by index and by name, and a metadata lookup). */
#include "ckpt/safetensors.h"
#include "fuzz.h"

/* The first and last byte of every tensor are read: a pointer or size past
 * the mapped file faults here. */
static volatile unsigned sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *p = fuzz_file("in.safetensors", data, size);
    ts_st_file *f = NULL;
    if (!p || ts_st_open(p, &f) != TS_OK) return 0;
    for (int i = 0; i < ts_st_count(f); i++) {
        ts_st_tensor t;
        if (ts_st_get(f, i, &t) == TS_OK && t.bytes)
            sink += ((const unsigned char *)t.data)[t.bytes - 1];
        if (ts_st_find(f, ts_st_name(f, i), &t) == TS_OK && t.bytes)
            sink += ((const unsigned char *)t.data)[0];
    }
    const char *step = ts_st_metadata(f, "step");
    if (step) sink += (unsigned char)step[0];
    ts_st_close(f);
    return 0;
}
