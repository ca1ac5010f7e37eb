/* Datasets and loaders: round trips through every file format (files
 * written here, in a fresh temporary directory), gzip IDX, each kind of bad
 * input with its message, split sizes and determinism, loader order,
 * seeking and epoch wrap, SHA-256 lineage; the real Fashion-MNIST test set
 * when the Debian package is installed. */
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include "check.h"
#include "core/sha256.h"
#include "data/data.h"

#define HAS(sub) (strstr(ts_last_error(), (sub)) != NULL)

static char dir[64];

/* Paths stay valid until the end: each call gets its own slot. */
static char paths[512][320];
static int n_paths;

static const char *path_of(const char *name) {
    char *b = paths[n_paths++ % 512];
    if (snprintf(b, sizeof paths[0], "%s/%.255s", dir, name) < 0) b[0] = 0;
    return b;
}

static const char *write_at(const char *p, const void *data, size_t n) {
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(data, 1, n, f) != n) CHECK(0, "cannot write %s", p);
    if (f) fclose(f);
    return p;
}

static const char *write_bytes(const char *name, const void *data, size_t n) {
    return write_at(path_of(name), data, n);
}

static const char *write_text(const char *name, const char *text) {
    return write_bytes(name, text, strlen(text));
}

static void remove_dir(void) {
    DIR *dd = opendir(dir);
    if (!dd) return;
    struct dirent *e;
    char p[320];
    while ((e = readdir(dd)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            snprintf(p, sizeof p, "%s/%.255s", dir, e->d_name) > 0)
            unlink(p);
    closedir(dd);
    rmdir(dir);
}

/* ---- .npy ---------------------------------------------------------------- */

/* A .npy file with the given header dict, padded as numpy pads it, then
 * `data`. `cut` bytes are dropped from the end (truncation tests). */
static const char *write_npy_raw(const char *name, int major, const char *dict, const void *data,
                                 size_t n, size_t cut) {
    static uint8_t buf[1 << 16];
    const size_t pre = major == 1 ? 10 : 12;
    size_t hl = strlen(dict) + 1;
    while ((pre + hl) % 64) hl++;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (uint8_t)major, buf[7] = 0;
    for (int i = 0; i < (major == 1 ? 2 : 4); i++) buf[8 + i] = (uint8_t)(hl >> (8 * i));
    memset(buf + pre, ' ', hl);
    memcpy(buf + pre, dict, strlen(dict));
    buf[pre + hl - 1] = '\n';
    if (n) memcpy(buf + pre + hl, data, n);
    return write_bytes(name, buf, pre + hl + n - cut);
}

static const char *write_npy(const char *name, int major, const char *descr, const char *shape,
                             const void *data, size_t n) {
    char dict[256];
    snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr,
             shape);
    return write_npy_raw(name, major, dict, data, n, 0);
}

