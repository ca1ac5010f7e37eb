/* Mapped .npy and IDX data sets (src/data/xmap.c) against the in-memory
 * readers: for every element type, plain and gzip IDX, with and without a
 * split and prefetch, the loaders hand out byte-identical batches over
 * several shuffled epochs, the validation parts and the lineage (path,
 * SHA-256, size) are identical, and every kind of bad file gives the same
 * status and message, including a bad element past the first chunk of the
 * load pass. Then resident memory: a 40 MB IDX file trains through an epoch
 * with its peak resident memory growing by far less than the f32 copy the
 * in-memory reader makes (160 MB). Files are written to a fresh temporary
 * directory; the real Fashion-MNIST test set is compared when installed. */
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zlib.h>
#include "check.h"
#include "data/data.h"

static char dir[64];

static const char *path_of(const char *name) {
    static char paths[64][320];
    static int n;
    char *b = paths[n++ % 64];
    snprintf(b, sizeof paths[0], "%s/%.255s", dir, name);
    return b;
}

static const char *write_file(const char *name, const void *a, size_t na, const void *b,
                              size_t nb) {
    const char *p = path_of(name);
    FILE *f = fopen(p, "wb");
    int ok = f && fwrite(a, 1, na, f) == na && (!nb || fwrite(b, 1, nb, f) == nb);
    CHECK(ok, "cannot write %s", p);
    if (f) fclose(f);
    return p;
}

/* A .npy file (version 1.0) of `data`, `extra` bytes appended or `cut`
 * bytes dropped from the end. */
static const char *write_npy(const char *name, const char *descr, const char *shape,
                             const void *data, size_t n, size_t extra, size_t cut) {
    uint8_t head[128];
    char dict[120];
    snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr,
             shape);
    memcpy(head, "\x93NUMPY\x01\x00", 8);
    head[8] = 128 - 10, head[9] = 0;
    memset(head + 10, ' ', 118);
    memcpy(head + 10, dict, strlen(dict));
    head[127] = '\n';
    uint8_t *buf = malloc(n + extra + 1);
    memcpy(buf, data, n);
    memset(buf + n, 7, extra);
    const char *p = write_file(name, head, sizeof head, buf, n + extra - cut);
    free(buf);
    return p;
}

static size_t idx_head(uint8_t *h, int rank, const uint32_t *dims) {
    h[0] = h[1] = 0, h[2] = 0x08, h[3] = (uint8_t)rank;
    for (int i = 0; i < rank; i++)
        for (int b = 0; b < 4; b++) h[4 + 4 * i + b] = (uint8_t)(dims[i] >> (24 - 8 * b));
    return 4 + 4 * (size_t)rank;
}

static const char *write_gz(const char *name, const void *a, size_t na, const void *b, size_t nb) {
    const char *p = path_of(name);
    gzFile g = gzopen(p, "wb");
    CHECK(g && gzwrite(g, a, (unsigned)na) == (int)na && gzwrite(g, b, (unsigned)nb) == (int)nb,
          "gzwrite %s", p);
    if (g) gzclose(g);
    return p;
}

static int same_lineage(const ts_dataset *a, const ts_dataset *b) {
    if (a->n_lineage != b->n_lineage) return 0;
    for (int i = 0; i < a->n_lineage; i++)
        if (strcmp(a->lineage[i].path, b->lineage[i].path) ||
            strcmp(a->lineage[i].sha256, b->lineage[i].sha256) ||
            a->lineage[i].bytes != b->lineage[i].bytes)
            return 0;
    return 1;
}

/* Batches of loaders over mem and map agree byte for byte over three
 * epochs (shuffled, prefetching on the mapped side), after a split and
 * without one; the validation parts are equal in memory. */
