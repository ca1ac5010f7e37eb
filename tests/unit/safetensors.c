/* test_safetensors.c — round trips through the safetensors writer and
 * reader, and malformed files that must be refused with TS_ERR_FORMAT and a
 * message naming the file and the tensor at fault.
 *
 * Run from the repository root: the last case also reads the parity
 * fixtures in tests/parity/fixtures/ when they are present. Set
 * TS_TEST_VERBOSE=1 to print every expected error message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ckpt/safetensors.h"
#include "tessel/status.h"

static char g_dir[64];
static int g_failed_checks;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "  %s:%d: check failed: %s (last error: %s)\n", __FILE__, __LINE__,    \
                    #cond, ts_last_error());                                                       \
            g_failed_checks++;                                                                     \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static void tmp_path(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", g_dir, name);
}

/* Write a file: 8-byte little-endian `hlen`, `header` (strlen bytes), then
 * `data_len` bytes of a 0,1,2,... pattern. `hlen` is normally strlen(header)
 * but can lie to exercise the length checks. */
static int write_raw(const char *path, uint64_t hlen, const char *header, size_t data_len) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return 0;
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(hlen >> (8 * i));
    int ok = fwrite(len, 1, 8, fp) == 8;
    ok = ok && fwrite(header, 1, strlen(header), fp) == strlen(header);
    for (size_t i = 0; i < data_len && ok; i++) ok = fputc((int)(i & 0xff), fp) != EOF;
    return fclose(fp) == 0 && ok;
}

static int write_hdr(const char *path, const char *header, size_t data_len) {
    return write_raw(path, strlen(header), header, data_len);
}

/* Opening `path` fails with `want`, and the message mentions `path` and
 * (when given) `needle`. */
static int expect_open_error(const char *path, ts_status want, const char *needle) {
    ts_st_file *f = (ts_st_file *)1;
    ts_status s = ts_st_open(path, &f);
    const char *msg = ts_last_error();
    if (s != want || f != NULL || !strstr(msg, path) || (needle && !strstr(msg, needle))) {
        fprintf(stderr, "  %s: want %s mentioning \"%s\", got %s: %s\n", path, ts_status_name(want),
                needle ? needle : "", ts_status_name(s), msg);
        if (s == TS_OK) ts_st_close(f);
        return 0;
    }
    if (getenv("TS_TEST_VERBOSE")) printf("  ok: %s\n", msg);
    return 1;
}

/* ---- round trips --------------------------------------------------------- */