static void test_npy(void) {
    float f[12];
    for (int i = 0; i < 12; i++) f[i] = (float)i * 0.5f - 2.0f;
    ts_array a;
    for (int major = 1; major <= 3; major++) {
        char name[32];
        snprintf(name, sizeof name, "f32_v%d.npy", major);
        const char *p = write_npy(name, major, "<f4", "(3, 4)", f, sizeof f);
        CHECK_OK(ts_data_read_npy(p, TS_F32, &a));
        CHECK(a.dtype == TS_F32 && a.rank == 2 && a.dims[0] == 3 && a.dims[1] == 4, "v%d.0 shape",
              major);
        CHECK(a.data && !memcmp(a.data, f, sizeof f), "v%d.0 data round trip", major);
        CHECK(a.lineage.path && !strcmp(a.lineage.path, p) && a.lineage.bytes == 128 + 48,
              "v%d.0 lineage path and size", major);
        ts_array_free(&a);
    }
    /* Conversions: f4 -> f64, f8 -> f32, i4 -> i64, u1 -> f32, i8 -> i32,
     * whole floats -> i64. */
    const char *p = write_npy("f.npy", 1, "<f4", "(12,)", f, sizeof f);
    CHECK_OK(ts_data_read_npy(p, TS_F64, &a));
    int ok = a.dtype == TS_F64 && a.rank == 1 && a.dims[0] == 12;
    for (int i = 0; ok && i < 12; i++) ok = ((double *)a.data)[i] == f[i];
    CHECK(ok, "f4 to f64");
    ts_array_free(&a);
    double d[3] = {1.25, -3.5, 1e10};
    p = write_npy("d.npy", 1, "<f8", "(3,)", d, sizeof d);
    CHECK_OK(ts_data_read_npy(p, TS_F32, &a));
    CHECK(a.dtype == TS_F32 && ((float *)a.data)[1] == -3.5f && ((float *)a.data)[2] == 1e10f,
          "f8 to f32");
    ts_array_free(&a);
    int32_t i4[4] = {7, -1, 0, 2000000000};
    p = write_npy("i4.npy", 1, "<i4", "(2, 2)", i4, sizeof i4);
    CHECK_OK(ts_data_read_npy(p, TS_I64, &a));
    CHECK(a.dtype == TS_I64 && ((int64_t *)a.data)[1] == -1 && ((int64_t *)a.data)[3] == 2000000000,
          "i4 to i64");
    ts_array_free(&a);
    uint8_t u1[3] = {0, 128, 255};
    p = write_npy("u1.npy", 1, "|u1", "(3,)", u1, sizeof u1);
    CHECK_OK(ts_data_read_npy(p, TS_F32, &a));
    CHECK(((float *)a.data)[2] == 255.0f && ((float *)a.data)[1] == 128.0f, "u1 to f32");
    ts_array_free(&a);
    int64_t i8[2] = {-5, 1LL << 40};
    p = write_npy("i8.npy", 1, "<i8", "(2,)", i8, sizeof i8);
    CHECK_OK(ts_data_read_npy(p, TS_I64, &a));
    CHECK(((int64_t *)a.data)[1] == (1LL << 40), "i8 as i64");
    ts_array_free(&a);
    CHECK(ts_data_read_npy(p, TS_I32, &a) == TS_ERR_FORMAT && HAS("element 1") && HAS("i32") &&
              HAS(p) && !a.data,
          "i8 2^40 does not fit i32: %s", ts_last_error());
    double whole[2] = {3.0, -4.0};
    p = write_npy("whole.npy", 1, "<f8", "(2,)", whole, sizeof whole);
    CHECK_OK(ts_data_read_npy(p, TS_I64, &a));
    CHECK(((int64_t *)a.data)[1] == -4, "whole floats to i64");
    ts_array_free(&a);
    /* Scalars and empty arrays. */
    p = write_npy("scalar.npy", 1, "<f4", "()", f + 3, 4);
    CHECK_OK(ts_data_read_npy(p, TS_F32, &a));
    CHECK(a.rank == 0 && ((float *)a.data)[0] == f[3], "shape () holds one element");
    ts_array_free(&a);
    p = write_npy("empty.npy", 1, "<f4", "(0, 5)", NULL, 0);
    CHECK_OK(ts_data_read_npy(p, TS_F32, &a));
    CHECK(a.rank == 2 && a.dims[0] == 0 && a.dims[1] == 5, "shape (0, 5)");
    ts_array_free(&a);
    /* Keys in another order, double quotes, no trailing comma, Python 2
     * long suffixes. */
    p = write_npy_raw("order.npy", 1,
                      "{\"shape\": (2L, 2L), \"fortran_order\": False, \"descr\": "
                      "\"<f4\"}",
                      f, 16, 0);
    CHECK_OK(ts_data_read_npy(p, TS_F32, &a));
    CHECK(a.rank == 2 && a.dims[1] == 2 && ((float *)a.data)[3] == f[3], "free key order");
    ts_array_free(&a);

    /* Pairs: x to f32 with the example axis split off, integer y to i64,
     * float y to f32. */
    float x[6 * 2 * 3];
    for (int i = 0; i < 36; i++) x[i] = (float)i;
    int32_t yl[6] = {0, 1, 2, 0, 1, 2};
    const char *xp = write_npy("x.npy", 1, "<f4", "(6, 2, 3)", x, sizeof x);
    const char *yp = write_npy("y.npy", 2, "<i4", "(6,)", yl, sizeof yl);
    ts_dataset *ds = NULL;
    CHECK_OK(ts_data_load_npy_pair(xp, yp, &ds));
    if (ds) {
        CHECK(ds->n == 6 && ds->x_dtype == TS_F32 && ds->x_rank == 2 && ds->x_dims[0] == 2 &&
                  ds->x_dims[1] == 3 && ds->y_dtype == TS_I64 && ds->y_rank == 0,
              "npy pair types and shapes");
        CHECK(ts_dataset_x_bytes(ds) == 24 && ts_dataset_y_bytes(ds) == 8, "example sizes");
        CHECK(!memcmp(ds->x, x, sizeof x) && ((int64_t *)ds->y)[5] == 2, "npy pair data");
        char hex[65];
        int64_t bytes = 0;
        CHECK_OK(ts_sha256_path(xp, hex, &bytes));
        CHECK(ds->n_lineage == 2 && !strcmp(ds->lineage[0].path, xp) &&
                  !strcmp(ds->lineage[0].sha256, hex) && ds->lineage[0].bytes == bytes &&
                  !strcmp(ds->lineage[1].path, yp),
              "npy pair lineage");
        ts_dataset_free(ds);
    }
    double yf[12] = {0};
    yp = write_npy("yf.npy", 1, "<f8", "(6, 2)", yf, sizeof yf);
    CHECK_OK(ts_data_load_npy_pair(xp, yp, &ds));
    CHECK(ds && ds->y_dtype == TS_F32 && ds->y_rank == 1 && ds->y_dims[0] == 2, "float y is f32");
    ts_dataset_free(ds);
    yp = write_npy("y5.npy", 1, "<i4", "(5,)", yl, 20);
    CHECK(ts_data_load_npy_pair(xp, yp, &ds) == TS_ERR_SHAPE && !ds && HAS(xp) && HAS(yp) &&
              HAS("6") && HAS("5"),
          "example counts differ: %s", ts_last_error());
}

static void expect_npy_error(const char *what, const char *file, ts_status want, const char *msg) {
    ts_array a;
    ts_status s = ts_data_read_npy(file, TS_F32, &a);
    CHECK(s == want && HAS(file) && HAS(msg) && !a.data, "%s: got %s '%s', expected %s with '%s'",
          what, ts_status_name(s), ts_last_error(), ts_status_name(want), msg);
}

