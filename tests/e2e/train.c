/* `tessel train` end to end: every kind of bad input exits 2 with a clear
 * message and leaves an existing run directory as it was; a small run
 * writes every run-directory file; Ctrl-C stops cleanly with a summary;
 * and the Fashion-MNIST demo config trains a few steps when the dataset is
 * installed. Runs $TESSEL_BIN from the repository root. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "testfiles.h"
#include "e2e.h"

static const char *bin;
static char dir[64];

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static int file_exists(const char *d, const char *name) {
    char p[512];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", d, name);
    return stat(p, &st) == 0;
}

/* Entries of a directory besides . and .., by listing it with ls. */
static int entries(const char *d) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ls -A '%s' 2>/dev/null | wc -l", d);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p) {
        if (fscanf(p, "%d", &n) != 1) n = -1;
        pclose(p);
    }
    return n;
}

static void make_files(void) {
    enum { N = 200, F = 6 };
    static float x[N * F];
    static int64_t y[N], ybad[N];
    for (int i = 0; i < N * F; i++) x[i] = (float)((i * 7919) % 101) / 101.0f;
    for (int i = 0; i < N; i++) y[i] = i % 3, ybad[i] = i == 37 ? 3 : i % 3;
    tf_write_npy(e2e_path("x.npy"), "<f4", N, F, x, sizeof(float), 0);
    tf_write_npy(e2e_path("y.npy"), "<i8", N, 0, y, sizeof(int64_t), 0);
    tf_write_npy(e2e_path("ybad.npy"), "<i8", N, 0, ybad, sizeof(int64_t), 0);
    tf_write_npy(e2e_path("xc.npy"), "<c8", N / 2, F, x, sizeof(float), 0);
    tf_write_npy(e2e_path("xtrunc.npy"), "<f4", N, F, x, sizeof(float), 100);
    FILE *f = fopen(e2e_path("series.csv"), "w");
    if (f) {
        fprintf(f, "t,a,b,price\n");
        for (int i = 0; i < 60; i++) fprintf(f, "%d,%.2f,%d,%.2f\n", i, i * 0.5, i % 7, i * 0.1);
        fclose(f);
    }
    f = fopen(e2e_path("bad.csv"), "w");
    if (f) {
        fprintf(f, "t,a,b,price\n");
        for (int i = 0; i < 60; i++)
            fprintf(f, i == 40 ? "%d,%.2f,abc,%.2f\n" : "%d,%.2f,1,%.2f\n", i, i * 0.5, i * 0.1);
        fclose(f);
    }
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "model: {name: mlp, batch: 16, hidden: 16, n_hidden: 1}\n"
             "train: {steps: 8, threads: 1}\n"
             "data: {source: npy, x: %s, y: %s}\n",
             e2e_path("x.npy"), e2e_path("y.npy"));
    write_text(e2e_path("npy.yaml"), yaml);
    snprintf(yaml, sizeof yaml,
             "model: {name: mlp, batch: 8, hidden: 16, n_hidden: 1}\n"
             "train: {steps: 8, threads: 1}\n"
             "data: {source: csv, path: %s, label: price, features: [a, b], window: 4}\n",
             e2e_path("series.csv"));
    write_text(e2e_path("csv.yaml"), yaml);
}

