/* `tessel train CONFIG` for the gru, lstm, unet3d and gcn models: each
 * trains from YAML for a few steps with falling loss, its evaluation
 * reports the model's metrics (accuracy and AUC for a binary gru, Dice for
 * the unet3d, accuracy on held-out nodes for the gcn), and two runs of the
 * same config give byte-identical weights (`tessel ckpt diff`). Also: CSV
 * sequences (class ids and regression) for the lstm, .npy volumes for the
 * unet3d, --procs refused for the full-batch gcn, and runs resumed from a
 * checkpoint ending on the same bytes as runs without a stop. Shapes are small so
 * every run takes a fraction of a second to a few seconds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"
#include "testfiles.h"

/* The number after "key": in text (the first one after `after`), or -1. */
static double field(const char *json, const char *after, const char *key) {
    const char *p = after ? strstr(json, after) : json;
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    if (p) p = strstr(p, pat);
    double v = -1;
    if (!p || sscanf(p + strlen(pat), " %lf", &v) != 1) return -1;
    return v;
}

static char *summary(const char *run) {
    char path[512];
    snprintf(path, sizeof path, "%s/summary.json", e2e_path(run));
    return e2e_slurp(path, NULL);
}

/* Train `args` twice (runs NAME-a, NAME-b, a checkpoint at the end of each)
 * and return the first run's summary; checks exit 0 and equal weights. */
static char *train_twice(const char *name, const char *args) {
    char a[64], b[64];
    snprintf(a, sizeof a, "%s-a", name);
    snprintf(b, sizeof b, "%s-b", name);
    for (int k = 0; k < 2; k++) {
        e2e_result r =
            e2e_runf("train %s --set ckpt.every=1000 --out %s", args, e2e_path(k ? b : a));
        CHECK(r.rc == 0, "%s: exit %d\n%s%s", name, r.rc, r.out, r.err);
        if (k == 0) printf("%s", r.out);
        e2e_done(&r);
    }
    e2e_result r = e2e_runf("ckpt diff %s %s", e2e_path(a), e2e_path(b));
    CHECK(r.rc == 0 && strstr(r.out, " 0 different"), "%s: two runs differ: exit %d\n%s%s", name,
          r.rc, r.out, r.err);
    e2e_done(&r);
    return summary(a);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void loss_falls(const char *what, const char *sum, double factor) {
    const double first = field(sum, NULL, "first_loss"), last = field(sum, NULL, "final_loss");
    CHECK(first > 0 && last >= 0 && last < factor * first, "%s: loss %.4f -> %.4f (want < %.2fx)",
          what, first, last, factor);
    printf("%s: loss %.4f -> %.4f\n", what, first, last);
}

static void test_gru(void) {
    /* W2's binary task (synthetic), small: accuracy and AUC on held-out batches. */
    char *s = train_twice("gru", "examples/w2.yaml --set model.batch=32 --set model.window=16 "
                                 "--set model.features=4 --set model.hidden=16 --set "
                                 "model.n_layers=1 --set train.steps=40 --set train.lr=0.01");
    CHECK(strstr(s, "\"model\": \"gru\""), "summary names the gru: %s", s);
    loss_falls("gru (binary, synthetic)", s, 0.6);
    const double acc = field(s, "\"val\"", "accuracy"), auc = field(s, "\"val\"", "auc");
    CHECK(acc > 0.7 && auc > 0.85, "gru val accuracy %.3f, auc %.3f", acc, auc);
    printf("gru val accuracy %.4f, auc %.4f\n", acc, auc);
    free(s);

    /* Two processes, 16 rows each: the batch splits as for the mlp. */
    e2e_result r = e2e_runf("train examples/w2.yaml --procs 2 --set model.batch=32 --set "
                            "model.window=16 --set model.features=4 --set model.hidden=16 --set "
                            "model.n_layers=1 --set train.steps=4 "
                            "--out %s",
                            e2e_path("gru-procs"));
    CHECK(r.rc == 0 && strstr(r.out, "data parallel: 2 processes"), "gru --procs 2: exit %d\n%s%s",
          r.rc, r.out, r.err);
    e2e_done(&r);
}

/* A series whose class (0, 1, 2) is the sign pattern of the last two values
 * of column a; column b is noise. */
static void write_series(const char *path, int rows) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs("t,a,b,cls,level\n", f);
    unsigned u = 7;
    double prev = 0;
    for (int i = 0; i < rows; i++) {
        u = u * 1103515245u + 12345u;
        double a = ((u >> 8) % 2001) / 1000.0 - 1.0;
        u = u * 1103515245u + 12345u;
        double b = ((u >> 8) % 2001) / 1000.0 - 1.0;
        int cls = a > 0 && prev > 0 ? 2 : a > 0 || prev > 0 ? 1 : 0;
        fprintf(f, "%d,%.3f,%.3f,%d,%.4f\n", i, a, b, cls, 0.5 * a + 0.25 * prev);
        prev = a;
    }
    fclose(f);
}

