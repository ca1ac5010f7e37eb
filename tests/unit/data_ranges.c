/* Sizes and numbers read from data files, reader by reader, with crafted
 * files: shapes whose dimensions multiply past 2^63 (also behind a 0, where
 * the element count is 0 but an example's size is not), dataset arrays
 * whose examples hold no values (a tiny file claiming 2^30 examples),
 * class ids that would make the derived class count overflow or leave
 * model.classes's range, a context length of INT64_MAX, and the number
 * rule: .npy NaN/Inf and CSV cells that strtod would take but a plain
 * decimal is not (hex, inf, nan, "1e"); an edge line with a trailing comma
 * (a fuzzing find). Each is an error naming the file
 * and the value; built with -DTESSEL_SANITIZE=ON none may trip UBSan. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "data/data.h"
#include "testfiles.h"

#define HAS(sub) (strstr(ts_last_error(), (sub)) != NULL)

static char dir[64];

static const char *path_of(const char *name) {
    static char buf[16][320];
    static int k;
    char *b = buf[k++ % 16];
    snprintf(b, sizeof buf[0], "%s/%s", dir, name);
    return b;
}

static const char *write_bytes(const char *name, const void *data, size_t n) {
    const char *p = path_of(name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(data, 1, n, f) != n) CHECK(0, "cannot write %s", p);
    if (f) fclose(f);
    return p;
}

static const char *write_text(const char *name, const char *text) {
    return write_bytes(name, text, strlen(text));
}

/* A version-1.0 .npy whose header states `shape`, followed by n data bytes. */
static const char *write_npy_shape(const char *name, const char *descr, const char *shape,
                                   const void *data, size_t n) {
    static uint8_t buf[4096];
    char dict[256];
    snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr,
             shape);
    size_t hl = strlen(dict) + 1;
    while ((10 + hl) % 64) hl++;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (uint8_t)hl, buf[9] = (uint8_t)(hl >> 8);
    memset(buf + 10, ' ', hl);
    memcpy(buf + 10, dict, strlen(dict));
    buf[10 + hl - 1] = '\n';
    if (n) memcpy(buf + 10 + hl, data, n);
    return write_bytes(name, buf, 10 + hl + n);
}

static void test_npy_shapes(void) {
    ts_array a;
    /* 2^62 x 2^2: past 2^63 elements. */
    const char *p = write_npy_shape("big.npy", "<f4", "(4611686018427387904, 4)", NULL, 0);
    CHECK(ts_data_read_npy(p, TS_F32, &a) == TS_ERR_FORMAT && HAS(p) &&
              HAS("(4611686018427387904, 4) is too large") && !a.data,
          "2^64 elements: %s", ts_last_error());
    /* (0, 2^62): no elements, but a row of 2^62 f32 is 2^64 bytes. */
    p = write_npy_shape("zero_big.npy", "<f4", "(0, 4611686018427387904)", NULL, 0);
    CHECK(ts_data_read_npy(p, TS_F32, &a) == TS_ERR_FORMAT && HAS("too large") && !a.data,
          "(0, 2^62): %s", ts_last_error());
    /* Dimensions that fit but whose product the file does not hold. */
    p = write_npy_shape("short.npy", "<f4", "(1000000, 1000000)", NULL, 0);
    CHECK(ts_data_read_npy(p, TS_F32, &a) == TS_ERR_FORMAT && HAS("truncated") && !a.data,
          "10^12 elements in an empty file: %s", ts_last_error());
    /* An empty array is still fine to read on its own. */
    p = write_npy_shape("empty.npy", "<f4", "(0, 5)", NULL, 0);
    CHECK_OK(ts_data_read_npy(p, TS_F32, &a));
    ts_array_free(&a);

    /* A pair whose examples hold no values: x (2^30, 0) is 128 bytes on
     * disk and would otherwise be 2^30 examples to split and shuffle. */
    const char *xp = write_npy_shape("x_none.npy", "<f4", "(1073741824, 0)", NULL, 0);
    const char *yp = write_npy_shape("y_none.npy", "<i8", "(1073741824, 0)", NULL, 0);
    ts_dataset *d = NULL;
    CHECK(ts_data_load_npy_pair(xp, yp, &d) == TS_ERR_SHAPE && !d && HAS(xp) &&
              HAS("dimension 1 is 0, so an example holds no values"),
          "examples without values: %s", ts_last_error());
}

