/* `tessel bench --compare-torch` with a chosen interpreter and mode:
 * --torch-python, --torch-mode and --torch-best. The reference is a
 * stand-in for torch_bench.py that imports torch (so the interpreter must
 * really have it) and prints a RESULT line per mode, faster for some modes
 * than others, so the test knows which mode is the fastest. It runs with
 * Debian's /usr/bin/python3 (torch 1.13: eager and bf16 only) and with a
 * wrapper that reports torch 2.99 and runs the same Python, which is how the
 * compiled modes are chosen without torch 2 installed. Errors: a bad mode,
 * a missing interpreter, one without torch, a compiled mode on torch 1.x,
 * the options without --compare-torch: exit 2 naming what is wrong.
 * Exits 77 (skipped) if /usr/bin/python3 cannot import torch. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/dnnl_caps.h"
#include "check.h"
#include "e2e.h"

static char dir[64], ref[128], torch2[128], json[128];

static void write_file(const char *path, const char *text, int exec) {
    FILE *f = fopen(path, "w");
    CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0, "write %s", path);
    if (exec) e2e_sh("chmod +x %s", path);
}

static void setup_files(void) {
    snprintf(ref, sizeof ref, "%s/fake_bench.py", dir);
    snprintf(torch2, sizeof torch2, "%s/torch2-python", dir);
    snprintf(json, sizeof json, "%s/bench.jsonl", dir);
    write_file(ref,
               "import os, sys, torch\n"
               "m = sys.argv[sys.argv.index('--mode') + 1]\n"
               "tp = {'eager': 5000.0, 'compile': 6500.0, 'compile_opt': 6000.0,\n"
               "      'bf16': 7000.0, 'bf16_compile': 9000.0}[m]\n"
               "c = os.environ.get('FAKE_TORCH_CALLS')  # counts the runs: the first is slow\n"
               "if c:\n"
               "    n = int(open(c).read()) if os.path.exists(c) else 0\n"
               "    open(c, 'w').write(str(n + 1))\n"
               "    tp = tp / 3 if n == 0 else tp\n"
               "print(f'RESULT x {m} t=2 : {tp:.2f} samples/s  median step {256e3 / tp:.1f} ms "
               "(min 1 max 2, n=5)  peak RSS 344 MB')\n",
               0);
    /* An interpreter that says it has torch 2.99 and otherwise is Debian's. */
    write_file(torch2,
               "#!/bin/sh\n"
               "if [ \"$1\" = -c ]; then echo 'TORCH_VERSION 2.99.0'; exit 0; fi\n"
               "exec /usr/bin/python3 \"$@\"\n",
               1);
}

/* The JSON file's last line, parsed (NULL if absent or not JSON); *text: the file, for the
 * caller to free, and *last: that line in it, for messages. */
static json_t *last_json(char **text, const char **last) {
    char *nl;
    *text = e2e_slurp(json, NULL);
    *last = *text ? *text : "";
    while ((nl = strchr(*last, '\n')) && nl[1]) *last = nl + 1;
    json_error_t err;
    return *text ? json_loads(*last, JSON_DISABLE_EOF_CHECK, &err) : NULL;
}

/* Round k of `rounds`'s line: tessel's median step and the compile mode's step, in ms. */
static int round_line(const char *out, int k, int rounds, double *tessel_ms, double *compile_ms) {
    char key[32];
    snprintf(key, sizeof key, "round %d/%d: tessel", k, rounds);
    const char *q = strstr(out, key), *c = q ? strstr(q, "compile ") : NULL;
    return q && c && sscanf(q + strlen(key), "%lf", tessel_ms) == 1 &&
           sscanf(c + 8, "%lf", compile_ms) == 1;
}

/* The last JSON line: the fastest mode, the torch version, the modes run, and each round's own
 * ratio (only with 2 rounds or more: `rounds` of them, each within [lo, hi] by 2 %). */
static void check_json(const char *mode, const char *version_prefix, size_t n_modes, size_t rounds,
                       double lo, double hi) {
    char *text;
    const char *last;
    json_t *j = last_json(&text, &last);
    json_t *t = j ? json_object_get(j, "torch") : NULL;
    const char *m = json_string_value(json_object_get(t, "mode"));
    const char *v = json_string_value(json_object_get(t, "version"));
    CHECK(m && !strcmp(m, mode) && v && !strncmp(v, version_prefix, strlen(version_prefix)) &&
              json_array_size(json_object_get(t, "modes")) == n_modes,
          "JSON torch mode %s, version %s*, %zu modes: %s", mode, version_prefix, n_modes, last);
    json_t *rr = j ? json_object_get(j, "round_ratios") : NULL;
    int ok = rounds < 2 ? rr == NULL : json_array_size(rr) == rounds;
    for (size_t k = 0; ok && rounds >= 2 && k < rounds; k++) {
        double v = json_real_value(json_array_get(rr, k));
        ok = v > 0.98 * lo && v < 1.02 * hi;
    }
    CHECK(ok, "JSON round_ratios: %zu of them within %.3f to %.3f: %s", rounds, lo, hi, last);
    json_decref(j);
    free(text);
}