static void test_npy_errors(void) {
    float f[4] = {1, 2, 3, 4};
    const char *base = "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }";
    expect_npy_error("truncated data", write_npy_raw("e1.npy", 1, base, f, 16, 3), TS_ERR_FORMAT,
                     "truncated");
    expect_npy_error("trailing bytes",
                     write_npy_raw("e2.npy", 1,
                                   "{'descr': '<f4', 'fortran_order': False, "
                                   "'shape': (3,), }",
                                   f, 16, 0),
                     TS_ERR_FORMAT, "after the .npy data");
    expect_npy_error("bad magic", write_text("e3.npy", "\x93NUMPX\x01\x00\x10\x00{}        \n"),
                     TS_ERR_FORMAT, "bad magic");
    expect_npy_error("not npy at all", write_text("e4.npy", "hello"), TS_ERR_FORMAT, "bad magic");
    expect_npy_error("big-endian",
                     write_npy_raw("e5.npy", 1,
                                   "{'descr': '>f4', 'fortran_order': False, "
                                   "'shape': (4,), }",
                                   f, 16, 0),
                     TS_ERR_UNSUPPORTED, "big-endian");
    expect_npy_error("Fortran order",
                     write_npy_raw("e6.npy", 1,
                                   "{'descr': '<f4', 'fortran_order': True, "
                                   "'shape': (2, 2), }",
                                   f, 16, 0),
                     TS_ERR_UNSUPPORTED, "Fortran");
    expect_npy_error("f16", write_npy("e7.npy", 1, "<f2", "(8,)", f, 16), TS_ERR_UNSUPPORTED,
                     "dtype '<f2'");
    expect_npy_error("complex", write_npy("e8.npy", 1, "<c8", "(2,)", f, 16), TS_ERR_UNSUPPORTED,
                     "dtype '<c8'");
    expect_npy_error("structured",
                     write_npy_raw("e9.npy", 1,
                                   "{'descr': [('a', '<f4')], 'fortran_order': "
                                   "False, 'shape': (4,), }",
                                   f, 16, 0),
                     TS_ERR_UNSUPPORTED, "structured");
    expect_npy_error("version 4.0", write_npy("e10.npy", 4, "<f4", "(4,)", f, 16),
                     TS_ERR_UNSUPPORTED, "version 4.0");
    expect_npy_error("(4) is not a tuple", write_npy("e11.npy", 1, "<f4", "(4)", f, 16),
                     TS_ERR_FORMAT, "not a tuple");
    expect_npy_error("negative dim", write_npy("e12.npy", 1, "<f4", "(-4,)", f, 16), TS_ERR_FORMAT,
                     "non-negative");
    expect_npy_error("extra key",
                     write_npy_raw("e13.npy", 1,
                                   "{'descr': '<f4', 'fortran_order': False, "
                                   "'shape': (4,), 'x': 1}",
                                   f, 16, 0),
                     TS_ERR_FORMAT, "unexpected key 'x'");
    expect_npy_error(
        "missing shape",
        write_npy_raw("e14.npy", 1, "{'descr': '<f4', 'fortran_order': False}", f, 16, 0),
        TS_ERR_FORMAT, "lacks 'shape'");
    expect_npy_error("duplicate key",
                     write_npy_raw("e15.npy", 1,
                                   "{'descr': '<f4', 'descr': '<f4', "
                                   "'fortran_order': False, 'shape': (4,)}",
                                   f, 16, 0),
                     TS_ERR_FORMAT, "twice");
    expect_npy_error("text after the dict",
                     write_npy_raw("e16.npy", 1,
                                   "{'descr': '<f4', 'fortran_order': False, "
                                   "'shape': (4,)} x",
                                   f, 16, 0),
                     TS_ERR_FORMAT, "after the dict");
    /* A header length pointing past the end of the file. */
    uint8_t hdr[16] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0xff, 0x7f, '{', '}'};
    expect_npy_error("header past the end", write_bytes("e17.npy", hdr, sizeof hdr), TS_ERR_FORMAT,
                     "truncated");
    hdr[8] = 2, hdr[9] = 0; /* a two-byte header "{}" */
    expect_npy_error("no newline", write_bytes("e18.npy", hdr, 12), TS_ERR_FORMAT, "newline");
    float bad[2] = {1.5f, 2.0f};
    ts_array a;
    const char *p = write_npy("e19.npy", 1, "<f4", "(2,)", bad, sizeof bad);
    CHECK(ts_data_read_npy(p, TS_I64, &a) == TS_ERR_FORMAT && HAS("element 0") &&
              HAS("not a whole number"),
          "1.5 is not an integer: %s", ts_last_error());
    double big = 1e300;
    p = write_npy("e20.npy", 1, "<f8", "()", &big, sizeof big);
    CHECK(ts_data_read_npy(p, TS_F32, &a) == TS_ERR_FORMAT && HAS("too large for f32"),
          "1e300 overflows f32: %s", ts_last_error());
    CHECK(ts_data_read_npy(p, TS_F16, &a) == TS_ERR_UNSUPPORTED && HAS("f16"),
          "conversion to f16: %s", ts_last_error());
    CHECK(ts_data_read_npy(path_of("missing.npy"), TS_F32, &a) == TS_ERR_NOT_FOUND &&
              HAS("missing.npy"),
          "missing file: %s", ts_last_error());
    CHECK(ts_data_read_npy(dir, TS_F32, &a) == TS_ERR_IO && HAS(dir), "a directory: %s",
          ts_last_error());
}

/* ---- IDX ----------------------------------------------------------------- */

static size_t idx_bytes(uint8_t *buf, int rank, const uint32_t *dims, const uint8_t *data) {
    size_t n = 1, k = 4;
    buf[0] = buf[1] = 0, buf[2] = 0x08, buf[3] = (uint8_t)rank;
    for (int i = 0; i < rank; i++) {
        for (int b = 0; b < 4; b++) buf[k++] = (uint8_t)(dims[i] >> (24 - 8 * b));
        n *= dims[i];
    }
    memcpy(buf + k, data, n);
    return k + n;
}

static const char *write_gz(const char *name, const void *data, size_t n) {
    const char *p = path_of(name);
    gzFile g = gzopen(p, "wb");
    CHECK(g && gzwrite(g, data, (unsigned)n) == (int)n, "gzwrite %s", p);
    if (g) gzclose(g);
    return p;
}

static uint8_t *read_all(const char *p, size_t *n) {
    static uint8_t buf[1 << 16];
    FILE *f = fopen(p, "rb");
    *n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    return buf;
}

