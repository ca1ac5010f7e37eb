/* Bad input for the models' data, end to end through `tessel train`: images
 * of the wrong size for a cnn, a sequence (CSV) shorter than the window,
 * and labels outside the class count (CSV and .npy); each exits 2 with an
 * error naming the file and, where there is one, the line or example. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"
#include "testfiles.h"

static char dir[64];

static const char *in_dir(const char *name) {
    static char buf[8][256];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 256, "%s/%s", dir, name);
    return p;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void expect(const char *what, const char *args, const char *m1, const char *m2) {
    e2e_result r = e2e_run(args);
    CHECK(r.rc == 2 && strstr(r.err, m1) && (!m2 || strstr(r.err, m2)),
          "%s: exit %d, want '%s'%s%s: %s", what, r.rc, m1, m2 ? " and " : "", m2 ? m2 : "", r.err);
    printf("%-28s -> %s", what, r.err);
    e2e_done(&r);
}

int main(void) {
    if (!e2e_setup("badm", dir, sizeof dir)) return check_summary("e2e/bad_input_models");

    /* 8 images of 1 x 30 x 30 for a cnn configured for 28 x 28. */
    enum { N = 8, PIX = 30 * 30 };
    float *x = calloc(N * PIX, sizeof *x);
    int64_t y[N] = {0, 1, 0, 1, 0, 1, 0, 1};
    tf_write_npy(in_dir("img.npy"), "<f4", N, PIX, x, 4, 0);
    tf_write_npy(in_dir("lab.npy"), "<i8", N, 0, y, 8, 0);
    free(x);
    write_text(in_dir("cnn.yaml"), "model: {name: cnn, preset: fashion, classes: 2, batch: 2}\n"
                                   "data: {source: npy, val_fraction: 0}\ntrain: {steps: 1}\n");
    char args[1024], want[300];
    snprintf(args, sizeof args, "train %s --set data.x=%s --set data.y=%s --out %s",
             in_dir("cnn.yaml"), in_dir("img.npy"), in_dir("lab.npy"), in_dir("r1"));
    snprintf(want, sizeof want, "%s: ", in_dir("img.npy"));
    expect("cnn images of the wrong size", args, want,
           "height 28 x width 28 does not match the data's 900");

    /* A 5-row series with window 8. */
    write_text(in_dir("series.csv"), "t,a,y\n0,1,2\n1,2,3\n2,3,4\n3,4,5\n4,5,6\n");
    write_text(in_dir("seq.yaml"), "model: {name: mlp, batch: 1}\n"
                                   "data: {source: csv, label: y, window: 8, horizon: 1}\n");
    snprintf(args, sizeof args, "train %s --set data.path=%s --out %s", in_dir("seq.yaml"),
             in_dir("series.csv"), in_dir("r2"));
    snprintf(want, sizeof want, "%s: 5 data rows are too few for window 8 and horizon 1",
             in_dir("series.csv"));
    expect("sequence shorter than window", args, want, NULL);

    /* Labels outside model.classes: CSV (file:line) and .npy (example). */
    write_text(in_dir("tab.csv"), "a,y\n1,0\n2,1\n3,4\n");
    write_text(in_dir("tab.yaml"),
               "model: {name: mlp, window: 0, in_dim: 1, classes: 3, batch: 1}\n"
               "data: {source: csv, label: y, window: 1, horizon: 0}\n");
    snprintf(args, sizeof args, "train %s --set data.path=%s --out %s", in_dir("tab.yaml"),
             in_dir("tab.csv"), in_dir("r3"));
    snprintf(want, sizeof want, "%s:4: label column 'y' holds 4, not a class id in [0, 3)",
             in_dir("tab.csv"));
    expect("CSV label outside classes", args, want, NULL);
    int64_t yb[N] = {0, 1, 0, 1, 2, 1, 0, 1};
    tf_write_npy(in_dir("labbad.npy"), "<i8", N, 0, yb, 8, 0);
    snprintf(args, sizeof args,
             "train %s --set data.x=%s --set data.y=%s --set model.classes=2 --out %s",
             in_dir("cnn.yaml"), in_dir("img.npy"), in_dir("labbad.npy"), in_dir("r4"));
    snprintf(want, sizeof want, "%s: example 4 has label 2, out of range", in_dir("labbad.npy"));
    expect("npy label outside classes", args, want, NULL);

    e2e_cleanup(dir);
    return check_summary("e2e/bad_input_models");
}
