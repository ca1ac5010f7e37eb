/* Shape buckets with data parallelism (docs/shapes.md, "Several
 * processes"): `tessel train --procs 2` on shape.policy bucket trains as
 * one process does on the same buckets.
 *
 * - an mlp on 45 examples, model.batch 16 (8 per process): each epoch ends
 *   in a batch of 13 rows, split 6 / 7 over the ranks, and both ranks run
 *   the 7-row bucket (bucket lists count rows per process); the losses and
 *   weights are one process's within fp32 rounding (the ranks' means are
 *   weighed by their real rows, so the uneven split weighs every row as
 *   one process does);
 * - 49 examples: the last batch has 1 row, so rank 0 has none: it runs the
 *   bucket on a copy of a real row with loss weight 0 (an exact zero
 *   gradient) and the run still equals one process's;
 * - a gpt on documents of 3 to 31 tokens: the ranks' rows differ in
 *   length, yet both run the sequence bucket of the batch's longest row
 *   (metrics.jsonl of rank 0 names it; a mismatch would hang or fail the
 *   all-reduce), and the losses are one process's within rounding;
 * - shape.split_oversize: a batch larger than every bucket runs in pieces
 *   of (largest bucket x ranks) rows, as one process runs pieces of its
 *   largest bucket;
 * - under mpirun (the mpi transport) the mlp run gives the losses of
 *   --procs 2 (skipped without mpirun);
 * - refused with exit 2 naming the key: dist.zero, dist.compress, and
 *   a short last batch under shape.policy exact (data.drop_last false, as
 *   by default), with 2 processes. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"
#include "testfiles.h"

enum { F = 6, C = 3 };

static char dir[64];
static const char *bin;

static void write_text(const char *name, const char *text) {
    FILE *f = fopen(e2e_path(name), "w");
    CHECK(f != NULL, "cannot write %s", name);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void ok(const char *what, e2e_result r) {
    CHECK(r.rc == 0, "%s: exit %d\n%s%s", what, r.rc, r.out, r.err);
    e2e_done(&r);
}

/* The "loss" values of the train lines of run `run`'s metrics.jsonl. */
static int losses(const char *run, double *out, int max) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", dir, run);
    char *m = e2e_slurp(path, NULL);
    int n = 0;
    for (char *p = m; (p = strstr(p, "{\"type\":\"train\"")); p++) {
        const char *l = strstr(p, "\"loss\":");
        if (l && n < max && sscanf(l, "\"loss\":%lf", &out[n]) == 1) n++;
    }
    free(m);
    return n;
}

/* Runs a and b log `steps` losses each, equal within rel (relative). */
static void close_losses(const char *a, const char *b, int steps, double rel) {
    double x[64], y[64];
    int nx = losses(a, x, 64), ny = losses(b, y, 64);
    CHECK(nx == steps && ny == steps, "%s, %s: %d and %d train lines, expected %d", a, b, nx, ny,
          steps);
    for (int i = 0; i < nx && i < ny; i++)
        CHECK(fabs(x[i] - y[i]) <= rel * fabs(x[i]), "step %d: %s %.9g, %s %.9g", i + 1, a, x[i], b,
              y[i]);
}

/* `tessel ckpt diff`: the largest difference of any tensor of the last
 * checkpoints of runs a and b; -1 if the diff did not compare. */
static double weights_diff(const char *a, const char *b) {
    e2e_result r = e2e_runf("ckpt diff %s/%s %s/%s", dir, a, dir, b);
    const int ran = strstr(r.out, " identical, ") != NULL;
    double worst = ran ? 0 : -1;
    for (const char *p = r.out; ran && (p = strstr(p, "|A-B| ")); p++) {
        double v = strtod(p + 6, NULL);
        if (v > worst) worst = v;
    }
    if (!ran) printf("ckpt diff %s %s: exit %d\n%s%s", a, b, r.rc, r.out, r.err);
    e2e_done(&r);
    return worst;
}

static void mlp_data(int n, const char *name) {
    float x[64 * F];
    int64_t y[64];
    for (int i = 0; i < n * F; i++) x[i] = (float)sin(0.37 * i);
    for (int i = 0; i < n; i++) y[i] = (i * 7) % C;
    char xp[64], yp[64], yaml[1024];
    snprintf(xp, sizeof xp, "%s-x.npy", name);
    snprintf(yp, sizeof yp, "%s-y.npy", name);
    tf_write_npy(e2e_path(xp), "<f4", n, F, x, 4, 0);
    tf_write_npy(e2e_path(yp), "<i8", n, 0, y, 8, 0);
    snprintf(yaml, sizeof yaml,
             "model: {name: mlp, window: 0, in_dim: 6, hidden: 16, n_hidden: 2, batch: 16}\n"
             "data: {source: npy, x: %s/%s, y: %s/%s, val_fraction: 0}\n"
             "train: {optimizer: adamw, lr: 1.0e-2, steps: 9, total_steps: 9, seed: 3, "
             "threads: 1}\n"
             "dist: {algo: native}\n"
             "ckpt: {every: 9, keep_last: 0}\n",
             dir, xp, dir, yp);
    snprintf(xp, sizeof xp, "%s.yaml", name);
    write_text(xp, yaml);
}