static void test_idx(void) {
    enum { N = 5, R = 3, C = 4 };
    uint8_t px[N * R * C], lab[N] = {3, 0, 9, 1, 3}, buf[512], buf2[64];
    for (int i = 0; i < N * R * C; i++) px[i] = (uint8_t)(i * 37 % 256);
    size_t ni = idx_bytes(buf, 3, (uint32_t[]){N, R, C}, px);
    size_t nl = idx_bytes(buf2, 1, (uint32_t[]){N}, lab);
    const char *ip = write_bytes("img.idx", buf, ni), *lp = write_bytes("lab.idx", buf2, nl);
    const char *igz = write_gz("img.idx.gz", buf, ni), *lgz = write_gz("lab.idx.gz", buf2, nl);
    for (int gz = 0; gz < 2; gz++) {
        ts_dataset *d = NULL;
        CHECK_OK(ts_data_load_idx_pair(gz ? igz : ip, gz ? lgz : lp, &d));
        if (!d) continue;
        CHECK(d->n == N && d->x_dtype == TS_F32 && d->x_rank == 1 && d->x_dims[0] == R * C &&
                  d->y_dtype == TS_I64 && d->y_rank == 0,
              "IDX pair shapes (gzip %d)", gz);
        int ok = 1;
        for (int i = 0; i < N * R * C; i++) ok &= ((float *)d->x)[i] == (float)px[i] / 255.0f;
        for (int i = 0; i < N; i++) ok &= ((int64_t *)d->y)[i] == lab[i];
        CHECK(ok, "IDX pair values (gzip %d)", gz);
        char hex[65];
        CHECK_OK(ts_sha256_path(gz ? igz : ip, hex, NULL));
        CHECK(d->n_lineage == 2 && !strcmp(d->lineage[0].sha256, hex) &&
                  !strcmp(d->lineage[1].path, gz ? lgz : lp),
              "IDX lineage hashes the file as stored (gzip %d)", gz);
        ts_dataset_free(d);
    }
    ts_array a;
    CHECK_OK(ts_data_read_idx(igz, TS_U8, &a));
    CHECK(a.dtype == TS_U8 && a.rank == 3 && a.dims[2] == C && !memcmp(a.data, px, sizeof px),
          "IDX u8 read");
    ts_array_free(&a);

    /* Two gzip members back to back read as one stream, as with gunzip. */
    size_t na, nb;
    const char *ha = write_gz("half_a.gz", buf, 30), *hb = write_gz("half_b.gz", buf + 30, ni - 30);
    static uint8_t cat[4096];
    uint8_t *pa = read_all(ha, &na);
    memcpy(cat, pa, na);
    uint8_t *pb = read_all(hb, &nb);
    memcpy(cat + na, pb, nb);
    const char *mp = write_bytes("multi.gz", cat, na + nb);
    CHECK_OK(ts_data_read_idx(mp, TS_U8, &a));
    CHECK(a.data && a.dims[0] == N && !memcmp(a.data, px, sizeof px), "two gzip members");
    ts_array_free(&a);

    /* Bad input. */
#define IDX_ERR(what, file, want, msg)                                                             \
    do {                                                                                           \
        const char *f_ = (file);                                                                   \
        ts_status s_ = ts_data_read_idx(f_, TS_U8, &a);                                            \
        CHECK(s_ == (want) && HAS(f_) && HAS(msg) && !a.data, "%s: %s: %s", what,                  \
              ts_status_name(s_), ts_last_error());                                                \
    } while (0)
    IDX_ERR("truncated", write_bytes("t.idx", buf, ni - 1), TS_ERR_FORMAT, "truncated IDX data");
    IDX_ERR("truncated gz", write_gz("t.idx.gz", buf, ni - 7), TS_ERR_FORMAT, "truncated");
    IDX_ERR("trailing", write_bytes("tr.idx", buf, ni + 1), TS_ERR_FORMAT, "unexpected data");
    IDX_ERR("short header", write_bytes("h.idx", buf, 9), TS_ERR_FORMAT, "truncated IDX header");
    uint8_t bad[8] = {1, 0, 8, 1, 0, 0, 0, 0};
    IDX_ERR("bad magic", write_bytes("m.idx", bad, 8), TS_ERR_FORMAT, "bad magic");
    bad[0] = 0, bad[2] = 0x0d;
    IDX_ERR("f32 elements", write_bytes("f.idx", bad, 8), TS_ERR_UNSUPPORTED, "0x0d");
    bad[2] = 0x08, bad[3] = 0;
    IDX_ERR("rank 0", write_bytes("r.idx", bad, 8), TS_ERR_FORMAT, "0 dimensions");
    /* A gzip file cut short, and one with a flipped byte. */
    uint8_t *gzb = read_all(igz, &na);
    IDX_ERR("gzip cut", write_bytes("cut.gz", gzb, na - 6), TS_ERR_FORMAT, "gzip stream is");
    gzb[na - 5] ^= 0xff; /* in the stored CRC-32: the trailer check fails */
    IDX_ERR("gzip corrupt", write_bytes("corrupt.gz", gzb, na), TS_ERR_FORMAT, "corrupt gzip");
    gzb = read_all(igz, &na);
    memcpy(cat, gzb, na);
    memcpy(cat + na, "junk", 4);
    IDX_ERR("junk after gzip", write_bytes("junk.gz", cat, na + 4), TS_ERR_FORMAT,
            "after the end of the gzip stream");
    CHECK(ts_data_read_idx(ip, TS_F16, &a) == TS_ERR_UNSUPPORTED && HAS("f16"), "IDX to f16: %s",
          ts_last_error());
    ts_dataset *d = NULL;
    CHECK(ts_data_load_idx_pair(ip, ip, &d) == TS_ERR_SHAPE && !d && HAS("1 dimension"),
          "images as labels: %s", ts_last_error());
    nl = idx_bytes(buf2, 1, (uint32_t[]){N - 1}, lab);
    lp = write_bytes("lab4.idx", buf2, nl);
    CHECK(ts_data_load_idx_pair(ip, lp, &d) == TS_ERR_SHAPE && !d && HAS("5 images") &&
              HAS("4 labels"),
          "count mismatch: %s", ts_last_error());
}

/* The Fashion-MNIST test set, when Debian's dataset-fashion-mnist is
 * installed: 1000 images of each of the 10 classes. */
static void test_fashion_mnist(void) {
    const char *im = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
    const char *lb = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz";
    if (access(im, R_OK) || access(lb, R_OK)) {
        printf("data: Fashion-MNIST not installed, real-data check skipped\n");
        return;
    }
    ts_dataset *d = NULL;
    CHECK_OK(ts_data_load_idx_pair(im, lb, &d));
    if (!d) return;
    CHECK(d->n == 10000 && d->x_rank == 1 && d->x_dims[0] == 784, "t10k shapes");
    int64_t hist[10] = {0}, bad = 0;
    for (int64_t i = 0; i < d->n; i++) {
        int64_t c = ((int64_t *)d->y)[i];
        if (c < 0 || c >= 10)
            bad++;
        else
            hist[c]++;
    }
    int even = 1;
    for (int c = 0; c < 10; c++) even &= hist[c] == 1000;
    CHECK(!bad && even, "t10k labels: %lld out of range, classes of 1000 each: %d", (long long)bad,
          even);
    float lo = 1, hi = 0;
    for (int64_t i = 0; i < d->n * 784; i++) {
        float v = ((float *)d->x)[i];
        lo = v < lo ? v : lo, hi = v > hi ? v : hi;
    }
    CHECK(lo == 0.0f && hi == 1.0f, "pixels in [0, 1]: %g..%g", lo, hi);
    CHECK(d->n_lineage == 2 && d->lineage[1].bytes == 5125 && strlen(d->lineage[0].sha256) == 64,
          "t10k lineage");
    ts_dataset_free(d);
}

/* Every prefix of a valid file is an error, and flipping any byte gives an
 * error or a valid array, never a crash (the sanitizer build checks reads). */