static void test_lstm_csv(void) {
    write_series(e2e_path("series.csv"), 400);
    write_text(e2e_path("lstm.yaml"),
               "model: {name: lstm, batch: 16, hidden: 16, n_layers: 1}\n"
               "data: {source: csv, label: cls, features: [a, b], window: 4, horizon: 0}\n"
               "train: {optimizer: adam, lr: 0.02, steps: 60}\n");
    char args[600];
    snprintf(args, sizeof args, "%s --set data.path=%s --set model.classes=3",
             e2e_path("lstm.yaml"), e2e_path("series.csv"));
    char *s = train_twice("lstm", args);
    CHECK(strstr(s, "\"model\": \"lstm\""), "summary names the lstm: %s", s);
    loss_falls("lstm (3 classes, csv)", s, 0.7);
    const double acc = field(s, "\"val\"", "accuracy");
    CHECK(acc > 0.6, "lstm val accuracy %.3f (3 classes)", acc);
    printf("lstm val accuracy %.4f\n", acc);
    free(s);

    /* The same series as a regression (float label, model.classes unset). */
    e2e_result r = e2e_runf("train %s --set data.path=%s --set data.label=level --out %s",
                            e2e_path("lstm.yaml"), e2e_path("series.csv"), e2e_path("lstm-reg"));
    CHECK(r.rc == 0, "lstm regression: exit %d\n%s", r.rc, r.err);
    e2e_done(&r);
    s = summary("lstm-reg");
    loss_falls("lstm (regression, csv)", s, 0.5);
    CHECK(field(s, "\"val\"", "mse") >= 0, "lstm regression reports mse: %s", s);
    free(s);
}

