/* The training session through the library: small runs on synthetic data
 * and on generated .npy, IDX, CSV and token files; the run directory's
 * files (metrics.jsonl lines parse, lineage hashes match); epochs and
 * evaluation cadence; determinism; refusing a used run directory; the stop
 * flag; and the executor's optional profile. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "check.h"
#include "testfiles.h"
#include "core/sha256.h"
#include "data/data.h"
#include "session/session.h"

static char tmp[64];

static const char *path_in(const char *name) {
    return tf_path(tmp, name);
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(data, 1, n, f) == n, "write %s", path);
    if (f) fclose(f);
}

/* A version 1.0 .npy file of `n` rows of `cols` values ("<f4", "<i8"). */
/* A plain IDX file of unsigned bytes. */
static void write_idx(const char *path, int rank, const int *dims, const unsigned char *data) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    unsigned char head[4] = {0, 0, 0x08, (unsigned char)rank};
    fwrite(head, 1, 4, f);
    size_t n = 1;
    for (int i = 0; i < rank; i++) {
        unsigned char d[4] = {(unsigned char)(dims[i] >> 24), (unsigned char)(dims[i] >> 16),
                              (unsigned char)(dims[i] >> 8), (unsigned char)dims[i]};
        fwrite(d, 1, 4, f);
        n *= (size_t)dims[i];
    }
    fwrite(data, 1, n, f);
    fclose(f);
}

/* Separable data: class k puts its mass in features [2k, 2k+1]. */
static void make_files(void) {
    enum { N = 240, F = 8, C = 3 };
    static float x[N * F];
    static int64_t y[N];
    unsigned seed = 7;
    for (int i = 0; i < N; i++) {
        y[i] = i % C;
        for (int j = 0; j < F; j++)
            x[i * F + j] =
                (float)rand_r(&seed) / (float)RAND_MAX * 0.3f + (j / 2 == y[i] ? 1.0f : 0.0f);
    }
    tf_write_npy(path_in("x.npy"), "<f4", N, F, x, sizeof(float), 0);
    tf_write_npy(path_in("y.npy"), "<i8", N, 0, y, sizeof(int64_t), 0);

    /* 6x6 images: class k is a bright row k. */
    static unsigned char img[N * 36], lab[N];
    for (int i = 0; i < N; i++) {
        lab[i] = (unsigned char)(i % C);
        for (int p = 0; p < 36; p++)
            img[i * 36 + p] = (unsigned char)((p / 6 == lab[i] ? 200 : 0) + rand_r(&seed) % 40);
    }
    int idims[3] = {N, 6, 6}, ldims[1] = {N};
    write_idx(path_in("img.idx"), 3, idims, img);
    write_idx(path_in("lab.idx"), 1, ldims, lab);
    idims[0] = ldims[0] = 50;
    write_idx(path_in("timg.idx"), 3, idims, img);
    write_idx(path_in("tlab.idx"), 1, ldims, lab);

    /* A time series: the label follows a smooth function of the features. */
    FILE *f = fopen(path_in("series.csv"), "w");
    if (f) {
        fprintf(f, "time,open,close,target\n");
        for (int i = 0; i < 200; i++)
            fprintf(f, "%d,%.4f,%.4f,%.4f\n", i, 10 + (i % 17) * 0.5, 11 + (i % 13) * 0.25,
                    (i % 17) * 0.1);
        fclose(f);
    }
    /* Tokens: a repeating pattern a GPT learns quickly. */
    static unsigned short tok[4096];
    for (int i = 0; i < 4096; i++) tok[i] = (unsigned short)(i % 11);
    write_bytes(path_in("tokens.u16"), tok, sizeof tok);
}

static ts_status load(ts_config *c, const char *yaml) {
    ts_config_init(c);
    ts_status s = ts_config_load_string(c, yaml, strlen(yaml), "t.yaml");
    if (s == TS_OK) s = ts_config_finish(c);
    CHECK(s == TS_OK, "config: %s", ts_last_error());
    return s;
}

static ts_status run(const char *yaml, const char *dir, ts_session_result *r) {
    ts_config c;
    if (load(&c, yaml) != TS_OK) return TS_ERR_INVALID;
    ts_session_options o = ts_session_options_default();
    o.progress = TS_PROGRESS_NONE;
    o.out_dir = dir;
    return ts_session_run(&c, &o, r);
}