static void test_npy_numbers(void) {
    ts_array a;
    float f[6] = {1, 2, 3, 4, 5, 6};
    f[4] = NAN;
    const int64_t d23[2] = {2, 3};
    tf_write_npy_dims(path_of("nan.npy"), "<f4", 2, d23, f, 4);
    const char *p = path_of("nan.npy");
    CHECK(ts_data_read_npy(p, TS_F32, &a) == TS_ERR_FORMAT && HAS(p) &&
              HAS("element 4 (index [1, 1]) is nan; data must be finite numbers") && !a.data,
          "NaN f32: %s", ts_last_error());
    /* The same file read as f64 (the check is on the stored values). */
    CHECK(ts_data_read_npy(p, TS_F64, &a) == TS_ERR_FORMAT && HAS("is nan"), "NaN as f64: %s",
          ts_last_error());
    double g[3] = {0.5, INFINITY, 1};
    tf_write_npy(path_of("inf.npy"), "<f8", 3, 0, g, 8, 0);
    p = path_of("inf.npy");
    CHECK(ts_data_read_npy(p, TS_F32, &a) == TS_ERR_FORMAT && HAS("element 1 (index [1]) is inf"),
          "Inf f64: %s", ts_last_error());
    g[1] = -INFINITY;
    tf_write_npy(path_of("ninf.npy"), "<f8", 3, 0, g, 8, 0);
    CHECK(ts_data_read_npy(path_of("ninf.npy"), TS_F32, &a) == TS_ERR_FORMAT && HAS("is -inf"),
          "-Inf f64: %s", ts_last_error());
    /* A scalar holds index []. */
    float one = NAN;
    p = write_npy_shape("scalar.npy", "<f4", "()", &one, 4);
    CHECK(ts_data_read_npy(p, TS_F32, &a) == TS_ERR_FORMAT && HAS("element 0 (index []) is nan"),
          "NaN scalar: %s", ts_last_error());
    /* Finite extremes pass; integers are never affected. */
    float ok[3] = {-3.4e38f, 1e-45f, 0.0f};
    tf_write_npy(path_of("ok.npy"), "<f4", 3, 0, ok, 4, 0);
    CHECK_OK(ts_data_read_npy(path_of("ok.npy"), TS_F32, &a));
    CHECK(a.data && ((float *)a.data)[0] == -3.4e38f, "finite extremes read back");
    ts_array_free(&a);
}

/* An IDX header of `rank` dimensions (big-endian) with no data. */
static const char *write_idx(const char *name, int rank, const uint32_t *dims, size_t data) {
    static uint8_t buf[256];
    buf[0] = buf[1] = 0, buf[2] = 0x08, buf[3] = (uint8_t)rank;
    for (int i = 0; i < rank; i++)
        for (int b = 0; b < 4; b++) buf[4 + 4 * i + b] = (uint8_t)(dims[i] >> (24 - 8 * b));
    memset(buf + 4 + 4 * rank, 0, data);
    return write_bytes(name, buf, 4 + 4 * (size_t)rank + data);
}

