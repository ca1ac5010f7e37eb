/* ts_fed_samples (src/fed/samples.c): a client's FedAvg weight is the
 * examples of its training split, as its local runs split them, for CSV,
 * IDX and .npy data; other sources and unreadable files are refused with a
 * message naming them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "tessel/fed.h"
#include "tessel/tessel.h"

static char dir[] = "/tmp/tessel-fed-samples-XXXXXX";

static void write_bytes(const char *name, const void *b, size_t n) {
    char p[128];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    CHECK(f && fwrite(b, 1, n, f) == n, "writing %s", p);
    if (f) fclose(f);
}

/* An IDX pair of n 2x2 images and n labels. */
static void write_idx(int n) {
    unsigned char h[16] = {0, 0, 8, 3, 0, 0, (unsigned char)(n >> 8), (unsigned char)n, 0, 0,
                           0, 2, 0, 0, 0, 2};
    unsigned char *img = calloc((size_t)n * 4 + 16, 1), *lab = calloc((size_t)n + 8, 1);
    memcpy(img, h, 16);
    unsigned char lh[8] = {0, 0, 8, 1, 0, 0, (unsigned char)(n >> 8), (unsigned char)n};
    memcpy(lab, lh, 8);
    for (int i = 0; i < n; i++) lab[8 + i] = (unsigned char)(i % 3);
    write_bytes("x.idx", img, (size_t)n * 4 + 16);
    write_bytes("y.idx", lab, (size_t)n + 8);
    free(img);
    free(lab);
}

static ts_status samples_of(const char *yaml, int64_t *n) {
    ts_config c;
    ts_config_init(&c);
    ts_status s = ts_config_load_string(&c, yaml, strlen(yaml), "test.yaml");
    *n = -1;
    return s == TS_OK ? ts_fed_samples(&c, n) : s;
}

int main(void) {
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char yaml[1024];
    int64_t n;

    /* IDX: 300 examples, 10 % held out as the session splits them -> 270 */
    write_idx(300);
    snprintf(yaml, sizeof yaml,
             "data: {source: idx, train_images: %s/x.idx, train_labels: %s/y.idx, "
             "val_fraction: 0.1}\n",
             dir, dir);
    CHECK_OK(samples_of(yaml, &n));
    CHECK(n == 270, "idx: %lld samples, want 270", (long long)n);
    /* val_fraction 0.15 of 300 = 45 held out, rounded like ts_dataset_split */
    snprintf(yaml, sizeof yaml,
             "data: {source: idx, train_images: %s/x.idx, train_labels: %s/y.idx, "
             "val_fraction: 0.15}\n",
             dir, dir);
    CHECK_OK(samples_of(yaml, &n));
    CHECK(n == 255, "idx 0.15: %lld samples, want 255", (long long)n);

    /* CSV: 11 lines, a header, 20 % held out -> 8 */
    const char *csv = "a,b\n1,0\n2,1\n3,0\n4,1\n5,0\n6,1\n7,0\n8,1\n9,0\n10,1\n";
    write_bytes("d.csv", csv, strlen(csv));
    snprintf(yaml, sizeof yaml,
             "data: {source: csv, path: %s/d.csv, header: true, label: b, val_fraction: 0.2}\n",
             dir);
    CHECK_OK(samples_of(yaml, &n));
    CHECK(n == 8, "csv: %lld samples, want 8", (long long)n);

    /* a missing IDX file: refused naming it */
    snprintf(yaml, sizeof yaml,
             "data: {source: idx, train_images: %s/none.idx, train_labels: %s/y.idx}\n", dir, dir);
    ts_status s = samples_of(yaml, &n);
    CHECK(s != TS_OK && strstr(ts_last_error(), "none.idx"), "missing idx: %s", ts_last_error());
    /* images and labels of different counts: refused */
    write_bytes("y2.idx", (unsigned char[]){0, 0, 8, 1, 0, 0, 0, 2, 0, 1}, 10);
    snprintf(yaml, sizeof yaml,
             "data: {source: idx, train_images: %s/x.idx, train_labels: %s/y2.idx}\n", dir, dir);
    s = samples_of(yaml, &n);
    CHECK(s != TS_OK && strstr(ts_last_error(), "fed join"), "count mismatch: %s", ts_last_error());
    /* a source with no example count of its own: refused naming it */
    s = samples_of("data: {source: synthetic}\n", &n);
    CHECK(s == TS_ERR_UNSUPPORTED && strstr(ts_last_error(), "synthetic"), "synthetic: %s",
          ts_last_error());

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("unit/fed_samples");
}
