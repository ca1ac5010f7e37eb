/* progress.h — what a long run shows while it works: on a terminal one
 * line that refreshes in place, otherwise plain log lines every few steps.
 *
 *     ts_progress pr;
 *     ts_progress_start(&pr, stdout, TS_PROGRESS_TTY, steps, 0, "samples/s", batch);
 *     for (step = 1; step <= steps; step++) {
 *         ...
 *         ts_progress_info in = {step, epoch, epochs, loss, lr, rate};
 *         ts_progress_step(&pr, &in);
 *     }
 *     ts_progress_log(&pr, "eval  loss %.4f", val_loss);   // a line of its own
 *     ts_progress_end(&pr);
 *
 * Both forms print the same fields, "step 12/100  loss 0.4123  lr 1.000e-03
 * epoch 1/3  35120 samples/s  ETA 0:05", so a log reads like the screen.
 */
#ifndef TS_OBS_PROGRESS_H
#define TS_OBS_PROGRESS_H

#include <stdint.h>
#include <stdio.h>
#include "core/core.h"
#include "tessel/progress.h"

/* ts_progress_mode: tessel/progress.h */

typedef struct ts_progress_info {
    int64_t step;   /* 1-based */
    int64_t epoch;  /* 1-based; 0: no epochs (synthetic data) */
    int64_t epochs; /* epochs of the run; 0: unknown */
    double loss, lr;
    double rate; /* units per second of this step (shown for the first step only) */
} ts_progress_info;

typedef struct ts_progress {
    FILE *out;
    ts_progress_mode mode;
    int64_t total, log_every;
    const char *unit;
    int width;          /* digits of total */
    double per_step;    /* units (samples, tokens) per step */
    double t_start;     /* when the first step began */
    double t_drawn;     /* when the refreshing line was last drawn */
    double t_shown;     /* when a step was last shown (line drawn or logged) */
    int64_t step_shown; /* that step */
    int line_open;      /* the refreshing line is on screen, without a newline */
} ts_progress;

/* log_every 0: about 100 lines over the run (every step for short runs).
 * The throughput shown is the average since the last line shown, which a
 * busy machine's step-to-step jitter would otherwise make unreadable;
 * per_step is how many `unit`s one step handles. */
void ts_progress_start(ts_progress *p, FILE *out, ts_progress_mode mode, int64_t total,
                       int64_t log_every, const char *unit, double per_step);
void ts_progress_step(ts_progress *p, const ts_progress_info *in);
/* A line of its own (an evaluation, a note); printed in every mode but NONE. */
void ts_progress_log(ts_progress *p, const char *fmt, ...) TS_PRINTF(2, 3);
/* Close the refreshing line, so what follows starts on a fresh line. */
void ts_progress_end(ts_progress *p);

#endif
