/* Per-example source flags (data.valid, src/data/valid.c): attached to a
 * mapped .npy data set, they follow their examples through a split, a
 * shuffled loader with prefetch (several epochs), a kept short batch and
 * ts_dataset_read, always after the batch's targets; a file of another
 * shape, a value other than 0 or 1 and a missing file fail naming it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "data/data.h"
#include "testfiles.h"

enum { N = 37, S = 3, B = 5 };

static char dir[64];

/* example i's flags: a function of i that differs between neighbours */
static uint8_t flag(int64_t i, int k) {
    return (uint8_t)(k == 0 ? i % 2 : k == 1 ? i % 3 == 0 : (i / 2) % 2);
}

/* Every row of a batch (x holds the example's number) has its own flags
 * after the batch's y. */
static int rows_match(const float *x, const float *y, int64_t rows, int64_t batch) {
    const uint8_t *v = (const uint8_t *)(y + batch);
    for (int64_t j = 0; j < rows; j++) {
        const int64_t e = (int64_t)x[j];
        if (y[j] != (float)e) return 0;
        for (int k = 0; k < S; k++)
            if (v[j * S + k] != flag(e, k)) return 0;
    }
    return 1;
}

static void test_follow(void) {
    ts_dataset *all = NULL, *train = NULL, *val = NULL;
    CHECK(ts_data_map_npy_pair(tf_path(dir, "x.npy"), tf_path(dir, "y.npy"), &all) == TS_OK,
          "map: %s", ts_last_error());
    if (!all) return;
    CHECK(ts_dataset_attach_valid(all, tf_path(dir, "valid.npy"), S) == TS_OK, "attach: %s",
          ts_last_error());
    CHECK(all->n_lineage == 3, "lineage has %d files, not x, y and valid", all->n_lineage);
    CHECK(ts_dataset_split(all, 0.3, 7, &train, &val) == TS_OK, "split: %s", ts_last_error());
    float x[B], y[B + B * S / sizeof(float) + 1];
    int ok = 1;
    for (int depth = 0; depth <= 2; depth += 2) {
        ts_loader *l = NULL;
        CHECK(ts_loader_new(train, B, 1, 3, &l) == TS_OK, "loader: %s", ts_last_error());
        ts_loader_keep_last(l);
        CHECK(ts_loader_prefetch(l, depth) == TS_OK, "prefetch: %s", ts_last_error());
        for (int b = 0; b < 3 * ts_loader_batches_per_epoch(l); b++) {
            int64_t rows = 0;
            ok &= ts_loader_next_rows(l, x, y, &rows) == TS_OK && rows_match(x, y, rows, B);
        }
        ts_loader_free(l);
    }
    CHECK(ok, "a training batch's flags are not its examples'");
    ok = 1;
    for (int64_t i = 0; i < val->n; i += B) {
        const int64_t cnt = val->n - i < B ? val->n - i : B;
        ok &= ts_dataset_read(val, i, cnt, x, y) == TS_OK && rows_match(x, y, cnt, cnt);
    }
    CHECK(ok && val->n > B, "a validation batch's flags are not its examples' (%lld examples)",
          (long long)val->n);
    ts_dataset_free(all), ts_dataset_free(train), ts_dataset_free(val);
}

static void bad(const char *name, const char *want) {
    ts_dataset *all = NULL;
    if (ts_data_map_npy_pair(tf_path(dir, "x.npy"), tf_path(dir, "y.npy"), &all) != TS_OK) return;
    const ts_status s = ts_dataset_attach_valid(all, tf_path(dir, name), S);
    CHECK(s != TS_OK && strstr(ts_last_error(), want) && strstr(ts_last_error(), name),
          "%s: status %d, '%s' should name the file and say '%s'", name, s, ts_last_error(), want);
    CHECK(!all->valid && all->n_lineage == 2, "%s: a failed attach left flags or lineage", name);
    ts_dataset_free(all);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/tessel-data-valid-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    float x[N], y[N];
    uint8_t v[N * S];
    for (int i = 0; i < N; i++) {
        x[i] = y[i] = (float)i;
        for (int k = 0; k < S; k++) v[i * S + k] = flag(i, k);
    }
    tf_write_npy(tf_path(dir, "x.npy"), "<f4", N, 1, x, sizeof(float), 0);
    tf_write_npy(tf_path(dir, "y.npy"), "<f4", N, 1, y, sizeof(float), 0);
    tf_write_npy(tf_path(dir, "valid.npy"), "|u1", N, S, v, 1, 0);
    tf_write_npy(tf_path(dir, "cols.npy"), "|u1", N, S - 1, v, 1, 0);
    tf_write_npy(tf_path(dir, "rows.npy"), "|u1", N - 1, S, v, 1, 0);
    int64_t iv[N * S];
    for (int i = 0; i < N * S; i++) iv[i] = v[i];
    iv[5 * S + 2] = -1;
    tf_write_npy(tf_path(dir, "minus.npy"), "<i8", N, S, iv, sizeof(int64_t), 0);
    test_follow();
    bad("cols.npy", "data.valid has shape [37, 2], but the data needs [37, 3]");
    bad("rows.npy", "data.valid has shape [36, 3], but the data needs [37, 3]");
    bad("minus.npy", "data.valid of example 5, source 2 is -1: flags are 0 (missing) or 1");
    bad("none.npy", "cannot open");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) return 1;
    return check_summary("unit/data_valid");
}