static int test_roundtrip(void) {
    float f32[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f};
    double f64[4] = {1.0 / 3.0, -1e300, 2.0, 4.5};
    int64_t i64[4] = {INT64_MIN, -1, 0, INT64_MAX};
    int32_t i32[3] = {-7, 0, 7};
    uint8_t u8[5] = {0, 1, 0, 1, 255};
    uint16_t bf16[3] = {0x3f80, 0xc000, 0x7f80};
    uint16_t f16[2] = {0x3c00, 0xfbff};
    uint8_t f8a[7] = {1, 2, 3, 4, 5, 6, 0x7e}, f8b[1] = {0x3c};
    float scalar = 42.0f;
    float r8[2] = {7, 8};
    int64_t d23[] = {2, 3}, d4[] = {4}, d22[] = {2, 2}, d3[] = {3}, d5[] = {5}, d31[] = {3, 1};
    int64_t d2[] = {2}, d7[] = {7}, d1[] = {1}, d03[] = {0, 3}, d8[] = {1, 1, 1, 1, 1, 1, 1, 2};
    struct {
        const char *name;
        ts_dtype dt;
        int rank;
        const int64_t *dims;
        const void *data;
        size_t bytes;
    } t[] = {
        {"a.f32", TS_F32, 2, d23, f32, sizeof f32}, {"b.f64", TS_F64, 1, d4, f64, sizeof f64},
        {"c.i64", TS_I64, 2, d22, i64, sizeof i64}, {"d.i32", TS_I32, 1, d3, i32, sizeof i32},
        {"e.u8", TS_U8, 1, d5, u8, sizeof u8},      {"f.bf16", TS_BF16, 2, d31, bf16, sizeof bf16},
        {"g.f16", TS_F16, 1, d2, f16, sizeof f16},  {"h.f8e4m3", TS_F8E4M3, 1, d7, f8a, 7},
        {"i.f8e5m2", TS_F8E5M2, 1, d1, f8b, 1},     {"loss", TS_F32, 0, NULL, &scalar, 4},
        {"empty", TS_F32, 2, d03, NULL, 0},         {"rank8", TS_F32, 8, d8, r8, sizeof r8},
        {"z.ünïcode", TS_U8, 1, d1, u8, 1},
    };
    int nt = (int)(sizeof t / sizeof t[0]);
    char path[128];
    tmp_path(path, sizeof path, "rt.safetensors");

    ts_st_writer *w;
    CHECK(ts_st_writer_new(&w) == TS_OK);
    for (int i = 0; i < nt; i++)
        if (ts_st_writer_add(w, t[i].name, t[i].dt, t[i].rank, t[i].dims, t[i].data) != TS_OK) {
            ts_st_writer_free(w);
            CHECK(!"writer_add");
        }
    ts_status s = ts_st_writer_save(w, path);
    ts_st_writer_free(w);
    CHECK(s == TS_OK);

    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(access(tmp, F_OK) != 0); /* renamed away */

    /* The header is padded to a multiple of 8 with spaces. */
    FILE *fp = fopen(path, "rb");
    CHECK(fp);
    unsigned char len[8];
    size_t got = fread(len, 1, 8, fp);
    fclose(fp);
    CHECK(got == 8);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)len[i] << (8 * i);
    CHECK(hlen % 8 == 0);

    ts_st_file *f;
    CHECK(ts_st_open(path, &f) == TS_OK);
    int ok = ts_st_count(f) == nt;
    for (int i = 0; i < nt && ok; i++) {
        ts_st_tensor x;
        ok = strcmp(ts_st_name(f, i), t[i].name) == 0; /* data order = insertion order */
        ok = ok && ts_st_find(f, t[i].name, &x) == TS_OK;
        ok = ok && x.dtype == t[i].dt && x.rank == t[i].rank && x.bytes == t[i].bytes;
        for (int d = 0; d < t[i].rank && ok; d++) ok = x.dims[d] == t[i].dims[d];
        ok = ok && (t[i].bytes == 0 || memcmp(x.data, t[i].data, t[i].bytes) == 0);
        if (!ok) fprintf(stderr, "  round trip mismatch at tensor \"%s\"\n", t[i].name);
    }
    ts_st_tensor x;
    ok = ok && ts_st_get(f, nt - 1, &x) == TS_OK && strcmp(x.name, t[nt - 1].name) == 0;
    ok = ok && ts_st_get(f, nt, &x) == TS_ERR_INVALID && ts_st_name(f, nt) == NULL;
    float lossv = 0; /* after the odd-sized f8 tensors: unaligned, so memcpy */
    ok = ok && ts_st_find(f, "loss", &x) == TS_OK && x.rank == 0 && x.bytes == 4;
    if (ok) memcpy(&lossv, x.data, 4);
    ok = ok && lossv == 42;
    ok = ok && ts_st_metadata(f, "anything") == NULL;
    ts_st_close(f);
    CHECK(ok);
    return 0;
}

static int test_empty_file_roundtrip(void) {
    char path[128];
    tmp_path(path, sizeof path, "empty.safetensors");
    ts_st_writer *w;
    CHECK(ts_st_writer_new(&w) == TS_OK);
    ts_status s = ts_st_writer_save(w, path);
    ts_st_writer_free(w);
    CHECK(s == TS_OK);
    ts_st_file *f;
    CHECK(ts_st_open(path, &f) == TS_OK);
    int n = ts_st_count(f);
    ts_st_close(f);
    CHECK(n == 0);
    return 0;
}

static int test_metadata(void) {
    char path[128];
    tmp_path(path, sizeof path, "meta.safetensors");
    float v = 1;
    ts_st_writer *w;
    CHECK(ts_st_writer_new(&w) == TS_OK);
    ts_status s = ts_st_writer_meta(w, "format", "pt");
    if (s == TS_OK) s = ts_st_writer_meta(w, "step", "1");
    if (s == TS_OK) s = ts_st_writer_meta(w, "step", "1200"); /* replaces */
    if (s == TS_OK) s = ts_st_writer_meta(w, "note", "");
    if (s == TS_OK) s = ts_st_writer_add(w, "v", TS_F32, 0, NULL, &v);
    if (s == TS_OK) s = ts_st_writer_save(w, path);
    ts_st_writer_free(w);
    CHECK(s == TS_OK);
    ts_st_file *f;
    CHECK(ts_st_open(path, &f) == TS_OK);
    const char *fmt = ts_st_metadata(f, "format"), *step = ts_st_metadata(f, "step");
    const char *note = ts_st_metadata(f, "note"), *none = ts_st_metadata(f, "missing");
    int ok = fmt && strcmp(fmt, "pt") == 0 && step && strcmp(step, "1200") == 0 && note && !*note &&
             !none && ts_st_count(f) == 1;
    ts_st_tensor x;
    ok = ok && ts_st_find(f, "__metadata__", &x) == TS_ERR_NOT_FOUND;
    ok = ok && ts_st_find(f, "nope", &x) == TS_ERR_NOT_FOUND && strstr(ts_last_error(), "nope") &&
         strstr(ts_last_error(), path);
    ts_st_close(f);
    CHECK(ok);
    return 0;
}

