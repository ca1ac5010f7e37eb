/* IDX reader (plain or gzip): the input is the file (ts_data_read_idx, then
 * as both the images and the labels of a pair). */
#include "data/data.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *p = fuzz_file("in.idx", data, size);
    if (!p) return 0;
    ts_array a;
    if (ts_data_read_idx(p, TS_U8, &a) == TS_OK) ts_array_free(&a);
    if (ts_data_read_idx(p, TS_F32, &a) == TS_OK) ts_array_free(&a);
    ts_dataset *d = NULL;
    if (ts_data_load_idx_pair(p, p, &d) == TS_OK) ts_dataset_free(d);
    return 0;
}
