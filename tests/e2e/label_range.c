/* Sizes derived from data, end to end through `tessel train`: a class id
 * far past any sensible class count (INT64_MAX, 2^62, 1e9) or negative, in
 * the .npy labels of an mlp, a gru, a unet3d and a gcn (each derives
 * model.classes from the largest label in its own code), non-finite .npy inputs and CSV
 * cells outside the number rule. Each exits 2 before a run directory is
 * made, naming the file, the place, the value and, for a class id, the key
 * model.classes. Run under ASan+UBSan (build-asan) this is the check that
 * "label + 1" and the shapes built from it never overflow. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "check.h"
#include "e2e.h"
#include "testfiles.h"

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* `tessel train CONFIG ARGS --out DIR/bad` exits 2 with every one of the
 * NULL-terminated messages in stderr and leaves no run directory. */
static void expect(const char *what, const char *config, const char *args, ...) {
    e2e_result r = e2e_runf("train %s %s --out %s", config, args, e2e_path("bad"));
    int ok = r.rc == 2;
    va_list ap;
    va_start(ap, args);
    for (const char *m; (m = va_arg(ap, const char *));)
        if (!strstr(r.err, m)) {
            ok = 0;
            CHECK(0, "%s: stderr lacks '%s'", what, m);
        }
    va_end(ap);
    CHECK(ok, "%s: exit %d (want 2): %s", what, r.rc, r.err);
    struct stat st;
    CHECK(stat(e2e_path("bad"), &st) != 0, "%s: no run directory is left", what);
    printf("%-36s -> %s", what, r.err);
    e2e_done(&r);
}

enum { N = 8, F = 4, T = 5 };

static const int64_t bad_labels[] = {INT64_MAX, (int64_t)1 << 62, 1000000000, -1};

/* The mlp (ts_sess_load_data's check_labels). */
static void test_mlp(void) {
    float x[N * F] = {0};
    for (int i = 0; i < N * F; i++) x[i] = (float)(i % 7) * 0.25f;
    tf_write_npy(e2e_path("x.npy"), "<f4", N, F, x, 4, 0);
    write_text(e2e_path("mlp.yaml"), "model: {name: mlp, batch: 2}\n"
                                     "data: {source: npy, val_fraction: 0}\ntrain: {steps: 1}\n");
    for (size_t k = 0; k < sizeof bad_labels / sizeof bad_labels[0]; k++) {
        int64_t y[N] = {0, 1, 2, 0, 1, 2, 0, 1};
        y[5] = bad_labels[k];
        char name[32], args[512], want[300], value[64], what[64];
        snprintf(name, sizeof name, "y%zu.npy", k);
        tf_write_npy(e2e_path(name), "<i8", N, 0, y, 8, 0);
        snprintf(args, sizeof args, "--set data.x=%s --set data.y=%s", e2e_path("x.npy"),
                 e2e_path(name));
        snprintf(want, sizeof want, "%s: example 5 has label %lld", e2e_path(name),
                 (long long)bad_labels[k]);
        snprintf(value, sizeof value, "%s",
                 bad_labels[k] < 0 ? "out of range" : "above the range of model.classes");
        snprintf(what, sizeof what, "mlp label %lld", (long long)bad_labels[k]);
        expect(what, e2e_path("mlp.yaml"), args, want, value, NULL);
    }
}

/* The gru (ts_zoo_fit's sequences). */
static void test_gru(void) {
    float x[N * T * 2] = {0};
    const int64_t xd[3] = {N, T, 2};
    tf_write_npy_dims(e2e_path("seq.npy"), "<f4", 3, xd, x, 4);
    write_text(e2e_path("gru.yaml"), "model: {name: gru, batch: 2, hidden: 4}\n"
                                     "data: {source: npy, val_fraction: 0}\ntrain: {steps: 1}\n");
    int64_t y[N] = {0, 1, 0, 1, 0, 1, 0, (int64_t)1 << 62};
    tf_write_npy(e2e_path("seqy.npy"), "<i8", N, 0, y, 8, 0);
    char args[512], want[300];
    snprintf(args, sizeof args, "--set data.x=%s --set data.y=%s", e2e_path("seq.npy"),
             e2e_path("seqy.npy"));
    snprintf(want, sizeof want, "%s: example 7 has label 4611686018427387904",
             e2e_path("seqy.npy"));
    expect("gru label 2^62", e2e_path("gru.yaml"), args, want, "model.classes", NULL);
}