static int test_writer_errors(void) {
    float v[2] = {0, 0};
    int64_t d2[] = {2}, neg[] = {-1}, d9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 2};
    ts_st_writer *w;
    CHECK(ts_st_writer_new(&w) == TS_OK);
    int ok = ts_st_writer_add(w, "x", TS_F32, 1, d2, v) == TS_OK;
    ok = ok && ts_st_writer_add(w, "x", TS_F32, 1, d2, v) == TS_ERR_INVALID &&
         strstr(ts_last_error(), "\"x\"");
    ok = ok && ts_st_writer_add(w, "__metadata__", TS_F32, 1, d2, v) == TS_ERR_INVALID;
    ok = ok && ts_st_writer_add(w, "", TS_F32, 1, d2, v) == TS_ERR_INVALID;
    ok = ok && ts_st_writer_add(w, "r9", TS_F32, 9, d9, v) == TS_ERR_INVALID &&
         strstr(ts_last_error(), "r9");
    ok = ok && ts_st_writer_add(w, "neg", TS_F32, 1, neg, v) == TS_ERR_INVALID;
    ok = ok && ts_st_writer_add(w, "null", TS_F32, 1, d2, NULL) == TS_ERR_INVALID;
    ok = ok && ts_st_writer_add(w, "dt", (ts_dtype)99, 1, d2, v) == TS_ERR_INVALID;
    ok = ok && ts_st_writer_add(w, "bad\xff", TS_F32, 1, d2, v) == TS_ERR_INVALID;
    ok = ok && ts_st_writer_meta(w, "k", "bad\xfe") == TS_ERR_INVALID;
    /* Failed saves leave nothing behind. */
    ok = ok && ts_st_writer_save(w, "/nonexistent-dir/x.safetensors") == TS_ERR_IO &&
         strstr(ts_last_error(), "/nonexistent-dir/x.safetensors");
    char path[128];
    tmp_path(path, sizeof path, "after_errors.safetensors");
    ok = ok && ts_st_writer_save(w, path) == TS_OK; /* the writer is still usable */
    ts_st_writer_free(w);
    CHECK(ok);
    ts_st_file *f;
    CHECK(ts_st_open(path, &f) == TS_OK);
    ok = ts_st_count(f) == 1;
    ts_st_close(f);
    CHECK(ok);
    CHECK(ts_st_open("/nonexistent-dir/x.safetensors", &f) == TS_ERR_IO && f == NULL);
    return 0;
}

/* ---- malformed files ------------------------------------------------------ */

static int test_truncated(void) {
    char ok_path[128], path[128];
    tmp_path(ok_path, sizeof ok_path, "trunc_src.safetensors");
    tmp_path(path, sizeof path, "truncated.safetensors");
    float v[16] = {0};
    int64_t d[] = {16};
    ts_st_writer *w;
    CHECK(ts_st_writer_new(&w) == TS_OK);
    ts_status s = ts_st_writer_add(w, "weights", TS_F32, 1, d, v);
    if (s == TS_OK) s = ts_st_writer_save(w, ok_path);
    ts_st_writer_free(w);
    CHECK(s == TS_OK);

    FILE *fp = fopen(ok_path, "rb");
    CHECK(fp);
    unsigned char buf[512];
    size_t n = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    CHECK(n > 64 + 8);
    /* Cut in the data: the tensor runs past the end of the file. */
    fp = fopen(path, "wb");
    CHECK(fp);
    CHECK(fwrite(buf, 1, n - 5, fp) == n - 5);
    fclose(fp);
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "\"weights\""));
    /* Cut in the header. */
    CHECK(truncate(path, 20) == 0);
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "header length"));
    /* Cut in the length field, and an empty file. */
    CHECK(truncate(path, 5) == 0);
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "too short"));
    CHECK(truncate(path, 0) == 0);
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "too short"));
    return 0;
}

