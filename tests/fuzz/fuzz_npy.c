/* .npy reader: the input is the file (ts_data_read_npy to f32 and to i64,
 * then as both halves of a dataset pair). */
#include <stdlib.h>
#include "data/data.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *p = fuzz_file("in.npy", data, size);
    if (!p) return 0;
    ts_array a;
    if (ts_data_read_npy(p, TS_F32, &a) == TS_OK) ts_array_free(&a);
    if (ts_data_read_npy(p, TS_I64, &a) == TS_OK) ts_array_free(&a);
    ts_dataset *d = NULL;
    if (ts_data_load_npy_pair(p, p, &d) == TS_OK) {
        /* What the session does next with a dataset: split it. */
        ts_dataset *train = NULL, *val = NULL;
        if (ts_dataset_split(d, 0.25, 1, &train, &val) == TS_OK) {
            ts_dataset_free(train);
            ts_dataset_free(val);
        }
        ts_dataset_free(d);
    }
    return 0;
}
