/* Loss scaling, host side: torch.amp.GradScaler's update rule. */
#include <math.h>
#include "scaler.h"
#include "plan/plan.h"

ts_scaler_config ts_scaler_config_default(void) {
    ts_scaler_config c = {TS_LOSS_SCALE_NONE, 65536.0, 2.0, 0.5, 2000};
    return c;
}

ts_status ts_scaler_config_check(const ts_scaler_config *c) {
    if (c->mode == TS_LOSS_SCALE_NONE) return TS_OK;
    if (!(c->init_scale > 0) || !isfinite((float)c->init_scale))
        return ts_fail(TS_ERR_INVALID,
                       "precision.loss_scale: the scale must be a positive finite f32, got %g",
                       c->init_scale);
    if (c->mode == TS_LOSS_SCALE_STATIC) return TS_OK;
    if (!(c->growth_factor > 1.0))
        return ts_fail(TS_ERR_INVALID, "precision.growth_factor must be > 1, got %g",
                       c->growth_factor);
    if (!(c->backoff_factor > 0.0 && c->backoff_factor < 1.0))
        return ts_fail(TS_ERR_INVALID, "precision.backoff_factor must be in (0, 1), got %g",
                       c->backoff_factor);
    if (c->growth_interval < 1 || c->growth_interval > INT32_MAX)
        return ts_fail(TS_ERR_INVALID, "precision.growth_interval must be in [1, 2^31), got %lld",
                       (long long)c->growth_interval);
    return TS_OK;
}

void ts_scaler_init(ts_scaler *s, const ts_scaler_config *c) {
    s->cfg = *c;
    s->scale = (float)c->init_scale;
    s->growth_tracker = 0;
    s->skipped = 0;
    s->last_skipped = 0;
}

float ts_scaler_inv_scale(const ts_scaler *s) {
    /* GradScaler.unscale_: self._scale.double().reciprocal().float() */
    return (float)(1.0 / (double)s->scale);
}

void ts_scaler_update(ts_scaler *s, int found_inf) {
    s->last_skipped = found_inf != 0;
    s->skipped += found_inf != 0;
    if (s->cfg.mode != TS_LOSS_SCALE_DYNAMIC) return;
    /* torch._amp_update_scale_ (aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp):
     * the f32 scale times a double factor, rounded back to f32; growth is
     * dropped when it would overflow. */
    if (found_inf) {
        s->scale = (float)((double)s->scale * s->cfg.backoff_factor);
        s->growth_tracker = 0;
    } else {
        int32_t successful = s->growth_tracker + 1;
        if (successful == s->cfg.growth_interval) {
            float grown = (float)((double)s->scale * s->cfg.growth_factor);
            if (isfinite(grown)) s->scale = grown;
            s->growth_tracker = 0;
        } else {
            s->growth_tracker = successful;
        }
    }
}

/* ---- in a plan ------------------------------------------------------------ */

ts_scaler_config ts_scaler_config_from(const ts_precision_options *o) {
    ts_scaler_config c = ts_scaler_config_default();
    c.mode = o->loss_scale == TS_SCALE_DYNAMIC  ? TS_LOSS_SCALE_DYNAMIC
             : o->loss_scale == TS_SCALE_STATIC ? TS_LOSS_SCALE_STATIC
                                                : TS_LOSS_SCALE_NONE;
    if (o->init_scale != 0) c.init_scale = o->init_scale;
    if (o->growth_factor != 0) c.growth_factor = o->growth_factor;
    if (o->backoff_factor != 0) c.backoff_factor = o->backoff_factor;
    if (o->growth_interval != 0) c.growth_interval = o->growth_interval;
    return c;
}

static ts_status scaler_gate(ts_plan *p, void *user, ts_gate_decision *out) {
    ts_plan_scaler *ps = user;
    ts_gate_decision next = TS_GATE_APPLY;
    /* the user's gate is always asked (data-parallel gates must run on
     * every rank every step) */
    if (ps->next_fn) {
        ts_status s = ps->next_fn(p, ps->next_user, &next);
        if (s != TS_OK) return s;
    }
    float found = *(const float *)ts_plan_at(p, ps->found_off);
    *out = found != 0.0f || next == TS_GATE_SKIP ? TS_GATE_SKIP : TS_GATE_APPLY;
    return TS_OK;
}

ts_status ts_plan_scaler_setup(ts_plan *p, const ts_scaler_config *c) {
    const ts_named *sv = ts_plan_find(p, "loss_scaler.scale");
    const ts_named *tv = ts_plan_find(p, "loss_scaler.growth_tracker");
    const ts_named *fv = ts_plan_find(p, "found_inf");
    if (!sv || !tv || !fv)
        return ts_fail(TS_ERR_INTERNAL, "loss scaling: the plan lacks %s",
                       !sv   ? "loss_scaler.scale"
                       : !tv ? "loss_scaler.growth_tracker"
                             : "found_inf");
    ts_plan_scaler *ps = ts_zalloc(sizeof *ps, "loss scaler");
    if (!ps) return TS_ERR_NOMEM;
    ts_scaler_init(&ps->sc, c);
    ps->scale_off = sv->v.off;
    ps->tracker_off = tv->v.off;
    ps->found_off = fv->v.off;
    p->rt.scaler = ps;
    p->rt.gate_fn = scaler_gate;
    p->rt.gate_user = ps;
    return TS_OK;
}

void ts_plan_scaler_after_step(ts_plan *p) {
    ts_plan_scaler *ps = p->rt.scaler;
    if (ps->hold) return; /* a round of a micro-batched step, not its last */
    float *scale = (float *)ts_plan_at(p, ps->scale_off);
    float *tracker = (float *)ts_plan_at(p, ps->tracker_off);
    /* the state values are the truth (a checkpoint restore writes them) */
    ps->sc.scale = *scale;
    ps->sc.growth_tracker = (int32_t)*tracker;
    ts_scaler_update(&ps->sc, *(const float *)ts_plan_at(p, ps->found_off) != 0.0f);
    *scale = ps->sc.scale;
    *tracker = (float)ps->sc.growth_tracker;
}

int ts_plan_loss_scale(const ts_plan *p, double *scale, int64_t *growth_tracker, int64_t *skipped) {
    if (!p || !p->rt.scaler) return 0;
    const ts_plan_scaler *ps = p->rt.scaler;
    if (scale) *scale = *(const float *)ts_plan_at(p, ps->scale_off);
    if (growth_tracker) *growth_tracker = (int64_t) * (const float *)ts_plan_at(p, ps->tracker_off);
    if (skipped) *skipped = ps->sc.skipped;
    return 1;
}

int ts_plan_found_inf(const ts_plan *p) {
    return p && p->rt.scaler ? p->rt.scaler->sc.last_skipped : 0;
}
