/* plot_cli.h — the `tessel plot RUN_DIR` subcommand. */
#ifndef TESSEL_PLOT_CLI_H
#define TESSEL_PLOT_CLI_H

/* argv holds the arguments after "plot" (main calls it as
 * tessel_cmd_plot(argc - 2, argv + 2)): RUN_DIR, and optionally
 * --gnuplot PROGRAM. Prints the PNG files written; returns the exit status
 * (0 success, 1 internal failure, 2 bad usage, input or missing gnuplot). */
int tessel_cmd_plot(int argc, char **argv);

#endif