static void test_mutations(void) {
    float f[6] = {1, 2, 3, 4, 5, 6};
    uint8_t img[2 * 3 * 3] = {0}, b[4096];
    size_t n, ni = idx_bytes(b, 3, (uint32_t[]){2, 3, 3}, img);
    write_gz("m.gz", b, ni);
    const char *srcs[3] = {write_npy("m.npy", 1, "<f4", "(2, 3)", f, sizeof f),
                           write_bytes("m.idx", b, ni), path_of("m.gz")};
    const char *mut = path_of("mut");
    for (int k = 0; k < 3; k++) {
        uint8_t orig[4096];
        const uint8_t *src = read_all(srcs[k], &n);
        memcpy(orig, src, n);
        int prefixes_fail = 1, flips_ok = 1;
        for (size_t cut = 0; cut < n; cut++) {
            ts_array a;
            const char *p = write_at(mut, orig, cut);
            ts_status s = k ? ts_data_read_idx(p, TS_F32, &a) : ts_data_read_npy(p, TS_F32, &a);
            prefixes_fail &= s != TS_OK && !a.data && HAS("mut");
            ts_array_free(&a);
        }
        for (size_t i = 0; i < n; i++) {
            uint8_t m[4096];
            memcpy(m, orig, n);
            m[i] ^= (uint8_t)(0x5a + i);
            ts_array a;
            const char *p = write_at(mut, m, n);
            ts_status s = k ? ts_data_read_idx(p, TS_F32, &a) : ts_data_read_npy(p, TS_F32, &a);
            flips_ok &= s == TS_OK ? a.data != NULL : a.data == NULL;
            ts_array_free(&a);
        }
        CHECK(prefixes_fail, "%s: every truncation is an error", srcs[k]);
        CHECK(flips_ok, "%s: byte flips give a clean result", srcs[k]);
    }
}

/* CSV files with one byte replaced by a separator, a letter, a NUL or a
 * space: each load succeeds or fails cleanly. */
static void test_csv_mutations(void) {
    const char text[] = "t,a,b,y\n1,2.5,3,4\n2,-1e3,0x10,5\n3, 7 ,8,9\n4,1,1,1\n";
    const char *mut = path_of("mut.csv");
    const char subst[] = {',', '\n', 'x', '\0', ' ', '\r'};
    int clean = 1;
    for (size_t i = 0; i + 1 < sizeof text; i++)
        for (size_t k = 0; k < sizeof subst; k++) {
            char m[sizeof text];
            memcpy(m, text, sizeof text);
            m[i] = subst[k];
            write_at(mut, m, sizeof text - 1);
            ts_csv_options o = {.path = mut, .label = "y", .window = 2, .normalise = 1};
            ts_dataset *d = (ts_dataset *)&o; /* must be reset to NULL on failure */
            ts_status s = ts_data_load_csv_windows(&o, &d);
            clean &= s == TS_OK ? d && d->n >= 1 : d == NULL && strlen(ts_last_error()) > 0;
            if (s == TS_OK) ts_dataset_free(d);
        }
    CHECK(clean, "mutated CSV files load or fail cleanly");
}

/* ---- CSV ----------------------------------------------------------------- */

