/* partition_graph.c — a forward graph as units for the cut search, the
 * chosen stages, and the `--dump partition` text (tessel/pipeline.h).
 *
 * Candidate cuts are the positions of the build order where exactly one
 * floating activation is alive across the cut: every path from a node
 * before it to the loss then goes through that value, so a stage is its
 * nodes plus that one value received, and the pipeline sends one tensor
 * forward and its gradient back per micro-batch. */
#include <stdlib.h>
#include <string.h>
#include "ops/op.h"
#include "passes/partition.h"
#include "passes/partition_graph.h"

struct ts_partition {
    int S, M;
    ts_pipe_schedule sched;
    int n_order;
    int32_t *order; /* live forward nodes, build order */
    int n_units;
    ts_part_unit *units;
    int *unit_end;       /* last position (into order) of each unit */
    int32_t *unit_cut;   /* value crossing after each unit (-1: the last) */
    int *param_ids;      /* storage of the units' params */
    double *param_bytes; /* per parameter, with gradient and state */
    double *grad_bytes;  /* per parameter, its gradient */
    int32_t *param_val;  /* its value id */
    int n_params;
    ts_device_speed devs[TS_PIPE_MAX_STAGES];
    int n_devs;
    ts_part_result res, even;
    int even_fits;
    double max_mem_mb;
    ts_partition_stage st[TS_PIPE_MAX_STAGES];
    char (*op_names)[24]; /* per position, for the listing */
};

ts_partition_options ts_partition_options_default(void) {
    ts_partition_options o = {0};
    o.stages = 1;
    o.microbatches = 1;
    o.schedule = TS_PIPE_1F1B;
    o.state_per_param = 2;
    return o;
}

static int is_gemm(int op) {
    return op == TS_OP_MATMUL || op == TS_OP_ATTENTION || op == TS_OP_CONV ||
           op == TS_OP_CONV_TRANSPOSE || op == TS_OP_SPMM;
}

static int is_float(ts_dtype d) {
    return d == TS_F32 || d == TS_F64 || d == TS_BF16 || d == TS_F16;
}

void ts_partition_free(ts_partition *p) {
    if (!p) return;
    free(p->order), free(p->units), free(p->unit_end), free(p->unit_cut);
    free(p->param_ids), free(p->param_bytes), free(p->grad_bytes), free(p->param_val);
    free(p->op_names);
    free(p);
}

/* The live nodes (ancestors of the loss) in build order. */
static ts_status live_order(const ts_graph *g, ts_val loss, ts_partition *p) {
    unsigned char *need = calloc((size_t)g->n_values, 1);
    p->order = malloc((size_t)(g->n_nodes > 0 ? g->n_nodes : 1) * sizeof *p->order);
    if (!need || !p->order) {
        free(need);
        return ts_fail(TS_ERR_NOMEM, "partition: out of memory");
    }
    need[loss.id] = 1;
    unsigned char *keep = calloc((size_t)(g->n_nodes > 0 ? g->n_nodes : 1), 1);
    if (!keep) {
        free(need);
        return ts_fail(TS_ERR_NOMEM, "partition: out of memory");
    }
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        const ts_node *n = &g->nodes[i];
        if (n->dead) continue;
        int used = 0;
        for (int j = 0; j < n->n_out; j++) used |= n->out[j] >= 0 && need[n->out[j]];
        if (!used) continue;
        keep[i] = 1;
        for (int j = 0; j < n->n_in; j++) need[n->in[j]] = 1;
    }
    p->n_order = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (keep[i]) p->order[p->n_order++] = i;
    free(need), free(keep);
    if (p->n_order == 0)
        return ts_fail(TS_ERR_INVALID, "partition: the loss is not computed by any node");
    return TS_OK;
}