static void test_unet3d(void) {
    char *s = train_twice("unet", "examples/w4.yaml --set model.batch=2 --set model.size=8 --set "
                                  "model.c1=4 --set model.c2=8 --set model.c3=8 --set "
                                  "train.steps=25 --set train.lr=0.01");
    CHECK(strstr(s, "\"model\": \"unet3d\""), "summary names the unet3d: %s", s);
    loss_falls("unet3d (synthetic)", s, 0.8);
    const double dice = field(s, "\"val\"", "dice");
    CHECK(dice > 0.6 && dice <= 1, "unet3d val dice %.3f", dice);
    printf("unet3d val dice %.4f\n", dice);
    free(s);

    /* .npy volumes: 8 of 1 x 8^3 with a cube of class 1 in the middle. */
    enum { N = 8, S = 8, V = S * S * S };
    static float x[N * V];
    static int64_t y[N * V];
    unsigned u = 3;
    for (int i = 0; i < N; i++)
        for (int v = 0; v < V; v++) {
            const int z = v / (S * S), r = v / S % S, c = v % S, lo = 2 + i % 2;
            y[i * V + v] = z >= lo && z < lo + 4 && r >= 2 && r < 6 && c >= 2 && c < 6;
            u = u * 1103515245u + 12345u;
            x[i * V + v] = (float)y[i * V + v] + 0.3f * ((float)((u >> 8) % 1000) / 500.0f - 1.0f);
        }
    const int64_t xd[5] = {N, 1, S, S, S}, yd[4] = {N, S, S, S};
    tf_write_npy_dims(e2e_path("vol_x.npy"), "<f4", 5, xd, x, 4);
    tf_write_npy_dims(e2e_path("vol_y.npy"), "<i8", 4, yd, y, 8);
    write_text(e2e_path("unet_npy.yaml"),
               "model: {name: unet3d, batch: 2, c1: 4, c2: 8, c3: 8}\n"
               "data: {source: npy, val_fraction: 0.25}\n"
               "train: {optimizer: adam, lr: 0.01, steps: 12, metrics: [accuracy, dice, miou]}\n");
    e2e_result r =
        e2e_runf("train %s --set data.x=%s --set data.y=%s --out %s", e2e_path("unet_npy.yaml"),
                 e2e_path("vol_x.npy"), e2e_path("vol_y.npy"), e2e_path("unet-npy"));
    CHECK(r.rc == 0, "unet3d on npy: exit %d\n%s", r.rc, r.err);
    CHECK(strstr(r.out, "dice") && strstr(r.out, "miou"), "unet3d npy eval: %s", r.out);
    e2e_done(&r);
    s = summary("unet-npy");
    loss_falls("unet3d (npy)", s, 0.9);
    CHECK(field(s, "\"val\"", "examples") == 2, "2 validation volumes: %s", s);
    free(s);
}

static void test_gcn(void) {
    char *s = train_twice("gcn", "examples/w5.yaml --set train.steps=40");
    CHECK(strstr(s, "\"model\": \"gcn\""), "summary names the gcn: %s", s);
    loss_falls("gcn (tiny graph)", s, 0.6);
    const double val = field(s, "\"val\"", "accuracy"), test = field(s, "\"test\"", "accuracy");
    CHECK(val > 0.75 && test > 0.75, "gcn held-out accuracy: val %.3f, test %.3f", val, test);
    printf("gcn accuracy: val %.4f, test %.4f\n", val, test);
    CHECK(field(s, "\"val\"", "examples") == 18 && field(s, "\"test\"", "examples") == 18,
          "18 val and 18 test nodes: %s", s);
    CHECK(field(s, NULL, "median_epochs_per_s") > 0, "gcn rate in epochs/s: %s", s);
    free(s);

    /* The split from a file: nodes 0-59 train, 60-74 val, 75-89 test. */
    int64_t split[90];
    for (int i = 0; i < 90; i++) split[i] = i < 60 ? 0 : i < 75 ? 1 : 2;
    tf_write_npy(e2e_path("split.npy"), "<i8", 90, 0, split, 8, 0);
    write_text(e2e_path("gcn_split.yaml"),
               "model: {name: gcn, hidden: 16}\n"
               "data: {source: graph, edges: examples/data/tiny_graph/edges.csv,\n"
               "       x: examples/data/tiny_graph/x.npy, y: examples/data/tiny_graph/y.npy}\n"
               "train: {optimizer: adam, lr: 0.01, steps: 30}\n");
    e2e_result r =
        e2e_runf("train %s --set data.node_split=%s --out %s", e2e_path("gcn_split.yaml"),
                 e2e_path("split.npy"), e2e_path("gcn-split"));
    CHECK(r.rc == 0 && strstr(r.out, "60 train, 15 val, 15 test"), "gcn node_split: exit %d\n%s%s",
          r.rc, r.out, r.err);
    e2e_done(&r);
    s = summary("gcn-split");
    CHECK(field(s, "\"test\"", "examples") == 15, "15 test nodes: %s", s);
    free(s);

    /* W5's synthetic graph (model.nodes, features, classes from the seed). */
    write_text(e2e_path("gcn_synth.yaml"),
               "model: {name: gcn, nodes: 600, features: 16, classes: 4, hidden: 16}\n"
               "train: {optimizer: adam, lr: 0.01, steps: 30}\n");
    r = e2e_runf("train %s --out %s", e2e_path("gcn_synth.yaml"), e2e_path("gcn-synth"));
    CHECK(r.rc == 0 && strstr(r.out, "graph of 600 nodes, 3000 edges: 540 train, 60 val"),
          "synthetic gcn: exit %d\n%s%s", r.rc, r.out, r.err);
    e2e_done(&r);
    s = summary("gcn-synth");
    loss_falls("gcn (synthetic W5 graph)", s, 0.9);
    CHECK(field(s, "\"val\"", "accuracy") > 0.3, "synthetic gcn beats chance (0.25): %s", s);
    free(s);

    /* tessel compile reads the graph a gcn is built on. */
    r = e2e_run("compile examples/w5.yaml --dump stats");
    CHECK(r.rc == 0 && strstr(r.out, "arena"), "compile w5.yaml: exit %d\n%s%s", r.rc, r.out,
          r.err);
    e2e_done(&r);

    /* Data parallelism has no batch to split. */
    r = e2e_runf("train examples/w5.yaml --procs 2 --set train.steps=2 --out %s",
                 e2e_path("gcn-procs"));
    CHECK(r.rc != 0 && strstr(r.err, "full batch") && strstr(r.err, "no --procs"),
          "gcn --procs 2 refused: exit %d\n%s", r.rc, r.err);
    e2e_done(&r);
}