static void test_csv(void) {
    /* A date column the features leave out, spaces around cells, CRLF line
     * ends, a blank line at the end. */
    const char *p = write_text("series.csv", "date, a ,b,y\r\n"
                                             "2024-01-01, 1, 10, 100\r\n"
                                             "2024-01-02, 2, 10, 200\r\n"
                                             "2024-01-03, 3, 10, 300\r\n"
                                             "2024-01-04, 4, 10, 400\r\n"
                                             "2024-01-05, 5, 10, 500\r\n"
                                             "2024-01-06, 6, 10, 600\r\n"
                                             "\r\n");
    const char *feats[] = {"a", "b"};
    ts_csv_options o = {
        .path = p, .features = feats, .n_features = 2, .label = "y", .window = 3, .horizon = 1};
    ts_dataset *d = NULL;
    CHECK_OK(ts_data_load_csv_windows(&o, &d));
    if (d) {
        /* 6 rows, window 3, horizon 1: examples start at rows 0, 1, 2. */
        CHECK(d->n == 3 && d->x_rank == 2 && d->x_dims[0] == 3 && d->x_dims[1] == 2 &&
                  d->y_rank == 1 && d->y_dims[0] == 1 && d->x_dtype == TS_F32,
              "CSV shapes: n %lld", (long long)d->n);
        const float *x = d->x, *y = d->y;
        int ok = 1;
        for (int i = 0; i < 3; i++) {
            for (int t = 0; t < 3; t++)
                ok &= x[(i * 3 + t) * 2] == (float)(i + t + 1) && x[(i * 3 + t) * 2 + 1] == 10.0f;
            ok &= y[i] == (float)(100 * (i + 4)); /* row i + 3 + 1 - 1, 1-based i + 4 */
        }
        CHECK(ok, "CSV windows and labels");
        CHECK(!d->norm_mean && d->n_lineage == 1 && !strcmp(d->lineage[0].path, p),
              "CSV lineage, no normalisation");
        ts_dataset_free(d);
    }
    /* Normalisation with the first 4 rows: a has mean 2.5 and population
     * std sqrt(1.25); b is constant, so its std is recorded as 1. */
    o.normalise = 1, o.train_rows = 4, o.horizon = 0;
    CHECK_OK(ts_data_load_csv_windows(&o, &d));
    if (d) {
        CHECK(d->n == 4 && d->n_norm == 2 && d->norm_mean && d->norm_std, "norm stats recorded");
        CHECK_NEAR(d->norm_mean[0], 2.5, 1e-6);
        CHECK_NEAR(d->norm_std[0], sqrt(1.25), 1e-6);
        CHECK(d->norm_mean[1] == 10.0f && d->norm_std[1] == 1.0f, "constant feature: std 1");
        const float *x = d->x;
        /* Example 3 covers rows 3..5 (a = 4, 5, 6): row 5 lies outside the
         * statistics but is normalised all the same. */
        CHECK_NEAR(x[(3 * 3 + 2) * 2], (6 - 2.5) / sqrt(1.25), 1e-5);
        CHECK(x[(3 * 3 + 2) * 2 + 1] == 0.0f, "b - mean = 0");
        CHECK(((float *)d->y)[3] == 600.0f, "labels stay in their units (horizon 0)");
        ts_dataset_free(d);
    }
    /* No features named: all columns but the label, in file order. */
    p = write_text("all.csv", "y,p,q\n1,2,3\n4,5,6\n");
    ts_csv_options o2 = {.path = p, .label = "y", .window = 1};
    CHECK_OK(ts_data_load_csv_windows(&o2, &d));
    if (d) {
        const float *x = d->x;
        CHECK(d->n == 2 && d->x_dims[1] == 2 && x[0] == 2 && x[1] == 3 && x[3] == 6 &&
                  ((float *)d->y)[1] == 4,
              "default features");
        ts_dataset_free(d);
    }

    /* Errors. */
    p = write_text("bad.csv", "a,b,y\n1,2,3\n4,abc,6\n");
    ts_csv_options ob = {.path = p, .label = "y", .window = 1};
    char want[300];
    snprintf(want, sizeof want, "%s:3: column 'b' holds 'abc', not a number", p);
    CHECK(ts_data_load_csv_windows(&ob, &d) == TS_ERR_FORMAT && !d &&
              !strcmp(ts_last_error(), want),
          "non-numeric cell: '%s'", ts_last_error());
    p = write_text("empty_cell.csv", "a,b,y\n1,,3\n");
    ob.path = p;
    CHECK(ts_data_load_csv_windows(&ob, &d) == TS_ERR_FORMAT && HAS(":2: column 'b' holds ''"),
          "empty cell: %s", ts_last_error());
    p = write_text("nan.csv", "a,b,y\n1,nan,3\n");
    ob.path = p;
    CHECK(ts_data_load_csv_windows(&ob, &d) == TS_ERR_FORMAT && HAS("not a finite number"),
          "nan: %s", ts_last_error());
    p = write_text("cells.csv", "a,b,y\n1,2,3\n1,2\n");
    ob.path = p;
    CHECK(ts_data_load_csv_windows(&ob, &d) == TS_ERR_FORMAT && HAS(":3: 2 cells") &&
              HAS("3 columns"),
          "short row: %s", ts_last_error());
    p = write_text("ok.csv", "a,b,y\n1,2,3\n4,5,6\n7,8,9\n");
    ob.path = p, ob.label = "target";
    CHECK(ts_data_load_csv_windows(&ob, &d) == TS_ERR_NOT_FOUND && HAS(p) &&
              HAS("label column 'target'") && HAS("'a', 'b', 'y'"),
          "missing label: %s", ts_last_error());
    const char *fz[] = {"a", "z"};
    ob.label = "y", ob.features = fz, ob.n_features = 2;
    CHECK(ts_data_load_csv_windows(&ob, &d) == TS_ERR_NOT_FOUND && HAS("feature column 'z'") &&
              HAS("'a', 'b', 'y'"),
          "missing feature: %s", ts_last_error());
    ob.features = NULL, ob.n_features = 0, ob.window = 3, ob.horizon = 1;
    CHECK(ts_data_load_csv_windows(&ob, &d) == TS_ERR_INVALID && HAS("3 data rows"),
          "too few rows: %s", ts_last_error());
    ob.window = 1, ob.horizon = 0, ob.normalise = 1, ob.train_rows = 4;
    CHECK(ts_data_load_csv_windows(&ob, &d) == TS_ERR_INVALID && HAS("train_rows"),
          "train_rows past the end: %s", ts_last_error());
    ob.window = 0;
    CHECK(ts_data_load_csv_windows(&ob, &d) == TS_ERR_INVALID && HAS("window 0"), "window 0: %s",
          ts_last_error());
    p = write_text("dup.csv", "a,y,a\n1,2,3\n");
    ts_csv_options od = {.path = p, .label = "y", .window = 1, .features = fz, .n_features = 1};
    CHECK(ts_data_load_csv_windows(&od, &d) == TS_ERR_FORMAT && HAS("'a' appears twice"),
          "duplicate column: %s", ts_last_error());
    p = write_text("blank.csv", "\n1,2\n");
    od.path = p;
    CHECK(ts_data_load_csv_windows(&od, &d) == TS_ERR_FORMAT && HAS("column names"),
          "no header: %s", ts_last_error());
    CHECK(!d, "no dataset after errors");
}

/* ---- CSV tables: skipped lines, no header, class labels, standardising --- */

static void test_csv_table(void) {
    const char *p = write_text("table.csv", "3,2,no,yes\n1,10,0\n3,30,1\n\n5,20,1\n");
    ts_dataset *d = NULL;
    ts_csv_options o = {
        .path = p, .label = "2", .window = 1, .skip_rows = 1, .no_header = 1, .classes = 2};
    CHECK_OK(ts_data_load_csv_windows(&o, &d));
    if (d) {
        const float *x = d->x;
        const int64_t *y = d->y;
        CHECK(d->n == 3 && d->y_dtype == TS_I64 && d->y_rank == 0 && d->x_dims[1] == 2 &&
                  x[0] == 1 && x[1] == 10 && x[4] == 5 && y[0] == 0 && y[1] == 1 && y[2] == 1,
              "table: 3 rows, columns named by position, i64 labels");
        ts_dataset_free(d);
        d = NULL;
    }
    /* Standardise: rows (1, 10), (3, 30) as the training split, (5, 20) held out. */
    ts_dataset *tr = NULL, *va = NULL;
    ts_csv_options ot = o;
    ot.path = write_text("tab_train.csv", "a,b,y\n1,10,0\n3,30,1\n"), ot.skip_rows = 0;
    ot.no_header = 0, ot.label = "y";
    CHECK_OK(ts_data_load_csv_windows(&ot, &tr));
    ot.path = write_text("tab_val.csv", "a,b,y\n5,20,1\n");
    CHECK_OK(ts_data_load_csv_windows(&ot, &va));
    if (tr && va) {
        ts_dataset *others[1] = {va};
        CHECK_OK(ts_dataset_standardise(tr, others, 1));
        const float *tx = tr->x, *vx = va->x;
        /* features (1, 3) and (10, 30): mean 2, 20; std 1, 10. */
        CHECK(tr->n_norm == 2 && tr->norm_mean[0] == 2 && tr->norm_std[1] == 10 && tx[0] == -1 &&
                  tx[1] == -1 && tx[2] == 1 && tx[3] == 1 && vx[0] == 3 && vx[1] == 0 &&
                  va->norm_mean[1] == 20,
              "standardised with the training rows' statistics only");
    }
    ts_dataset_free(tr);
    ts_dataset_free(va);
    /* A label outside the classes or not whole: FILE:LINE. */
    o.classes = 1;
    CHECK(ts_data_load_csv_windows(&o, &d) == TS_ERR_INVALID && HAS(p) && HAS(":3: label") &&
              HAS("[0, 1)"),
          "label outside the classes: %s", ts_last_error());
    p = write_text("half.csv", "1,0.5\n");
    ts_csv_options oh = {.path = p, .label = "1", .window = 1, .no_header = 1, .classes = 2};
    CHECK(ts_data_load_csv_windows(&oh, &d) == TS_ERR_INVALID &&
              HAS(":1: label column '1' holds 0.5"),
          "fractional label: %s", ts_last_error());
    o.classes = 2, o.skip_rows = 7;
    CHECK(ts_data_load_csv_windows(&o, &d) == TS_ERR_FORMAT && HAS("skip_rows is 7"),
          "skip_rows past the end: %s", ts_last_error());
    o.skip_rows = -1;
    CHECK(ts_data_load_csv_windows(&o, &d) == TS_ERR_INVALID, "negative skip_rows");
    CHECK(!d, "no dataset after errors");
}