/* 45 rows: batches 16, 16, 13; the 13 split 6 / 7 over 2 ranks. */
static void test_mlp(void) {
    mlp_data(45, "clf");
    ok("1 process", e2e_runf("train %s/clf.yaml --out %s/one --set shape.policy=bucket --set "
                             "'shape.batch_buckets=4, 8, 12, 14, 16'",
                             dir, dir));
    ok("2 processes", e2e_runf("train %s/clf.yaml --procs 2 --out %s/two --set shape.policy=bucket "
                               "--set 'shape.batch_buckets=2, 4, 6, 7, 8'",
                               dir, dir));
    close_losses("one", "two", 9, 1e-6);
    const double dw = weights_diff("one", "two");
    printf("mlp, 2 processes vs 1: weights within %g\n", dw);
    CHECK(dw >= 0 && dw <= 1e-5, "mlp weights, 2 processes vs 1: %g", dw);
    char path[256];
    snprintf(path, sizeof path, "%s/two/metrics.jsonl", dir);
    char *m = e2e_slurp(path, NULL);
    CHECK(strstr(m, "\"rows\":13,\"bucket\":7") != NULL,
          "the short batch of 13 rows on the 7-row bucket: %s", m);
    free(m);
    /* shape.split_oversize: pieces of the largest bucket times the ranks
     * (16 rows as 8 + 8 on one process, 4 + 4 per rank twice on two) */
    ok("split, 1 process", e2e_runf("train %s/clf.yaml --out %s/s1 --set shape.policy=bucket --set "
                                    "'shape.batch_buckets=4, 8' --set shape.split_oversize=true",
                                    dir, dir));
    ok("split, 2 processes",
       e2e_runf("train %s/clf.yaml --procs 2 --out %s/s2 --set shape.policy=bucket --set "
                "'shape.batch_buckets=2, 4' --set shape.split_oversize=true",
                dir, dir));
    close_losses("s1", "s2", 9, 1e-6);
    /* the mpi transport: the same step as shm */
    const char *pathv = getenv("PATH");
    char mpirun[512] = "";
    for (const char *p = pathv ? pathv : ""; *p && !mpirun[0];) {
        const char *e = strchr(p, ':');
        int n = e ? (int)(e - p) : (int)strlen(p);
        char c[512];
        snprintf(c, sizeof c, "%.*s/mpirun", n, p);
        if (access(c, X_OK) == 0) snprintf(mpirun, sizeof mpirun, "%s", c);
        p += n + (e != NULL);
    }
    if (!mpirun[0]) {
        printf("skipped the mpirun run: mpirun not found on PATH\n");
        return;
    }
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "TESSEL_COLL_CACHE=0 ASAN_OPTIONS=detect_leaks=0 '%s' %s--oversubscribe -np 2 '%s' "
             "train %s/clf.yaml --out %s/mpi --set shape.policy=bucket --set "
             "'shape.batch_buckets=2, 4, 6, 7, 8' > %s 2>&1",
             mpirun, geteuid() == 0 ? "--allow-run-as-root " : "", bin, dir, dir,
             e2e_path("mpi.log"));
    int rc = system(cmd);
    char *log = e2e_slurp(e2e_path("mpi.log"), NULL);
    CHECK(rc == 0 && strstr(log, "data parallel: 2 processes (mpi)"), "mpirun: status %d:\n%s", rc,
          log);
    free(log);
    close_losses("two", "mpi", 9, 1e-6);
}

