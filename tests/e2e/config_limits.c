/* The config's limits from the command line (issue 16): a 100 000-deep YAML
 * file and a file over 1 MiB exit 2 at once, naming the file; metrics ports
 * that do not fit every --procs rank exit 2 before the run directory is
 * made; tessel compile refuses dist.* keys (it builds one process's step)
 * except for --dump config. Runs $TESSEL_BIN from the repository root. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include "check.h"
#include "e2e.h"

static char dir[64];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void test_deep_and_large(void) {
    enum { DEPTH = 100000 };
    const char *deep = e2e_path("deep.yaml");
    FILE *f = fopen(deep, "w");
    CHECK(f != NULL, "create %s", deep);
    if (!f) return;
    fputs("model:\n  preset: w1\ntrain:\n  lr: ", f);
    for (int i = 0; i < DEPTH; i++) fputc('[', f);
    for (int i = 0; i < DEPTH; i++) fputc(']', f);
    fputc('\n', f);
    fclose(f);
    double t0 = now();
    e2e_result r = e2e_runf("compile %s --dump config", deep);
    double dt = now() - t0;
    CHECK(r.rc == 2 && strstr(r.err, "deep.yaml:4:") && strstr(r.err, "deeper than 32 levels"),
          "deep: rc %d '%s'", r.rc, r.err);
    CHECK(dt < 10.0, "deep: %.2f s", dt);
    e2e_done(&r);
    r = e2e_runf("train %s --steps 1", deep);
    CHECK(r.rc == 2 && strstr(r.err, "deeper than 32 levels"), "train deep: rc %d '%s'", r.rc,
          r.err);
    e2e_done(&r);

    const char *big = e2e_path("big.yaml");
    f = fopen(big, "w");
    CHECK(f != NULL, "create %s", big);
    if (!f) return;
    fputs("model:\n  preset: w1\n", f);
    for (int i = 0; i < 25000; i++)
        fputs("# a comment line of about sixty characters, to pad\n", f);
    fclose(f);
    r = e2e_runf("compile %s --dump config", big);
    CHECK(r.rc == 2 && strstr(r.err, "big.yaml: larger than 1 MiB"), "big: rc %d '%s'", r.rc,
          r.err);
    e2e_done(&r);
}

static void test_ports(void) {
    const char *run = e2e_path("run-ports");
    e2e_result r = e2e_runf(
        "train examples/w1.yaml --procs 2 --steps 1 --set observe.metrics_port=65535 --out %s",
        run);
    CHECK(r.rc == 2 && strstr(r.err, "observe.metrics_port 65535") && strstr(r.err, "65536"),
          "port 65535 x 2: rc %d '%s'", r.rc, r.err);
    struct stat st;
    CHECK(stat(run, &st) != 0, "port 65535 x 2: %s was created", run);
    e2e_done(&r);
}

static void test_compile_dist(void) {
    e2e_result r = e2e_run("compile examples/w1_dist.yaml");
    CHECK(r.rc == 2 && strstr(r.err, "examples/w1_dist.yaml:") &&
              strstr(r.err, "dist.procs is set, but tessel compile builds the step of one process"),
          "w1_dist stats: rc %d '%s'", r.rc, r.err);
    e2e_done(&r);
    r = e2e_run("compile examples/w1_dist.yaml --dump plan");
    CHECK(r.rc == 2 && strstr(r.err, "dist.procs"), "w1_dist plan: rc %d '%s'", r.rc, r.err);
    e2e_done(&r);
    r = e2e_run("compile examples/w1.yaml --set dist.zero=1 --dump memory");
    CHECK(r.rc == 2 && strstr(r.err, "--set: dist.zero is set"), "dist.zero: rc %d '%s'", r.rc,
          r.err);
    e2e_done(&r);
    /* the resolved config shows the dist keys as they are */
    r = e2e_run("compile examples/w1_dist.yaml --dump config");
    CHECK(r.rc == 0 && strstr(r.out, "  procs: 2\n") && strstr(r.out, "  zero: 2\n"),
          "w1_dist config: rc %d '%s'", r.rc, r.err);
    e2e_done(&r);
    /* at their defaults they are no reason to refuse */
    r = e2e_run("compile examples/w1.yaml --set dist.procs=1 --dump stats");
    CHECK(r.rc == 0, "dist.procs=1: rc %d '%s'", r.rc, r.err);
    e2e_done(&r);
}

int main(void) {
    if (!e2e_setup("config_limits", dir, sizeof dir)) return check_summary("e2e/config_limits");
    test_deep_and_large();
    test_ports();
    test_compile_dist();
    e2e_cleanup(dir);
    return check_summary("e2e/config_limits");
}
