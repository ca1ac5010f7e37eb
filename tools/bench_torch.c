/* The PyTorch side of `tessel bench --compare-torch` (bench_torch.h): the
 * interpreter, the modes, and one run of the reference script through popen,
 * a separate process so its memory and threads are its own. */
#include "bench_torch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

static const struct {
    const char *mode, *label;
    int bf16, needs_2; /* autocast bf16; needs torch >= 2 (torch.compile) */
} modes[TS_TORCH_N_MODES] = {
    {"eager", "eager fp32", 0, 0},
    {"compile", "torch.compile fp32", 0, 1},
    {"compile_opt", "torch.compile fp32 + compiled optimizer step", 0, 1},
    {"bf16", "bf16 autocast", 1, 0},
    {"bf16_compile", "torch.compile bf16 autocast", 1, 1},
};

static int mode_index(const char *m) {
    for (int i = 0; m && i < TS_TORCH_N_MODES; i++)
        if (!strcmp(m, modes[i].mode)) return i;
    return -1;
}

int ts_torch_mode_valid(const char *mode) {
    return mode_index(mode) >= 0;
}

const char *ts_torch_mode_label(const char *mode) {
    int i = mode_index(mode);
    return i < 0 ? "unknown mode" : modes[i].label;
}

ts_status ts_torch_check_python(const char *python) {
    if (!python || !*python)
        return ts_fail(TS_ERR_INVALID, "bench: --torch-python: empty interpreter name");
    if (strchr(python, '\''))
        return ts_fail(TS_ERR_INVALID, "bench: the interpreter path may not contain a quote");
    if (strchr(python, '/')) {
        if (access(python, X_OK) == 0) return TS_OK;
    } else { /* a bare name, as the shell would find it on $PATH */
        const char *path = getenv("PATH");
        while (path && *path) {
            const char *end = strchr(path, ':');
            size_t len = end ? (size_t)(end - path) : strlen(path);
            char full[4096];
            if (len && len + strlen(python) + 2 < sizeof full) {
                snprintf(full, sizeof full, "%.*s/%s", (int)len, path, python);
                if (access(full, X_OK) == 0) return TS_OK;
            }
            path = end ? end + 1 : NULL;
        }
    }
    return ts_fail(TS_ERR_NOT_FOUND,
                   "bench: the PyTorch interpreter '%s' is not an executable file "
                   "(--torch-python)",
                   python);
}

/* A pclose/waitpid status as words: "exit 3", "killed by signal 9", or
 * "status -1" when the interpreter could not be waited for. */
static const char *wait_words(int st, char *buf, size_t n) {
    if (st == -1)
        snprintf(buf, n, "status -1");
    else if (WIFEXITED(st))
        snprintf(buf, n, "exit %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, n, "killed by signal %d", WTERMSIG(st));
    else
        snprintf(buf, n, "wait status %d", st);
    return buf;
}

ts_status ts_torch_version(const char *python, char *version, size_t n, int *major) {
    char cmd[4200], line[512];
    snprintf(cmd, sizeof cmd,
             "'%s' -c 'import torch; print(\"TORCH_VERSION\", torch.__version__)' 2>&1", python);
    FILE *f = popen(cmd, "r");
    if (!f) return ts_fail(TS_ERR_IO, "bench: cannot start the PyTorch interpreter '%s'", python);
    int found = 0;
    char last[256] = "";
    while (fgets(line, sizeof line, f)) {
        char v[64];
        if (sscanf(line, "TORCH_VERSION %63s", v) == 1) {
            snprintf(version, n, "%s", v);
            *major = atoi(v);
            found = 1;
        } else if (line[0] && line[0] != '\n')
            snprintf(last, sizeof last, "%.200s", line);
    }
    int rc = pclose(f);
    if (!found || rc != 0) {
        last[strcspn(last, "\n")] = 0;
        char how[48];
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "bench: the PyTorch interpreter '%s' cannot import torch (%s%s%s)", python,
                       rc != 0 ? wait_words(rc, how, sizeof how) : "no version printed",
                       last[0] ? ": " : "", last);
    }
    return TS_OK;
}

int ts_torch_pick_modes(const ts_bench_options *o, int major, const char **out) {
    const int bf16 = !strcasecmp(o->precision, "bf16");
    if (o->torch_mode) {
        out[0] = o->torch_mode;
        return 1;
    }
    /* torch 1.13's autocast fails on W1's LayerNorm; its target was set
     * against fp32 there anyway. fp16 autocast needs CUDA: fp32 modes. */
    const int w1_no_bf16 = !strcasecmp(o->workload, "W1") && major < 2;
    if (!o->torch_best) {
        out[0] = bf16 && !w1_no_bf16 ? "bf16" : "eager";
        return 1;
    }
    int n = 0;
    for (int i = 0; i < TS_TORCH_N_MODES; i++)
        if (modes[i].bf16 == (bf16 && !w1_no_bf16) && (!modes[i].needs_2 || major >= 2))
            out[n++] = modes[i].mode;
    return n;
}

ts_status ts_torch_run(const ts_bench_options *o, const char *mode, ts_bench_side *t) {
    if (strchr(o->python, '\'') || strchr(o->reference, '\''))
        return ts_fail(TS_ERR_INVALID, "bench: the reference path may not contain a quote");
    if (!ts_torch_mode_valid(mode)) return ts_fail(TS_ERR_INVALID, "bench: no mode '%s'", mode);
    char cmd[2048];
    /* Debian's torch links the generic BLAS: OpenBLAS must be what loads.
     * A PyPI wheel brings its own and ignores the path. */
    snprintf(cmd, sizeof cmd,
             "LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp '%s' '%s' --workload %s "
             "--mode %s --threads %d --min-steps 5 --min-time %g --budget 60 2>&1",
             o->python, o->reference, o->workload, mode, o->threads, o->torch_min_time);
    FILE *f = popen(cmd, "r");
    if (!f) return ts_fail(TS_ERR_IO, "bench: cannot start %s", o->python);
    char line[4096], last[256] = "";
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] && line[0] != '\n') snprintf(last, sizeof last, "%.200s", line);
        char *p = strstr(line, "RESULT"), *q = p ? strchr(p, ':') : NULL, unit[32];
        double tp, ms;
        if (!q || sscanf(q + 1, " %lf %31s median step %lf", &tp, unit, &ms) != 3) continue;
        char *rs = strstr(q, "peak RSS");
        if (rs) sscanf(rs, "peak RSS %lf", &t->rss_mb);
        t->throughput = tp;
        t->step_ms = ms;
        found = 1;
    }
    int rc = pclose(f);
    if (!found || rc != 0) {
        last[strcspn(last, "\n")] = 0;
        char how[48];
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "bench: the PyTorch reference failed in mode %s (%s%s%s); it needs "
                       "torch in %s and %s",
                       mode, rc != 0 ? wait_words(rc, how, sizeof how) : "no RESULT line",
                       last[0] ? ": " : "", last, o->python, o->reference);
    }
    return TS_OK;
}