static int exists(const char *dir, const char *name) {
    char p[512];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

/* Lines of metrics.jsonl: every one a JSON object; counts by type. */
static void check_metrics(const char *dir, int64_t train_lines, int64_t eval_lines, double *losses,
                          int max) {
    char p[512], line[1024];
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    FILE *f = fopen(p, "r");
    CHECK(f != NULL, "%s exists", p);
    if (!f) return;
    int64_t nt = 0, ne = 0, bad = 0, last_step = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t err;
        json_t *j = json_loads(line, 0, &err);
        const char *type = j ? json_string_value(json_object_get(j, "type")) : NULL;
        if (!type) {
            bad++;
        } else if (!strcmp(type, "train")) {
            int64_t step = json_integer_value(json_object_get(j, "step"));
            bad += step != last_step + 1 || !json_is_number(json_object_get(j, "loss")) ||
                   !json_is_number(json_object_get(j, "lr")) ||
                   !json_is_number(json_object_get(j, "samples_per_s")) ||
                   !json_is_integer(json_object_get(j, "epoch"));
            if (losses && nt < max) losses[nt] = json_number_value(json_object_get(j, "loss"));
            last_step = step;
            nt++;
        } else if (!strcmp(type, "eval")) {
            bad += !json_is_string(json_object_get(j, "split")) ||
                   !json_is_number(json_object_get(j, "loss"));
            ne++;
        }
        json_decref(j);
    }
    fclose(f);
    CHECK(!bad, "%s: %lld malformed lines", p, (long long)bad);
    CHECK(nt == train_lines, "%s: %lld train lines, expected %lld", p, (long long)nt,
          (long long)train_lines);
    CHECK(eval_lines < 0 || ne == eval_lines, "%s: %lld eval lines, expected %lld", p,
          (long long)ne, (long long)eval_lines);
}

static json_t *read_json(const char *dir, const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    json_error_t err;
    json_t *j = json_load_file(p, 0, &err);
    CHECK(j != NULL, "%s parses: %s", p, j ? "" : err.text);
    return j;
}

static const char *synth_mlp =
    "model: {name: mlp, batch: 16, window: 4, features: 4, hidden: 16, n_hidden: 1}\n"
    "train: {steps: 12, lr: 0.01, threads: 1, seed: 3}\n";

static void test_synthetic(void) {
    ts_session_result r;
    const char *dir = path_in("synth");
    CHECK_OK(run(synth_mlp, dir, &r));
    CHECK(r.steps == 12 && r.planned_steps == 12 && !r.interrupted, "12 steps");
    CHECK(r.final_loss < r.first_loss, "loss falls: %g -> %g", r.first_loss, r.final_loss);
    CHECK(!r.has_val && !r.has_test, "synthetic data has no evaluation");
    CHECK(!strcmp(r.run_dir, dir) && !strcmp(r.unit, "samples/s"), "run dir and unit");
    const char *files[] = {"config.yaml", "lineage.json", "metrics.jsonl", "summary.json"};
    for (int i = 0; i < 4; i++) CHECK(exists(dir, files[i]), "%s written", files[i]);
    CHECK(!exists(dir, "normalisation.json"), "no normalisation without CSV");
    check_metrics(dir, 12, 0, NULL, 0);
    json_t *sum = read_json(dir, "summary.json");
    CHECK(sum && !strcmp(json_string_value(json_object_get(sum, "status")), "completed") &&
              json_integer_value(json_object_get(sum, "steps")) == 12,
          "summary: completed, 12 steps");
    json_decref(sum);

    /* The resolved config loads back and finishes. */
    ts_config c;
    char p[512];
    snprintf(p, sizeof p, "%s/config.yaml", dir);
    ts_config_init(&c);
    CHECK_OK(ts_config_load_file(&c, p));
    CHECK_OK(ts_config_finish(&c));

    /* A used run directory is refused and left as it was. */
    CHECK(run(synth_mlp, dir, &r) == TS_ERR_INVALID &&
              strstr(ts_last_error(), "already exists and is not empty"),
          "used directory refused: %s", ts_last_error());
    check_metrics(dir, 12, 0, NULL, 0);

    /* Without a directory nothing is written and the run still works. */
    CHECK_OK(run(synth_mlp, NULL, &r));
    CHECK(!r.run_dir[0] && r.steps == 12, "no run directory");
}

