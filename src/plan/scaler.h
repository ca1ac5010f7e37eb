/* scaler.h — the host side of loss scaling (internal), with the semantics
 * of torch.amp.GradScaler exactly.
 *
 * The step graph multiplies the loss by the scale (a runtime scalar input,
 * "loss_scale"), unscales every gradient by the f32 inverse scale
 * ("loss_scale_inv") and writes found_inf (1 when any scaled gradient is
 * non-finite) in one fused pass; the update gate skips the parameter update
 * when found_inf is set. After each step the host calls
 *
 *     ts_scaler_update(&sc, found_inf);      // torch._amp_update_scale_
 *     float s = sc.scale, inv = ts_scaler_inv_scale(&sc);
 *
 * and feeds the two scalars to the next step. Static scaling (a fixed
 * number) keeps the scale but still skips non-finite steps; "none"
 * disables the whole mechanism (no nodes are added).
 */
#ifndef TS_SCALER_H
#define TS_SCALER_H

#include <stdint.h>
#include "core/core.h"
#include "tessel/plan.h"

typedef enum ts_loss_scale_mode {
    TS_LOSS_SCALE_NONE = 0,
    TS_LOSS_SCALE_DYNAMIC,
    TS_LOSS_SCALE_STATIC
} ts_loss_scale_mode;

typedef struct ts_scaler_config {
    ts_loss_scale_mode mode;
    double init_scale;       /* dynamic: 65536; static: the fixed scale */
    double growth_factor;    /* 2 */
    double backoff_factor;   /* 0.5 */
    int64_t growth_interval; /* 2000 */
} ts_scaler_config;

/* GradScaler's defaults (mode NONE). */
ts_scaler_config ts_scaler_config_default(void);
/* Check ranges as torch does (growth > 1, 0 < backoff < 1, interval >= 1,
 * scale > 0 and finite); a message names the bad key. */
ts_status ts_scaler_config_check(const ts_scaler_config *c);

typedef struct ts_scaler {
    ts_scaler_config cfg;
    float scale;            /* torch keeps the scale as an f32 tensor */
    int32_t growth_tracker; /* consecutive finite steps (int32 tensor in torch) */
    int64_t skipped;        /* steps skipped so far (for metrics) */
    int last_skipped;       /* the last step was skipped */
} ts_scaler;

void ts_scaler_init(ts_scaler *s, const ts_scaler_config *c);
/* 1 / scale as torch computes it: in double, then rounded to f32. */
float ts_scaler_inv_scale(const ts_scaler *s);
/* After a step: found_inf nonzero when any gradient was non-finite.
 * Dynamic mode follows torch._amp_update_scale_ bit for bit. */
void ts_scaler_update(ts_scaler *s, int found_inf);

/* ---- in a plan ----------------------------------------------------------
 * ts_compile sets this up when precision.loss_scale is not NONE: the
 * scale and growth tracker live in the plan's state values (so checkpoints
 * carry them), found_inf is the unscale node's output, and the scaler is
 * the plan's update gate, calling the gate the user sets
 * (ts_plan_set_update_gate) and skipping when either says so. */
typedef struct ts_plan_scaler {
    ts_scaler sc;
    size_t scale_off, tracker_off, found_off; /* arena offsets */
    ts_update_gate_fn next_fn;                /* the user's gate, or NULL */
    void *next_user;
    int hold; /* 1: the steps leave the scale alone (micro.h, ts_plan_scaler_hold) */
} ts_plan_scaler;

struct ts_plan;
/* After the passes and the arena: find the values and install the gate. */
ts_status ts_plan_scaler_setup(struct ts_plan *p, const ts_scaler_config *c);
/* After each executed step: torch._amp_update_scale_ on the plan's state. */
void ts_plan_scaler_after_step(struct ts_plan *p);
/* The scaler config from compile options (defaults filled in). */
ts_scaler_config ts_scaler_config_from(const ts_precision_options *o);

#endif