/* Cuts: positions where exactly one float activation crosses. */
static ts_status find_units(const ts_graph *g, ts_partition *p) {
    const int n = p->n_order;
    int *pos = malloc((size_t)g->n_nodes * sizeof *pos), *last = NULL;
    long long *cnt = calloc((size_t)n + 1, sizeof *cnt), *ids = calloc((size_t)n + 1, sizeof *ids);
    last = malloc((size_t)g->n_values * sizeof *last);
    p->unit_end = malloc((size_t)n * sizeof *p->unit_end);
    p->unit_cut = malloc((size_t)n * sizeof *p->unit_cut);
    ts_status s = TS_OK;
    if (!pos || !cnt || !ids || !last || !p->unit_end || !p->unit_cut) {
        s = ts_fail(TS_ERR_NOMEM, "partition: out of memory");
        goto out;
    }
    for (int i = 0; i < g->n_nodes; i++) pos[i] = -1;
    for (int i = 0; i < n; i++) pos[p->order[i]] = i;
    for (int v = 0; v < g->n_values; v++) last[v] = -1;
    for (int i = 0; i < n; i++) {
        const ts_node *nd = &g->nodes[p->order[i]];
        for (int j = 0; j < nd->n_in; j++) last[nd->in[j]] = i;
    }
    for (int v = 0; v < g->n_values; v++) {
        const ts_value *val = &g->values[v];
        if (val->kind != TS_VK_NODE || val->node < 0 || pos[val->node] < 0) continue;
        const int a = pos[val->node];
        if (last[v] <= a) continue;
        /* alive across the cuts after positions a .. last-1 */
        /* a non-float value (indices) crossing weighs more than any
         * count of activations, so no cut is made across it */
        const long long w = is_float(val->t.dtype) ? 1 : 1 << 30;
        cnt[a] += w, cnt[last[v]] -= w;
        ids[a] += v, ids[last[v]] -= v;
    }
    long long c = 0, id = 0;
    p->n_units = 0;
    for (int i = 0; i < n - 1; i++) {
        c += cnt[i], id += ids[i];
        if (c != 1) continue;
        p->unit_end[p->n_units] = i;
        p->unit_cut[p->n_units++] = (int32_t)id;
    }
    p->unit_end[p->n_units] = n - 1;
    p->unit_cut[p->n_units++] = -1;
out:
    free(pos), free(cnt), free(ids), free(last);
    return s;
}

static ts_status unit_costs(const ts_graph *g, ts_partition *p, int state_per_param) {
    int *pidx = malloc((size_t)g->n_values * sizeof *pidx);
    p->units = calloc((size_t)p->n_units, sizeof *p->units);
    p->param_bytes = malloc((size_t)g->n_values * sizeof *p->param_bytes);
    p->grad_bytes = malloc((size_t)g->n_values * sizeof *p->grad_bytes);
    p->param_val = malloc((size_t)g->n_values * sizeof *p->param_val);
    int cap = 1; /* every input of every node, the most the units can list */
    for (int i = 0; i < p->n_order; i++) cap += g->nodes[p->order[i]].n_in;
    p->param_ids = malloc((size_t)cap * sizeof *p->param_ids);
    p->op_names = malloc((size_t)p->n_order * sizeof *p->op_names);
    int *seen = calloc((size_t)g->n_values, sizeof *seen);
    if (!pidx || !p->units || !p->param_bytes || !p->grad_bytes || !p->param_val || !p->param_ids ||
        !p->op_names || !seen) {
        free(pidx), free(seen);
        return ts_fail(TS_ERR_NOMEM, "partition: out of memory");
    }
    for (int v = 0; v < g->n_values; v++) pidx[v] = -1;
    int np = 0;
    for (int u = 0, i = 0; u < p->n_units; u++) {
        ts_part_unit *un = &p->units[u];
        un->params = p->param_ids + np; /* fixed up below if the store moves */
        const int first = np;
        for (; i <= p->unit_end[u]; i++) {
            const ts_node *nd = &g->nodes[p->order[i]];
            const ts_op_def *def = ts_op_get(nd->op);
            snprintf(p->op_names[i], sizeof p->op_names[i], "%s", ts_ir_op_name(nd->op));
            double in = 0, outb = 0;
            for (int j = 0; j < nd->n_in; j++) {
                const ts_value *v = &g->values[nd->in[j]];
                in += (double)ts_type_bytes(&v->t);
                if (v->kind != TS_VK_PARAM) continue;
                if (pidx[nd->in[j]] < 0) {
                    pidx[nd->in[j]] = p->n_params;
                    p->param_val[p->n_params] = nd->in[j];
                    p->grad_bytes[p->n_params] = (double)ts_type_bytes(&v->t);
                    p->param_bytes[p->n_params++] =
                        (double)ts_type_bytes(&v->t) * (2.0 + state_per_param);
                }
                if (seen[nd->in[j]] == u + 1) continue;
                seen[nd->in[j]] = u + 1;
                if (np == cap) {
                    free(pidx), free(seen);
                    return ts_fail(TS_ERR_INTERNAL, "partition: parameter list overflow");
                }
                p->param_ids[np++] = pidx[nd->in[j]];
            }
            for (int j = 0; j < nd->n_out; j++)
                if (nd->out[j] >= 0) outb += (double)ts_type_bytes(&g->values[nd->out[j]].t);
            if (def && (def->flags & TS_OPF_ALIAS)) continue; /* a view moves nothing */
            const double f = def && def->cost ? def->cost(g, nd) : 0;
            /* backward: about twice the forward's work */
            if (is_gemm(nd->op))
                un->gemm_flops += 3.0 * f;
            else
                un->mem_traffic += 3.0 * (in + outb);
            un->act_bytes += outb;
        }
        un->n_params = np - first;
        un->out_bytes =
            p->unit_cut[u] >= 0 ? (double)ts_type_bytes(&g->values[p->unit_cut[u]].t) : 0;
    }
    free(pidx), free(seen);
    return TS_OK;
}