/* Debian's torch 1.13: --torch-best runs eager only (bf16 for bf16 except
 * W1); an explicit compiled mode is refused, naming the version. */
static void test_debian(void) {
    e2e_result r = e2e_runf("bench --workload W1 --steps 1 --warmup 0 --compare-torch --torch-best "
                            "--reference %s --rounds 1 --json %s",
                            ref, json);
    CHECK(r.rc == 0 && strstr(r.out, "PyTorch eager fp32 (mode eager; torch 1.") &&
              !strstr(r.out, "torch mode compile"),
          "Debian torch, best of fp32 modes: eager only: %d %s %s", r.rc, r.out, r.err);
    e2e_done(&r);
    check_json("eager", "1.", 1, 1, 0, 0);

    if (ts_cpu_supports_dtype_gemm(TS_BF16)) {
        r = e2e_runf("bench --workload W2 --precision bf16 --steps 1 --warmup 0 --compare-torch "
                     "--torch-best --reference %s --rounds 1",
                     ref);
        CHECK(r.rc == 0 && strstr(r.out, "PyTorch bf16 autocast (mode bf16; torch 1."),
              "Debian torch, best of bf16 modes: bf16 autocast: %d %s %s", r.rc, r.out, r.err);
        e2e_done(&r);
    } else {
        printf("W2 bf16 bench skipped: %s\n", ts_cpu_dtype_gemm_why(TS_BF16));
    }

    r = e2e_runf("bench --workload W1 --steps 1 --compare-torch --torch-mode compile "
                 "--reference %s",
                 ref);
    CHECK(r.rc == 2 && strstr(r.err, "--torch-mode compile needs torch >= 2") &&
              strstr(r.err, "'/usr/bin/python3' has torch 1."),
          "compiled mode on torch 1.13: %d %s", r.rc, r.err);
    e2e_done(&r);
}

/* The rounds' own ratios pair each round's tessel step with the torch step run right after it:
 * a reference whose first run is three times as slow as its second, two rounds; the JSON's
 * round_ratios, in round order, are the round lines' compile ms over tessel ms. */
static void test_round_pairing(void) {
    char calls[160];
    snprintf(calls, sizeof calls, "%s/calls", dir);
    remove(calls);
    setenv("FAKE_TORCH_CALLS", calls, 1);
    e2e_result r = e2e_runf("bench --workload W1 --steps 1 --warmup 0 --compare-torch "
                            "--torch-mode compile --torch-python %s --reference %s --rounds 2 "
                            "--json %s",
                            torch2, ref, json);
    unsetenv("FAKE_TORCH_CALLS");
    CHECK(r.rc == 0, "two rounds, a slow first reference run: %d %s", r.rc, r.err);
    double want[2] = {0, 0}, ms[2] = {0, 0};
    for (int k = 1; k <= 2; k++) {
        double t = 0;
        CHECK(round_line(r.out, k, 2, &t, &ms[k - 1]) && t > 0, "round %d's line: %s", k, r.out);
        want[k - 1] = t > 0 ? ms[k - 1] / t : 0;
    }
    CHECK(ms[0] > 2.9 * ms[1] && ms[0] < 3.1 * ms[1], "the stub's first run is 3x slower: %s",
          r.out);
    e2e_done(&r);
    char *text;
    const char *last;
    json_t *j = last_json(&text, &last);
    json_t *rr = json_object_get(j, "round_ratios");
    int ok = json_array_size(rr) == 2;
    for (int k = 0; ok && k < 2; k++) {
        double v = json_real_value(json_array_get(rr, (size_t)k));
        ok = fabs(v - want[k]) < 0.02 * want[k];
    }
    CHECK(ok, "round_ratios in round order, %.3f then %.3f: %s", want[0], want[1], last);
    json_decref(j);
    free(text);
}

/* A ratio printed with two decimals ("%.2fx") against the value computed from the round lines:
 * within 2 % and half a unit of the last digit (under ASan tessel's step is slow and the ratio
 * near 0.24, where the rounding alone is 2 %). */
static int near_printed(double printed, double x) {
    return fabs(printed - x) <= 0.02 * x + 0.005;
}