static void test_determinism(void) {
    ts_session_result a, b;
    double la[64], lb[64];
    CHECK_OK(run(synth_mlp, path_in("det1"), &a));
    CHECK_OK(run(synth_mlp, path_in("det2"), &b));
    CHECK(a.final_loss == b.final_loss, "same final loss: %.9g vs %.9g", a.final_loss,
          b.final_loss);
    check_metrics(path_in("det1"), 12, 0, la, 64);
    check_metrics(path_in("det2"), 12, 0, lb, 64);
    CHECK(!memcmp(la, lb, sizeof(double) * 12), "same losses in metrics.jsonl");

    /* Real data too: the split and the shuffled order depend on the seed only. */
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "model: {name: mlp, batch: 16, hidden: 16, n_hidden: 1}\n"
             "train: {epochs: 2, threads: 1, seed: 5}\n"
             "data: {source: npy, x: %s, y: %s}\n",
             path_in("x.npy"), path_in("y.npy"));
    CHECK_OK(run(yaml, NULL, &a));
    CHECK_OK(run(yaml, NULL, &b));
    CHECK(a.final_loss == b.final_loss && a.val.accuracy == b.val.accuracy,
          "npy run repeats exactly");
}

static void test_npy_classifier(void) {
    char yaml[1024];
    const char *dir = path_in("npy");
    /* 240 examples, 24 for validation: 216 / 16 = 13 full batches and a
     * short one of 8 per epoch (kept: data.drop_last defaults to false). */
    snprintf(yaml, sizeof yaml,
             "model: {name: mlp, batch: 16, hidden: 32, n_hidden: 1}\n"
             "train: {epochs: 3, lr: 0.01, threads: 1}\n"
             "data: {source: npy, x: %s, y: %s}\n",
             path_in("x.npy"), path_in("y.npy"));
    ts_session_result r;
    CHECK_OK(run(yaml, dir, &r));
    CHECK(r.planned_steps == 42 && r.steps == 42, "3 epochs of 14: %lld",
          (long long)r.planned_steps);
    CHECK(r.has_val && r.val.examples == 24, "val split of 24: %lld", (long long)r.val.examples);
    CHECK(r.val.accuracy > 0.9, "separable data learnt: %.3f", r.val.accuracy);
    CHECK(isnan(r.val.mse), "no mse for a classifier");
    check_metrics(dir, 42, 3, NULL, 0); /* one evaluation per epoch, the last at the end */

    /* lineage.json names both files with their SHA-256. */
    json_t *lin = read_json(dir, "lineage.json");
    json_t *files = lin ? json_object_get(lin, "files") : NULL;
    CHECK(json_array_size(files) == 2, "two data files");
    for (size_t i = 0; i < json_array_size(files); i++) {
        json_t *e = json_array_get(files, i);
        char hex[65];
        int64_t bytes;
        const char *p = json_string_value(json_object_get(e, "path"));
        CHECK_OK(ts_sha256_path(p, hex, &bytes));
        CHECK(!strcmp(hex, json_string_value(json_object_get(e, "sha256"))) &&
                  json_integer_value(json_object_get(e, "bytes")) == bytes,
              "lineage hash of %s", p);
    }
    json_decref(lin);

    /* eval_every: steps 3, 6, 9 and the end (10). */
    snprintf(yaml, sizeof yaml,
             "model: {name: mlp, batch: 16, hidden: 8, n_hidden: 1}\n"
             "train: {steps: 10, eval_every: 3, threads: 1}\n"
             "data: {source: npy, x: %s, y: %s, val_fraction: 0.25}\n",
             path_in("x.npy"), path_in("y.npy"));
    CHECK_OK(run(yaml, path_in("every"), &r));
    check_metrics(path_in("every"), 10, 4, NULL, 0);
    CHECK(r.val.examples == 60, "val_fraction 0.25 of 240");

    /* Labels beyond model.classes are bad input, named with the file. */
    snprintf(yaml, sizeof yaml,
             "model: {name: mlp, batch: 16, hidden: 8, n_hidden: 1, classes: 2}\n"
             "train: {steps: 2}\n"
             "data: {source: npy, x: %s, y: %s}\n",
             path_in("x.npy"), path_in("y.npy"));
    CHECK(run(yaml, path_in("bad-labels"), &r) == TS_ERR_INVALID &&
              strstr(ts_last_error(), "y.npy: example 2 has label 2, out of range"),
          "label out of range: %s", ts_last_error());
    CHECK(!exists(path_in("bad-labels"), "."), "no run directory for bad input");

    /* A metric that does not fit the model. */
    snprintf(yaml, sizeof yaml,
             "model: {name: mlp, batch: 16, hidden: 8, n_hidden: 1}\n"
             "train: {steps: 2, metrics: mse}\n"
             "data: {source: npy, x: %s, y: %s}\n",
             path_in("x.npy"), path_in("y.npy"));
    CHECK(run(yaml, NULL, &r) == TS_ERR_INVALID && strstr(ts_last_error(), "mse needs"),
          "mse on a classifier: %s", ts_last_error());
}

