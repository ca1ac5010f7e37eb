/* tessel/quant.h — FP8 numbers, calibration and quantisation error.
 *
 * Two OCP 8-bit formats, named by their dtypes (docs/fp8.md):
 *   TS_F8E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; max 448, no
 *              infinities, NaN = 0x7F / 0xFF, smallest subnormal 2^-9.
 *   TS_F8E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; max 57344,
 *              IEEE infinities (0x7C / 0xFC) and NaNs, smallest subnormal 2^-16.
 * Conversions round to nearest, ties to even. Saturating conversion (what
 * quantisation uses) maps finite values beyond max, and +-inf, to +-max;
 * NaN always becomes 0x7F. Without saturation an overflow gives +-inf in
 * E5M2 and NaN (0x7F) in E4M3, as IEEE rounding (and PyTorch) do.
 *
 *     uint8_t c = ts_fp8_from_f32(3.3f, TS_F8E4M3, 1);   // 0x45 (3.25)
 *     float v = ts_fp8_to_f32(c, TS_F8E4M3);              // 3.25f
 *
 * Scales: tessel's `scale` s is the dequantisation step, x ~ decode(q) * s,
 * q = encode(x / s) (PyTorch's convention). Transformer Engine's scale is
 * its reciprocal. A calibration turns an amax (the largest magnitude to
 * represent) into s = amax * 2^margin / fmt_max:
 *
 *     double amax;
 *     ts_amax_percentile(w, n, 99.9, &amax);
 *     double s = ts_fp8_scale_for(amax, TS_F8E4M3, 0);
 *     ts_quant_error e;
 *     ts_quant_error_f32(w, 1, &n, -1, TS_F8E4M3, &s, &e);   // MSE, SQNR, ...
 *
 * Delayed scaling (Transformer Engine's recipe) keeps a history of amaxes
 * across steps and quantises step t with a scale derived from steps < t:
 *
 *     ts_delayed_scaling d;
 *     ts_delayed_scaling_init(&d, TS_F8E4M3, 1, 16, TS_AMAX_MAX, 0);
 *     for (...) {
 *         use d.scale[0] to quantise this step's tensor, measure its amax;
 *         ts_delayed_scaling_update(&d, &amax);
 *     }
 *     ts_delayed_scaling_free(&d);
 */
#ifndef TESSEL_QUANT_H
#define TESSEL_QUANT_H

#include <stdint.h>
#include "tessel/dtype.h"
#include "tessel/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- FP8 numbers ------------------------------------------------------- */

/* 1 for TS_F8E4M3 and TS_F8E5M2. */
int ts_fp8_is_format(ts_dtype fmt);
/* Largest finite value (448, 57344); 0 for a non-FP8 dtype. */
double ts_fp8_max(ts_dtype fmt);
/* Smallest positive normal (2^-6, 2^-14) and subnormal (2^-9, 2^-16) value. */
double ts_fp8_min_normal(ts_dtype fmt);
double ts_fp8_min_subnormal(ts_dtype fmt);
/* The value of code c (exact in f32; NaN for NaN codes). */
float ts_fp8_to_f32(uint8_t c, ts_dtype fmt);
/* Round x to the nearest code (ties to even); see above for saturate. */
uint8_t ts_fp8_from_f64(double x, ts_dtype fmt, int saturate);
uint8_t ts_fp8_from_f32(float x, ts_dtype fmt, int saturate);
/* n conversions at once, bit-identical to ts_fp8_from_f32 (vectorised). */
void ts_fp8_encode_f32(uint8_t *out, const float *x, int64_t n, ts_dtype fmt, int saturate);

/* ---- calibration ------------------------------------------------------- */

/* The largest |x| over n values (NaN and infinities are skipped). */
ts_status ts_amax_max(const float *x, int64_t n, double *amax);
/* The pct-th percentile (0 < pct <= 100) of |x| over the finite values,
 * interpolated linearly between order statistics as numpy.percentile. */
ts_status ts_amax_percentile(const float *x, int64_t n, double pct, double *amax);

typedef enum ts_calib_method {
    TS_CALIB_MAX = 0,
    TS_CALIB_PERCENTILE,
    TS_CALIB_DELAYED /* ts_quant_report only: see docs/fp8.md */
} ts_calib_method;

/* amax per channel of x (rank, dims) along `axis` (negative counts from
 * the end) into amax[dims[axis]]; method MAX or PERCENTILE (pct). */
