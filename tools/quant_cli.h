/* quant_cli.h — the `tessel quant` subcommand (tools/quant.c). */
#ifndef TESSEL_QUANT_CLI_H
#define TESSEL_QUANT_CLI_H

/* Lines for `tessel help`. */
#define TESSEL_QUANT_USAGE                                                                         \
    "  quant report FILE.npy|CKPT [--format e4m3|e5m2] [--per-channel AXIS] [--percentile P]\n"    \
    "        [--history N] [--reduce max|most_recent] [--margin M] [--json]\n"                     \
    "      FP8 quantisation error of each calibration (max, percentile, delayed) per tensor\n"

/* argv holds the arguments after "quant"; returns the exit status (0
 * success, 1 internal failure, 2 bad usage or input). */
int tessel_cmd_quant(int argc, char **argv);

#endif