static void test_bad_input(void) {
    char empty[256], used[256];
    snprintf(empty, sizeof empty, "%s", e2e_path("empty-run"));
    snprintf(used, sizeof used, "%s", e2e_path("used-run"));
    mkdir(empty, 0777);
    mkdir(used, 0777);
    write_text(e2e_path("used-run/summary.json"), "{\"status\": \"completed\"}\n");
    struct {
        const char *what, *config, *sets, *msg, *msg2;
    } cases[] = {
        {"missing file", "npy.yaml", "--set data.x=%s/nope.npy", "nope.npy: cannot open", NULL},
        {"wrong .npy dtype", "npy.yaml", "--set data.x=%s/xc.npy", "xc.npy", "'<c8'"},
        {"truncated .npy", "npy.yaml", "--set data.x=%s/xtrunc.npy", "xtrunc.npy", "truncated"},
        {"non-numeric CSV cell", "csv.yaml", "--set data.path=%s/bad.csv", "bad.csv:42",
         "column 'b' holds 'abc', not a number"},
        {"label out of range", "npy.yaml", "--set data.y=%s/ybad.npy --set model.classes=3",
         "ybad.npy: example 37 has label 3, out of range", "[0, 3)"},
        {"config typo", "npy.yaml", "--set data.trian_images=%s", "unknown key 'data.trian_images'",
         "did you mean 'data.train_images'?"},
        {"key of another source", "npy.yaml", "--set data.path=%s/x.csv",
         "data.path is not used by data.source npy", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char sets[512], args[1024];
        snprintf(sets, sizeof sets, cases[i].sets, dir);
        snprintf(args, sizeof args, "train %s %s --out %s", e2e_path(cases[i].config), sets, empty);
        e2e_result r = e2e_run(args);
        CHECK(r.rc == 2, "%s: exit %d, expected 2 (%s)", cases[i].what, r.rc, r.err);
        CHECK(strstr(r.err, "tessel: error: ") && strstr(r.err, cases[i].msg) &&
                  (!cases[i].msg2 || strstr(r.err, cases[i].msg2)),
              "%s: message '%s'", cases[i].what, r.err);
        CHECK(entries(empty) == 0, "%s: the existing run directory stays empty", cases[i].what);
        printf("%-22s -> %s", cases[i].what, r.err);
        e2e_done(&r);
    }
    /* A good config into a used run directory: refused, nothing changed. */
    char args[1024];
    snprintf(args, sizeof args, "train %s --out %s", e2e_path("npy.yaml"), used);
    e2e_result r = e2e_run(args);
    CHECK(r.rc == 2 && strstr(r.err, "already exists and is not empty"), "used dir: %d %s", r.rc,
          r.err);
    char *kept = e2e_slurp(e2e_path("used-run/summary.json"), NULL);
    CHECK(entries(used) == 1 && !strcmp(kept, "{\"status\": \"completed\"}\n"),
          "the used run directory is untouched");
    free(kept);
    e2e_done(&r);
}

static void test_success(void) {
    char out[256];
    snprintf(out, sizeof out, "%s", e2e_path("run-npy"));
    char args[1024];
    snprintf(args, sizeof args, "train %s --out %s", e2e_path("npy.yaml"), out);
    e2e_result r = e2e_run(args);
    CHECK(r.rc == 0, "npy run: exit %d: %s", r.rc, r.err);
    CHECK(strstr(r.out, "run directory: ") && strstr(r.out, out), "prints the run directory");
    CHECK(strstr(r.out, "eval  step 8") && strstr(r.out, "accuracy"), "evaluates at the end");
    const char *files[] = {"config.yaml", "lineage.json", "metrics.jsonl", "summary.json"};
    for (int i = 0; i < 4; i++) CHECK(file_exists(out, files[i]), "%s written", files[i]);
    e2e_done(&r);

    snprintf(out, sizeof out, "%s", e2e_path("run-csv"));
    snprintf(args, sizeof args, "train %s --out %s", e2e_path("csv.yaml"), out);
    r = e2e_run(args);
    CHECK(r.rc == 0 && file_exists(out, "normalisation.json"), "csv run: %d %s", r.rc, r.err);
    CHECK(strstr(r.out, " mse "), "regression reports mse");
    e2e_done(&r);

    /* The resolved config reproduces the run: same final loss. */
    char a[256], b[256];
    snprintf(args, sizeof args, "train %s/config.yaml --out %s", out, e2e_path("run-csv2"));
    r = e2e_run(args);
    CHECK(r.rc == 0, "rerun of config.yaml: %s", r.err);
    e2e_done(&r);
    char *s1 = e2e_slurp(e2e_path("run-csv/summary.json"), NULL),
         *s2 = e2e_slurp(e2e_path("run-csv2/summary.json"), NULL);
    const char *f1 = strstr(s1, "\"final_loss\""), *f2 = strstr(s2, "\"final_loss\"");
    CHECK(f1 && f2 && sscanf(f1, "\"final_loss\": %255[^,]", a) == 1 &&
              sscanf(f2, "\"final_loss\": %255[^,]", b) == 1 && !strcmp(a, b),
          "config.yaml reproduces the final loss");
    free(s1);
    free(s2);
}

static void test_interrupt(void) {
    char out[256], metrics[512];
    snprintf(out, sizeof out, "%s", e2e_path("run-int"));
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", out);
    fflush(stdout); /* or the child would print what is buffered again */
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stdout);
        execl(bin, bin, "train", "examples/w1.yaml", "--steps", "1000000", "--set", "model.batch=8",
              "--set", "model.hidden=8", "--set", "model.window=2", "--set", "model.features=2",
              "--set", "train.threads=1", "--out", out, (char *)NULL);
        _exit(127);
    }
    /* Wait for a few steps (at most 20 s), then press Ctrl-C. */
    struct timespec pause = {0, 20 * 1000 * 1000};
    for (int i = 0; i < 1000; i++) {
        char *m = e2e_slurp(metrics, NULL);
        size_t lines = 0;
        for (char *p = m; (p = strchr(p, '\n')); p++) lines++;
        free(m);
        if (lines >= 5) break;
        nanosleep(&pause, NULL);
    }
    kill(pid, SIGINT);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 130, "Ctrl-C: exit 130, got %d",
          WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    char *sum = e2e_slurp(e2e_path("run-int/summary.json"), NULL);
    CHECK(strstr(sum, "\"status\": \"interrupted\""), "summary written: %s", sum);
    free(sum);
}

static void test_demo_config(void) {
    const char *images = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
    if (access(images, R_OK) != 0) {
        printf("skipped the demo config: %s is not installed (dataset-fashion-mnist)\n", images);
        return;
    }
    char args[512];
    snprintf(args, sizeof args,
             "train examples/fashion_mnist.yaml --set train.epochs=0 --steps 30 --out %s",
             e2e_path("run-demo"));
    e2e_result r = e2e_run(args);
    CHECK(r.rc == 0, "demo config: exit %d: %s", r.rc, r.err);
    CHECK(strstr(r.out, "test loss") && strstr(r.out, "accuracy"), "test split evaluated");
    char *sum = e2e_slurp(e2e_path("run-demo/summary.json"), NULL);
    const char *t = strstr(sum, "\"test\"");
    double acc = 0;
    const char *a = t ? strstr(t, "\"accuracy\":") : NULL;
    CHECK(a && sscanf(a, "\"accuracy\": %lf", &acc) == 1 && acc > 0.5,
          "30 steps already beat chance by far: %.3f", acc);
    printf("demo config, 30 steps: test accuracy %.3f\n", acc);
    free(sum);
    e2e_done(&r);
}

int main(void) {
    bin = e2e_setup("train", dir, sizeof dir);
    if (!bin) return check_summary("e2e/train");
    make_files();
    test_bad_input();
    test_success();
    test_interrupt();
    test_demo_config();
    e2e_cleanup(dir);
    return check_summary("e2e/train");
}
