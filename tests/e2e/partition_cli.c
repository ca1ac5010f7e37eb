/* partition_cli.c — `tessel compile --dump partition`: W3 cut into 2 and 4
 * stages on equal and unequal devices (a devices file), the cost-model
 * split against the even split, memory limits, and bad devices files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "e2e.h"

/* The number after `key` in text, or -1. */
static double after(const char *text, const char *key) {
    const char *p = strstr(text, key);
    return p ? atof(p + strlen(key)) : -1;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

int main(void) {
    char dir[64];
    if (!e2e_setup("partition", dir, sizeof dir)) return check_summary("e2e/partition_cli");
    const char *w3 = "compile examples/w3.yaml --set dist.microbatches=8 --dump partition";

    /* one device twice as fast at matrix work as the other (a rank with
     * twice the threads): the split gives it more layers and beats the
     * even split by the estimate */
    char unequal[256];
    snprintf(unequal, sizeof unequal, "%s", e2e_path("unequal.txt"));
    write_file(unequal, "# name gemm_gflops mem_gbps link_gbps [mem_mb]\n"
                        "fast 200 30 6\n"
                        "slow 100 15 6   # half of everything\n");
    e2e_result r = e2e_runf("%s --set dist.pipeline_stages=2 --set dist.devices=%s", w3, unequal);
    CHECK(r.rc == 0, "unequal: %s", r.err);
    const double speedup = after(r.out, "the chosen split is ");
    CHECK(speedup >= 1.25, "cost-model split vs even: %.2fx (want >= 1.25)\n%s", speedup, r.out);
    CHECK(strstr(r.out, "cuts: after op ") && strstr(r.out, "f32[1,256,512]"),
          "the cut is a residual stream of one micro-batch:\n%s", r.out);
    CHECK(strstr(r.out, "stage 1 ops") && strstr(r.out, "cross_entropy x1"), "ops listed:\n%s",
          r.out);
    /* the fast device's stage holds more ops than the slow one's */
    int ops0 = -1, ops1 = -1;
    const char *row0 = strstr(r.out, "\n0     fast"), *row1 = strstr(r.out, "\n1     slow");
    if (row0) sscanf(row0 + 11, "%d", &ops0);
    if (row1) sscanf(row1 + 11, "%d", &ops1);
    CHECK(ops0 > ops1 && ops1 > 0, "ops per stage %d %d\n%s", ops0, ops1, r.out);
    e2e_done(&r);

    /* equal devices: the even split is as good as it gets within 10 % */
    char equal[256];
    snprintf(equal, sizeof equal, "%s", e2e_path("equal.txt"));
    write_file(equal, "a 100 20 6\nb 100 20 6\nc 100 20 6\nd 100 20 6\n");
    r = e2e_runf("%s --set dist.pipeline_stages=4 --set dist.devices=%s", w3, equal);
    CHECK(r.rc == 0, "4 stages: %s", r.err);
    const double eq = after(r.out, "the chosen split is ");
    CHECK(eq >= 1.0 && eq < 1.6, "equal devices: %.2fx\n%s", eq, r.out);
    const double bubble = after(r.out, "bubble ");
    /* 1F1B, 4 stages, 8 micro-batches: (S-1)/(M+S-1) = 27 % when balanced */
    CHECK(bubble > 20 && bubble < 45, "bubble %.1f %%\n%s", bubble, r.out);
    e2e_done(&r);

    /* a memory limit below what the first stage's parameters need is
     * refused with the need; a generous one is kept */
    r = e2e_runf("%s --set dist.pipeline_stages=2 --set dist.devices=%s --set dist.max_mem_mb=100",
                 w3, equal);
    CHECK(r.rc != 0 && strstr(r.err, "no split into 2 stages fits the memory limits"), "limit: %s",
          r.err);
    e2e_done(&r);
    r = e2e_runf("%s --set dist.pipeline_stages=2 --set dist.devices=%s --set dist.max_mem_mb=4000",
                 w3, equal);
    CHECK(r.rc == 0 && strstr(r.out, "limit 4000 MiB"), "generous limit: %s%s", r.out, r.err);
    e2e_done(&r);

    /* measured speeds when no file is given */
    r = e2e_runf("%s --set dist.pipeline_stages=2", w3);
    CHECK(r.rc == 0 && strstr(r.out, "measured"), "measured: %s%s", r.out, r.err);
    e2e_done(&r);

    /* a bad devices file names its line */
    char bad[256];
    snprintf(bad, sizeof bad, "%s", e2e_path("bad.txt"));
    write_file(bad, "a 100 20 6\nb fast 20 6\n");
    r = e2e_runf("%s --set dist.pipeline_stages=2 --set dist.devices=%s", w3, bad);
    CHECK(r.rc != 0 && strstr(r.err, "bad.txt:2: expected `name gemm_gflops"), "bad file: %s",
          r.err);
    e2e_done(&r);
    /* more stages than places to cut */
    r = e2e_run("compile examples/w1.yaml --set dist.pipeline_stages=64 --dump partition");
    CHECK(r.rc != 0 && strstr(r.err, "64 stages need 63 cuts"), "too many stages: %s", r.err);
    e2e_done(&r);
    /* the plan dumps still refuse the pipeline keys (they build one process's step) */
    r = e2e_run("compile examples/w3.yaml --set dist.pipeline_stages=2 --dump stats");
    CHECK(r.rc != 0 && strstr(r.err, "dist.pipeline_stages is set"), "plan dump: %s", r.err);
    e2e_done(&r);

    /* tessel train runs one process per stage (tests/e2e/pipeline_train.c):
     * a single process is refused, naming the key and the way to run it */
    r = e2e_runf("train examples/w1.yaml --steps 1 --set dist.pipeline_stages=2 --out %s",
                 e2e_path("run"));
    CHECK(r.rc == 2 && strstr(r.err, "dist.pipeline_stages 2 runs one process per stage") &&
              strstr(r.err, "--procs 2"),
          "train: exit %d: %s", r.rc, r.err);
    e2e_done(&r);

    e2e_cleanup(dir);
    return check_summary("e2e/partition_cli");
}
