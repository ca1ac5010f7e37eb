/* tessel/progress.h — how a long run shows its progress (a training
 * session's ts_session_options.progress):
 *
 *     o.progress = isatty(fileno(stdout)) ? TS_PROGRESS_TTY : TS_PROGRESS_LINES;
 *
 * Both forms print the same fields, "step 12/100  loss 0.4123  lr 1.000e-03
 * epoch 1/3  35120 samples/s  ETA 0:05", so a log reads like the screen. */
#ifndef TESSEL_PROGRESS_H
#define TESSEL_PROGRESS_H

typedef enum ts_progress_mode {
    TS_PROGRESS_NONE = 0, /* print nothing */
    TS_PROGRESS_LINES,    /* a log line every log_every steps (and the first and last) */
    TS_PROGRESS_TTY       /* one line redrawn with \r, at most 10 times a second */
} ts_progress_mode;

#endif
