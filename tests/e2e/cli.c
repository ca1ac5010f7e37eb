/* The `tessel` command line end to end: dumps of the benchmark configs,
 * exit codes and messages for bad input, and training runs whose loss
 * falls and repeats exactly. Runs $TESSEL_BIN from the repository root. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"

static const char *bin;
static char dir[64];

static const char *write_file(const char *name, const char *text) {
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return path;
}

/* "arena  N bytes" and "naive sum  N bytes" of a --dump memory. */
static void memory_summary(const char *out, const char *what) {
    unsigned long long arena = 0, naive = 0;
    const char *a = strstr(out, "arena "), *n = strstr(out, "naive sum ");
    CHECK(a && sscanf(a, "arena %llu bytes", &arena) == 1, "%s: arena line", what);
    CHECK(n && sscanf(n, "naive sum %llu bytes", &naive) == 1, "%s: naive line", what);
    CHECK(arena > 0 && arena < naive, "%s: arena %llu < naive %llu", what, arena, naive);
    printf("%s: arena %llu bytes, naive sum %llu bytes (%.3f)\n", what, arena, naive,
           naive ? (double)arena / (double)naive : 0.0);
}

static void test_basics(void) {
    e2e_result r = e2e_run("version");
    CHECK(r.rc == 0 && !strncmp(r.out, "tessel ", 7), "version: %d '%s'", r.rc, r.out);
    e2e_done(&r);
    r = e2e_run("help");
    CHECK(r.rc == 0 && strstr(r.out, "usage: tessel") && strstr(r.out, "--dump"), "help");
    /* help's --dump-after list is the pipeline's passes, in order (the error for an unknown
     * pass lists them from the pipeline itself) */
    char listed[1024] = "", *w = listed;
    const char *h = strstr(r.out, "that pass of the pipeline:");
    for (h = h ? strchr(h, '\n') : NULL; h && *h && *h != ';'; h++)
        if (*h != ' ' && *h != '\n' && w < listed + sizeof listed - 1) *w++ = *h;
    *w = 0;
    e2e_done(&r);
    r = e2e_run("compile examples/w1.yaml --dump-after nope");
    char piped[1024] = "";
    w = piped;
    h = strstr(r.err, "(passes: ");
    for (h = h ? h + 9 : NULL; h && *h && *h != ')'; h++)
        if (*h != ' ' && w < piped + sizeof piped - 1) *w++ = *h;
    *w = 0;
    CHECK(r.rc == 2 && *piped && !strcmp(listed, piped),
          "help lists the passes '%s', the pipeline "
          "has '%s'",
          listed, piped);
    e2e_done(&r);
    r = e2e_run("compile --help");
    CHECK(r.rc == 0 && strstr(r.out, "usage: tessel"), "--help");
    e2e_done(&r);
    r = e2e_run("");
    CHECK(r.rc == 2 && strstr(r.err, "usage: tessel"), "no command: %d", r.rc);
    e2e_done(&r);
    r = e2e_run("frobnicate");
    CHECK(r.rc == 2 && strstr(r.err, "tessel: error: unknown command 'frobnicate'"), "unknown "
                                                                                     "command");
    e2e_done(&r);
}