ts_status ts_amax_channels(const float *x, int rank, const int64_t *dims, int axis,
                           ts_calib_method method, double pct, double *amax);

/* s = amax * 2^margin / fmt_max; 1 when amax is 0 or not finite (nothing
 * to scale for). */
double ts_fp8_scale_for(double amax, ts_dtype fmt, double margin);

typedef enum ts_amax_reduce { TS_AMAX_MAX = 0, TS_AMAX_MOST_RECENT } ts_amax_reduce;

typedef struct ts_delayed_scaling {
    ts_dtype fmt;
    int channels;    /* 1 for a per-tensor scale */
    int history_len; /* amaxes kept per channel */
    ts_amax_reduce reduce;
    double margin;
    int64_t updates; /* amaxes recorded so far */
    double *history; /* [history_len][channels], a ring; owned */
    double *scale;   /* [channels]: the scale for the next step; starts at 1 */
} ts_delayed_scaling;

ts_status ts_delayed_scaling_init(ts_delayed_scaling *d, ts_dtype fmt, int channels,
                                  int history_len, ts_amax_reduce reduce, double margin);
/* Record this step's amax[channels] and recompute every scale from the
 * history: amax_h = max over the history (TS_AMAX_MAX) or the amax just
 * recorded (TS_AMAX_MOST_RECENT), then s = ts_fp8_scale_for(amax_h); a
 * channel whose amax_h is 0 or not finite keeps its previous scale. */
ts_status ts_delayed_scaling_update(ts_delayed_scaling *d, const double *amax);
void ts_delayed_scaling_free(ts_delayed_scaling *d);

/* ---- quantisation error ------------------------------------------------ */

typedef struct ts_quant_error {
    int64_t n;             /* finite elements compared (NaN/inf are skipped) */
    double mse;            /* mean (x - q)^2, q = decode(encode(x / s)) * s */
    double max_abs;        /* max |x - q| */
    double sqnr_db;        /* 10 log10(sum x^2 / sum (x - q)^2); +inf if exact */
    double frac_saturated; /* share clamped to +-max: |x / s| beyond max + half an ulp */
    double frac_flushed;   /* share of non-zero elements that quantise to 0 */
} ts_quant_error;

/* Error of quantising x (rank, dims) to fmt, saturating, with scale[0]
 * when per_channel_axis is TS_PER_TENSOR, else scale[c] for index c of
 * that axis (negative counts from the end). */
#define TS_PER_TENSOR (-1000)
ts_status ts_quant_error_f32(const float *x, int rank, const int64_t *dims, int per_channel_axis,
                             ts_dtype fmt, const double *scale, ts_quant_error *e);

/* ---- the calibration report (`tessel quant report`) -------------------
 *
 * For one f32 tensor, each calibration method picks scales (per tensor, or
 * per channel along an axis) and the tensor is fake-quantised with them
 * exactly as the f32 fake_quant kernel does (x / s and decode * s in f32);
 * the rows give the resulting error (ts_quant_error above).
 *
 * The delayed method treats axis 0 as time, as in training where each step
 * brings a new tensor: slice t (x[t]) is quantised with the scales that
 * Transformer Engine's recipe derives from the amax history of slices < t
 * (the history is primed with slice 0's amax, so slice 0 uses its own).
 * It needs rank >= 2 and a channel axis other than 0.
 */

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

/* ---- FP8 export of a checkpoint (`tessel export --fp8`) ----------------- */

struct ts_ckpt; /* tessel/ckpt.h */

/* Write the checkpoint's parameters (no optimizer state) as one standard
 * safetensors file in which every floating-point parameter W becomes
 *   "W"        dtype F8_E4M3 or F8_E5M2 (fmt), W's shape: the codes
 *              q = encode(W / s), saturating, as ts_quantize in f32;
 *   "W.scale"  dtype F32, shape [] (a scalar): the dequantisation step s,
 *              so W ~ decode(q) * s; s = amax(|W|) / fmt_max (max
 *              calibration, margin 0), 1 for an all-zero tensor.
 * Other parameters are written unchanged. Metadata: format=pt,
 * tessel_step, tessel_checkpoint_id, tessel_fp8 (e4m3|e5m2) and
 * tessel_fp8_scale ("dequant": w = f8 * scale). A parameter named
 * "W.scale" next to a quantised "W" is an error (the names would clash). */
ts_status ts_quant_export_safetensors(const struct ts_ckpt *c, const char *path, ts_dtype fmt);

#ifdef __cplusplus
}
#endif
#endif