/* ---- tokens -------------------------------------------------------------- */

static void test_tokens(void) {
    uint16_t t16[11];
    uint32_t t32[11];
    for (int i = 0; i < 11; i++) t16[i] = (uint16_t)(i * 7 % 50), t32[i] = (uint32_t)(70000 + i);
    const char *p16 = write_bytes("tok16.bin", t16, sizeof t16);
    const char *p32 = write_bytes("tok32.bin", t32, sizeof t32);
    ts_dataset *d = NULL;
    CHECK_OK(ts_data_load_tokens(p16, 16, 3, 50, &d));
    if (d) {
        /* 11 tokens, ctx 3: windows [0,4) [3,7) [6,10); token 10 is left over. */
        const int64_t *x = d->x, *y = d->y;
        int ok = d->n == 3 && d->x_dtype == TS_I64 && d->y_dtype == TS_I64 && d->x_rank == 1 &&
                 d->x_dims[0] == 3 && d->y_dims[0] == 3;
        for (int k = 0; ok && k < 3; k++)
            for (int j = 0; j < 3; j++)
                ok &= x[k * 3 + j] == t16[3 * k + j] && y[k * 3 + j] == t16[3 * k + j + 1];
        CHECK(ok, "uint16 windows");
        CHECK(d->n_lineage == 1 && d->lineage[0].bytes == 22, "token lineage");
        ts_dataset_free(d);
    }
    CHECK_OK(ts_data_load_tokens(p32, 32, 5, 70011, &d));
    if (d) {
        CHECK(d->n == 2 && ((int64_t *)d->x)[5] == 70005 && ((int64_t *)d->y)[9] == 70010,
              "uint32 windows");
        ts_dataset_free(d);
    }
    CHECK(ts_data_load_tokens(p32, 32, 5, 70010, &d) == TS_ERR_FORMAT && HAS(p32) &&
              HAS("byte offset 40 is 70010"),
          "token >= vocab: %s", ts_last_error());
    const char *odd = write_bytes("odd.bin", t16, 21);
    CHECK(ts_data_load_tokens(odd, 16, 3, 50, &d) == TS_ERR_FORMAT && HAS(odd) &&
              HAS("21 bytes is not a whole number of 16-bit tokens"),
          "odd size: %s", ts_last_error());
    CHECK(ts_data_load_tokens(p16, 16, 11, 50, &d) == TS_ERR_INVALID && HAS("11 tokens"),
          "too short: %s", ts_last_error());
    CHECK(ts_data_load_tokens(p16, 8, 3, 50, &d) == TS_ERR_INVALID && HAS("8 bits"),
          "8-bit tokens: %s", ts_last_error());
    CHECK(!d, "no dataset after errors");
}

/* ---- split and loader ---------------------------------------------------- */

enum { NE = 103 };

/* x[i] = (i, -i), y[i] = i: every example says which one it is. */
static ts_dataset *numbered(void) {
    float x[NE * 2];
    int64_t y[NE];
    for (int i = 0; i < NE; i++) x[2 * i] = (float)i, x[2 * i + 1] = (float)-i, y[i] = i;
    const char *xp = write_npy("nx.npy", 1, "<f4", "(103, 2)", x, sizeof x);
    const char *yp = write_npy("ny.npy", 1, "<i8", "(103,)", y, sizeof y);
    ts_dataset *d = NULL;
    CHECK_OK(ts_data_load_npy_pair(xp, yp, &d));
    return d;
}

static int same(const ts_dataset *a, const ts_dataset *b) {
    return a->n == b->n && !memcmp(a->y, b->y, (size_t)a->n * 8) &&
           !memcmp(a->x, b->x, (size_t)a->n * 8);
}

static void test_split(ts_dataset *all) {
    ts_dataset *tr = NULL, *va = NULL, *tr2 = NULL, *va2 = NULL;
    CHECK_OK(ts_dataset_split(all, 0.2, 7, &tr, &va));
    if (!tr || !va) return;
    CHECK(tr->n == 82 && va->n == 21, "sizes %lld + %lld (round(20.6) = 21 to val)",
          (long long)tr->n, (long long)va->n);
    int seen[NE] = {0}, ordered = 1, consistent = 1;
    const int64_t *ty = tr->y, *vy = va->y;
    for (int64_t i = 0; i < tr->n; i++) {
        seen[ty[i]]++;
        ordered &= i == 0 || ty[i] > ty[i - 1];
        consistent &= ((float *)tr->x)[2 * i] == (float)ty[i];
    }
    for (int64_t i = 0; i < va->n; i++) {
        seen[vy[i]]++;
        ordered &= i == 0 || vy[i] > vy[i - 1];
        consistent &= ((float *)va->x)[2 * i + 1] == (float)-vy[i];
    }
    int once = 1;
    for (int i = 0; i < NE; i++) once &= seen[i] == 1;
    CHECK(once, "train and val are disjoint and cover every example");
    CHECK(ordered && consistent, "parts keep file order; x travels with y");
    CHECK(tr->n_lineage == 2 && va->n_lineage == 2 &&
              !strcmp(va->lineage[1].sha256, all->lineage[1].sha256),
          "parts carry the lineage");
    CHECK_OK(ts_dataset_split(all, 0.2, 7, &tr2, &va2));
    CHECK(tr2 && va2 && same(tr, tr2) && same(va, va2), "same seed, same split");
    ts_dataset_free(tr2);
    ts_dataset_free(va2);
    CHECK_OK(ts_dataset_split(all, 0.2, 8, &tr2, &va2));
    CHECK(tr2 && va2 && va2->n == 21 && !same(va, va2), "another seed, another split");
    ts_dataset_free(tr2);
    ts_dataset_free(va2);
    CHECK_OK(ts_dataset_split(all, 0.0, 1, &tr2, &va2));
    CHECK(tr2 && va2 && tr2->n == NE && va2->n == 0 && same(tr2, all), "fraction 0: all train");
    ts_dataset_free(tr2);
    ts_dataset_free(va2);
    CHECK(ts_dataset_split(all, 1.0, 1, &tr2, &va2) == TS_ERR_INVALID && !tr2 && !va2 &&
              HAS("not in [0, 1)"),
          "fraction 1: %s", ts_last_error());
    CHECK(ts_dataset_split(all, 0.996, 1, &tr2, &va2) == TS_ERR_INVALID && HAS("none for training"),
          "nothing left to train on: %s", ts_last_error());
    ts_dataset_free(tr);
    ts_dataset_free(va);
}

