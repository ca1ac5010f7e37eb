/* partition_search.c — where to cut: the stages' estimated times and
 * memory for a split, and the split with the smallest slowest stage.
 *
 * The pipeline's steady state runs one micro-batch per slowest-stage time,
 * so that time is what the search minimises. A stage's cost depends only
 * on its own range of units (its parameters, its activations, the two
 * activations at its ends), so the best split of units 0..k into s+1
 * stages is the best split of 0..j into s stages plus stage s on j+1..k
 * for the best j: dynamic programming over (stage, last unit) finds the
 * exact optimum in O(S K^2) ranges. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dist/repro_sum.h"
#include "passes/partition.h"

int ts_part_inflight(ts_pipe_schedule k, int S, int M, int s) {
    if (k == TS_PIPE_GPIPE) return M;
    return S - s < M ? S - s : M;
}

static const ts_device_speed *dev_of(const ts_part_problem *p, int s) {
    return &p->devs[s % p->n_devs];
}

static double limit_bytes(const ts_part_problem *p, int s) {
    const double mb = dev_of(p, s)->mem_mb > 0 ? dev_of(p, s)->mem_mb : p->max_mem_mb;
    return mb > 0 ? mb * 1024.0 * 1024.0 : INFINITY;
}

/* Per-range figures, reused by eval and search. */
typedef struct range_cost {
    double compute, xfer, mem, params;
    int inflight;
} range_cost;

/* What ranges are measured with: seen (n_params ints) and a stamp unique
 * per range, and the first and last unit that reads each parameter (one
 * read outside the range: a parameter another stage holds too). */
typedef struct range_ctx {
    int *seen, stamp, *first, *last;
} range_ctx;

static ts_status ctx_init(const ts_part_problem *p, range_ctx *c) {
    const size_t n = (size_t)p->n_params + 1;
    c->stamp = 0;
    c->seen = calloc(n, sizeof *c->seen);
    c->first = malloc(n * sizeof *c->first);
    c->last = malloc(n * sizeof *c->last);
    if (!c->seen || !c->first || !c->last) {
        free(c->seen), free(c->first), free(c->last);
        return ts_fail(TS_ERR_NOMEM, "partition: out of memory");
    }
    for (int i = 0; i < p->n_params; i++) c->first[i] = p->n_units, c->last[i] = -1;
    for (int u = 0; u < p->n_units; u++)
        for (int i = 0; i < p->units[u].n_params; i++) {
            const int id = p->units[u].params[i];
            if (u < c->first[id]) c->first[id] = u;
            c->last[id] = u;
        }
    return TS_OK;
}

static void ctx_free(range_ctx *c) {
    free(c->seen), free(c->first), free(c->last);
}

static void range_of(const ts_part_problem *p, int s, int j, int k, range_ctx *c, range_cost *rc) {
    int *seen = c->seen;
    const int stamp = ++c->stamp;
    double shared = 0, summed = 0; /* summed: the gradients its micro-batch tree sums */
    const ts_device_speed *d = dev_of(p, s);
    double flops = 0, traffic = 0, act = 0, params = 0;
    for (int u = j; u <= k; u++) {
        const ts_part_unit *un = &p->units[u];
        flops += un->gemm_flops;
        traffic += un->mem_traffic;
        act += un->act_bytes;
        for (int i = 0; i < un->n_params; i++) {
            const int id = un->params[i];
            if (seen[id] == stamp) continue;
            seen[id] = stamp;
            params += p->param_bytes[id];
            if (!p->grad_bytes) continue;
            /* held with an earlier stage: a send buffer per micro-batch
             * (and the earlier stage sums it); with a later one: one
             * receive buffer */
            if (c->first[id] < j)
                shared += p->microbatches * p->grad_bytes[id];
            else if (c->last[id] > k)
                shared += p->grad_bytes[id];
            if (c->first[id] >= j) summed += p->grad_bytes[id];
        }
    }
    const double in = j > 0 ? p->units[j - 1].out_bytes : 0;
    const double out = k < p->n_units - 1 ? p->units[k].out_bytes : 0;
    rc->inflight = ts_part_inflight(p->schedule, p->stages, p->microbatches, s);
    rc->compute = flops / (d->gemm_gflops * 1e9) + traffic / (d->mem_gbps * 1e9);
    /* the activation in and out, and their gradients back */
    rc->xfer = 2.0 * (in + out) / (d->link_gbps * 1e9);
    /* The activations (and the received input) of a micro-batch: in the
     * plan's arena for the one running, and on a stage before the last
     * saved for each micro-batch in flight (the last runs a micro-batch's
     * forward and backward at once); one buffer for the gradient of its
     * output, and a send buffer per micro-batch for the activation out and
     * the gradient back (session/stages_run.c); the micro-batch tree's
     * partial sums of the gradients the stage sums (stages_sum.c: not
     * those of a parameter an earlier stage also holds); the shared
     * parameters'. With one micro-batch nothing runs between its forward
     * and its backward, so none is saved. */
    const int last = s == p->stages - 1;
    const int M = p->microbatches;
    const int kept = last || M == 1 ? 1 : 1 + rc->inflight;
    const int tree = M > 1 ? ts_tree_sum_buffers(M) : 0;
    rc->mem = params + kept * (act + in) + out + M * (in + out) + tree * summed + shared;
    rc->params = params;
}

