/* `tessel plot`: a small metrics.jsonl (train and eval lines, a null loss,
 * a half-written last line) drawn to PNGs through gnuplot; the files must
 * exist and start with the PNG signature. Also the errors: no
 * metrics.jsonl, a malformed line, gnuplot missing. Skips the drawing when
 * gnuplot is not installed. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"
#include "obs/plot.h"

static char dir[64];

static int is_png(const char *path) {
    static const unsigned char magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    unsigned char head[8] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(head, 1, 8, f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    return n == 8 && !memcmp(head, magic, 8) && size > 1000;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* gnuplot on PATH? (the library reports its absence; the test wants to
 * skip instead of fail). */
static int have_gnuplot(void) {
    return system("command -v gnuplot >/dev/null 2>&1") == 0;
}

static void test_errors(void) {
    ts_plot_result r;
    char run[128], path[256];
    snprintf(run, sizeof run, "%s/empty", dir);
    mkdir(run, 0755);
    CHECK(ts_plot_run(run, NULL, &r) == TS_ERR_NOT_FOUND, "no metrics.jsonl: %s", ts_last_error());
    CHECK(strstr(ts_last_error(), "metrics.jsonl"), "names the file: %s", ts_last_error());

    snprintf(run, sizeof run, "%s/bad", dir);
    mkdir(run, 0755);
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    write_text(path, "{\"type\":\"train\",\"step\":1,\"loss\":2}\n{\"step\":2,\"loss\":}\n"
                     "{\"type\":\"train\",\"step\":3,\"loss\":2}\n");
    CHECK(ts_plot_run(run, NULL, &r) == TS_ERR_FORMAT, "malformed line: %s", ts_last_error());
    CHECK(strstr(ts_last_error(), "line 2"), "names the line: %s", ts_last_error());

    write_text(path, "{\"type\":\"train\",\"step\":1,\"loss\":2,\"samples_per_s\":5}\n");
    ts_plot_options o = {"/nonexistent/gnuplot"};
    CHECK(ts_plot_run(run, &o, &r) == TS_ERR_UNSUPPORTED, "gnuplot missing: %s", ts_last_error());
    CHECK(strstr(ts_last_error(), "gnuplot"), "says gnuplot: %s", ts_last_error());
}

static void test_plot(void) {
    char run[128], path[256];
    snprintf(run, sizeof run, "%s/run", dir);
    mkdir(run, 0755);
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    FILE *f = fopen(path, "w");
    if (!f) return;
    for (int s = 1; s <= 40; s++) {
        if (s == 17)
            fprintf(f, "{\"type\":\"train\",\"step\":17,\"loss\":null,\"samples_per_s\":900}\n");
        else
            fprintf(f,
                    "{\"type\":\"train\",\"step\":%d,\"epoch\":1,\"loss\":%.4f,\"lr\":0.001,"
                    "\"samples_per_s\":%d,\"tokens_per_s\":%d,\"grad_norm\":%.3f}\n",
                    s, 3.0 / s + 0.1, 1000 + s, 64000 + 10 * s, 1.0 / (1 + s % 7));
        if (s % 10 == 0)
            fprintf(f, "{\"type\":\"eval\",\"split\":\"val\",\"step\":%d,\"loss\":%.4f}\n", s,
                    3.3 / s + 0.2);
    }
    fprintf(f, "{\"type\":\"train\",\"step\":41,\"lo"); /* still being written */
    fclose(f);

    ts_plot_result r;
    CHECK_OK(ts_plot_run(run, NULL, &r));
    CHECK(r.train_points == 40 && r.eval_points == 4 && r.skipped_lines == 1,
          "points %lld/%lld, skipped %lld", (long long)r.train_points, (long long)r.eval_points,
          (long long)r.skipped_lines);
    CHECK(r.n_files == 3, "three PNGs, got %d", r.n_files);
    const char *names[] = {"loss.png", "throughput.png", "grad_norm.png"};
    for (int i = 0; i < 3; i++) {
        char png[512];
        snprintf(png, sizeof png, "%s/plots/%s", run, names[i]);
        CHECK(is_png(png), "%s is a PNG", png);
        CHECK(i < r.n_files && !strcmp(r.files[i], png), "result names %s", png);
    }
    snprintf(path, sizeof path, "%s/plots/plot.gp", run);
    CHECK(access(path, R_OK) == 0, "the script is kept");
    snprintf(path, sizeof path, "%s/plots/gnuplot.log", run);
    CHECK(access(path, F_OK) != 0, "no log left after success");

    /* Without grad_norm (the session's lines today): two PNGs. */
    snprintf(run, sizeof run, "%s/run2", dir);
    mkdir(run, 0755);
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    f = fopen(path, "w");
    for (int s = 1; f && s <= 5; s++)
        fprintf(f, "{\"type\":\"train\",\"step\":%d,\"loss\":%g,\"samples_per_s\":%d}\n", s,
                1.0 / s, 100 * s);
    if (f) fclose(f);
    CHECK_OK(ts_plot_run(run, NULL, &r));
    CHECK(r.n_files == 2, "loss and throughput only, got %d", r.n_files);

    /* The command line, when this build's tessel dispatches `plot`. */
    const char *bin = getenv("TESSEL_BIN");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' help 2>/dev/null | grep -q '^  plot'", bin ? bin : "");
    if (!bin || system(cmd) != 0) {
        printf("plot: skipping the `tessel plot` command line check: this tessel has no plot "
               "command yet\n");
        return;
    }
    snprintf(cmd, sizeof cmd, "'%s' plot '%s/run' > %s/cli.out 2>&1", bin, dir, dir);
    CHECK(system(cmd) == 0, "tessel plot exits 0");
    snprintf(cmd, sizeof cmd, "'%s' plot '%s/empty' > /dev/null 2>&1", bin, dir);
    int st = system(cmd);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2, "tessel plot on a dir without metrics: exit 2");
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/tessel-plot-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_errors();
    if (have_gnuplot())
        test_plot();
    else
        printf("plot: SKIP drawing: gnuplot is not installed (Debian: apt-get install "
               "gnuplot-nox)\n");
    e2e_cleanup(dir);
    return check_summary("plot");
}
