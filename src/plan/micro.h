/* micro.h — what running a training plan once per micro-batch needs from
 * the plan's internals (dist.reproducible, src/session/repro.c).
 *
 *     float *g; size_t n;
 *     ts_plan_grad_region(plan, &g, &n);        // every gradient, as one f32 array
 *     ts_plan_fwd_state st[8];
 *     int ns = ts_plan_fwd_states(plan, st, 8); // state the forward writes (BatchNorm)
 *     ts_plan_set_seed(plan, seed ^ mix(i));     // dropout stream of micro-batch i
 *
 * The gradient region is what memplan laid out for the gradients: the
 * tensors of every parameter with zero padding between them (which the
 * step keeps zero), so a sum over it element by element is a sum of each
 * gradient and leaves the padding zero. */
#ifndef TS_PLAN_MICRO_H
#define TS_PLAN_MICRO_H

#include <stddef.h>
#include <stdint.h>
#include "tessel/plan.h"
#include "tessel/status.h"

/* The plan's gradient region as n floats at *g. Fails when a gradient is
 * not f32, when the region is sharded (ZeRO-2) or the plan has none. */
ts_status ts_plan_grad_region(ts_plan *p, float **g, size_t *n);

/* A persistent state value that instructions before the update gate write
 * (BatchNorm's running mean and variance): f32, n elements at data. */
typedef struct ts_plan_fwd_state {
    const char *name;
    float *data;
    size_t n;
} ts_plan_fwd_state;

/* Fills up to max entries (not the loss scaler's scale, growth tracker and
 * found_inf), returns how many there are (may exceed max), or
 * -1 with an error set when one is not f32. */
int ts_plan_fwd_states(ts_plan *p, ts_plan_fwd_state *out, int max);

/* The gradients (f32, each in the gradient region), up to max entries as
 * {name, data, n}; returns how many there are (may exceed max). Their order
 * is the plan's: sort them (by name) for an order that is every plan's. */
int ts_plan_grads(ts_plan *p, ts_plan_fwd_state *out, int max);

/* The seed the step's kernels see (dropout masks); ts_plan_seed() gives
 * the compile seed. */
void ts_plan_set_seed(ts_plan *p, uint64_t seed);

/* The update gate set now (NULL fn: none), to be chained by a gate that
 * replaces it: the one ts_plan_set_update_gate would replace (with loss
 * scaling, the gate the scaler asks, not the scaler's own). */
void ts_plan_get_update_gate(const ts_plan *p, ts_update_gate_fn *fn, void **user);

/* Rebinds the instructions before the update gate (forward, backward, gradient monitors) from
 * the gradient region they now write at `from` to `to`, the same size as the region
 * (ts_plan_grad_region: n floats, its padding zero): every tensor of theirs inside [from,
 * from + n) moves to the same offset in `to`. The update phase keeps reading the plan's own
 * region. So each micro-batch's backward pass can write its gradients where they are summed
 * (dist.reproducible: a leaf of the tree), with no copy; bind back to the own region (`to` =
 * the region) when done. Kernels read their tensors' pointers when they run (the CPU backend's
 * oneDNN memories are given them per call), so nothing else holds them. Fails when the plan
 * has no update gate or no gradient region. */
ts_status ts_plan_bind_grads(ts_plan *p, const float *from, float *to);

/* The same for the instructions from the update gate on (clipping, the optimizer's update):
 * they read the gradients at `to` from now on, e.g. a finished sum that several processes
 * share, which none of them copies into its own region. Only where they read them and nothing
 * else: fails (TS_ERR_UNSUPPORTED, binding nothing) when an instruction after the gate writes
 * into the region, or takes it as an input of an op with side effects other than the
 * optimizer updates (which write parameters and state) — those would write `to`, which others
 * read. The plan's own region is then stale after a step: whoever reads the gradients by name
 * (ts_plan_read) must copy `to` back first. */
ts_status ts_plan_bind_update_grads(ts_plan *p, const float *from, float *to);

/* hold 1: the gradient monitors' instructions (TS_OPF_MONITOR) do nothing in the steps that
 * follow, their outputs keeping the last values computed; hold 0: they run again. For the
 * rounds of a micro-batched step before its last, whose monitors nobody reads. */
ts_status ts_plan_hold_monitors(ts_plan *p, int hold);

/* Loss scaling (fp16) over micro-batches: hold 1 keeps the scale and its
 * growth tracker as they are after the steps that follow (the rounds of a
 * batch but its last); hold 0 lets the last one update them. Returns 0 when
 * the plan has no loss scaler. */
int ts_plan_scaler_hold(ts_plan *p, int hold);
/* Overwrites the step's "found_inf" flag (read by the scaler's gate after
 * the gate it asks, and by the scale update): the caller's verdict on the
 * gradients it wrote. No-op without a loss scaler. */
void ts_plan_set_found_inf(ts_plan *p, int found);

#endif
