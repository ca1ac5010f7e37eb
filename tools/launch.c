/* tessel launch [--max-restarts K] -- COMMAND...: restarts for training
 * started by mpirun or srun (tessel/launch.h, docs/cluster.md). */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "cluster_cli.h"
#include "tessel/launch.h"

static volatile sig_atomic_t stop_flag;

/* Ctrl-C or a scheduler's SIGTERM: pass it on to the command, restart
 * nothing. */
static void on_stop(int sig) {
    (void)sig;
    stop_flag = 1;
}

int tessel_cmd_launch(int argc, char **argv) {
    ts_launch_options o = ts_launch_options_default();
    int i = 0;
    for (; i < argc && strcmp(argv[i], "--"); i++) {
        if (!strcmp(argv[i], "--max-restarts") && i + 1 < argc) {
            char *end;
            long k = strtol(argv[++i], &end, 10);
            if (*end || end == argv[i] || k < 0 || k > 1000000)
                return cli_error(CLI_USAGE, "launch: --max-restarts takes 0 .. 1e6, got '%s'",
                                 argv[i]);
            o.max_restarts = (int)k;
        } else {
            return cli_error(CLI_USAGE,
                             "launch: unknown option '%s' (usage: tessel launch [--max-restarts "
                             "K] -- COMMAND ...)",
                             argv[i]);
        }
    }
    if (i + 1 >= argc)
        return cli_error(CLI_USAGE, "launch: no command after '--' (e.g. tessel launch "
                                    "--max-restarts 3 -- mpirun -np 4 tessel train CONFIG.yaml "
                                    "--out RUN_DIR)");
    o.stop = &stop_flag;
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    int code = 1;
    o.stop_signal = SIGTERM;
    ts_status s = ts_launch_job(argv + i + 1, &o, &code);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (s != TS_OK) {
        /* 2: the command's config was refused, or this one's arguments */
        const int rc = s == TS_ERR_INVALID ? CLI_USAGE : CLI_FAIL;
        return cli_error(rc, "launch: %s", ts_last_error());
    }
    return code;
}