static void test_idx_with_test_split(void) {
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "model: {name: mlp, batch: 10, hidden: 16, n_hidden: 1, layer_norm: false}\n"
             "train: {epochs: 2, lr: 0.01, threads: 1}\n"
             "data: {source: idx, train_images: %s, train_labels: %s, test_images: %s,\n"
             "       test_labels: %s, val_fraction: 0}\n",
             path_in("img.idx"), path_in("lab.idx"), path_in("timg.idx"), path_in("tlab.idx"));
    ts_session_result r;
    const char *dir = path_in("idx");
    CHECK_OK(run(yaml, dir, &r));
    CHECK(r.steps == 48 && !r.has_val, "2 epochs of 24 batches, no validation");
    CHECK(r.has_test && r.test.examples == 50 && r.test.accuracy > 0.9,
          "test split evaluated at the end: %lld examples, accuracy %.3f",
          (long long)r.test.examples, r.test.accuracy);
    json_t *sum = read_json(dir, "summary.json");
    json_t *t = sum ? json_object_get(sum, "test") : NULL;
    CHECK(t && json_number_value(json_object_get(t, "accuracy")) == r.test.accuracy,
          "summary holds the test accuracy");
    json_decref(sum);
    ts_config c;
    load(&c, yaml);
    CHECK(c.model.classes == 0, "classes not set in the config ...");
    CHECK(r.test.accuracy > 0, "... and derived from the labels (3 classes)");
}

static void test_csv_regression(void) {
    char yaml[1024];
    const char *dir = path_in("csv");
    snprintf(yaml, sizeof yaml,
             "model: {name: mlp, batch: 8, hidden: 16, n_hidden: 1}\n"
             "train: {steps: 30, lr: 0.01, threads: 1}\n"
             "data: {source: csv, path: %s, features: [open, close], label: target,\n"
             "       window: 5, horizon: 1}\n",
             path_in("series.csv"));
    ts_session_result r;
    CHECK_OK(run(yaml, dir, &r));
    CHECK(r.has_val && !isnan(r.val.mse) && isnan(r.val.accuracy), "mse on validation");
    json_t *n = read_json(dir, "normalisation.json");
    json_t *mean = n ? json_object_get(n, "mean") : NULL;
    CHECK(json_array_size(mean) == 2 && json_array_size(json_object_get(n, "std")) == 2,
          "a mean and std per feature");
    json_decref(n);
}

static void test_tokens_gpt(void) {
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "model: {name: gpt, batch: 4, ctx: 16, vocab: 16, d_model: 32, n_layers: 1,\n"
             "        n_heads: 2}\n"
             "train: {steps: 30, lr: 0.01, threads: 1}\n"
             "data: {source: tokens, path: %s, bits: 16}\n",
             path_in("tokens.u16"));
    ts_session_result r;
    CHECK_OK(run(yaml, path_in("gpt"), &r));
    CHECK(!strcmp(r.unit, "tokens/s") && r.has_val && r.val.accuracy > 0.5,
          "gpt learns the pattern: next-token accuracy %.3f", r.val.accuracy);
}