/* The unet3d (ts_zoo_fit's volumes): one voxel's label. */
static void test_unet(void) {
    enum { V = 4, S = 8 };
    float *x = calloc(V * S * S * S, sizeof *x);
    int64_t *y = calloc(V * S * S * S, sizeof *y);
    if (!x || !y) {
        CHECK(0, "out of memory");
        free(x), free(y);
        return;
    }
    y[2 * S * S * S + (1 * S + 2) * S + 3] = 1000000000; /* example 2, voxel (1, 2, 3) */
    const int64_t xd[5] = {V, 1, S, S, S}, yd[4] = {V, S, S, S};
    tf_write_npy_dims(e2e_path("vx.npy"), "<f4", 5, xd, x, 4);
    tf_write_npy_dims(e2e_path("vy.npy"), "<i8", 4, yd, y, 8);
    free(x);
    free(y);
    write_text(e2e_path("unet.yaml"), "model: {name: unet3d, batch: 2, c1: 2, c2: 2, c3: 2}\n"
                                      "data: {source: npy, val_fraction: 0}\ntrain: {steps: 1}\n");
    char args[512], want[300];
    snprintf(args, sizeof args, "--set data.x=%s --set data.y=%s", e2e_path("vx.npy"),
             e2e_path("vy.npy"));
    snprintf(want, sizeof want, "%s: example 2, voxel (1, 2, 3) has label 1000000000",
             e2e_path("vy.npy"));
    expect("unet3d voxel label 1e9", e2e_path("unet.yaml"), args, want, "model.classes", NULL);
}

/* The gcn (ts_data_load_graph). */
static void test_gcn(void) {
    float x[N * 3] = {0};
    tf_write_npy(e2e_path("gx.npy"), "<f4", N, 3, x, 4, 0);
    int64_t y[N] = {0, 1, 0, 1, 0, 1, INT64_MAX, 1};
    tf_write_npy(e2e_path("gy.npy"), "<i8", N, 0, y, 8, 0);
    write_text(e2e_path("edges.csv"), "0,1\n1,2\n2,3\n3,4\n4,5\n5,6\n6,7\n");
    write_text(e2e_path("gcn.yaml"), "model: {name: gcn}\ndata: {source: graph}\n"
                                     "train: {steps: 1}\n");
    char args[512], want[300];
    snprintf(args, sizeof args, "--set data.edges=%s --set data.x=%s --set data.y=%s",
             e2e_path("edges.csv"), e2e_path("gx.npy"), e2e_path("gy.npy"));
    snprintf(want, sizeof want, "%s: node 6 has label 9223372036854775807", e2e_path("gy.npy"));
    expect("gcn label INT64_MAX", e2e_path("gcn.yaml"), args, want, "model.classes", NULL);
}

/* The number rule: .npy NaN/Inf and CSV cells beyond plain decimals. */
static void test_numbers(void) {
    float x[N * F] = {0};
    x[2 * F + 3] = NAN;
    tf_write_npy(e2e_path("xnan.npy"), "<f4", N, F, x, 4, 0);
    int64_t y[N] = {0, 1, 0, 1, 0, 1, 0, 1};
    tf_write_npy(e2e_path("ygood.npy"), "<i8", N, 0, y, 8, 0);
    char args[512], want[300];
    snprintf(args, sizeof args, "--set data.x=%s --set data.y=%s", e2e_path("xnan.npy"),
             e2e_path("ygood.npy"));
    snprintf(want, sizeof want, "%s: element 11 (index [2, 3]) is nan", e2e_path("xnan.npy"));
    expect("npy NaN input", e2e_path("mlp.yaml"), args, want, NULL);
    double yf[N] = {0, 1, 0, 1, 0, -INFINITY, 0, 1};
    tf_write_npy(e2e_path("yinf.npy"), "<f8", N, 0, yf, 8, 0);
    snprintf(args, sizeof args, "--set data.x=%s --set data.y=%s", e2e_path("x.npy"),
             e2e_path("yinf.npy"));
    snprintf(want, sizeof want, "%s: element 5 (index [5]) is -inf", e2e_path("yinf.npy"));
    expect("npy -inf target", e2e_path("mlp.yaml"), args, want, NULL);

    write_text(e2e_path("tab.yaml"), "model: {name: mlp, batch: 1}\n"
                                     "data: {source: csv, label: y, window: 1}\n"
                                     "train: {steps: 1}\n");
    static const struct {
        const char *cell, *why;
    } cells[] = {{"0x10", "not a plain decimal number"},
                 {"inf", "not a finite number"},
                 {"nan", "not a finite number"},
                 {"1e", "not a number"}};
    for (size_t k = 0; k < sizeof cells / sizeof cells[0]; k++) {
        char name[32], text[128], what[64];
        snprintf(name, sizeof name, "t%zu.csv", k);
        snprintf(text, sizeof text, "a,y\n1,0.5\n2,1.5\n%s,2.5\n4,3.5\n", cells[k].cell);
        write_text(e2e_path(name), text);
        snprintf(args, sizeof args, "--set data.path=%s", e2e_path(name));
        snprintf(want, sizeof want, "%s:4: column 'a' holds '%s', %s", e2e_path(name),
                 cells[k].cell, cells[k].why);
        snprintf(what, sizeof what, "CSV cell %s", cells[k].cell);
        expect(what, e2e_path("tab.yaml"), args, want, NULL);
    }
}

int main(void) {
    char dir[64];
    if (!e2e_setup("labels", dir, sizeof dir)) return check_summary("e2e/label_range");
    test_mlp();
    test_gru();
    test_unet();
    test_gcn();
    test_numbers();
    e2e_cleanup(dir);
    return check_summary("e2e/label_range");
}