static ts_status check_problem(const ts_part_problem *p) {
    if (!p || !p->units || !p->devs || p->n_devs < 1 || (p->n_params > 0 && !p->param_bytes))
        return ts_fail(TS_ERR_INVALID, "partition: missing units, parameters or devices");
    if (p->stages < 1 || p->stages > TS_PIPE_MAX_STAGES)
        return ts_fail(TS_ERR_INVALID, "partition: %d stages (1..%d)", p->stages,
                       TS_PIPE_MAX_STAGES);
    if (p->microbatches < 1)
        return ts_fail(TS_ERR_INVALID, "partition: %d micro-batches (at least 1)", p->microbatches);
    if (p->n_units < p->stages)
        return ts_fail(TS_ERR_INVALID,
                       "partition: %d stages need %d cuts, but the graph has only %d place%s to "
                       "cut (positions where one activation crosses)",
                       p->stages, p->stages - 1, p->n_units - 1, p->n_units == 2 ? "" : "s");
    for (int i = 0; i < p->n_devs; i++) {
        const ts_device_speed *d = &p->devs[i];
        if (!(d->gemm_gflops > 0) || !(d->mem_gbps > 0) || !(d->link_gbps > 0) || !(d->mem_mb >= 0))
            return ts_fail(TS_ERR_INVALID,
                           "partition: device %d (%s) needs speeds > 0 and a memory limit >= 0 "
                           "(gemm %g GFLOP/s, memory %g GB/s, link %g GB/s, %g MiB)",
                           i, d->name, d->gemm_gflops, d->mem_gbps, d->link_gbps, d->mem_mb);
    }
    for (int u = 0; u < p->n_units; u++)
        for (int i = 0; i < p->units[u].n_params; i++)
            if (p->units[u].params[i] < 0 || p->units[u].params[i] >= p->n_params)
                return ts_fail(TS_ERR_INVALID, "partition: unit %d names parameter %d of %d", u,
                               p->units[u].params[i], p->n_params);
    return TS_OK;
}

ts_status ts_part_eval(const ts_part_problem *p, const int *last, ts_part_result *out) {
    ts_status s = check_problem(p);
    if (s != TS_OK) return s;
    if (last[p->stages - 1] != p->n_units - 1)
        return ts_fail(TS_ERR_INVALID, "partition: the last stage must end at unit %d",
                       p->n_units - 1);
    range_ctx c;
    if ((s = ctx_init(p, &c)) != TS_OK) return s;
    memset(out, 0, sizeof *out);
    out->fits = 1;
    for (int st = 0, j = 0; st < p->stages; st++) {
        if (last[st] < j || last[st] >= p->n_units) {
            ctx_free(&c);
            return ts_fail(TS_ERR_INVALID,
                           "partition: stage %d ends at unit %d, before it starts (%d)", st,
                           last[st], j);
        }
        range_cost rc;
        range_of(p, st, j, last[st], &c, &rc);
        out->last[st] = last[st];
        out->compute_s[st] = rc.compute;
        out->xfer_s[st] = rc.xfer;
        out->mem_bytes[st] = rc.mem;
        out->param_bytes[st] = rc.params;
        out->inflight[st] = rc.inflight;
        if (rc.compute + rc.xfer > out->objective) out->objective = rc.compute + rc.xfer;
        if (rc.mem > limit_bytes(p, st)) out->fits = 0;
        j = last[st] + 1;
    }
    ctx_free(&c);
    return TS_OK;
}