static void test_idx(void) {
    ts_array a;
    /* 0 x (2^32 - 1)^3: no elements, an image of 2^96 pixels. */
    const uint32_t huge[4] = {0, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    const char *p = write_idx("huge.idx", 4, huge, 0);
    CHECK(ts_data_read_idx(p, TS_U8, &a) == TS_ERR_FORMAT && HAS(p) && HAS("too large") && !a.data,
          "IDX 2^96: %s", ts_last_error());
    /* 5 images of 0 x 0 pixels. */
    const uint32_t empty[3] = {5, 0, 0}, labels[1] = {5};
    const char *ip = write_idx("empty_img.idx", 3, empty, 0);
    const char *lp = write_idx("labels.idx", 1, labels, 5);
    ts_dataset *d = NULL;
    CHECK(ts_data_load_idx_pair(ip, lp, &d) == TS_ERR_SHAPE && !d && HAS(ip) &&
              HAS("an example holds no values"),
          "IDX images of no pixels: %s", ts_last_error());
}

/* One CSV of rows "a,y" with `cell` in column a of line 3. */
static ts_status csv_cell(const char *cell, ts_dataset **d) {
    char text[256];
    snprintf(text, sizeof text, "a,y\n1,0\n%s,1\n2,0\n", cell);
    ts_csv_options o = {.path = write_text("cell.csv", text), .label = "y", .window = 1};
    return ts_data_load_csv_windows(&o, d);
}

static void test_csv_numbers(void) {
    static const struct {
        const char *cell;
        float value;
    } good[] = {{"3", 3},        {"-1.5", -1.5f}, {"+2", 2},  {".5", 0.5f},        {"1.", 1},
                {"2e-3", 2e-3f}, {"2E+3", 2e3f},  {" 7 ", 7}, {"\t-0.25", -0.25f}, {"007", 7},
                {"1e-50", 0}};
    for (size_t k = 0; k < sizeof good / sizeof good[0]; k++) {
        ts_dataset *d = NULL;
        ts_status s = csv_cell(good[k].cell, &d);
        CHECK(s == TS_OK && d && ((float *)d->x)[1] == good[k].value, "'%s' reads as %g: %s",
              good[k].cell, (double)good[k].value, s == TS_OK ? "wrong value" : ts_last_error());
        ts_dataset_free(d);
    }
    static const struct {
        const char *cell, *why;
    } bad[] = {{"0x10", "not a plain decimal number"},
               {"0x1p3", "not a plain decimal number"},
               {"inf", "not a finite number"},
               {"-Infinity", "not a finite number"},
               {"nan", "not a finite number"},
               {"NAN(123)", "not a finite number"},
               {"1e", "not a number"},
               {"1e+", "not a number"},
               {".", "not a number"},
               {"-", "not a number"},
               {"1 2", "not a number"},
               {"1e5x", "not a number"},
               {"", "not a number"},
               {"1e39", "too large for f32"},
               {"-1e400", "too large for f32"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        ts_dataset *d = NULL;
        char want[160];
        snprintf(want, sizeof want, "cell.csv:3: column 'a' holds '%s', %s", bad[k].cell,
                 bad[k].why);
        CHECK(csv_cell(bad[k].cell, &d) == TS_ERR_FORMAT && !d && HAS(want), "'%s': want '%s': %s",
              bad[k].cell, want, ts_last_error());
    }
}

static void test_tokens(void) {
    uint16_t t[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    const char *p = write_bytes("t.bin", t, sizeof t);
    ts_dataset *d = NULL;
    CHECK(ts_data_load_tokens(p, 16, INT64_MAX, 100, &d) == TS_ERR_INVALID && !d &&
              HAS("9 tokens, fewer than one example") && HAS("model.ctx 9223372036854775807"),
          "ctx INT64_MAX: %s", ts_last_error());
    CHECK(ts_data_load_tokens(p, 16, 8, 100, &d) == TS_OK && d && d->n == 1, "ctx 8 of 9 tokens");
    ts_dataset_free(d);
    d = NULL;
    CHECK(ts_data_load_tokens(p, 16, 9, 100, &d) == TS_ERR_INVALID && !d, "ctx 9 of 9 tokens");
    p = write_bytes("none.bin", t, 0);
    CHECK(ts_data_load_tokens(p, 16, 1, 100, &d) == TS_ERR_INVALID && !d && HAS("0 tokens"),
          "an empty token file: %s", ts_last_error());
}

static void test_graph(void) {
    const char *edges = write_text("e.csv", "0,1\n1,2\n2,3\n");
    float x[4 * 2] = {0};
    tf_write_npy(path_of("gx.npy"), "<f4", 4, 2, x, 4, 0);
    static const int64_t bad[] = {INT64_MAX, (int64_t)1 << 62, 1000000000};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        int64_t y[4] = {0, 1, bad[k], 1};
        tf_write_npy(path_of("gy.npy"), "<i8", 4, 0, y, 8, 0);
        ts_graph_data g;
        char want[128];
        snprintf(want, sizeof want, "gy.npy: node 2 has label %lld", (long long)bad[k]);
        CHECK(ts_data_load_graph(edges, path_of("gx.npy"), path_of("gy.npy"), 0, &g) ==
                      TS_ERR_INVALID &&
                  HAS(want) && HAS("model.classes [0, 1e9]") && !g.x,
              "graph label %lld: %s", (long long)bad[k], ts_last_error());
    }
    /* The largest class id allowed gives 1e9 classes; with the count set,
     * the same label is simply outside it. */
    int64_t y[4] = {0, 1, 999999999, 1};
    tf_write_npy(path_of("gy.npy"), "<i8", 4, 0, y, 8, 0);
    ts_graph_data g;
    CHECK_OK(ts_data_load_graph(edges, path_of("gx.npy"), path_of("gy.npy"), 0, &g));
    CHECK(g.classes == 1000000000, "label 999999999 gives 1e9 classes (got %lld)",
          (long long)g.classes);
    ts_graph_data_free(&g);
    CHECK(ts_data_load_graph(edges, path_of("gx.npy"), path_of("gy.npy"), 3, &g) ==
                  TS_ERR_INVALID &&
              HAS("node 2 has label 999999999, outside [0, 3)"),
          "label past a set class count: %s", ts_last_error());
    /* Nodes without features. */
    const char *gx0 = write_npy_shape("gx0.npy", "<f4", "(4, 0)", NULL, 0);
    CHECK(ts_data_load_graph(edges, gx0, path_of("gy.npy"), 0, &g) == TS_ERR_SHAPE &&
              HAS("an example holds no values"),
          "nodes without features: %s", ts_last_error());
    /* A trailing comma is an empty second cell (found by fuzz_graph: the
     * message read a cell pointer that was never set). */
    const char *comma = write_text("comma.csv", "0,1\n2,\n");
    ts_edge_list ec;
    CHECK(ts_data_read_edges(comma, 4, &ec) == TS_ERR_FORMAT &&
              HAS("comma.csv:2: '' is not an integer node id"),
          "trailing comma: %s", ts_last_error());
    /* Node ids past int64 in the edge list are not integers. */
    const char *far = write_text("far.csv", "0,1\n1,99999999999999999999\n");
    ts_edge_list e;
    CHECK(ts_data_read_edges(far, 4, &e) == TS_ERR_FORMAT &&
              HAS("far.csv:2: '99999999999999999999' is not an integer node id"),
          "node id past int64: %s", ts_last_error());
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/tessel-ranges-XXXXXX");
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return check_summary("unit/data_ranges");
    }
    test_npy_shapes();
    test_npy_numbers();
    test_idx();
    test_csv_numbers();
    test_tokens();
    test_graph();
    if (!check_failed) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    }
    return check_summary("unit/data_ranges");
}
