/* Bad input for the gru/lstm, unet3d and gcn models through `tessel train`:
 * volumes of the wrong size or shape, labels outside the class count (by
 * voxel, by node, by sequence), graph node ids out of range, self loops and
 * repeated edges, sequences shorter than the window, keys of another model
 * and sources a model cannot read. Each exits 2 before a run directory is
 * made, with an error naming the file and the place (line, example, voxel,
 * node) or the config key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
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

/* `tessel train ARGS --out DIR/bad` exits 2 with m1 (and m2) in stderr and
 * leaves no run directory. */
static void expect(const char *what, const char *args, const char *m1, const char *m2) {
    e2e_result r = e2e_runf("train %s --out %s", args, e2e_path("bad"));
    CHECK(r.rc == 2 && strstr(r.err, m1) && (!m2 || strstr(r.err, m2)),
          "%s: exit %d, want '%s'%s%s: %s", what, r.rc, m1, m2 ? " and " : "", m2 ? m2 : "", r.err);
    struct stat st;
    CHECK(stat(e2e_path("bad"), &st) != 0, "%s: no run directory is left", what);
    printf("%-34s -> %s", what, r.err);
    e2e_done(&r);
}

enum { N = 4, S = 8, V = S * S * S };

static void volumes(const char *xname, const char *yname, int size, int deep, int64_t bad_label) {
    const int64_t vol = (int64_t)size * size * deep;
    float *x = calloc((size_t)(N * vol), sizeof *x);
    int64_t *y = calloc((size_t)(N * vol), sizeof *y);
    if (bad_label) y[1 * vol + (2 * size + 3) * deep + 4] = bad_label; /* example 1, (2, 3, 4) */
    const int64_t xd[5] = {N, 1, size, size, deep}, yd[4] = {N, size, size, deep};
    tf_write_npy_dims(e2e_path(xname), "<f4", 5, xd, x, 4);
    tf_write_npy_dims(e2e_path(yname), "<i8", 4, yd, y, 8);
    free(x);
    free(y);
}

static void test_unet3d(void) {
    char args[1024], want[512];
    write_text(e2e_path("unet.yaml"), "model: {name: unet3d, batch: 2, c1: 2, c2: 2, c3: 2}\n"
                                      "data: {source: npy, val_fraction: 0}\ntrain: {steps: 1}\n");
    /* 12^3 volumes for a model set to 8^3. */
    volumes("v12_x.npy", "v12_y.npy", 12, 12, 0);
    snprintf(args, sizeof args, "%s --set model.size=8 --set data.x=%s --set data.y=%s",
             e2e_path("unet.yaml"), e2e_path("v12_x.npy"), e2e_path("v12_y.npy"));
    snprintf(want, sizeof want, "%s: --set: model.size 8 does not match the data's volumes of 12^3",
             e2e_path("v12_x.npy"));
    expect("unet3d volumes of the wrong size", args, want, NULL);
    /* 8 x 8 x 12: not cubes. */
    volumes("vbox_x.npy", "vbox_y.npy", 8, 12, 0);
    snprintf(args, sizeof args, "%s --set data.x=%s --set data.y=%s", e2e_path("unet.yaml"),
             e2e_path("vbox_x.npy"), e2e_path("vbox_y.npy"));
    snprintf(want, sizeof want, "%s: a unet3d reads cubic volumes", e2e_path("vbox_x.npy"));
    expect("unet3d volumes not cubes", args, want, "the examples are [1, 8, 8, 12]");
    /* A voxel labelled 3 with model.classes 2. */
    volumes("v8_x.npy", "v8_y.npy", S, S, 3);
    snprintf(args, sizeof args, "%s --set model.classes=2 --set data.x=%s --set data.y=%s",
             e2e_path("unet.yaml"), e2e_path("v8_x.npy"), e2e_path("v8_y.npy"));
    snprintf(want, sizeof want,
             "%s: example 1, voxel (2, 3, 4) has label 3, outside [0, 2) (model.classes)",
             e2e_path("v8_y.npy"));
    expect("unet3d label outside classes", args, want, NULL);
    /* Float targets are not class ids. */
    float *fy = calloc(N * V, sizeof *fy);
    const int64_t yd[4] = {N, S, S, S};
    tf_write_npy_dims(e2e_path("v8_fy.npy"), "<f4", 4, yd, fy, 4);
    free(fy);
    snprintf(args, sizeof args, "%s --set data.x=%s --set data.y=%s", e2e_path("unet.yaml"),
             e2e_path("v8_x.npy"), e2e_path("v8_fy.npy"));
    snprintf(want, sizeof want, "%s: a unet3d needs integer class ids [n, 8, 8, 8]",
             e2e_path("v8_fy.npy"));
    expect("unet3d float labels", args, want, NULL);
    snprintf(args, sizeof args, "%s --set data.source=csv --set data.path=x.csv --set data.label=y",
             e2e_path("unet.yaml"));
    expect("unet3d from a csv", args, "data.source csv cannot feed a unet3d model", NULL);
}

