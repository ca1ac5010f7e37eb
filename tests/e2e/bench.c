/* `tessel bench` end to end: W1 with a few steps prints step time,
 * throughput, peak RSS and the GEMM share; --profile lists kernels; --json
 * appends a line that parses; --compare-torch alternates with a reference
 * (here a stand-in script that prints a RESULT line as torch_bench.py
 * does, so the test needs no PyTorch) and prints the ratio; W2, W5 and W4
 * run a step or few; unknown workloads and bad options exit 2. Runs $TESSEL_BIN from the repository
 * root. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "backends/cpu/dnnl_caps.h"
#include "check.h"
#include "e2e.h"

static const char *bin;
static char dir[64];

static void test_w1(void) {
    char args[512], json[128];
    snprintf(json, sizeof json, "%s/bench.jsonl", dir);
    snprintf(args, sizeof args, "bench --workload W1 --steps 3 --warmup 1 --profile --json %s",
             json);
    e2e_result r = e2e_run(args);
    CHECK(r.rc == 0, "bench W1: exit %d: %s", r.rc, r.err);
    double tp = 0, ms = 0, rss = 0, gemm = -1;
    const char *line = strstr(r.out, "tessel  W1:");
    CHECK(line && sscanf(line, "tessel  W1: %lf samples/s median step %lf ms peak RSS %lf MB", &tp,
                         &ms, &rss) == 3,
          "throughput, median step and peak RSS: %s", r.out);
    CHECK(tp > 0 && ms > 0 && rss > 0, "positive figures");
    const char *g = strstr(r.out, "GEMM/conv ");
    CHECK(g && sscanf(g, "GEMM/conv %lf %% of kernel time", &gemm) == 1 && gemm > 0 && gemm <= 100,
          "GEMM share of the step: %g", gemm);
    CHECK(strstr(r.out, "top kernels") && strstr(r.out, "matmul") && strstr(r.out, "(GEMM/conv)"),
          "--profile lists the kernels");
    /* The GEMM ceiling of W1's shapes in the same run, the step as a share of
     * it, and (with --profile) each shape's rate. */
    double ceil = 0, step = 0, share = 0;
    int shapes = 0;
    const char *c = strstr(r.out, "f32 GEMM ceiling");
    CHECK(c &&
              sscanf(c, "f32 GEMM ceiling %lf GFLOP/s (oneDNN %*s %d linear-layer GEMM shapes",
                     &ceil, &shapes) == 2 &&
              shapes == 8 && ceil > 0,
          "W1's ceiling over 8 GEMM shapes (3 layers x fwd, dW; 2 x dX): %s", c ? c : r.out);
    const char *st = c ? strstr(c, "step ") : NULL;
    /* printed to 0.1 each: the share lies between the extremes they allow */
    CHECK(st && sscanf(st, "step %lf GFLOP/s = %lf %%", &step, &share) == 2 && step > 0 &&
              share >= 100 * (step - 0.05) / (ceil + 0.05) - 0.05 &&
              share <= 100 * (step + 0.05) / (ceil - 0.05) + 0.05,
          "step GFLOP/s as a share of the ceiling: %g of %g = %g %%", step, ceil, share);
    CHECK(strstr(r.out, "fwd M   256 N  1024 K  2048 B^T x1:") &&
              strstr(r.out, "dW  M  1024 N  1024 K   256 A^T x1:"),
          "--profile: each shape of the ceiling: %s", r.out);
    printf("%s", r.out);
    e2e_done(&r);

    json_error_t err;
    char *text = e2e_slurp(json, NULL);
    json_t *j = json_loads(text, JSON_DISABLE_EOF_CHECK, &err);
    json_t *t = j ? json_object_get(j, "tessel") : NULL;
    CHECK(t && json_number_value(json_object_get(t, "throughput")) > 0 &&
              json_is_number(json_object_get(t, "gemm_share")) &&
              !strcmp(json_string_value(json_object_get(j, "workload")), "W1") &&
              json_number_value(json_object_get(j, "gemm_ceiling_gflops")) > 0,
          "--json line: %s", text);
    json_decref(j);
    free(text);
}

/* W2 (GRU) and W5 (GCN, full batch) with a few steps: the right unit,
 * positive figures, a finite falling-or-not loss. W4 (3D U-Net) takes about
 * 2 s a step plus compile on the shared 2-core machine: one step only. */