/* N steps in one run and N/2 + N/2 with --resume latest give the same
 * weights and optimizer state (BatchNorm running statistics included). */
static void resume_exact(const char *name, const char *args, int steps) {
    char full[64], part[64];
    snprintf(full, sizeof full, "%s-full", name);
    snprintf(part, sizeof part, "%s-part", name);
    e2e_result r = e2e_runf("train %s --set ckpt.every=%d --set train.total_steps=%d --set "
                            "train.steps=%d --out %s",
                            args, steps / 2, steps, steps, e2e_path(full));
    CHECK(r.rc == 0, "%s full: exit %d\n%s", name, r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("train %s --set ckpt.every=%d --set train.total_steps=%d --set train.steps=%d "
                 "--out %s",
                 args, steps / 2, steps, steps / 2, e2e_path(part));
    CHECK(r.rc == 0, "%s first half: exit %d\n%s", name, r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("train %s --set ckpt.every=%d --set train.total_steps=%d --set train.steps=%d "
                 "--out %s --resume latest",
                 args, steps / 2, steps, steps, e2e_path(part));
    CHECK(r.rc == 0 && strstr(r.out, "resuming from"), "%s resumed: exit %d\n%s%s", name, r.rc,
          r.out, r.err);
    e2e_done(&r);
    r = e2e_runf("ckpt diff %s %s", e2e_path(full), e2e_path(part));
    CHECK(r.rc == 0 && strstr(r.out, " 0 different"), "%s: resumed run differs: exit %d\n%s%s",
          name, r.rc, r.out, r.err);
    printf("%s: %d steps = %d + %d resumed\n", name, steps, steps / 2, steps / 2);
    e2e_done(&r);
}

int main(void) {
    char dir[64];
    if (!e2e_setup("zoo", dir, sizeof dir)) return check_summary("e2e/zoo_train");
    test_gru();
    test_lstm_csv();
    test_unet3d();
    test_gcn();
    resume_exact("gru-resume",
                 "examples/w2.yaml --set model.batch=16 --set model.window=8 --set "
                 "model.features=3 --set model.hidden=8 --set model.n_layers=1",
                 20);
    resume_exact("unet-resume",
                 "examples/w4.yaml --set model.batch=2 --set model.size=8 --set model.c1=4 --set "
                 "model.c2=4 --set model.c3=4",
                 6);
    resume_exact("gcn-resume", "examples/w5.yaml", 20);
    e2e_cleanup(dir);
    return check_summary("e2e/zoo_train");
}