static void compare(const char *what, ts_dataset *mem, ts_dataset *map) {
    CHECK(mem->n == map->n && mem->x_dtype == map->x_dtype && mem->y_dtype == map->y_dtype &&
              mem->x_rank == map->x_rank && mem->y_rank == map->y_rank &&
              !memcmp(mem->x_dims, map->x_dims, sizeof mem->x_dims) &&
              !memcmp(mem->y_dims, map->y_dims, sizeof mem->y_dims),
          "%s: same shapes", what);
    CHECK(map->x == NULL && map->xmap != NULL, "%s: x is mapped, not copied", what);
    CHECK(same_lineage(mem, map), "%s: same lineage", what);
    const size_t xb = ts_dataset_x_bytes(mem), yb = ts_dataset_y_bytes(mem);
    for (int split = 0; split < 2; split++) {
        ts_dataset *tm = mem, *tp = map, *vm = NULL, *vp = NULL;
        if (split) {
            CHECK_OK(ts_dataset_split(mem, 0.25, 5, &tm, &vm));
            CHECK_OK(ts_dataset_split(map, 0.25, 5, &tp, &vp));
            if (!tm || !tp) return;
            /* the validation part is a view of the mapping too, read as
             * evaluation reads it */
            int equal = vm->n == vp->n && !vp->x && vp->xmap && vp->index;
            uint8_t *xv = malloc(xb), *yv = malloc(yb);
            for (int64_t i = 0; equal && xv && yv && i < vm->n; i++)
                equal = ts_dataset_read(vp, i, 1, xv, yv) == TS_OK &&
                        !memcmp(xv, (const uint8_t *)vm->x + i * xb, xb) &&
                        !memcmp(yv, (const uint8_t *)vm->y + i * yb, yb);
            free(xv), free(yv);
            CHECK(equal, "%s: validation parts equal", what);
            CHECK(same_lineage(vm, vp) && same_lineage(tm, tp), "%s: split lineage", what);
        }
        const int64_t B = 3;
        ts_loader *lm, *lp;
        CHECK_OK(ts_loader_new(tm, B, 1, 11, &lm));
        CHECK_OK(ts_loader_new(tp, B, 1, 11, &lp));
        CHECK_OK(ts_loader_prefetch(lp, 2));
        uint8_t *x1 = malloc(B * xb), *x2 = malloc(B * xb), *y1 = malloc(B * yb),
                *y2 = malloc(B * yb);
        int differ = 0;
        const int64_t steps = 3 * ts_loader_batches_per_epoch(lm);
        for (int64_t k = 0; k < steps; k++) {
            CHECK_OK(ts_loader_next(lm, x1, y1));
            CHECK_OK(ts_loader_next(lp, x2, y2));
            differ += memcmp(x1, x2, B * xb) != 0 || memcmp(y1, y2, B * yb) != 0;
        }
        CHECK(differ == 0, "%s (split %d): %d of %lld batches differ", what, split, differ,
              (long long)steps);
        free(x1), free(x2), free(y1), free(y2);
        ts_loader_free(lm);
        ts_loader_free(lp);
        if (split) {
            ts_dataset_free(tm), ts_dataset_free(vm);
            ts_dataset_free(tp), ts_dataset_free(vp);
        }
    }
}