static void test_other_workloads(void) {
    static const struct {
        const char *wl, *args, *unit;
    } cases[] = {
        {"W2", "--steps 2 --warmup 1", "samples/s"},
        {"W5", "--steps 3 --warmup 1", "epochs/s"},
        {"W4", "--steps 1 --warmup 0", "samples/s"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[256], head[64], fmt[160];
        snprintf(args, sizeof args, "bench --workload %s %s", cases[i].wl, cases[i].args);
        e2e_result r = e2e_run(args);
        CHECK(r.rc == 0, "bench %s: exit %d: %s", cases[i].wl, r.rc, r.err);
        snprintf(head, sizeof head, "tessel  %s:", cases[i].wl);
        snprintf(fmt, sizeof fmt,
                 "tessel  %s: %%lf %s median step %%lf ms peak RSS %%lf MB loss %%lf", cases[i].wl,
                 cases[i].unit);
        double tp = 0, ms = 0, rss = 0, loss = NAN;
        const char *line = strstr(r.out, head);
        CHECK(line && sscanf(line, fmt, &tp, &ms, &rss, &loss) == 4, "%s figures in %s: %s",
              cases[i].wl, cases[i].unit, r.out);
        CHECK(tp > 0 && ms > 0 && rss > 0 && isfinite(loss), "%s: positive figures, loss %g",
              cases[i].wl, loss);
        printf("%s", r.out);
        e2e_done(&r);
    }
}

static void test_compare(void) {
    /* A stand-in for torch_bench.py: its RESULT line, as the real one prints it. */
    char ref[128], args[512];
    snprintf(ref, sizeof ref, "%s/fake_bench.py", dir);
    FILE *f = fopen(ref, "w");
    if (f) {
        fputs("import sys\n"
              "print('== W1 finance time-series MLP | mode=eager')\n"
              "print('RESULT W1 eager t=2 : 5000.00 samples/s  median step 51.2 ms (min 50.0 "
              "max 53.0, n=5)  peak RSS 344 MB  self cpu 2.00 cores')\n",
              f);
        fclose(f);
    }
    snprintf(args, sizeof args,
             "bench --workload W1 --steps 2 --warmup 1 --compare-torch --rounds 2 --reference %s",
             ref);
    e2e_result r = e2e_run(args);
    CHECK(r.rc == 0, "compare: exit %d: %s", r.rc, r.err);
    double tp = 0, ms = 0, ratio = 0;
    const char *p = strstr(r.out, "pytorch W1:"), *q = strstr(r.out, "ratio   W1:");
    CHECK(p && sscanf(p, "pytorch W1: %lf samples/s median step %lf ms", &tp, &ms) == 2 &&
              tp == 5000 && ms == 51.2,
          "reference figures parsed: %s", r.out);
    CHECK(q && sscanf(q, "ratio   W1: throughput %lfx", &ratio) == 1 && ratio > 0, "ratio printed");
    CHECK(strstr(r.out, "round 1/2") && strstr(r.out, "round 2/2"), "two alternating rounds");
    e2e_done(&r);

    /* --precision bf16: the reference runs bf16 autocast (its --mode), except
     * for W1 (fp32: torch 1.13's autocast fails on its LayerNorm). */
    char ref2[128];
    snprintf(ref2, sizeof ref2, "%s/fake_mode.py", dir);
    f = fopen(ref2, "w");
    if (f) {
        fputs("import sys\n"
              "m = sys.argv[sys.argv.index('--mode') + 1]\n"
              "tp = {'eager': 5000.0, 'bf16': 7000.0}[m]\n"
              "print(f'RESULT x {m} t=2 : {tp:.2f} samples/s  median step 51.2 ms (min 50.0 "
              "max 53.0, n=5)  peak RSS 344 MB')\n",
              f);
        fclose(f);
    }
    const struct {
        const char *wl, *mode;
        double tp;
    } modes[] = {{"W2", "bf16 autocast", 7000}, {"W1", "eager fp32", 5000}};
    /* Both workloads have matmuls, which run in bf16 only where oneDNN has them (AVX-512). */
    if (!ts_cpu_supports_dtype_gemm(TS_BF16))
        printf("bf16 benches skipped: %s\n", ts_cpu_dtype_gemm_why(TS_BF16));
    for (int i = 0; i < 2 && ts_cpu_supports_dtype_gemm(TS_BF16); i++) {
        snprintf(args, sizeof args,
                 "bench --workload %s --precision bf16 --steps 1 --warmup 0 --compare-torch "
                 "--rounds 1 --reference %s",
                 modes[i].wl, ref2);
        r = e2e_run(args);
        char head[32], want[64];
        snprintf(head, sizeof head, "pytorch %s:", modes[i].wl);
        snprintf(want, sizeof want, "PyTorch %s", modes[i].mode);
        p = strstr(r.out, head);
        CHECK(r.rc == 0 && p && sscanf(p + strlen(head), "%lf", &tp) == 1 && tp == modes[i].tp &&
                  strstr(r.out, want) && strstr(r.out, ", bf16"),
              "bf16 bench of %s against %s: exit %d: %s %s", modes[i].wl, modes[i].mode, r.rc,
              r.out, r.err);
        e2e_done(&r);
    }

    /* A failing reference is an error that says what it needs. */
    snprintf(args, sizeof args,
             "bench --workload W1 --steps 1 --compare-torch --reference %s/none.py", dir);
    r = e2e_run(args);
    /* python3 exits 2 for a script it cannot open: the status is decoded. */
    CHECK(r.rc == 2 && strstr(r.err, "the PyTorch reference failed in mode") &&
              strstr(r.err, "(exit 2: "),
          "missing reference: %d %s", r.rc, r.err);
    e2e_done(&r);
}

static void test_errors(void) {
    struct {
        const char *args, *msg;
    } cases[] = {
        {"bench --workload gpt2-124m --compare-torch --steps 1",
         "the PyTorch reference has no gpt2-124m workload"},
        {"bench --workload W9", "unknown workload 'W9'"},
        {"bench --workload W1 --precision fp8", "precision 'fp8' is unknown"},
        {"bench --workload W1 --steps 0", "--steps: expected a whole number"},
        {"bench --workload W1 --frobnicate", "unknown option '--frobnicate'"},
        {"bench --workload", "missing value for '--workload'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        e2e_result r = e2e_run(cases[i].args);
        CHECK(r.rc == 2 && strstr(r.err, "tessel: error: ") && strstr(r.err, cases[i].msg),
              "'%s': exit %d, stderr '%s'", cases[i].args, r.rc, r.err);
        e2e_done(&r);
    }
}

int main(void) {
    bin = e2e_setup("bench", dir, sizeof dir);
    if (!bin) return check_summary("e2e/bench");
    test_w1();
    test_compare();
    test_other_workloads();
    test_errors();
    e2e_cleanup(dir);
    return check_summary("e2e/bench");
}