static void fill_stage(const ts_graph *g, ts_partition *p, int s) {
    ts_partition_stage *st = &p->st[s];
    const int first_unit = s ? p->res.last[s - 1] + 1 : 0, last_unit = p->res.last[s];
    st->first_unit = first_unit;
    st->last_unit = last_unit;
    st->first_op = first_unit ? p->unit_end[first_unit - 1] + 1 : 0;
    st->n_ops = p->unit_end[last_unit] - st->first_op + 1;
    st->device = p->devs[s % p->n_devs].name;
    st->compute_s = p->res.compute_s[s];
    st->xfer_s = p->res.xfer_s[s];
    st->time_s = st->compute_s + st->xfer_s;
    st->mem_bytes = p->res.mem_bytes[s];
    st->param_bytes = p->res.param_bytes[s];
    st->inflight = p->res.inflight[s];
    int np = 0;
    for (int u = first_unit; u <= last_unit; u++) np += p->units[u].n_params;
    st->n_params = np; /* refined in the listing (distinct) */
    const int32_t cut = p->unit_cut[last_unit];
    st->cut_value[0] = 0;
    st->cut_bytes = 0;
    if (cut >= 0) {
        char name[32], type[48];
        ts_value_label(g, cut, name, sizeof name);
        snprintf(st->cut_value, sizeof st->cut_value, "%s %s", name,
                 ts_type_str(type, sizeof type, &g->values[cut].t));
        st->cut_bytes = (long long)ts_type_bytes(&g->values[cut].t);
    }
}

ts_status ts_partition_graph(const ts_graph *g, ts_val loss, const ts_partition_options *o,
                             ts_partition **out) {
    if (!g || !o || !out || loss.id < 0 || loss.id >= g->n_values)
        return ts_fail(TS_ERR_INVALID, "partition: missing graph, loss or options");
    if (o->n_devices < 0 || (o->n_devices > 0 && !o->devices) || o->n_devices > TS_PIPE_MAX_STAGES)
        return ts_fail(TS_ERR_INVALID, "partition: %d devices (0..%d)", o->n_devices,
                       TS_PIPE_MAX_STAGES);
    ts_partition *p = calloc(1, sizeof *p);
    if (!p) return ts_fail(TS_ERR_NOMEM, "partition: out of memory");
    p->S = o->stages, p->M = o->microbatches, p->sched = o->schedule;
    p->max_mem_mb = o->max_mem_mb;
    ts_status s = TS_OK;
    if (o->n_devices > 0) {
        memcpy(p->devs, o->devices, (size_t)o->n_devices * sizeof *p->devs);
        p->n_devs = o->n_devices;
    } else {
        s = ts_device_measure(o->threads, &p->devs[0]);
        p->n_devs = 1;
    }
    if (s == TS_OK) s = live_order(g, loss, p);
    if (s == TS_OK) s = find_units(g, p);
    if (s == TS_OK) s = unit_costs(g, p, o->state_per_param);
    ts_part_problem pr = {p->units, p->n_units,    p->param_bytes, p->n_params,
                          p->devs,  p->n_devs,     p->S,           p->M,
                          p->sched, p->max_mem_mb, p->grad_bytes};
    if (s == TS_OK) s = ts_part_search(&pr, &p->res);
    if (s == TS_OK && p->S <= p->n_units) {
        int last[TS_PIPE_MAX_STAGES];
        ts_part_even(p->n_units, p->S, last);
        s = ts_part_eval(&pr, last, &p->even);
    }
    if (s != TS_OK) {
        ts_partition_free(p);
        return s;
    }
    for (int st = 0; st < p->S; st++) fill_stage(g, p, st);
    *out = p;
    return TS_OK;
}

int ts_partition_stages(const ts_partition *p) {
    return p ? p->S : 0;
}
const ts_partition_stage *ts_partition_stage_at(const ts_partition *p, int s) {
    return p && s >= 0 && s < p->S ? &p->st[s] : NULL;
}
double ts_partition_objective(const ts_partition *p) {
    return p ? p->res.objective : 0;
}
double ts_partition_even_objective(const ts_partition *p) {
    return p && p->even.fits ? p->even.objective : -1;
}

/* The stage time splits into forward and backward as 1 : 2 (the cost
 * model's backward is twice the forward); transfers ride on the link. */
