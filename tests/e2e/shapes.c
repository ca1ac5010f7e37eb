/* Shape buckets end to end through `tessel train` (docs/shapes.md): an mlp
 * on 45 examples with model.batch 16, so each epoch ends in a batch of 13.
 *
 * - shape.policy bucket (batch_buckets [4, 8, 12, 14, 16]: the 13 rows run
 *   padded on the 14 bucket, the padded target ignored) trains exactly as
 *   shape.policy exact with data.drop_last false (a plan of 13 rows):
 *   `tessel ckpt diff` finds 0 different tensors, and every step's loss is
 *   the same text; a regression (masked MSE) matches within 1e-6; exact
 *   shapes train the 13 by default (the same weights as data.drop_last
 *   false), and with data.drop_last true say that they drop them;
 * - after the first epoch no bucket is compiled again (metrics.jsonl's
 *   plan_cache.compiles), and summary.json reports the cache;
 * - 3 steps, then --resume from that checkpoint (the next short batch on
 *   another bucket) reproduce the uninterrupted run bit for bit; so do 2
 *   steps and a resume under exact shapes (the short batch on its plan);
 * - a batch larger than every bucket fails with exit 2 naming the shape and
 *   the largest bucket, before a run directory exists; with
 *   shape.split_oversize it runs as several steps; a bucket list that is
 *   not increasing fails naming the key and the value;
 * - a gpt on a token file of documents (data.eot_id) of 3 to 31 tokens,
 *   ctx 32, seq_buckets multiple:8 and length-sorted windows: every step
 *   runs on the smallest sequence bucket of its batch, the second epoch
 *   compiles nothing (with shape.precompile nothing after step 1), the
 *   padding share is reported; an explicit list
 *   shorter than a document fails naming the sequence and the largest
 *   bucket. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "check.h"
#include "e2e.h"
#include "testfiles.h"

enum { N = 45, F = 6, C = 3, K = 2 };

static char dir[64];

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

/* Every "loss": value of the train lines of a run's metrics.jsonl, joined. */
static char *losses(const char *run) {
    char path[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    char *text = e2e_slurp(path, NULL), *out = calloc(1, strlen(text) + 1);
    size_t n = 0;
    for (char *p = text; (p = strstr(p, "\"type\":\"train\"")); p++) {
        char *l = strstr(p, "\"loss\":");
        if (!l) break;
        size_t k = strcspn(l + 7, ",");
        memcpy(out + n, l + 7, k);
        n += k;
        out[n++] = ' ';
    }
    free(text);
    return out;
}

/* `tessel ckpt diff a b`: the largest difference of any tensor (0 when
 * every tensor is identical), -1 if the diff failed; *only_moments is set
 * when every differing tensor is an AdamW moment (exp_avg, exp_avg_sq). */
static double diff_max(const char *a, const char *b, int *only_moments) {
    e2e_result r = e2e_runf("ckpt diff %s/%s %s/%s", dir, a, dir, b);
    /* it exits 1 when tensors differ; the count line says it compared */
    const int ran = strstr(r.out, " identical, ") != NULL;
    double worst = ran ? 0 : -1;
    *only_moments = 1;
    for (char *p = r.out; ran && (p = strstr(p, "differs")); p++) {
        char *bar = strstr(p, "|A-B| "), *eol = strchr(p, '\n');
        if (!bar || (eol && bar > eol)) break;
        double v = strtod(bar + 6, NULL);
        if (v > worst) worst = v;
        char line[256];
        size_t n = eol ? (size_t)(eol - p) : strlen(p);
        snprintf(line, sizeof line, "%.*s", (int)(n < 255 ? n : 255), p);
        if (!strstr(line, ".exp_avg")) *only_moments = 0;
    }
    if (!ran) printf("ckpt diff %s %s: exit %d\n%s%s", a, b, r.rc, r.out, r.err);
    e2e_done(&r);
    return worst;
}

/* plan_cache.compiles of the train line of `step`; -1 if none. */
static long compiles_at(const char *run, int step) {
    char path[256], key[48];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    snprintf(key, sizeof key, "\"step\":%d,", step);
    char *text = e2e_slurp(path, NULL);
    long v = -1;
    char *p = strstr(text, key);
    if (p && (p = strstr(p, "\"compiles\":"))) v = strtol(p + 11, NULL, 10);
    free(text);
    return v;
}

static void data(void) {
    float x[N * F], yr[N * K];
    int64_t y[N];
    for (int i = 0; i < N * F; i++) x[i] = (float)sin(0.37 * i);
    for (int i = 0; i < N; i++) y[i] = (i * 7) % C;
    for (int i = 0; i < N * K; i++) yr[i] = (float)cos(0.21 * i);
    tf_write_npy(e2e_path("x.npy"), "<f4", N, F, x, 4, 0);
    tf_write_npy(e2e_path("y.npy"), "<i8", N, 0, y, 8, 0);
    tf_write_npy(e2e_path("yr.npy"), "<f4", N, K, yr, 4, 0);
    char yaml[1024];
    snprintf(
        yaml, sizeof yaml,
        "model: {name: mlp, window: 0, in_dim: 6, hidden: 16, n_hidden: 2, batch: 16}\n"
        "data: {source: npy, x: %s/x.npy, y: %s/y.npy, val_fraction: 0}\n"
        "train: {optimizer: adamw, lr: 1.0e-2, steps: 9, total_steps: 9, seed: 3, threads: 1}\n"
        "ckpt: {every: 3, keep_last: 0}\n",
        dir, dir);
    write_text("clf.yaml", yaml);
    snprintf(
        yaml, sizeof yaml,
        "model: {name: mlp, window: 0, in_dim: 6, hidden: 16, n_hidden: 2, batch: 16}\n"
        "data: {source: npy, x: %s/x.npy, y: %s/yr.npy, val_fraction: 0}\n"
        "train: {optimizer: adamw, lr: 1.0e-2, steps: 9, total_steps: 9, seed: 3, threads: 1}\n",
        dir, dir);
    write_text("reg.yaml", yaml);
}

static void test_equal(void) {
    ok("bucket", e2e_runf("train %s/clf.yaml --out %s/b --set shape.policy=bucket "
                          "--set 'shape.batch_buckets=4, 8, 12, 14, 16'",
                          dir, dir));
    ok("exact", e2e_runf("train %s/clf.yaml --out %s/e --set data.drop_last=false", dir, dir));
    /* the default under exact trains the short batch of 13 (the same run
     * as data.drop_last false); data.drop_last true drops it, and says so */
    e2e_result d = e2e_runf("train %s/clf.yaml --out %s/d", dir, dir);
    CHECK(d.rc == 0 && !strstr(d.out, "is dropped"), "exact by default: exit %d\n%s%s", d.rc, d.out,
          d.err);
    e2e_done(&d);
    int dm;
    CHECK(diff_max("d", "e", &dm) == 0,
          "exact by default vs data.drop_last false: weights or moments differ");
    d = e2e_runf("train %s/clf.yaml --out %s/dd --steps 2 --set data.drop_last=true", dir, dir);
    CHECK(d.rc == 0 && strstr(d.out, "each epoch trains 32 of the 45 training examples; its short "
                                     "batch of 13 is dropped"),
          "exact, data.drop_last true: exit %d\n%s%s", d.rc, d.out, d.err);
    e2e_done(&d);
    /* Padded rows add exact zeros, but the GEMMs of the weight gradients
     * sum 13 and 14 rows in other blocks: fp32 rounding (3e-8 measured). */
    int moments;
    const double dw = diff_max("b", "e", &moments);
    printf("classifier: padded vs exact weights differ by at most %.3g\n", dw);
    CHECK(dw >= 0 && dw <= 1e-6, "padded vs exact weights: %g", dw);
    char b[128], e[128];
    snprintf(b, sizeof b, "%s/b", dir);
    snprintf(e, sizeof e, "%s/e", dir);
    char *lb = losses(b), *le = losses(e);
    CHECK(strlen(lb) > 9 && !strcmp(lb, le), "losses\n  bucket %s\n  exact  %s", lb, le);
    free(lb), free(le);
    /* 3 batches per epoch (16, 16, 13): the 13 compiles once, in epoch 1. */
    CHECK(compiles_at(b, 3) == 1 && compiles_at(b, 9) == 1, "compiles %ld after epoch 1, %ld at 9",
          compiles_at(b, 3), compiles_at(b, 9));
    CHECK(compiles_at(e, 9) == 1, "exact: one plan of 13 rows (%ld)", compiles_at(e, 9));
    char path[256];
    snprintf(path, sizeof path, "%s/summary.json", b);
    char *sum = e2e_slurp(path, NULL);
    CHECK(strstr(sum, "\"plan_cache\"") && strstr(sum, "\"policy\": \"bucket\"") &&
              strstr(sum, "\"misses\": 1") && strstr(sum, "\"hits\": 8"),
          "summary: %s", sum);
    free(sum);
    /* Regression: the masked MSE over the real rows is the MSE of the
     * unpadded batch, up to the order of its sums. */
    ok("reg bucket", e2e_runf("train %s/reg.yaml --out %s/rb --set shape.policy=bucket", dir, dir));
    ok("reg exact", e2e_runf("train %s/reg.yaml --out %s/re --set data.drop_last=false", dir, dir));
    snprintf(b, sizeof b, "%s/rb", dir);
    snprintf(e, sizeof e, "%s/re", dir);
    lb = losses(b), le = losses(e);
    double worst = 0;
    char *p = lb, *q = le;
    int n = 0;
    for (; *p && *q; n++) {
        char *pe, *qe;
        double u = strtod(p, &pe), v = strtod(q, &qe);
        if (pe == p || qe == q) break;
        if (fabs(u - v) > worst) worst = fabs(u - v);
        p = pe, q = qe;
    }
    printf("regression: %d steps, losses differ by at most %.3g\n", n, worst);
    CHECK(n == 9 && worst <= 1e-6, "regression: %d steps, worst %g\n  %s\n  %s", n, worst, lb, le);
    free(lb), free(le);
}

static void test_resume(void) {
    ok("bucket 3", e2e_runf("train %s/clf.yaml --out %s/b3 --steps 3 --set shape.policy=bucket "
                            "--set 'shape.batch_buckets=4, 8, 12, 14, 16'",
                            dir, dir));
    ok("bucket resume", e2e_runf("train %s/clf.yaml --out %s/b9 --resume %s/b3/step-00000003 --set "
                                 "shape.policy=bucket --set 'shape.batch_buckets=4, 8, 12, 14, 16'",
                                 dir, dir, dir));
    e2e_result r = e2e_runf("ckpt diff %s/b %s/b9", dir, dir);
    CHECK(r.rc == 0 && strstr(r.out, "0 different"), "9 vs 3 + resume: %s%s", r.out, r.err);
    e2e_done(&r);
    /* exact shapes by default: 2 steps, then the resumed run meets the
     * short batch of 13 at steps 3, 6 and 9 on its own plan */
    ok("exact 2", e2e_runf("train %s/clf.yaml --out %s/d2 --steps 2", dir, dir));
    ok("exact resume",
       e2e_runf("train %s/clf.yaml --out %s/d9 --resume %s/d2/step-00000002", dir, dir, dir));
    r = e2e_runf("ckpt diff %s/d %s/d9", dir, dir);
    CHECK(r.rc == 0 && strstr(r.out, "0 different"), "exact: 9 vs 2 + resume: %s%s", r.out, r.err);
    e2e_done(&r);
}

static void test_bad(void) {
    e2e_result r = e2e_runf("train %s/clf.yaml --out %s/x --set shape.policy=bucket --set "
                            "'shape.batch_buckets=4, 8'",
                            dir, dir);
    CHECK(r.rc == 2 && strstr(r.err, "a batch of 16 rows") && strstr(r.err, "the largest is 8") &&
              strstr(r.err, "shape.split_oversize"),
          "oversize: exit %d: %s", r.rc, r.err);
    struct stat st;
    char x[128];
    snprintf(x, sizeof x, "%s/x", dir);
    CHECK(stat(x, &st) != 0, "no run directory after a refused shape");
    e2e_done(&r);
    r = e2e_runf("train %s/clf.yaml --out %s/s --set shape.policy=bucket --set "
                 "'shape.batch_buckets=4, 8' --set shape.split_oversize=true --set train.steps=3",
                 dir, dir);
    CHECK(r.rc == 0, "split: exit %d: %s", r.rc, r.err);
    e2e_done(&r);
    char path[256];
    snprintf(path, sizeof path, "%s/s/metrics.jsonl", dir);
    char *m = e2e_slurp(path, NULL);
    /* 16 rows: two steps of 8; 13 rows: 8 + 5 (on the 8 bucket) */
    CHECK(strstr(m, "\"step\":3,") && strstr(m, "\"rows\":13,\"bucket\":8"), "split: %s", m);
    free(m);
    r = e2e_runf("train %s/clf.yaml --out %s/x --set shape.policy=bucket --set "
                 "'shape.batch_buckets=8, 4'",
                 dir, dir);
    CHECK(r.rc == 2 && strstr(r.err, "shape.batch_buckets '8, 4'") &&
              strstr(r.err, "not increasing"),
          "decreasing: exit %d: %s", r.rc, r.err);
    e2e_done(&r);
}

/* A cnn with BatchNorm on 45 images of 8 x 8 (model.batch 16, a batch of
 * 13 closes each epoch): bucketed (13 padded to 14, the BatchNorms' row
 * mask leaving the padding out of the statistics) trains bit for bit as a
 * plan of exactly 13 rows, running statistics included; evaluation on a
 * validation split runs the running statistics, unmasked. */
static void test_cnn(void) {
    enum { NI = 54, P = 64 };
    static float x[NI * P];
    int64_t y[NI];
    unsigned seed = 5;
    for (int i = 0; i < NI * P; i++) x[i] = (float)rand_r(&seed) / RAND_MAX;
    for (int i = 0; i < NI; i++) y[i] = rand_r(&seed) % C;
    tf_write_npy(e2e_path("img.npy"), "<f4", NI, P, x, 4, 0);
    tf_write_npy(e2e_path("imgy.npy"), "<i8", NI, 0, y, 8, 0);
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "model: {name: cnn, channels: 1, height: 8, width: 8, c1: 4, c2: 4, batch: 16}\n"
             "data: {source: npy, x: %s/img.npy, y: %s/imgy.npy, val_fraction: 0.1667}\n"
             "train: {optimizer: adamw, lr: 1.0e-2, steps: 6, total_steps: 6, seed: 3, "
             "threads: 1, eval_every: 3}\n"
             "ckpt: {every: 6, keep_last: 0}\n",
             dir, dir);
    write_text("cnn.yaml", yaml);
    ok("cnn bucket", e2e_runf("train %s/cnn.yaml --out %s/cb --set shape.policy=bucket "
                              "--set 'shape.batch_buckets=8, 14, 16'",
                              dir, dir));
    ok("cnn exact", e2e_runf("train %s/cnn.yaml --out %s/ce --set data.drop_last=false", dir, dir));
    /* Parameters and running statistics bit for bit; the classifier's
     * AdamW moments see its weight gradient summed over 13 vs 14 rows by
     * the GEMM in other blocks (fp32 rounding, 4e-9 measured). */
    int moments;
    const double dw = diff_max("cb", "ce", &moments);
    printf("cnn with BatchNorm: padded vs exact: tensors differ by at most %.3g (%s)\n", dw,
           moments ? "optimizer moments only" : "parameters too");
    CHECK(dw >= 0 && dw <= 1e-7 && moments, "cnn padded vs exact: %g, moments only %d", dw,
          moments);
    char b[128], e[128];
    snprintf(b, sizeof b, "%s/cb", dir);
    snprintf(e, sizeof e, "%s/ce", dir);
    char *lb = losses(b), *le = losses(e);
    CHECK(strlen(lb) > 6 && !strcmp(lb, le), "cnn losses\n  bucket %s\n  exact  %s", lb, le);
    free(lb), free(le);
    char path[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", b);
    char *m = e2e_slurp(path, NULL);
    CHECK(strstr(m, "\"rows\":13,\"bucket\":14") && strstr(m, "\"type\":\"eval\""),
          "cnn: the 13 rows on bucket 14, and an evaluation: %s", m);
    free(m);
}

/* data.doc_offsets: the same documents given by their start offsets (the
 * end-of-text ids stay in the file as ordinary tokens) train the same
 * losses as data.eot_id: only the padded inputs differ (token 0 for 63),
 * and no real position reads them. Bad offset files fail naming the file,
 * the line and the offset. */
static void test_offsets(const int64_t *offsets) {
    FILE *f = fopen(e2e_path("offsets.txt"), "w");
    CHECK(f != NULL, "offsets.txt");
    if (!f) return;
    for (int d = 0; d < 60; d++) fprintf(f, "%lld\n", (long long)offsets[d]);
    fclose(f);
    ok("gpt offsets", e2e_runf("train %s/gpt.yaml --out %s/go --set data.eot_id=-1 --set "
                               "data.doc_offsets=%s/offsets.txt",
                               dir, dir, dir));
    char g[128], o[128];
    snprintf(g, sizeof g, "%s/g", dir);
    snprintf(o, sizeof o, "%s/go", dir);
    char *lg = losses(g), *lo = losses(o);
    CHECK(strlen(lg) > 20 && !strcmp(lg, lo), "offsets vs eot_id losses\n  %s\n  %s", lo, lg);
    free(lg), free(lo);
    static const char *const bad[][2] = {{"3\n40\n", "must be 0"},
                                         {"0\n40\n40\n", "does not follow the previous offset"},
                                         {"0\n99999\n", "past the token file's end"},
                                         {"0\n4x\n", "expected a whole token offset"}};
    for (int i = 0; i < 4; i++) {
        write_text("bad_offsets.txt", bad[i][0]);
        e2e_result r = e2e_runf("train %s/gpt.yaml --out %s/gb --set data.eot_id=-1 --set "
                                "data.doc_offsets=%s/bad_offsets.txt",
                                dir, dir, dir);
        CHECK(r.rc != 0 && strstr(r.err, "bad_offsets.txt:") && strstr(r.err, bad[i][1]),
              "bad offsets %d: exit %d: %s", i, r.rc, r.err);
        e2e_done(&r);
    }
    e2e_result r = e2e_runf("train %s/gpt.yaml --out %s/gb --set data.doc_offsets=%s/offsets.txt",
                            dir, dir, dir);
    CHECK(r.rc == 2 && strstr(r.err, "data.doc_offsets and data.eot_id"), "both: exit %d: %s", r.rc,
          r.err);
    e2e_done(&r);
}

static void test_gpt(void) {
    /* 60 documents of 3..31 tokens, each ending with the end-of-text id 63 */
    FILE *f = fopen(e2e_path("docs.bin"), "wb");
    CHECK(f != NULL, "docs.bin");
    if (!f) return;
    unsigned seed = 1;
    int64_t offsets[61] = {0};
    for (int d = 0; d < 60; d++) {
        const int len = 3 + (int)(rand_r(&seed) % 29);
        offsets[d + 1] = offsets[d] + len;
        for (int t = 0; t < len; t++) {
            uint16_t tok = (uint16_t)(t + 1 == len ? 63 : rand_r(&seed) % 63);
            fwrite(&tok, 2, 1, f);
        }
    }
    fclose(f);
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "model: {name: gpt, batch: 6, ctx: 32, vocab: 64, d_model: 16, n_layers: 1, "
             "n_heads: 2}\n"
             "data: {source: tokens, path: %s/docs.bin, eot_id: 63, val_fraction: 0}\n"
             "train: {optimizer: adamw, lr: 1.0e-2, epochs: 2, seed: 3, threads: 1}\n"
             "shape: {policy: bucket, batch_buckets: [6], seq_buckets: multiple:8, "
             "sort_window: 4}\n",
             dir);
    write_text("gpt.yaml", yaml);
    ok("gpt docs", e2e_runf("train %s/gpt.yaml --out %s/g", dir, dir));
    char g[128], path[256];
    snprintf(g, sizeof g, "%s/g", dir);
    snprintf(path, sizeof path, "%s/metrics.jsonl", g);
    char *m = e2e_slurp(path, NULL);
    int seen[5] = {0}, lines = 0;
    for (char *p = m; (p = strstr(p, "\"seq_bucket\":")); p++, lines++) {
        long b = strtol(p + 13, NULL, 10);
        if (b % 8 == 0 && b >= 8 && b <= 32) seen[b / 8]++;
    }
    CHECK(lines == 20 && seen[1] + seen[2] + seen[3] + seen[4] == 20 && seen[1] && seen[4],
          "20 steps on buckets 8..32 (8: %d, 16: %d, 24: %d, 32: %d)", seen[1], seen[2], seen[3],
          seen[4]);
    free(m);
    /* 10 batches per epoch: the buckets of epoch 2 were all compiled in epoch 1 */
    CHECK(compiles_at(g, 10) >= 1 && compiles_at(g, 20) == compiles_at(g, 10),
          "compiles after epoch 1: %ld, after epoch 2: %ld", compiles_at(g, 10),
          compiles_at(g, 20));
    snprintf(path, sizeof path, "%s/summary.json", g);
    char *sum = e2e_slurp(path, NULL);
    char *pad = strstr(sum, "\"padding\": ");
    double share = pad ? strtod(pad + 11, NULL) : -1;
    printf("gpt documents: padding share %.3f\n", share);
    CHECK(share > 0 && share < 0.5, "padding share %g", share);
    free(sum);
    /* shape.precompile: every bucket (8, 16, 24 beside the full 32) before step 1 */
    ok("gpt precompile",
       e2e_runf("train %s/gpt.yaml --out %s/gp --set shape.precompile=true", dir, dir));
    snprintf(g, sizeof g, "%s/gp", dir);
    CHECK(compiles_at(g, 1) == 3 && compiles_at(g, 20) == 3,
          "precompiled: %ld at step 1, %ld at 20", compiles_at(g, 1), compiles_at(g, 20));
    test_offsets(offsets);
    e2e_result r =
        e2e_runf("train %s/gpt.yaml --out %s/gx --set 'shape.seq_buckets=8, 16'", dir, dir);
    CHECK(r.rc != 0 && strstr(r.err, "longer than every bucket of shape.seq_buckets '8, 16'") &&
              strstr(r.err, "the largest is 16"),
          "too long: exit %d: %s", r.rc, r.err);
    e2e_done(&r);
}

int main(void) {
    if (!e2e_setup("shapes", dir, sizeof dir)) return check_summary("e2e/shapes");
    data();
    test_equal();
    test_resume();
    test_bad();
    test_cnn();
    test_gpt();
    e2e_cleanup(dir);
    return check_summary("e2e/shapes");
}
