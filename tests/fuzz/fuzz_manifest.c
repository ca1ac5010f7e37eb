/* Checkpoint manifest: the input is manifest.json of a checkpoint
 * directory (ts_ckpt_open without a key: parsing, tensor tiling, file
 * names, then the listed files, which are absent unless the manifest names
 * manifest.json itself). */
#include <stdio.h>
#include "fuzz.h"
#include "tessel/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!fuzz_file("manifest.json", data, size)) return 0;
    ts_ckpt *c = NULL;
    if (ts_ckpt_open(fuzz_dir(), NULL, NULL, &c) == TS_OK) {
        ts_ckpt_info info;
        ts_ckpt_get_info(c, &info);
        for (int i = 0; i < ts_ckpt_tensor_count(c); i++) {
            ts_ckpt_tensor t;
            ts_ckpt_tensor_info(c, i, &t);
        }
        ts_ckpt_close(c);
    }
    return 0;
}
