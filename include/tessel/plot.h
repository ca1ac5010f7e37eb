/* tessel/plot.h — PNG curves of a run from its metrics.jsonl, drawn by gnuplot.
 *
 *     ts_plot_result r;
 *     if (ts_plot_run("runs/first", NULL, &r) != TS_OK) puts(ts_last_error());
 *     for (int i = 0; i < r.n_files; i++) puts(r.files[i]);
 *
 * Reads RUN_DIR/metrics.jsonl: one JSON object per line. Lines with
 * "type": "train" (or without a type) give `step`, `loss`, `samples_per_s`
 * and/or `tokens_per_s`, and optionally `grad_norm`; lines with
 * "type": "eval" give `split`, `step` and `loss`. Null or missing numbers
 * (a non-finite loss is written as null) are gaps in the curves. A last
 * line without its newline (a run still writing) is skipped.
 *
 * Writes into RUN_DIR/plots/: loss.png (train loss, and each eval split's
 * loss as points), throughput.png (samples/s and/or tokens/s), and
 * grad_norm.png when the run logged gradient norms; plus plot.gp, the
 * gnuplot script with the data inlined, so a plot can be restyled and
 * redrawn by running `gnuplot plot.gp` inside plots/ (gnuplot runs there,
 * so the script names its outputs relative to itself). Uses the pngcairo
 * terminal when gnuplot has it, else png. */
#ifndef TESSEL_PLOT_H
#define TESSEL_PLOT_H

#include <stdint.h>
#include "tessel/status.h"

typedef struct ts_plot_options {
    const char *gnuplot; /* program to run; NULL: "gnuplot" searched on PATH */
} ts_plot_options;

#define TS_PLOT_MAX_FILES 3

typedef struct ts_plot_result {
    int64_t train_points;  /* training lines read */
    int64_t eval_points;   /* evaluation lines read */
    int64_t skipped_lines; /* lines without a usable step (e.g. a half-written last line) */
    int n_files;
    char files[TS_PLOT_MAX_FILES][1024]; /* PNG paths written */
} ts_plot_result;

/* Fails with TS_ERR_NOT_FOUND when metrics.jsonl is missing, TS_ERR_FORMAT
 * naming the line of a malformed one, TS_ERR_UNSUPPORTED when gnuplot is not
 * installed, TS_ERR_IO with gnuplot's first error line when it fails. */
ts_status ts_plot_run(const char *run_dir, const ts_plot_options *o, ts_plot_result *r);

#endif
