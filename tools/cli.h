/* cli.h — pieces shared by the subcommands of the `tessel` command line. */
#ifndef TESSEL_CLI_H
#define TESSEL_CLI_H

#include "tessel/tessel.h"

/* Exit statuses: success, an internal failure, bad usage/config/input. */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

#define CLI_MAX_ARGS 256

/* The command line after the subcommand, split into its parts. */
typedef struct cli_args {
    const char *config;             /* CONFIG.yaml */
    const char *sets[CLI_MAX_ARGS]; /* --set key=value, in order */
    int n_sets;
    const char *dumps[CLI_MAX_ARGS]; /* compile: --dump KIND, in order */
    int n_dumps;
    const char *dump_after; /* compile: --dump-after PASS */
    const char *emit_c;     /* compile: --emit-c DIR (the step as a C program, docs/aot.md) */
    const char *steps;      /* train: --steps N */
    const char *out;        /* train: --out RUN_DIR */
    const char *resume;     /* train: --resume latest|CHECKPOINT_DIR */
    const char *procs;      /* train: --procs N (as --set dist.procs=N) */
    const char *trace;      /* train: --trace FILE (Chrome trace of the steps) */
    /* train: --max-restarts K (as --set dist.max_restarts=K) */
    const char *max_restarts;
} cli_args;

/* Prints "tessel: error: <message>" to stderr and returns `code`. */
int cli_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The exit status for a library failure before any step ran: bad input
 * unless the library ran out of memory or hit a bug. */
int cli_status_code(ts_status s);
/* Load, override and finish the config named by the arguments. */
int cli_load_config(const cli_args *a, ts_config *c);

int cli_compile(const cli_args *a);
int cli_train(const cli_args *a);
/* tessel bench takes its own options (no config file). */
int cli_bench(int argc, char **argv);

#endif
