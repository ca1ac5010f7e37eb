/* tessel — the command line: parses arguments and hands them to the
 * library through its public headers (tessel/config.h, tessel/session.h, ...). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "ckpt_cli.h"
#include "replay_cli.h"
#include "peft_cli.h"
#include "cli.h"
#include "cluster_cli.h"
#include "ctl_cli.h"
#include "fed_cli.h"
#include "onnx_cli.h"
#include "plot_cli.h"
#include "quant_cli.h"

static const char usage[] =
    "usage: tessel <command> [arguments]\n"
    "\n"
    "commands:\n"
    "  train CONFIG.yaml [--set key=value ...] [--steps N] [--out RUN_DIR]\n"
    "        [--resume latest|CKPT_DIR] [--procs N] [--max-restarts K] [--trace FILE]\n"
    "      train the configured model on its data (data.source) with progress, evaluation\n"
    "      and a run directory (RUN_DIR must be new or empty); Ctrl-C stops after the step;\n"
    "      --resume latest continues RUN_DIR from its newest checkpoint, --resume CKPT_DIR\n"
    "      continues a checkpoint in a new RUN_DIR (ckpt.every saves them); --procs N trains\n"
    "      on N processes of this host, each on model.batch / N rows (under mpirun: MPI ranks);\n"
    "      --max-restarts K restarts failed workers up to K times from the latest checkpoint;\n"
    "      --trace FILE writes a Chrome trace of every step's kernels and collectives per rank\n"
    "  compile CONFIG.yaml [--set key=value ...]\n"
    "        [--dump ir|plan|memory|stats|config|partition ...]\n"
    "        [--dump-after PASS] [--emit-c DIR]\n"
    "      compile the training step and print the requested dumps (default: stats);\n"
    "      --dump-after PASS prints the graph (IR text) after that pass of the pipeline:\n"
    "      peft, attention_qkv, loss_scale, autodiff, discard_outputs, unscale, monitor, train,\n"
    "      monitor_order, loss_scale_order, train_mode, simplify, chunk_ce, fuse, precision,\n"
    "      gelu_grad, attn_bwd_low, qkv_low, fuse_ce, weight_copies, verify, schedule,\n"
    "      distribute, memplan; --emit-c DIR writes the training step as a standalone C\n"
    "      program (make, then ./train: train.steps steps, the same weights as tessel train);\n"
    "      --dump partition: the pipeline stages dist.pipeline_stages asks for (cuts, each\n"
    "      stage's ops, memory and time estimate)\n"
    "  bench --workload W1|W2|W3|W4|W5|gpt2-124m [--steps N] [--threads N] [--profile]\n"
    "        [--json FILE] [--compare-torch] [--precision fp32|bf16|fp16]\n"
    "      time training steps of a benchmark workload (shared/BENCH.md), optionally\n"
    "      alternating with the PyTorch reference, and print the ratio; --backend cuda\n"
    "      times W1, W3 or gpt2-124m on the GPU, with and without the CUDA graph\n"
    "  bench collectives [--transport shm|mpi] [--json FILE]\n"
    "      all-reduce, reduce-scatter and all-gather bandwidth beside "
    "MPI_Allreduce\n" TESSEL_CLUSTER_USAGE TESSEL_CKPT_USAGE TESSEL_REPLAY_USAGE TESSEL_PEFT_USAGE
        TESSEL_QUANT_USAGE TESSEL_ONNX_USAGE TESSEL_FED_USAGE
    "  plot RUN_DIR  draw loss, throughput and gradient-norm curves into RUN_DIR/plots\n"
    "  ctl resume|status RUN_DIR\n"
    "      resume a run paused by an alert, or say whether it is paused\n"
    "  version       print the version\n"
    "  help          print this help\n"
    "\n"
    "--set overrides one config key after the file is read, e.g. --set train.lr=3e-4\n"
    "--set model.n_layers=2; docs/config.md lists every key.\n"
    "exit status: 0 success, 1 a failure while training (a step, a save, a worker\n"
    "that died by a signal) or an internal one, 2 bad usage, config or input (or a run\n"
    "directory in use), 3 training stopped by an alert rule (action stop), 130 training\n"
    "stopped by Ctrl-C or SIGTERM (its checkpoint committed: ckpt.on_signal, resume it)\n";

int cli_error(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("tessel: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

int cli_status_code(ts_status s) {
    return s == TS_ERR_NOMEM || s == TS_ERR_INTERNAL ? CLI_FAIL : CLI_USAGE;
}

int cli_load_config(const cli_args *a, ts_config *c) {
    ts_config_init(c);
    ts_status s = ts_config_load_file(c, a->config);
    for (int i = 0; s == TS_OK && i < a->n_sets; i++) s = ts_config_set(c, a->sets[i]);
    if (s == TS_OK && a->steps) {
        char set[128];
        snprintf(set, sizeof set, "train.steps=%.100s", a->steps);
        s = ts_config_set(c, set);
    }
    if (s == TS_OK && a->procs) {
        char set[128];
        snprintf(set, sizeof set, "dist.procs=%.100s", a->procs);
        s = ts_config_set(c, set);
    }
    if (s == TS_OK && a->max_restarts) {
        char set[128];
        snprintf(set, sizeof set, "dist.max_restarts=%.100s", a->max_restarts);
        s = ts_config_set(c, set);
    }
    if (s == TS_OK) s = ts_config_finish(c);
    return s == TS_OK ? CLI_OK : cli_error(cli_status_code(s), "%s", ts_last_error());
}

/* "--opt value" or "--opt=value": the value, advancing *i past it; NULL if
 * argv[*i] is not this option. *missing is set when the value is absent. */