void ts_partition_predict(const ts_partition *p, double *step_s, double *bubble) {
    double f[TS_PIPE_MAX_STAGES], b[TS_PIPE_MAX_STAGES], l[TS_PIPE_MAX_STAGES];
    for (int s = 0; s < p->S; s++) {
        f[s] = p->st[s].compute_s / 3.0;
        b[s] = 2.0 * p->st[s].compute_s / 3.0;
        /* one direction of the boundary after stage s */
        l[s] = s < p->S - 1 ? (double)p->st[s].cut_bytes / (p->devs[s % p->n_devs].link_gbps * 1e9)
                            : 0;
    }
    if (ts_pipe_simulate(p->sched, p->S, p->M, f, b, l, step_s, bubble) != TS_OK)
        *step_s = *bubble = -1;
}

const int32_t *ts_partition_order(const ts_partition *p, int *n) {
    *n = p->n_order;
    return p->order;
}

void ts_partition_stage_nodes(const ts_partition *p, int s, int *first, int *count, int32_t *in_cut,
                              int32_t *out_cut) {
    const ts_partition_stage *st = &p->st[s];
    *first = st->first_op;
    *count = st->n_ops;
    *in_cut = s ? p->unit_cut[p->st[s - 1].last_unit] : -1;
    *out_cut = p->unit_cut[st->last_unit];
}

ts_status ts_partition_print(const ts_partition *p, FILE *out) {
    const double mib = 1024.0 * 1024.0;
    fprintf(out, "partition: %d stage%s, %d micro-batch%s, %s; %d place%s to cut\n", p->S,
            p->S == 1 ? "" : "s", p->M, p->M == 1 ? "" : "es",
            p->sched == TS_PIPE_GPIPE ? "gpipe" : "1f1b", p->n_units - 1,
            p->n_units == 2 ? "" : "s");
    for (int i = 0; i < p->n_devs; i++) {
        const double lim = p->devs[i].mem_mb > 0 ? p->devs[i].mem_mb : p->max_mem_mb;
        fprintf(out, "device %d %-12s gemm %.1f GFLOP/s, memory %.1f GB/s, link %.1f GB/s, ", i,
                p->devs[i].name, p->devs[i].gemm_gflops, p->devs[i].mem_gbps, p->devs[i].link_gbps);
        if (lim > 0)
            fprintf(out, "limit %.0f MiB\n", lim);
        else
            fprintf(out, "no memory limit\n");
    }
    fprintf(out, "cuts:");
    for (int s = 0; s + 1 < p->S; s++)
        fprintf(out, " after op %d (%s, %.2f MiB per micro-batch)",
                p->st[s].first_op + p->st[s].n_ops - 1, p->st[s].cut_value,
                (double)p->st[s].cut_bytes / mib);
    fprintf(out, "%s\n", p->S == 1 ? " none" : "");
    fprintf(out, "%-5s %-12s %6s %8s %11s %11s %11s %11s %9s %8s\n", "stage", "device", "ops",
            "units", "persist MiB", "memory MiB", "compute ms", "transfer ms", "time ms",
            "in flight");
    for (int s = 0; s < p->S; s++) {
        const ts_partition_stage *st = &p->st[s];
        fprintf(out, "%-5d %-12s %6d %4d..%-3d %11.1f %11.1f %11.3f %11.3f %9.3f %8d\n", s,
                st->device, st->n_ops, st->first_unit, st->last_unit, st->param_bytes / mib,
                st->mem_bytes / mib, st->compute_s * 1e3, st->xfer_s * 1e3, st->time_s * 1e3,
                st->inflight);
    }
    double step, bubble;
    ts_partition_predict(p, &step, &bubble);
    fprintf(out,
            "estimate: slowest stage %.3f ms per micro-batch; step %.3f ms, bubble %.1f %% "
            "(schedule simulated)\n",
            p->res.objective * 1e3, step * 1e3, bubble * 100);
    if (p->S > 1) {
        if (p->even.fits)
            fprintf(out,
                    "even split (units shared equally): slowest stage %.3f ms; the chosen "
                    "split is %.2fx faster\n",
                    p->even.objective * 1e3, p->even.objective / p->res.objective);
        else
            fprintf(out, "even split (units shared equally): does not fit the memory limits\n");
    }
    /* each stage's ops: op kinds with their counts, in first-use order */
    for (int s = 0; s < p->S; s++) {
        const ts_partition_stage *st = &p->st[s];
        fprintf(out, "stage %d ops %d..%d:", s, st->first_op, st->first_op + st->n_ops - 1);
        for (int i = st->first_op; i < st->first_op + st->n_ops; i++) {
            int dup = 0, count = 0;
            for (int j = st->first_op; j < i && !dup; j++)
                dup = !strcmp(p->op_names[j], p->op_names[i]);
            if (dup) continue;
            for (int j = i; j < st->first_op + st->n_ops; j++)
                count += !strcmp(p->op_names[j], p->op_names[i]);
            fprintf(out, " %s x%d", p->op_names[i], count);
        }
        fprintf(out, "\n");
    }
    return ferror(out) ? ts_fail(TS_ERR_IO, "partition: writing the dump failed") : TS_OK;
}
