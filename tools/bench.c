/* tessel bench: training-step throughput of a benchmark workload, with the
 * PyTorch reference side by side (bench_step.c and bench_dist.c do the work). */
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "dist_cli.h"
#include "bench_compress.h"
#include "bench_cuda.h"
#include "bench_dist.h"
#include "bench_step.h"
#include "bench_torch.h"

static const char usage[] =
    "usage: tessel bench --workload W1|W2|W3|W4|W5|gpt2-124m [--steps N] [--threads N] [--warmup "
    "N]\n"
    "                    [--precision fp32|bf16|fp16] [--profile] [--no-fuse] [--fused-update]\n"
    "                    [--json FILE]\n"
    "                    [--compare-torch [--rounds N] [--reference torch_bench.py]\n"
    "                     [--torch-python CMD] [--torch-mode eager|compile|compile_opt|bf16|"
    "bf16_compile | --torch-best]]\n"
    "       tessel bench --workload W1|W3 --procs N [--threads N] [--steps N] [--rounds N]\n"
    "                    [--per-rank-batch] [--zero [0|1|2|3] [--private-params]]\n"
    "                    [--bucket-mb M] [--profile]\n"
    "                    (N data-parallel processes against 1)\n"
    "       tessel bench --workload W1|W3 --procs N --compress topk|powersgd [--threads N]\n"
    "                    [--power-iters N] [--steps N] [--rounds N] (compressed against the dense\n"
    "                    all-reduce; --power-iters: powersgd's dist.compress_power_iters)\n"
    "       tessel bench --workload W1|W3|gpt2-124m --backend cuda [--steps N] [--warmup N]\n"
    "                    [--precision fp32|bf16] [--json FILE] [--profile] (on the GPU, "
    "docs/cuda.md)\n";

/* A positive integer option value. */
static int count(const char *opt, const char *v, int *out) {
    char *end;
    long n = strtol(v, &end, 10);
    if (end == v || *end || n < 1 || n > 1000000)
        return cli_error(CLI_USAGE, "%s: expected a whole number from 1 to 1000000, got '%s'", opt,
                         v);
    *out = (int)n;
    return CLI_OK;
}