static void test_npy_types(void) {
    enum { N = 13, F = 6 };
    double f64[N * F];
    float f32[N * F], yf[N * 2];
    int32_t i32[N * F];
    int64_t i64[N * F], yi[N];
    uint8_t u8[N * F];
    for (int i = 0; i < N * F; i++) {
        f64[i] = (i * 0.37 - 9) / 3.0; /* not exact in f32: the rounding is compared */
        f32[i] = (float)f64[i];
        i32[i] = i * 1000003 - 40000000;
        i64[i] = ((int64_t)i << 40) + 12345; /* rounds through double, then f32 */
        u8[i] = (uint8_t)(i * 37);
    }
    for (int i = 0; i < N; i++) yi[i] = i % 4, yf[2 * i] = (float)i, yf[2 * i + 1] = -(float)i;
    const char *ys[2] = {write_npy("yi.npy", "<i8", "(13,)", yi, sizeof yi, 0, 0),
                         write_npy("yf.npy", "<f4", "(13, 2)", yf, sizeof yf, 0, 0)};
    const struct {
        const char *descr, *shape;
        const void *data;
        size_t n;
    } xs[] = {{"<f8", "(13, 6)", f64, sizeof f64},
              {"<f4", "(13, 2, 3)", f32, sizeof f32},
              {"<i4", "(13, 6)", i32, sizeof i32},
              {"<i8", "(13, 6)", i64, sizeof i64},
              {"|u1", "(13, 3, 2)", u8, sizeof u8}};
    for (size_t t = 0; t < sizeof xs / sizeof xs[0]; t++)
        for (int k = 0; k < 2; k++) {
            char name[32], what[64];
            snprintf(name, sizeof name, "x%zu.npy", t);
            snprintf(what, sizeof what, "npy x %s, y %s", xs[t].descr, k ? "f32" : "i64");
            const char *xp = write_npy(name, xs[t].descr, xs[t].shape, xs[t].data, xs[t].n, 0, 0);
            ts_dataset *mem = NULL, *map = NULL;
            CHECK_OK(ts_data_load_npy_pair(xp, ys[k], &mem));
            CHECK_OK(ts_data_map_npy_pair(xp, ys[k], &map));
            if (mem && map) compare(what, mem, map);
            ts_dataset_free(mem);
            ts_dataset_free(map);
        }
}

static void test_idx_kinds(void) {
    enum { N = 17, R = 4, C = 5 };
    uint8_t im[N * R * C], lb[N], h1[32], h2[32];
    for (int i = 0; i < N * R * C; i++) im[i] = (uint8_t)(i * 53 + 1);
    for (int i = 0; i < N; i++) lb[i] = (uint8_t)(i % 10);
    const uint32_t di[3] = {N, R, C}, dl[1] = {N};
    const size_t hi = idx_head(h1, 3, di), hl = idx_head(h2, 1, dl);
    const char *ip = write_file("im.idx", h1, hi, im, sizeof im);
    const char *lp = write_file("lb.idx", h2, hl, lb, sizeof lb);
    const char *ig = write_gz("im.idx.gz", h1, hi, im, sizeof im);
    const char *lg = write_gz("lb.idx.gz", h2, hl, lb, sizeof lb);
    const char *pairs[2][2] = {{ip, lp}, {ig, lg}};
    for (int g = 0; g < 2; g++) {
        ts_dataset *mem = NULL, *map = NULL;
        CHECK_OK(ts_data_load_idx_pair(pairs[g][0], pairs[g][1], &mem));
        CHECK_OK(ts_data_map_idx_pair(pairs[g][0], pairs[g][1], &map));
        if (mem && map) compare(g ? "IDX gzip" : "IDX plain", mem, map);
        ts_dataset_free(mem);
        ts_dataset_free(map);
    }
}

/* The mapped reader refuses what the in-memory one refuses, alike. */
static void same_error(const char *what, ts_status sm, const char *map_err, ts_status sp) {
    CHECK(sm != TS_OK && sm == sp && !strcmp(map_err, ts_last_error()),
          "%s: in memory %s '%s', mapped %s '%s'", what, ts_status_name(sm), map_err,
          ts_status_name(sp), ts_last_error());
}

static void npy_error(const char *what, const char *x, const char *y) {
    ts_dataset *d = NULL;
    const ts_status sp = ts_data_map_npy_pair(x, y, &d);
    char err[1024];
    snprintf(err, sizeof err, "%s", ts_last_error());
    CHECK(d == NULL, "%s: no data set on error", what);
    const ts_status sm = ts_data_load_npy_pair(x, y, &d);
    CHECK(d == NULL, "%s: no data set on error (in memory)", what);
    same_error(what, sm, err, sp);
}

static void idx_error(const char *what, const char *im, const char *lb) {
    ts_dataset *d = NULL;
    const ts_status sp = ts_data_map_idx_pair(im, lb, &d);
    char err[1024];
    snprintf(err, sizeof err, "%s", ts_last_error());
    CHECK(d == NULL, "%s: no data set on error", what);
    const ts_status sm = ts_data_load_idx_pair(im, lb, &d);
    same_error(what, sm, err, sp);
}

