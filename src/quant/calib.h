/* quant/calib.h — the error report behind `tessel quant report` (internal).
 *
 * For one f32 tensor, each calibration method picks scales (per tensor, or
 * per channel along an axis) and the tensor is fake-quantised with them
 * exactly as the f32 fake_quant kernel does (x / s and decode * s in f32);
 * the rows give the resulting error (tessel/quant.h: ts_quant_error).
 *
 * The delayed method treats axis 0 as time, as in training where each step
 * brings a new tensor: slice t (x[t]) is quantised with the scales that
 * Transformer Engine's recipe derives from the amax history of slices < t
 * (the history is primed with slice 0's amax, so slice 0 uses its own).
 * It needs rank >= 2 and a channel axis other than 0.
 */
#ifndef TS_QUANT_CALIB_H
#define TS_QUANT_CALIB_H

#include "tessel/quant.h"

typedef struct ts_quant_report_opts {
    ts_dtype fmt;          /* TS_F8E4M3 or TS_F8E5M2 */
    int axis;              /* channel axis, or TS_PER_TENSOR */
    double pct;            /* percentile method: 0 < pct <= 100 */
    int history_len;       /* delayed: amaxes kept */
    ts_amax_reduce reduce; /* delayed: max or most recent */
    double margin;         /* every method: s = amax 2^margin / fmt_max */
} ts_quant_report_opts;

/* Defaults: e4m3, per tensor, 99.9 %, history 16, max, margin 0. */
ts_quant_report_opts ts_quant_report_defaults(void);

typedef struct ts_quant_report_row {
    ts_calib_method method;
    int available; /* 0: the method does not apply (delayed on rank 1, ...) */
    double amax;   /* the amax used (largest over channels / slices) */
    ts_quant_error err;
} ts_quant_report_row;

/* The three rows (max, percentile, delayed) for x. */
ts_status ts_quant_report(const float *x, int rank, const int64_t *dims,
                          const ts_quant_report_opts *o, ts_quant_report_row rows[3]);

const char *ts_calib_method_name(ts_calib_method m);

#endif