static void test_gcn(void) {
    char args[1024], want[512];
    const char *g = "examples/w5.yaml --set train.steps=1";
    write_text(e2e_path("far.csv"), "src,dst\n0,1\n1,95\n");
    snprintf(args, sizeof args, "%s --set data.edges=%s", g, e2e_path("far.csv"));
    snprintf(want, sizeof want, "%s:3: node id 95 is outside [0, 90)", e2e_path("far.csv"));
    expect("gcn node id out of range", args, want, NULL);
    write_text(e2e_path("loop.csv"), "0,1\n# a comment\n3,3\n");
    snprintf(args, sizeof args, "%s --set data.edges=%s", g, e2e_path("loop.csv"));
    snprintf(want, sizeof want, "%s:3: node 3 joined to itself", e2e_path("loop.csv"));
    expect("gcn self loop", args, want, "self loops are added by the normalisation");
    write_text(e2e_path("dup.tsv"), "0\t1\n2\t3\n0\t1\n");
    snprintf(args, sizeof args, "%s --set data.edges=%s", g, e2e_path("dup.tsv"));
    snprintf(want, sizeof want, "%s:3: edge 0,1 is listed again (first on line 1)",
             e2e_path("dup.tsv"));
    expect("gcn repeated edge", args, want, NULL);
    snprintf(args, sizeof args, "%s --set model.classes=2", g);
    expect("gcn label outside classes", args,
           "examples/data/tiny_graph/y.npy: node 2 has label 2, outside [0, 2)", NULL);
    int64_t split[90] = {0};
    split[7] = 5;
    tf_write_npy(e2e_path("split.npy"), "<i8", 90, 0, split, 8, 0);
    write_text(e2e_path("gcn.yaml"),
               "model: {name: gcn}\n"
               "data: {source: graph, edges: examples/data/tiny_graph/edges.csv,\n"
               "       x: examples/data/tiny_graph/x.npy, y: examples/data/tiny_graph/y.npy}\n");
    snprintf(args, sizeof args, "%s --set data.node_split=%s", e2e_path("gcn.yaml"),
             e2e_path("split.npy"));
    snprintf(want, sizeof want, "%s: node 7 has split id 5", e2e_path("split.npy"));
    expect("gcn bad split id", args, want, NULL);
    snprintf(args, sizeof args, "%s --set data.node_split=%s --set data.val_fraction=0.1",
             e2e_path("gcn.yaml"), e2e_path("split.npy"));
    expect("gcn split file and fractions", args, "set data.node_split or the fractions", NULL);
    expect("gcn batch key", "examples/w5.yaml --set model.batch=4",
           "--set: model.batch is not a key of gcn models", NULL);
    expect("gcn nodes against the graph", "examples/w5.yaml --set model.nodes=50",
           "--set: model.nodes 50 does not match the graph's 90 nodes", NULL);
    write_text(e2e_path("gcnx.yaml"), "model: {name: gcn}\ndata: {source: synthetic, x: x.npy}\n");
    snprintf(want, sizeof want, "%s:2:", e2e_path("gcnx.yaml"));
    expect("gcn graph keys on synthetic data", e2e_path("gcnx.yaml"), want,
           "data.x is not used by data.source synthetic (it is for npy and graph)");
}

static void test_rnn(void) {
    char args[1024], want[512];
    write_text(e2e_path("short.csv"), "t,a,y\n0,1,0\n1,2,1\n2,3,0\n3,4,1\n4,5,0\n");
    write_text(e2e_path("gru.yaml"), "model: {name: gru, batch: 1, hidden: 4, n_layers: 1}\n"
                                     "data: {source: csv, label: y, window: 8, horizon: 1}\n"
                                     "train: {steps: 1}\n");
    snprintf(args, sizeof args, "%s --set data.path=%s", e2e_path("gru.yaml"),
             e2e_path("short.csv"));
    snprintf(want, sizeof want, "%s: 5 data rows are too few for window 8 and horizon 1",
             e2e_path("short.csv"));
    expect("gru sequence shorter than window", args, want, NULL);
    write_text(e2e_path("half.csv"), "a,y\n1,0\n2,1\n3,0.5\n4,1\n5,0\n");
    snprintf(args, sizeof args,
             "%s --set data.path=%s --set data.window=2 --set data.horizon=0 --set "
             "model.classes=1 --set data.val_fraction=0 --set data.normalise=false",
             e2e_path("gru.yaml"), e2e_path("half.csv"));
    snprintf(want, sizeof want,
             "%s: example 1 has target 0.5; model.classes 1 (binary) needs 0 or 1",
             e2e_path("half.csv"));
    expect("gru binary target not 0/1", args, want, NULL);
    snprintf(args, sizeof args,
             "%s --set data.path=%s --set data.window=2 --set data.horizon=0 --set "
             "model.classes=2 --set data.val_fraction=0",
             e2e_path("gru.yaml"), e2e_path("half.csv"));
    snprintf(want, sizeof want, "%s:4: label column 'y' holds 0.5, not a class id in [0, 2)",
             e2e_path("half.csv"));
    expect("gru class id not an integer", args, want, NULL);
    snprintf(args, sizeof args,
             "%s --set data.path=%s --set data.window=2 --set data.horizon=0 --set "
             "model.window=3",
             e2e_path("gru.yaml"), e2e_path("half.csv"));
    expect("gru window against the data", args,
           "--set: model.window 3 does not match the data's sequences of 2 steps", NULL);
    expect("gru key of another model", "examples/w2.yaml --set model.size=8",
           "--set: model.size is not a key of gru models", NULL);
    expect("lstm graph key", "examples/w2.yaml --set model.name=lstm --set data.edges=e.csv",
           "data.edges is not used by data.source synthetic (it is for graph)", NULL);
    expect("gru graph source", "examples/w2.yaml --set data.source=graph",
           "data.source graph cannot feed a gru model", NULL);
    expect("gru synthetic classes", "examples/w2.yaml --set model.classes=3",
           "synthetic gru data is W2's binary task", NULL);
    expect("preset of another model", "examples/w2.yaml --set model.preset=w4",
           "model.preset w4 is a unet3d preset, but model.name is gru", NULL);
}

int main(void) {
    char dir[64];
    if (!e2e_setup("zoobad", dir, sizeof dir)) return check_summary("e2e/zoo_bad_input");
    test_unet3d();
    test_gcn();
    test_rnn();
    e2e_cleanup(dir);
    return check_summary("e2e/zoo_bad_input");
}