static void test_errors(void) {
    float x[12] = {0};
    int64_t y[4] = {0, 1, 2, 3};
    const char *yp = write_npy("ey.npy", "<i8", "(4,)", y, sizeof y, 0, 0);
    const char *y3 = write_npy("ey3.npy", "<i8", "(3,)", y, 24, 0, 0);
    npy_error("missing x", path_of("none.npy"), yp);
    npy_error("missing y", write_npy("ex.npy", "<f4", "(4, 3)", x, sizeof x, 0, 0),
              path_of("none.npy"));
    npy_error("empty x", write_file("empty.npy", "", 0, NULL, 0), yp);
    npy_error("bad magic", write_file("magic.npy", "NUMPY.......", 12, NULL, 0), yp);
    npy_error("truncated", write_npy("trunc.npy", "<f4", "(4, 3)", x, sizeof x, 0, 5), yp);
    npy_error("trailing", write_npy("trail.npy", "<f4", "(4, 3)", x, sizeof x, 3, 0), yp);
    npy_error("count", write_npy("cnt.npy", "<f4", "(4, 3)", x, sizeof x, 0, 0), y3);
    npy_error("scalar", write_npy("scalar.npy", "<f4", "()", x, 4, 0, 0), yp);
    npy_error("zero dim", write_npy("zero.npy", "<f4", "(4, 0)", x, 0, 0, 0), yp);
    x[7] = NAN;
    npy_error("nan", write_npy("nan.npy", "<f4", "(4, 3)", x, sizeof x, 0, 0), yp);
    double big[12] = {0};
    big[10] = 1e300;
    npy_error("f64 past f32", write_npy("big.npy", "<f8", "(4, 3)", big, sizeof big, 0, 0), yp);
    /* A bad element in the second chunk of the load pass: its index. */
    enum { M = (1 << 20) + 1000 };
    float *f = calloc(M, sizeof *f);
    int64_t *yy = calloc(M / 8, sizeof *yy);
    f[(1 << 20) + 17] = -INFINITY;
    const char *fy = write_npy("fy.npy", "<i8", "(131197,)", yy, (M / 8) * 8, 0, 0);
    npy_error("inf past the first chunk",
              write_npy("inf2.npy", "<f4", "(131197, 8)", f, (size_t)M / 8 * 8 * 4, 0, 0), fy);
    free(f), free(yy);

    uint8_t h[32], b[48] = {0};
    const uint32_t di[3] = {2, 4, 5}, dl[1] = {2}, d3[1] = {3};
    const char *lb = write_file("elb", h, idx_head(h, 1, dl), b, 2);
    size_t n = idx_head(h, 3, di);
    idx_error("idx missing", path_of("none.idx"), lb);
    idx_error("idx empty", write_file("e0", "", 0, NULL, 0), lb);
    idx_error("idx magic", write_file("em", "\x01\x00\x08\x01", 4, NULL, 0), lb);
    idx_error("idx type", write_file("et", "\x00\x00\x0d\x01", 4, NULL, 0), lb);
    idx_error("idx rank", write_file("er", "\x00\x00\x08\x00", 4, NULL, 0), lb);
    idx_error("idx header", write_file("eh", h, n - 2, NULL, 0), lb);
    idx_error("idx truncated", write_file("etr", h, n, b, 39), lb);
    idx_error("idx trailing", write_file("eta", h, n, b, 41), lb);
    idx_error("idx rank 1 images", write_file("e1", h, idx_head(h, 1, dl), b, 2), lb);
    n = idx_head(h, 3, di);
    const char *good = write_file("eg", h, n, b, 40);
    idx_error("idx counts", good, write_file("el3", h, idx_head(h, 1, d3), b, 3));
    idx_error("idx labels missing", good, path_of("none.idx"));
    idx_error("idx gzip corrupt", write_file("egz", "\x1f\x8b\x08\x00garbage", 11, NULL, 0), lb);
}