static int test_bad_json(void) {
    char path[128];
    tmp_path(path, sizeof path, "badjson.safetensors");
    CHECK(write_hdr(path, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], ", 4));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "JSON"));
    CHECK(write_hdr(path, "{\"a\": 1} trailing", 0));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "JSON"));
    CHECK(write_hdr(path, "[1, 2, 3]", 0));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "JSON object"));
    CHECK(write_hdr(path, "{\"a\": 7}", 0));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "\"a\""));
    CHECK(write_hdr(path,
                    "{\"dup\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]},"
                    " \"dup\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [1, 2]}}",
                    2));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "dup"));
    CHECK(write_hdr(path, "{\"__metadata__\": {\"k\": 3}}", 0));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "\"k\""));
    CHECK(write_hdr(path, "{\"__metadata__\": [\"k\"]}", 0));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "__metadata__"));
    return 0;
}

static int test_bad_fields(void) {
    char path[128];
    tmp_path(path, sizeof path, "badfields.safetensors");
    CHECK(write_hdr(path, "{\"t\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "\"t\": missing or non-string \"dtype\""));
    CHECK(write_hdr(path, "{\"t\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "\"shape\""));
    CHECK(write_hdr(path,
                    "{\"t\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "shape[0]"));
    CHECK(write_hdr(
        path, "{\"t\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 4));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "shape[0]"));
    CHECK(
        write_hdr(path, "{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 4));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "\"t\": \"data_offsets\""));
    CHECK(write_hdr(path,
                    "{\"t\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], "
                    "\"data_offsets\": [0, 1]}}",
                    1));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "rank 9"));
    CHECK(write_hdr(path, "{\"t\": {\"dtype\": \"I16\", \"shape\": [2], \"data_offsets\": [0, 4]}}",
                    4));
    CHECK(expect_open_error(path, TS_ERR_UNSUPPORTED, "\"I16\""));
    CHECK(write_hdr(path,
                    "{\"t\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4294967296],"
                    " \"data_offsets\": [0, 4]}}",
                    4));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "too large"));
    return 0;
}

static int test_offsets_out_of_range(void) {
    char path[128];
    tmp_path(path, sizeof path, "range.safetensors");
    CHECK(write_hdr(
        path, "{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 12));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "\"w\": data_offsets [0, 16] are out of range"));
    CHECK(write_hdr(path, "{\"w\": {\"dtype\": \"U8\", \"shape\": [0], \"data_offsets\": [8, 4]}}",
                    8));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "\"w\": data_offsets [8, 4] end before"));
    CHECK(write_hdr(path,
                    "{\"w\": {\"dtype\": \"U8\", \"shape\": [1], "
                    "\"data_offsets\": [0, 18446744073709551615]}}",
                    1));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "JSON")); /* jansson: integer too big */
    return 0;
}

static int test_overlap_and_gaps(void) {
    char path[128];
    tmp_path(path, sizeof path, "overlap.safetensors");
    CHECK(write_hdr(path,
                    "{\"first\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                    " \"second\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
                    12));
    CHECK(
        expect_open_error(path, TS_ERR_FORMAT, "\"first\" [0, 8] and \"second\" [4, 12] overlap"));
    CHECK(write_hdr(path,
                    "{\"first\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                    " \"second\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}",
                    8));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "overlap"));
    CHECK(write_hdr(path,
                    "{\"first\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                    " \"second\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}",
                    12));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "gaps"));
    CHECK(write_hdr(
        path, "{\"only\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 9));
    CHECK(expect_open_error(path, TS_ERR_FORMAT,
                            "5 trailing data bytes after the last tensor \"only\""));
    return 0;
}

static int test_wrong_size(void) {
    char path[128];
    tmp_path(path, sizeof path, "size.safetensors");
    CHECK(write_hdr(
        path, "{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 20]}}", 20));
    CHECK(expect_open_error(path, TS_ERR_FORMAT,
                            "\"w\": data_offsets [0, 20] span 20 bytes but "
                            "f32[2,3] needs 24"));
    CHECK(write_hdr(path, "{\"s\": {\"dtype\": \"I64\", \"shape\": [], \"data_offsets\": [0, 4]}}",
                    4));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "\"s\""));
    return 0;
}

static int test_huge_header_length(void) {
    char path[128];
    tmp_path(path, sizeof path, "huge.safetensors");
    const char *h = "{}";
    CHECK(write_raw(path, UINT64_MAX, h, 0));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "header length 18446744073709551615"));
    CHECK(write_raw(path, (uint64_t)1 << 62, h, 0));
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "header length"));
    /* A length within the file but above the 100 MB limit (sparse file). */
    CHECK(write_raw(path, 150000000, h, 0));
    CHECK(truncate(path, 8 + 150000000) == 0);
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "exceeds the limit"));
    CHECK(write_raw(path, 3, h, 0)); /* one past the end */
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "header length 3"));
    CHECK(write_raw(path, 0, h, 0)); /* header "" then 2 data bytes */
    CHECK(expect_open_error(path, TS_ERR_FORMAT, "JSON object"));
    return 0;
}