/* 49 rows: the last batch has 1 row; rank 0 gets none. */
static void test_empty_rank(void) {
    mlp_data(49, "one-row");
    ok("1 process, 1-row batch",
       e2e_runf("train %s/one-row.yaml --out %s/r1 --set shape.policy=bucket --set "
                "'shape.batch_buckets=1, 8, 16'",
                dir, dir));
    ok("2 processes, 1-row batch",
       e2e_runf("train %s/one-row.yaml --procs 2 --out %s/r2 --set shape.policy=bucket --set "
                "'shape.batch_buckets=1, 8'",
                dir, dir));
    close_losses("r1", "r2", 9, 1e-6);
    const double dw = weights_diff("r1", "r2");
    CHECK(dw >= 0 && dw <= 1e-5, "1-row batch, 2 processes vs 1: %g", dw);
    char path[256];
    snprintf(path, sizeof path, "%s/r2/metrics.jsonl", dir);
    char *m = e2e_slurp(path, NULL);
    CHECK(strstr(m, "\"rows\":1,\"bucket\":1") != NULL, "the 1-row batch on bucket 1: %s", m);
    free(m);
}

/* Documents of 3 to 31 tokens (end-of-text 63), ctx 32, batch 6 (3 per
 * process), sequence buckets of 8. */
static void test_gpt(void) {
    FILE *f = fopen(e2e_path("docs.bin"), "wb");
    CHECK(f != NULL, "docs.bin");
    if (!f) return;
    unsigned seed = 11;
    for (int d = 0; d < 30; d++) {
        const int len = 3 + rand_r(&seed) % 29;
        for (int t = 0; t < len; t++) {
            const uint16_t tok = (uint16_t)(rand_r(&seed) % 63);
            fwrite(&tok, sizeof tok, 1, f);
        }
        const uint16_t eot = 63;
        fwrite(&eot, sizeof eot, 1, f);
    }
    fclose(f);
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "model: {name: gpt, batch: 6, ctx: 32, vocab: 64, d_model: 16, n_layers: 1, "
             "n_heads: 2}\n"
             "data: {source: tokens, path: %s/docs.bin, eot_id: 63, val_fraction: 0}\n"
             "train: {optimizer: adamw, lr: 1.0e-2, epochs: 2, seed: 3, threads: 1}\n"
             "dist: {algo: native}\n"
             "shape: {policy: bucket, seq_buckets: multiple:8, sort_window: 2}\n",
             dir);
    write_text("gpt.yaml", yaml);
    ok("gpt, 1 process",
       e2e_runf("train %s/gpt.yaml --out %s/g1 --set 'shape.batch_buckets=6'", dir, dir));
    ok("gpt, 2 processes",
       e2e_runf("train %s/gpt.yaml --procs 2 --out %s/g2 --set 'shape.batch_buckets=3'", dir, dir));
    close_losses("g1", "g2", 10, 1e-5);
    /* both logs name the same sequence bucket at every step */
    char p1[256], p2[256];
    snprintf(p1, sizeof p1, "%s/g1/metrics.jsonl", dir);
    snprintf(p2, sizeof p2, "%s/g2/metrics.jsonl", dir);
    char *a = e2e_slurp(p1, NULL), *b = e2e_slurp(p2, NULL);
    int steps = 0, same = 0, short_seq = 0;
    const char *x = a, *y = b;
    while ((x = strstr(x, "\"seq_bucket\":")) && (y = strstr(y, "\"seq_bucket\":"))) {
        const long lx = strtol(x + 13, NULL, 10), ly = strtol(y + 13, NULL, 10);
        steps++, same += lx == ly, short_seq += lx < 32;
        x++, y++;
    }
    CHECK(steps == 10 && same == 10 && short_seq > 0,
          "gpt: %d steps, %d on the same sequence bucket, %d shorter than ctx", steps, same,
          short_seq);
    free(a), free(b);
}

static void refused(const char *what, const char *set, const char *key) {
    e2e_result r = e2e_runf("train %s/clf.yaml --procs 2 --out %s/bad %s --steps 2", dir, dir, set);
    CHECK(r.rc == 2 && strstr(r.err, key), "%s: exit %d, naming %s: %s", what, r.rc, key, r.err);
    e2e_done(&r);
}

static void test_bad(void) {
    refused("zero", "--set shape.policy=bucket --set dist.zero=1", "dist.zero");
    refused("compress", "--set shape.policy=bucket --set dist.compress=topk", "dist.compress");
    /* exact shapes, 45 examples in batches of 16: the short batch of 13
     * cannot be shared by 2 ranks' plans, by default or asked for */
    refused("exact, drop_last by default", "", "data.drop_last: true");
    refused("exact, drop_last false", "--set data.drop_last=false", "data.drop_last: true");
}

int main(void) {
    if (!(bin = e2e_setup("shapes_dist", dir, sizeof dir))) return check_summary("e2e/shapes_dist");
    test_mlp();
    test_empty_rank();
    test_gpt();
    test_bad();
    e2e_cleanup(dir);
    return check_summary("e2e/shapes_dist");
}