/* Peak resident memory: training an epoch from a mapped 40 MB IDX file
 * grows it by a small part of the file, where the in-memory reader holds
 * the file and its f32 copy (200 MB). Run first, before other tests raise
 * the peak. */
static void test_resident(void) {
    enum { N = 50000, P = 800 };
    uint8_t h[32], row[P], lb[N];
    const uint32_t di[2] = {N, P}, dl[1] = {N};
    /* Written a row at a time: a buffer of the file would raise the peak
     * before the measurement starts. */
    const char *ip = write_file("big.idx", h, idx_head(h, 2, di), NULL, 0);
    FILE *f = fopen(ip, "ab");
    for (int i = 0; f && i < N; i++) {
        for (int j = 0; j < P; j++) row[j] = (uint8_t)(((uint32_t)(i * P + j) * 2654435761u) >> 24);
        CHECK(fwrite(row, 1, P, f) == P, "writing %s", ip);
    }
    if (f) fclose(f);
    for (int i = 0; i < N; i++) lb[i] = (uint8_t)(i % 10);
    const char *lp = write_file("big-lb.idx", h, idx_head(h, 1, dl), lb, N);
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    ts_dataset *d = NULL, *tr = NULL, *va = NULL;
    CHECK_OK(ts_data_map_idx_pair(ip, lp, &d));
    if (d) CHECK_OK(ts_dataset_split(d, 0.0, 1, &tr, &va));
    ts_loader *l = NULL;
    if (tr) CHECK_OK(ts_loader_new(tr, 100, 1, 3, &l));
    if (l) CHECK_OK(ts_loader_prefetch(l, 2));
    float *x = malloc(100 * P * sizeof *x);
    int64_t y[100];
    double sum = 0;
    for (int64_t k = 0; l && k < ts_loader_batches_per_epoch(l); k++) {
        CHECK_OK(ts_loader_next(l, x, y));
        sum += x[k % (100 * P)];
    }
    getrusage(RUSAGE_SELF, &r1);
    const double grew_mb = (double)(r1.ru_maxrss - r0.ru_maxrss) / 1024;
    printf("data_map: an epoch of a mapped %.0f MB IDX file raised peak RSS by %.1f MB "
           "(in memory: file + f32 copy, %.0f MB)\n",
           N * (double)P / 1e6, grew_mb, 5.0 * N * P / 1048576);
    CHECK(grew_mb < 24 && sum >= 0, "peak RSS grew %.1f MB for a 40 MB file", grew_mb);
    free(x);
    ts_loader_free(l);
    ts_dataset_free(tr), ts_dataset_free(va), ts_dataset_free(d);
    unlink(ip), unlink(lp);
}

static void test_fashion_mnist(void) {
    const char *im = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
    const char *lb = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz";
    if (access(im, R_OK) || access(lb, R_OK)) {
        printf("data_map: Fashion-MNIST not installed, real-data check skipped\n");
        return;
    }
    ts_dataset *mem = NULL, *map = NULL;
    CHECK_OK(ts_data_load_idx_pair(im, lb, &mem));
    CHECK_OK(ts_data_map_idx_pair(im, lb, &map));
    if (mem && map) compare("Fashion-MNIST t10k", mem, map);
    ts_dataset_free(mem);
    ts_dataset_free(map);
}

static void remove_dir(void) {
    DIR *dd = opendir(dir);
    if (!dd) return;
    char p[320];
    for (struct dirent *e; (e = readdir(dd));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            snprintf(p, sizeof p, "%s/%.255s", dir, e->d_name) > 0)
            unlink(p);
    closedir(dd);
    rmdir(dir);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/tessel-data-map-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_resident();
    test_npy_types();
    test_idx_kinds();
    test_errors();
    test_fashion_mnist();
    remove_dir();
    return check_summary("data_map");
}