/* mode 0: minimise the slowest time among splits that fit; mode 1:
 * minimise the largest memory / limit (for the message when none fits). */
static ts_status search(const ts_part_problem *p, int mode, int *last, double *best_out) {
    const int S = p->stages, K = p->n_units;
    double *best = malloc((size_t)S * K * sizeof *best);
    int *from = malloc((size_t)S * K * sizeof *from);
    range_ctx c;
    if (!best || !from || ctx_init(p, &c) != TS_OK) {
        free(best), free(from);
        return ts_fail(TS_ERR_NOMEM, "partition: out of memory for %d stages x %d units", S, K);
    }
    for (int i = 0; i < S * K; i++) best[i] = INFINITY, from[i] = -1;
    for (int s = 0; s < S; s++) {
        /* stage s covers j..k; stages before it end at j-1 */
        const int khi = K - S + s; /* leave a unit for each later stage */
        for (int j = s; j <= (s ? khi : 0); j++) {
            const double before = s ? best[(s - 1) * K + j - 1] : 0;
            if (!isfinite(before)) continue;
            for (int k = s == S - 1 ? K - 1 : j; k <= khi; k++) {
                range_cost rc;
                range_of(p, s, j, k, &c, &rc);
                double v;
                if (mode == 0) {
                    if (rc.mem > limit_bytes(p, s)) continue;
                    v = rc.compute + rc.xfer;
                } else {
                    const double lim = limit_bytes(p, s);
                    v = isfinite(lim) ? rc.mem / lim : 0;
                }
                if (before > v) v = before;
                if (v < best[s * K + k]) best[s * K + k] = v, from[s * K + k] = j;
            }
        }
    }
    const double b = best[(S - 1) * K + K - 1];
    if (isfinite(b))
        for (int s = S - 1, k = K - 1; s >= 0; s--) {
            last[s] = k;
            k = from[s * K + k] - 1;
        }
    *best_out = b;
    free(best), free(from);
    ctx_free(&c);
    return TS_OK;
}

ts_status ts_part_search(const ts_part_problem *p, ts_part_result *out) {
    ts_status s = check_problem(p);
    if (s != TS_OK) return s;
    int last[TS_PIPE_MAX_STAGES];
    double b;
    if ((s = search(p, 0, last, &b)) != TS_OK) return s;
    if (isfinite(b)) return ts_part_eval(p, last, out);
    /* nothing fits: name the split that comes closest */
    if ((s = search(p, 1, last, &b)) != TS_OK) return s;
    if ((s = ts_part_eval(p, last, out)) != TS_OK) return s;
    int worst = 0;
    for (int st = 1; st < p->stages; st++)
        if (out->mem_bytes[st] / limit_bytes(p, st) > out->mem_bytes[worst] / limit_bytes(p, worst))
            worst = st;
    const double mib = 1024.0 * 1024.0;
    return ts_fail(TS_ERR_INVALID,
                   "partition: no split into %d stages fits the memory limits: the closest needs "
                   "%.1f MiB on stage %d (device %s, limit %.1f MiB; dist.max_mem_mb or the "
                   "devices file's mem_mb)",
                   p->stages, out->mem_bytes[worst] / mib, worst, dev_of(p, worst)->name,
                   limit_bytes(p, worst) / mib);
}

void ts_part_even(int n_units, int S, int *last) {
    int end = -1;
    for (int s = 0; s < S; s++) {
        end += n_units / S + (s < n_units % S);
        last[s] = end;
    }
}
