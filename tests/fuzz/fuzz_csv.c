/* CSV reader: the first byte picks the options (window 1-4, horizon 0-1,
 * normalise, header or none, a class count, a line skipped), the rest is
 * the file. The label is column "y", or "1" without a header. */
#include "data/data.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t o = data[0];
    const char *p = fuzz_file("in.csv", data + 1, size - 1);
    if (!p) return 0;
    ts_csv_options opt = {.path = p,
                          .window = 1 + (o & 3),
                          .horizon = (o >> 2) & 1,
                          .normalise = (o >> 3) & 1,
                          .no_header = (o >> 4) & 1,
                          .classes = (o >> 5) & 1 ? 3 : 0,
                          .skip_rows = (o >> 6) & 1};
    opt.label = opt.no_header ? "1" : "y";
    const char *features[2] = {"a", "y"};
    if ((o >> 7) & 1 && !opt.no_header) opt.features = features, opt.n_features = 2;
    ts_dataset *d = NULL;
    if (ts_data_load_csv_windows(&opt, &d) == TS_OK) ts_dataset_free(d);
    return 0;
}