int cli_bench(int argc, char **argv) {
    if (argc && !strcmp(argv[0], "collectives")) return tessel_cmd_bench_collectives(argc, argv);
    ts_bench_options o = ts_bench_options_default();
    int rc = CLI_OK, procs = 1, python_set = 0, per_rank_batch = 0, threads_set = 0, zero = 0,
        private_params = 0, steps_set = 0, power_iters = 0;
    double bucket_mb = 0;
    const char *compress = NULL, *backend = NULL;
    static const char *const with_value[] = {
        "--workload",     "--precision",  "--json",    "--reference",  "--steps",
        "--threads",      "--rounds",     "--warmup",  "--procs",      "--compress",
        "--torch-python", "--torch-mode", "--backend", "--power-iters"};
    for (int i = 0; i < argc && rc == CLI_OK; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        char name[64];
        snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
        if (!strcmp(a, "--compare-torch")) {
            o.compare_torch = 1;
            continue;
        }
        if (!strcmp(a, "--torch-best")) {
            o.torch_best = 1;
            continue;
        }
        if (!strcmp(a, "--profile")) {
            o.profile = 1;
            continue;
        }
        if (!strcmp(a, "--private-params")) {
            private_params = 1;
            continue;
        }
        if (!strcmp(a, "--per-rank-batch")) {
            per_rank_batch = 1;
            continue;
        }
        if (!strcmp(name, "--zero")) { /* --zero alone: 1; --zero 2 or --zero=2: that stage */
            const char *v = eq                                              ? eq + 1
                            : i + 1 < argc && strncmp(argv[i + 1], "--", 2) ? argv[++i]
                                                                            : "1";
            if (strlen(v) != 1 || v[0] < '0' || v[0] > '3')
                return cli_error(CLI_USAGE, "bench: --zero: expected 0, 1, 2 or 3, got '%s'\n%s", v,
                                 usage);
            zero = v[0] - '0';
            continue;
        }
        if (!strcmp(name, "--bucket-mb")) {
            const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : "";
            char *end;
            bucket_mb = strtod(v, &end);
            if (end == v || *end || !(bucket_mb > 0) || bucket_mb > 1e6)
                return cli_error(CLI_USAGE,
                                 "bench: --bucket-mb: expected MiB in (0, 1e6], got '%s'", v);
            continue;
        }
        if (!strcmp(a, "--no-fuse")) {
            o.no_fuse = 1;
            continue;
        }
        if (!strcmp(a, "--fused-update")) {
            o.fused_update = 1;
            continue;
        }
        int known = 0;
        for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++)
            known |= !strcmp(name, with_value[k]);
        if (!known)
            return cli_error(CLI_USAGE, "bench: %s '%s'\n%s",
                             strncmp(a, "--", 2) ? "unexpected argument" : "unknown option", a,
                             usage);
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v) return cli_error(CLI_USAGE, "bench: missing value for '%s'\n%s", name, usage);
        if (!strcmp(name, "--workload"))
            o.workload = v;
        else if (!strcmp(name, "--precision"))
            o.precision = v;
        else if (!strcmp(name, "--json"))
            o.json_path = v;
        else if (!strcmp(name, "--reference"))
            o.reference = v;
        else if (!strcmp(name, "--torch-python"))
            o.python = v, python_set = 1;
        else if (!strcmp(name, "--torch-mode"))
            o.torch_mode = v;
        else if (!strcmp(name, "--steps"))
            rc = count(name, v, &o.steps), steps_set = 1;
        else if (!strcmp(name, "--backend")) /* the GPU (bench_cuda.c) */
            backend = v;
        else if (!strcmp(name, "--threads"))
            rc = count(name, v, &o.threads), threads_set = 1;
        else if (!strcmp(name, "--procs"))
            rc = count(name, v, &procs);
        else if (!strcmp(name, "--compress")) /* gradient compression (bench_compress.c) */
            compress = v;
        else if (!strcmp(name, "--power-iters")) /* powersgd: dist.compress_power_iters */
            rc = count(name, v, &power_iters);
        else if (!strcmp(name, "--rounds"))
            rc = count(name, v, &o.rounds);
        else if (!strcmp(v, "0"))
            o.warmup = 0; /* --warmup */
        else
            rc = count(name, v, &o.warmup);
    }
    if (rc != CLI_OK) return rc;
    if (o.torch_mode && !ts_torch_mode_valid(o.torch_mode))
        return cli_error(CLI_USAGE,
                         "bench: --torch-mode: expected eager, compile, compile_opt, bf16 or "
                         "bf16_compile, got '%s'\n%s",
                         o.torch_mode, usage);
    if (o.torch_mode && o.torch_best)
        return cli_error(CLI_USAGE, "bench: --torch-mode and --torch-best exclude each other\n%s",
                         usage);
    if ((o.torch_mode || o.torch_best || python_set) && !o.compare_torch)
        return cli_error(CLI_USAGE,
                         "bench: --torch-python, --torch-mode and --torch-best need "
                         "--compare-torch\n%s",
                         usage);
    if (backend && strcmp(backend, "cpu")) {
        if (strcmp(backend, "cuda"))
            return cli_error(CLI_USAGE, "bench: --backend: cpu or cuda, got '%s'\n%s", backend,
                             usage);
        ts_bench_cuda_options c = ts_bench_cuda_options_default();
        c.workload = o.workload;
        c.precision = o.precision;
        if (steps_set) c.steps = o.steps;
        c.warmup = o.warmup;
        c.json_path = o.json_path;
        c.profile = o.profile;
        ts_status s = ts_bench_cuda_run(&c);
        return s == TS_OK ? CLI_OK : cli_error(cli_status_code(s), "%s", ts_last_error());
    }
    if (power_iters && !compress)
        return cli_error(CLI_USAGE, "bench: --power-iters needs --compress powersgd\n%s", usage);
    if (compress) {
        ts_bench_compress_options d = ts_bench_compress_options_default();
        if (!strcmp(compress, "powersgd"))
            d.c.method = TS_COMPRESS_POWERSGD;
        else if (strcmp(compress, "topk"))
            return cli_error(CLI_USAGE, "bench: --compress: topk or powersgd, got '%s'\n%s",
                             compress, usage);
        if (procs < 2)
            return cli_error(CLI_USAGE, "bench: --compress needs --procs N >= 2\n%s", usage);
        if (power_iters && (d.c.method != TS_COMPRESS_POWERSGD || power_iters > 16))
            return cli_error(CLI_USAGE,
                             "bench: --power-iters %d: 1 to 16, with --compress powersgd\n%s",
                             power_iters, usage);
        d.c.power_iters = power_iters;
        d.workload = o.workload;
        d.procs = procs;
        if (threads_set) d.threads = o.threads;
        d.steps = o.steps;
        d.warmup = o.warmup;
        d.rounds = o.rounds;
        ts_status s = ts_bench_compress_run(&d);
        return s == TS_OK ? CLI_OK : cli_error(cli_status_code(s), "%s", ts_last_error());
    }
    if (procs > 1) {
        ts_bench_dist_options d = ts_bench_dist_options_default();
        d.workload = o.workload;
        d.procs = procs;
        if (threads_set) d.threads = o.threads;
        d.steps = o.steps;
        d.warmup = o.warmup;
        d.rounds = o.rounds;
        d.per_rank_batch = per_rank_batch;
        d.zero = zero;
        d.bucket_mb = bucket_mb;
        d.private_params = private_params;
        d.profile = o.profile;
        ts_bench_dist_result dr;
        ts_status s = ts_bench_dist_run(&d, &dr);
        return s == TS_OK ? CLI_OK : cli_error(cli_status_code(s), "%s", ts_last_error());
    }
    ts_bench_result r;
    ts_status s = ts_bench_run(&o, &r);
    return s == TS_OK ? CLI_OK : cli_error(cli_status_code(s), "%s", ts_last_error());
}