static void test_compile_dumps(void) {
    e2e_result r = e2e_run("compile examples/w1.yaml --dump ir");
    CHECK(r.rc == 0 && strstr(r.out, "\"net.0.weight\"") && strstr(r.out, "f32[256,64,32]"),
          "w1 ir: %d %s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_run("compile examples/w1.yaml --dump plan");
    CHECK(r.rc == 0 && strstr(r.out, " instructions, ") && strstr(r.out, "matmul"),
          "w1 plan: %d %s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_run("compile examples/w1.yaml --dump memory");
    CHECK(r.rc == 0, "w1 memory: %s", r.err);
    memory_summary(r.out, "W1");
    e2e_done(&r);
    r = e2e_run("compile examples/w1.yaml");
    CHECK(r.rc == 0 && strstr(r.out, "arena / naive") && strstr(r.out, "flops per step"),
          "default dump is stats: %s", r.err);
    e2e_done(&r);

    /* A small GPT, with every dump in one run. */
    r = e2e_run("compile examples/tiny_gpt.yaml --set model.n_layers=1 --dump ir --dump plan "
                "--dump=memory --dump stats --dump config");
    CHECK(r.rc == 0, "gpt dumps: %s", r.err);
    CHECK(strstr(r.out, "== ir ==") && strstr(r.out, "\"blocks.0.attn.c_attn.weight\"") &&
              !strstr(r.out, "blocks.1."),
          "gpt ir with one block");
    CHECK(strstr(r.out, "== plan ==") && strstr(r.out, "== memory ==") &&
              strstr(r.out, "== stats ==") && strstr(r.out, "n_layers: 1"),
          "gpt plan, memory, stats and config");
    e2e_done(&r);

    /* The full W3 compiles in a few seconds; once. */
    r = e2e_run("compile examples/w3.yaml --dump memory");
    CHECK(r.rc == 0, "w3 memory: %s", r.err);
    memory_summary(r.out, "W3");
    e2e_done(&r);

    /* --dump config loads back to the same config. */
    r = e2e_run("compile examples/w3.yaml --set train.lr=1.5e-4 --dump config");
    CHECK(r.rc == 0 && strstr(r.out, "lr: 0.00015"), "config dump");
    const char *path = write_file("resolved.yaml", r.out);
    char args[256];
    snprintf(args, sizeof args, "compile %s --dump config", path);
    e2e_result r2 = e2e_run(args);
    CHECK(r2.rc == 0 && !strcmp(r.out, r2.out), "resolved config reads back the same");
    e2e_done(&r);
    e2e_done(&r2);
}

static void test_errors(void) {
    e2e_result r = e2e_run("compile examples/w1.yaml --set train.lrr=3 --dump ir");
    CHECK(r.rc == 2, "bad key: exit %d", r.rc);
    CHECK(strstr(r.err, "tessel: error: ") && strstr(r.err, "did you mean 'train.lr'?"),
          "bad key message: %s", r.err);
    CHECK(!*r.out, "nothing on stdout after an error");
    e2e_done(&r);

    const char *bad = write_file("bad.yaml", "model:\n  preset: w1\ntrain:\n  lr: fast\n");
    char args[256];
    snprintf(args, sizeof args, "train %s", bad);
    r = e2e_run(args);
    CHECK(r.rc == 2 && strstr(r.err, "bad.yaml:4:7: train.lr: expected a number, got 'fast'"),
          "type error: %d %s", r.rc, r.err);
    e2e_done(&r);
    const char *broken = write_file("broken.yaml", "model:\n  preset: [w1\n");
    snprintf(args, sizeof args, "compile %s", broken);
    r = e2e_run(args);
    CHECK(r.rc == 2 && strstr(r.err, "malformed YAML"), "malformed: %d %s", r.rc, r.err);
    e2e_done(&r);

    struct {
        const char *args, *msg;
    } cases[] = {
        {"compile no/such.yaml", "cannot open config 'no/such.yaml'"},
        {"compile", "missing CONFIG.yaml"},
        {"compile examples/w1.yaml examples/w3.yaml", "takes one config file"},
        {"compile examples/w1.yaml --dump xml", "unknown kind 'xml'"},
        {"compile examples/w1.yaml --dump", "--dump needs a value"},
        {"compile examples/w1.yaml --steps 3", "unknown option '--steps'"},
        {"train examples/w1.yaml --steps many", "train.steps: expected an integer, got 'many'"},
        {"train examples/w1.yaml --set model.ctx=3", "model.ctx is not a key of mlp models"},
        {"compile examples/w3.yaml --set model.n_heads=5", "not divisible by model.n_heads 5"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        r = e2e_run(cases[i].args);
        CHECK(r.rc == 2 && strstr(r.err, "tessel: error: ") && strstr(r.err, cases[i].msg),
              "'%s': exit %d, stderr '%s'", cases[i].args, r.rc, r.err);
        e2e_done(&r);
    }
}

/* Losses of the "step N/M  loss X" lines; returns how many. */
static int losses(const char *out, double *loss, int max) {
    int n = 0;
    for (const char *p = out; p && *p && n < max; p = strchr(p, '\n'), p = p ? p + 1 : p) {
        long long s, total;
        if (sscanf(p, "step %lld/%lld loss %lf", &s, &total, &loss[n]) == 3) n++;
    }
    return n;
}

static void check_training(const char *args, const char *unit, int steps) {
    e2e_result r = e2e_run(args);
    double loss[256], again[256];
    int n = losses(r.out, loss, 256);
    CHECK(r.rc == 0, "%s: exit %d: %s", args, r.rc, r.err);
    CHECK(n == steps, "%s: %d step lines, expected %d", args, n, steps);
    CHECK(strstr(r.out, unit) && strstr(r.out, "done: "), "%s: throughput in %s", args, unit);
    if (n == steps && n > 1) {
        CHECK(loss[n - 1] < 0.8 * loss[0], "%s: loss %g -> %g should fall", args, loss[0],
              loss[n - 1]);
        printf("%s: loss %.4f -> %.4f\n", args, loss[0], loss[n - 1]);
    }
    /* Same config and seed: the same losses, bit for bit. */
    e2e_result r2 = e2e_run(args);
    int n2 = losses(r2.out, again, 256);
    CHECK(n2 == n && !memcmp(loss, again, (size_t)n * sizeof *loss), "%s: rerun repeats", args);
    e2e_done(&r);
    e2e_done(&r2);
}

static void test_train(void) {
    check_training("train examples/tiny_gpt.yaml --steps 30 --set model.n_layers=1", "tokens/s",
                   30);
    check_training("train examples/w1.yaml --steps 30 --set model.batch=32 --set model.window=8 "
                   "--set model.features=8 --set model.hidden=64 --set train.threads=1",
                   "samples/s", 30);
}

int main(void) {
    bin = e2e_setup("cli", dir, sizeof dir);
    if (!bin) return check_summary("e2e/cli");
    test_basics();
    test_compile_dumps();
    test_errors();
    test_train();
    e2e_cleanup(dir);
    return check_summary("e2e/cli");
}
