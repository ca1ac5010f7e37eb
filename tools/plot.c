/* plot.c — `tessel plot RUN_DIR`: PNG curves of a run (ts_plot_run of
 * tessel/plot.h does the work). */
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "plot_cli.h"

static const char plot_usage[] =
    "usage: tessel plot RUN_DIR [--gnuplot PROGRAM]\n"
    "  draws RUN_DIR/metrics.jsonl into RUN_DIR/plots/: loss.png, throughput.png and\n"
    "  grad_norm.png (when gradient norms were logged), with gnuplot\n";

int tessel_cmd_plot(int argc, char **argv) {
    const char *dir = NULL;
    ts_plot_options o = {NULL};
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(plot_usage, stdout);
            return CLI_OK;
        } else if (!strcmp(argv[i], "--gnuplot")) {
            if (i + 1 >= argc) return cli_error(CLI_USAGE, "plot: --gnuplot needs a program");
            o.gnuplot = argv[++i];
        } else if (!strncmp(argv[i], "--gnuplot=", 10)) {
            o.gnuplot = argv[i] + 10;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_error(CLI_USAGE, "plot: unknown option '%s' (options: --gnuplot)", argv[i]);
        } else if (dir) {
            return cli_error(CLI_USAGE, "plot takes one run directory, got '%s' and '%s'", dir,
                             argv[i]);
        } else {
            dir = argv[i];
        }
    }
    if (!dir) return cli_error(CLI_USAGE, "plot: missing RUN_DIR\n%s", plot_usage);
    ts_plot_result r;
    ts_status s = ts_plot_run(dir, &o, &r);
    if (s != TS_OK) return cli_error(cli_status_code(s), "%s", ts_last_error());
    for (int i = 0; i < r.n_files; i++) printf("wrote %s\n", r.files[i]);
    if (r.skipped_lines)
        printf("skipped %lld line(s) without a step (or still being written)\n",
               (long long)r.skipped_lines);
    return CLI_OK;
}
