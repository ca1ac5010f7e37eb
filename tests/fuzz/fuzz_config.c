/* YAML config loader: the input is the file (ts_config_load_string, then
 * ts_config_finish and ts_config_write when it loads). */
#include <stdio.h>
#include "fuzz.h"
#include "tessel/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_dir(); /* quiet logging */
    static ts_config c;
    ts_config_init(&c);
    if (ts_config_load_string(&c, (const char *)data, size, "fuzz.yaml") != TS_OK) return 0;
    if (ts_config_finish(&c) != TS_OK) return 0;
    FILE *null = fopen("/dev/null", "w");
    if (null) {
        ts_config_write(&c, null);
        fclose(null);
    }
    return 0;
}