static const char *option(int argc, char **argv, int *i, const char *opt, int *missing) {
    size_t n = strlen(opt);
    if (strncmp(argv[*i], opt, n)) return NULL;
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (argv[*i][n]) return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

static int parse(int argc, char **argv, const char *cmd, cli_args *a) {
    memset(a, 0, sizeof *a);
    const int is_compile = !strcmp(cmd, "compile");
    for (int i = 0; i < argc; i++) {
        int missing = 0;
        const char *v;
        if ((v = option(argc, argv, &i, "--set", &missing))) {
            if (a->n_sets == CLI_MAX_ARGS) return cli_error(CLI_USAGE, "too many --set options");
            a->sets[a->n_sets++] = v;
        } else if (is_compile && (v = option(argc, argv, &i, "--emit-c", &missing))) {
            a->emit_c = v;
        } else if (is_compile && (v = option(argc, argv, &i, "--dump-after", &missing))) {
            a->dump_after = v;
        } else if (is_compile && (v = option(argc, argv, &i, "--dump", &missing))) {
            if (a->n_dumps == CLI_MAX_ARGS) return cli_error(CLI_USAGE, "too many --dump options");
            a->dumps[a->n_dumps++] = v;
        } else if (!is_compile && (v = option(argc, argv, &i, "--steps", &missing))) {
            /* the same as --set train.steps=N, applied after every --set */
            a->steps = v;
        } else if (!is_compile && (v = option(argc, argv, &i, "--out", &missing))) {
            a->out = v;
        } else if (!is_compile && (v = option(argc, argv, &i, "--resume", &missing))) {
            a->resume = v;
        } else if (!is_compile && (v = option(argc, argv, &i, "--procs", &missing))) {
            a->procs = v;
        } else if (!is_compile && (v = option(argc, argv, &i, "--max-restarts", &missing))) {
            a->max_restarts = v;
        } else if (!is_compile && (v = option(argc, argv, &i, "--trace", &missing))) {
            a->trace = v;
        } else if (missing) {
            return cli_error(CLI_USAGE, "%s needs a value (see tessel help)", argv[i]);
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_error(CLI_USAGE, "%s: unknown option '%s' (options: --set%s)", cmd, argv[i],
                             is_compile
                                 ? ", --dump, --dump-after, --emit-c"
                                 : ", --steps, --out, --resume, --procs, --max-restarts, --trace");
        } else if (a->config) {
            return cli_error(CLI_USAGE, "%s takes one config file, got '%s' and '%s'", cmd,
                             a->config, argv[i]);
        } else {
            a->config = argv[i];
        }
    }
    if (!a->config) return cli_error(CLI_USAGE, "%s: missing CONFIG.yaml (see tessel help)", cmd);
    return CLI_OK;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(usage, stderr);
        return CLI_USAGE;
    }
    const char *cmd = argv[1];
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage, stdout);
            return CLI_OK;
        }
    if (!strcmp(cmd, "help")) {
        fputs(usage, stdout);
        return CLI_OK;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("tessel %s\n", TESSEL_VERSION);
        return CLI_OK;
    }
    if (!strcmp(cmd, "compile") || !strcmp(cmd, "train")) {
        cli_args a;
        int rc = parse(argc - 2, argv + 2, cmd, &a);
        if (rc != CLI_OK) return rc;
        return cmd[0] == 'c' ? cli_compile(&a) : cli_train(&a);
    }
    if (!strcmp(cmd, "bench")) return cli_bench(argc - 2, argv + 2);
    if (!strcmp(cmd, "ckpt")) return tessel_cmd_ckpt(argc - 2, argv + 2);
    if (!strcmp(cmd, "keygen")) return tessel_cmd_keygen(argc - 2, argv + 2);
    if (!strcmp(cmd, "audit") && argc > 2 && !strcmp(argv[2], "replay"))
        return tessel_cmd_audit_replay(argc - 3, argv + 3);
    if (!strcmp(cmd, "audit")) return tessel_cmd_audit(argc - 2, argv + 2);
    if (!strcmp(cmd, "export")) return tessel_cmd_export(argc - 2, argv + 2);
    if (!strcmp(cmd, "plot")) return tessel_cmd_plot(argc - 2, argv + 2);
    if (!strcmp(cmd, "quant")) return tessel_cmd_quant(argc - 2, argv + 2);
    if (!strcmp(cmd, "ctl")) return tessel_cmd_ctl(argc - 2, argv + 2);
    if (!strcmp(cmd, "onnx")) return tessel_cmd_onnx(argc - 2, argv + 2);
    if (!strcmp(cmd, "fed")) return tessel_cmd_fed(argc - 2, argv + 2);
    if (!strcmp(cmd, "launch")) return tessel_cmd_launch(argc - 2, argv + 2);
    if (!strcmp(cmd, "deploy")) return tessel_cmd_deploy(argc - 2, argv + 2);
    return cli_error(CLI_USAGE,
                     "unknown command '%s' (commands: train, compile, bench, ckpt, keygen, audit, "
                     "export, plot, quant, onnx, fed, ctl, launch, deploy, version, help)",
                     cmd);
}