/* ---- fixtures written by tests/parity/gen_fixtures.py ---------------------- */

static int check_fixture_file(const char *path, const char *workload, int64_t n_inputs,
                              ts_dtype in_dt) {
    ts_st_file *f;
    if (access(path, R_OK) != 0) {
        printf("  (skipped %s: not present; run from the repository root)\n", path);
        return 0;
    }
    CHECK(ts_st_open(path, &f) == TS_OK);
    const char *wl = ts_st_metadata(f, "workload");
    int ok = wl && strcmp(wl, workload) == 0;
    ts_st_tensor loss, x, y;
    ok = ok && ts_st_find(f, "loss", &loss) == TS_OK && loss.rank == 0 && loss.dtype == TS_F32;
    ok = ok && ts_st_find(f, "input.x", &x) == TS_OK && x.dtype == in_dt && x.dims[0] == n_inputs;
    ok = ok && ts_st_find(f, "target.y", &y) == TS_OK;
    /* Every param.<name> has grad.<name> and step2.<name> of the same shape. */
    int n_params = 0;
    for (int i = 0; i < ts_st_count(f) && ok; i++) {
        const char *name = ts_st_name(f, i);
        if (strncmp(name, "param.", 6) != 0) continue;
        n_params++;
        ts_st_tensor p, g, s2;
        char gname[256], sname[256];
        snprintf(gname, sizeof gname, "grad.%s", name + 6);
        snprintf(sname, sizeof sname, "step2.%s", name + 6);
        ok = ts_st_find(f, name, &p) == TS_OK && ts_st_find(f, gname, &g) == TS_OK &&
             ts_st_find(f, sname, &s2) == TS_OK && p.dtype == TS_F32 && g.dtype == TS_F32 &&
             s2.dtype == TS_F32 && p.rank == g.rank && p.rank == s2.rank && p.bytes == g.bytes &&
             p.bytes == s2.bytes && memcmp(p.dims, g.dims, sizeof p.dims) == 0 &&
             memcmp(p.data, s2.data, p.bytes) != 0;
        if (!ok) fprintf(stderr, "  %s: parameter %s is inconsistent\n", path, name);
    }
    ok = ok && n_params > 0 && ts_st_count(f) == 3 + 3 * n_params;
    float lv = 0;
    if (ok) memcpy(&lv, loss.data, sizeof lv);
    ts_st_close(f);
    CHECK(ok);
    CHECK(lv > 0 && lv < 100);
    printf("  %s: %d parameters, loss %.6f\n", path, n_params, lv);
    return 0;
}

static int test_parity_fixtures(void) {
    if (check_fixture_file("tests/parity/fixtures/w1_small.safetensors", "W1", 16, TS_F32))
        return 1;
    return check_fixture_file("tests/parity/fixtures/w3_small.safetensors", "W3", 2, TS_I64);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/ts_safetensors_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 2;
    }
    static const struct {
        const char *name;
        int (*fn)(void);
    } tests[] = {
        {"roundtrip", test_roundtrip},
        {"empty_file_roundtrip", test_empty_file_roundtrip},
        {"metadata", test_metadata},
        {"writer_errors", test_writer_errors},
        {"truncated", test_truncated},
        {"bad_json", test_bad_json},
        {"bad_fields", test_bad_fields},
        {"offsets_out_of_range", test_offsets_out_of_range},
        {"overlap_and_gaps", test_overlap_and_gaps},
        {"wrong_size", test_wrong_size},
        {"huge_header_length", test_huge_header_length},
        {"parity_fixtures", test_parity_fixtures},
    };
    int n = (int)(sizeof tests / sizeof tests[0]), passed = 0, failed = 0;
    for (int i = 0; i < n; i++) {
        if (tests[i].fn() == 0) {
            passed++;
        } else {
            failed++;
            fprintf(stderr, "FAILED: %s\n", tests[i].name);
        }
    }
    /* Remove the scratch files. */
    static const char *files[] = {
        "rt.safetensors",           "empty.safetensors",     "meta.safetensors",
        "after_errors.safetensors", "trunc_src.safetensors", "truncated.safetensors",
        "badjson.safetensors",      "badfields.safetensors", "range.safetensors",
        "overlap.safetensors",      "size.safetensors",      "huge.safetensors",
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[128];
        tmp_path(path, sizeof path, files[i]);
        unlink(path);
    }
    rmdir(g_dir);
    printf("safetensors: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