static void test_loader(ts_dataset *all) {
    enum { B = 10, STEPS = 25 };
    ts_loader *a = NULL, *b = NULL;
    CHECK_OK(ts_loader_new(all, B, 1, 42, &a));
    CHECK_OK(ts_loader_new(all, B, 1, 42, &b));
    if (!a || !b) return;
    CHECK(ts_loader_batches_per_epoch(a) == 10, "103 / 10: 10 batches, 3 dropped");
    static float xs[STEPS][B * 2];
    static int64_t ys[STEPS][B];
    int same_ab = 1, no_repeat = 1, consistent = 1;
    int seen[3][NE] = {{0}};
    for (int s = 0; s < STEPS; s++) {
        CHECK(ts_loader_epoch(a) == s / 10 && ts_loader_position(a) == s, "epoch and position");
        CHECK_OK(ts_loader_next(a, xs[s], ys[s]));
        float xb[B * 2];
        int64_t yb[B];
        CHECK_OK(ts_loader_next(b, xb, yb));
        same_ab &= !memcmp(xb, xs[s], sizeof xb) && !memcmp(yb, ys[s], sizeof yb);
        for (int j = 0; j < B; j++) {
            no_repeat &= ++seen[s / 10][ys[s][j]] == 1;
            consistent &= xs[s][2 * j] == (float)ys[s][j];
        }
    }
    CHECK(same_ab, "two loaders with one seed give the same batches");
    CHECK(no_repeat && consistent, "no example twice in an epoch; x matches y");
    CHECK(ts_loader_epoch(a) == 2 && ts_loader_position(a) == STEPS, "wrapped into epoch 2");
    CHECK(memcmp(ys[0], ys[10], sizeof ys[0]), "epoch 1 is shuffled differently from epoch 0");

    /* Seeking (forwards, backwards, across epochs) lands on the batch a
     * fresh loader would give after that many calls. */
    int seek_ok = 1;
    const int64_t targets[] = {13, 3, 24, 0, 19};
    for (size_t k = 0; k < sizeof targets / sizeof targets[0]; k++) {
        float xb[B * 2];
        int64_t yb[B];
        CHECK_OK(ts_loader_seek(b, targets[k]));
        CHECK_OK(ts_loader_next(b, xb, yb));
        seek_ok &= !memcmp(xb, xs[targets[k]], sizeof xb) && !memcmp(yb, ys[targets[k]], sizeof yb);
        seek_ok &= ts_loader_position(b) == targets[k] + 1;
    }
    CHECK(seek_ok, "seek equals replay");
    ts_loader *c = NULL;
    CHECK_OK(ts_loader_new(all, B, 1, 43, &c));
    float xc[B * 2];
    int64_t yc[B];
    CHECK_OK(ts_loader_next(c, xc, yc));
    CHECK(memcmp(yc, ys[0], sizeof yc), "another seed, another order");
    ts_loader_free(c);

    /* Unshuffled: file order, every epoch the same. */
    CHECK_OK(ts_loader_new(all, B, 0, 42, &c));
    int in_order = 1;
    for (int s = 0; s < 12; s++) {
        CHECK_OK(ts_loader_next(c, xc, yc));
        for (int j = 0; j < B; j++) in_order &= yc[j] == (s % 10) * B + j;
    }
    CHECK(in_order, "unshuffled batches follow the file, epoch after epoch");
    ts_loader_free(c);

    CHECK(ts_loader_seek(a, -1) == TS_ERR_INVALID, "negative seek");
    CHECK(ts_loader_next(a, NULL, yc) == TS_ERR_INVALID, "no x buffer");
    c = NULL;
    CHECK(ts_loader_new(all, NE + 1, 1, 0, &c) == TS_ERR_INVALID && !c && HAS("103 examples"),
          "batch larger than the data: %s", ts_last_error());
    CHECK(ts_loader_new(all, 0, 1, 0, &c) == TS_ERR_INVALID, "batch 0");
    ts_loader_free(a);
    ts_loader_free(b);
}

static void test_sha256(void) {
    char hex[65];
    int64_t n = -1;
    CHECK_OK(ts_sha256_path(write_text("abc.txt", "abc"), hex, &n));
    CHECK(n == 3 &&
              !strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
          "sha256(abc) = %s", hex);
    CHECK_OK(ts_sha256_path(write_text("empty.txt", ""), hex, &n));
    CHECK(n == 0 &&
              !strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
          "sha256('') = %s", hex);
    /* Longer than one read chunk: a million 'a' (FIPS 180-2 test vector). */
    static char mil[1000000];
    memset(mil, 'a', sizeof mil);
    CHECK_OK(ts_sha256_path(write_bytes("million.txt", mil, sizeof mil), hex, &n));
    CHECK(n == 1000000 &&
              !strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
          "sha256(a * 10^6) = %s", hex);
    CHECK(ts_sha256_path(path_of("nope"), hex, NULL) == TS_ERR_NOT_FOUND && HAS("nope"),
          "missing file: %s", ts_last_error());
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/tessel-data-XXXXXX");
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp failed");
        return check_summary("data");
    }
    test_npy();
    test_npy_errors();
    test_idx();
    test_mutations();
    test_fashion_mnist();
    test_csv();
    test_csv_mutations();
    test_csv_table();
    test_tokens();
    ts_dataset *all = numbered();
    if (all) {
        test_split(all);
        test_loader(all);
    }
    ts_dataset_free(all);
    test_sha256();
    remove_dir();
    CHECK(n_paths <= 512, "path slots were not reused (%d paths)", n_paths);
    return check_summary("data");
}