/* "torch 2.99": every mode of the precision, the ratio against the fastest. */
static void test_best(void) {
    e2e_result r = e2e_runf("bench --workload W1 --steps 1 --warmup 0 --compare-torch --torch-best "
                            "--torch-python %s --reference %s --rounds 2 --json %s",
                            torch2, ref, json);
    double tp = 0;
    const char *p = strstr(r.out, "pytorch W1:");
    CHECK(r.rc == 0 && p && sscanf(p, "pytorch W1: %lf", &tp) == 1 && tp == 6500 &&
              strstr(r.out, "PyTorch torch.compile fp32 (mode compile, the fastest of eager "
                            "compile compile_opt; torch 2.99.0)") &&
              strstr(r.out, "torch mode compile_opt") && strstr(r.out, "round 2/2"),
          "best of three fp32 modes is compile at 6500: %d %s %s", r.rc, r.out, r.err);
    /* the rounds' own ratios: each round's compile step over tessel's, range and median */
    double lo = 1e300, hi = 0, want_lo, want_hi, want_med;
    for (int k = 1; k <= 2; k++) {
        double t = 0, ms = 0;
        CHECK(round_line(r.out, k, 2, &t, &ms), "round %d's line: %s", k, r.out);
        if (t > 0 && ms / t < lo) lo = ms / t;
        if (t > 0 && ms / t > hi) hi = ms / t;
    }
    const char *q = strstr(r.out, "rounds  W1: the rounds' own ratios ");
    CHECK(q &&
              sscanf(q, "rounds  W1: the rounds' own ratios %lfx to %lfx, median %lfx", &want_lo,
                     &want_hi, &want_med) == 3 &&
              near_printed(want_lo, lo) && near_printed(want_hi, hi) && want_med == want_lo &&
              strstr(q, "(2 rounds)"),
          "the rounds' ratios %.3f to %.3f: %s", lo, hi, q ? q : r.out);
    e2e_done(&r);
    check_json("compile", "2.99", 3, 2, lo, hi);

    if (ts_cpu_supports_dtype_gemm(TS_BF16)) {
        r = e2e_runf("bench --workload W1 --precision bf16 --steps 1 --warmup 0 --compare-torch "
                     "--torch-best --torch-python %s --reference %s --rounds 1",
                     torch2, ref);
        CHECK(r.rc == 0 && strstr(r.out, "(mode bf16_compile, the fastest of bf16 bf16_compile;"),
              "bf16 on torch 2: W1 too, best of the two autocast modes: %d %s %s", r.rc, r.out,
              r.err);
        e2e_done(&r);
    } else {
        printf("W1 bf16 bench skipped: %s\n", ts_cpu_dtype_gemm_why(TS_BF16));
    }

    r = e2e_runf("bench --workload W1 --steps 1 --warmup 0 --compare-torch --torch-mode "
                 "compile_opt --torch-python %s --reference %s --rounds 1",
                 torch2, ref);
    CHECK(r.rc == 0 && strstr(r.out, "(mode compile_opt; torch 2.99.0)") &&
              strstr(r.out, "pytorch W1:     6000.0"),
          "one explicit mode: %d %s %s", r.rc, r.out, r.err);
    e2e_done(&r);
}

static void test_errors(void) {
    struct {
        const char *args, *msg;
    } cases[] = {
        {"bench --workload W1 --compare-torch --torch-mode fast",
         "--torch-mode: expected eager, compile, compile_opt, bf16 or bf16_compile, got 'fast'"},
        {"bench --workload W1 --compare-torch --torch-mode eager --torch-best",
         "--torch-mode and --torch-best exclude each other"},
        {"bench --workload W1 --torch-best", "need --compare-torch"},
        {"bench --workload W1 --torch-python /usr/bin/python3", "need --compare-torch"},
        {"bench --workload W1 --compare-torch --torch-python /nonexistent/python9",
         "the PyTorch interpreter '/nonexistent/python9' is not an executable file"},
        {"bench --workload W1 --compare-torch --torch-python no-such-python-for-tessel",
         "the PyTorch interpreter 'no-such-python-for-tessel' is not an executable file"},
        {"bench --workload W1 --compare-torch --torch-best --torch-python /bin/false",
         "the PyTorch interpreter '/bin/false' cannot import torch (exit 1)"},
        {"bench --workload W1 --compare-torch --torch-mode", "missing value for '--torch-mode'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        e2e_result r = e2e_run(cases[i].args);
        CHECK(r.rc == 2 && strstr(r.err, "tessel: error: ") && strstr(r.err, cases[i].msg),
              "'%s': exit %d, stderr '%s'", cases[i].args, r.rc, r.err);
        e2e_done(&r);
    }
}

int main(void) {
    if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
        printf("skipped: /usr/bin/python3 cannot import torch (python3-torch)\n");
        return 77;
    }
    if (!e2e_setup("bench_torch", dir, sizeof dir)) return check_summary("e2e/bench_torch");
    setup_files();
    test_errors();
    test_debian();
    test_best();
    test_round_pairing();
    e2e_cleanup(dir);
    return check_summary("e2e/bench_torch");
}
