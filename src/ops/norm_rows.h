/* norm_rows.h — layer norm's f32 row kernels, shared by layer_norm,
 * layer_norm_bwd (norm.c) and the fused activation + layer norm ops
 * (norm_act.c) so that both give the same bits (internal). */
#ifndef TS_NORM_ROWS_H
#define TS_NORM_ROWS_H

#include <stddef.h>
#include <stdint.h>
#include "core/core.h"

/* One row of d: y, *mean, *rstd from x (w, b may be NULL). */
void ts_ln_row_f32(float *y, float *mean, float *rstd, const float *x, const float *w,
                   const float *b, int64_t d, double eps);
/* dx of one row from dy, x and the row's statistics (w may be NULL). */
void ts_ln_dx_row_f32(float *dx, const float *dy, const float *x, const float *w, float mean,
                      float rstd, int64_t d);
/* dw and db (either may be NULL) over all rows, in a fixed block order (the
 * result does not depend on the thread count); scratch holds the partials. */
ts_status ts_ln_dwdb_f32(float *dw, float *db, const float *dy, const float *x, const float *mean,
                         const float *rstd, int64_t rows, int64_t d, void *scratch,
                         size_t scratch_bytes, const char *label);
/* Bytes of scratch ts_ln_dwdb_f32 needs. */
size_t ts_ln_dwdb_scratch(int64_t rows, int64_t d);

#endif