static void test_stop_flag(void) {
    volatile sig_atomic_t stop = 1;
    ts_config c;
    load(&c, synth_mlp);
    ts_session_options o = ts_session_options_default();
    o.progress = TS_PROGRESS_NONE;
    o.out_dir = path_in("stopped");
    o.stop = &stop;
    ts_session_result r;
    CHECK_OK(ts_session_run(&c, &o, &r));
    CHECK(r.interrupted && r.steps == 0, "a stop before the first step runs none");
    json_t *sum = read_json(o.out_dir, "summary.json");
    CHECK(sum && !strcmp(json_string_value(json_object_get(sum, "status")), "interrupted"),
          "summary says interrupted");
    json_decref(sum);
}

static void test_progress_lines(void) {
    ts_config c;
    load(&c, "model: {name: mlp, batch: 8, window: 2, features: 2, hidden: 8, n_hidden: 1}\n"
             "train: {steps: 10, log_every: 4, threads: 1}\n");
    FILE *f = tmpfile();
    ts_session_options o = ts_session_options_default();
    o.progress = TS_PROGRESS_LINES;
    o.log = f;
    ts_session_result r;
    CHECK_OK(ts_session_run(&c, &o, &r));
    rewind(f);
    char line[512];
    int steps[16], n = 0, done = 0;
    while (fgets(line, sizeof line, f)) {
        long long s, total;
        if (sscanf(line, "step %lld/%lld loss", &s, &total) == 2 && n < 16) steps[n++] = (int)s;
        done += !strncmp(line, "done: ", 6);
    }
    fclose(f);
    CHECK(n == 4 && steps[0] == 1 && steps[1] == 4 && steps[2] == 8 && steps[3] == 10,
          "log lines at steps 1, 4, 8, 10 (got %d lines)", n);
    CHECK(done == 1, "a done line");
}

static void test_profile(void) {
    ts_graph *g = ts_graph_new();
    ts_mlp_config mc = {8, 0, 0, 16, 32, 1, 1, 1, 0};
    ts_model m;
    CHECK_OK(ts_build_mlp(g, &mc, &m));
    ts_train_spec spec = ts_train_spec_default(m.loss);
    ts_compile_options opt = ts_compile_options_default();
    opt.threads = 1;
    ts_plan *plain = NULL, *prof = NULL;
    CHECK_OK(ts_compile(g, &spec, &opt, &plain));
    opt.profile = 1;
    CHECK_OK(ts_compile(g, &spec, &opt, &prof));
    CHECK(ts_plan_profile(plain, NULL, 0) == -1 && strstr(ts_last_error(), "without"),
          "no profile unless compiled with one");
    float x[8 * 16] = {0}, y[8] = {0};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(ts_plan_set_input(prof, "x", x, sizeof x));
        CHECK_OK(ts_plan_set_input(prof, "y", y, sizeof y));
        CHECK_OK(ts_plan_step(prof));
    }
    ts_profile_entry e[64];
    int n = ts_plan_profile(prof, e, 64);
    int gemm = 0, sorted = 1;
    int64_t calls = 0;
    ts_plan_stats st;
    ts_plan_get_stats(prof, &st);
    for (int i = 0; i < n && i < 64; i++) {
        gemm |= e[i].is_gemm && !strcmp(e[i].op, "matmul");
        calls += e[i].calls;
        if (i && e[i].seconds > e[i - 1].seconds) sorted = 0;
    }
    CHECK(n > 2 && gemm && sorted, "per-op totals, slowest first, GEMM marked");
    CHECK(calls == 3 * (int64_t)st.n_instructions, "every instruction timed every step");
    ts_plan_profile_reset(prof);
    n = ts_plan_profile(prof, e, 64);
    CHECK(n > 0 && e[0].seconds == 0 && e[0].calls == 0, "reset clears the times");
    ts_plan_free(plain);
    ts_plan_free(prof);
    ts_graph_free(g);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/tessel-session-XXXXXX");
    CHECK(mkdtemp(tmp) != NULL, "temporary directory");
    make_files();
    test_synthetic();
    test_determinism();
    test_npy_classifier();
    test_idx_with_test_split();
    test_csv_regression();
    test_tokens_gpt();
    test_stop_flag();
    test_progress_lines();
    test_profile();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (!check_failed && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return check_summary("unit/session");
}
