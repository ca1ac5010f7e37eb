/* Text dumps of a plan: the graph, the instruction list, the memory plan. */
#include <stdlib.h>
#include "plan.h"

static const char *mib(char *buf, size_t n, size_t bytes) {
    snprintf(buf, n, "%.2f MiB", (double)bytes / (1024.0 * 1024.0));
    return buf;
}

static void dump_plan(const ts_plan *p, FILE *out) {
    fprintf(out, "# %d instructions, %.3f GFLOP per step\n", p->n_ins, p->flops * 1e-9);
    for (int i = 0; i < p->n_ins; i++) {
        const ts_instr *in = &p->ins[i];
        const ts_op_def *def = ts_op_get(in->op);
        char tb[128];
        fprintf(out, "%5d %-18s", i, def->name);
        for (int j = 0; j < in->n_out; j++) {
            ts_type t = {in->out[j].dtype, in->out[j].rank, {0}};
            for (int d = 0; d < t.rank; d++) t.dims[d] = in->out[j].dims[d];
            fprintf(out, " %s@%zu", ts_type_str(tb, sizeof tb, &t), in->out_off[j]);
        }
        fprintf(out, " <-");
        for (int j = 0; j < in->n_in && j < 16; j++) fprintf(out, " @%zu", in->in_off[j]);
        if (in->n_in > 16) fprintf(out, " ...(%d inputs)", in->n_in);
        ts_backend_instr_info bi = {0, 0};
        p->backend->instr_info(p, i, &bi);
        if (bi.shared_scratch)
            fprintf(out, " scratch %zu (backend buffer)", in->scratch_bytes);
        else if (in->scratch_bytes)
            fprintf(out, " scratch %zu@%zu", in->scratch_bytes, in->scratch_off);
        fprintf(out, "  ; %s%s\n", in->label, bi.optimised ? " [optimised]" : "");
    }
}

static void dump_memory(const ts_plan *p, FILE *out) {
    const ts_memplan *m = &p->mp;
    char a[32], b[32];
    fprintf(out, "arena          %12zu bytes  %s\n", m->arena_bytes,
            mib(a, sizeof a, m->arena_bytes));
    fprintf(out, "  params       %12zu bytes  @%zu\n", m->param_bytes, m->param_off);
    fprintf(out, "  grads        %12zu bytes  @%zu\n", m->grad_bytes, m->grad_off);
    if (m->zero_grad_bytes)
        fprintf(out,
                "    ZeRO-2: gradient buckets %zu bytes in the temporaries, at most %zu alive at "
                "once; shards %zu bytes\n",
                m->zero_grad_bytes, m->zero_grad_peak, m->zero_shard_bytes);
    fprintf(out, "  opt state    %12zu bytes  @%zu\n", m->state_bytes, m->state_off);
    fprintf(out, "  io/consts    %12zu bytes  @%zu\n", m->io_bytes, m->io_off);
    fprintf(out, "  temporaries  %12zu bytes  @%zu\n", m->temp_bytes, m->temp_off);
    fprintf(out, "naive sum      %12zu bytes  %s (every tensor its own buffer)\n", m->naive_bytes,
            mib(b, sizeof b, m->naive_bytes));
    fprintf(out, "arena / naive  %12.3f\n",
            m->naive_bytes ? (double)m->arena_bytes / (double)m->naive_bytes : 0.0);
    fprintf(out, "peak live temporaries: %zu bytes (schedule) vs %zu bytes (build order)\n",
            p->peak_live, p->naive_peak);
    fprintf(out, "in-place outputs: %d\n", m->n_inplace);
    fprintf(out, "# value offsets\n");
    const ts_graph *g = p->graph;
    for (int v = 0; v < g->n_values; v++) {
        char tb[128], lb[32];
        fprintf(out, "%12zu %10zu %-28s %s\n", m->off[v], ts_type_bytes(&g->values[v].t),
                ts_type_str(tb, sizeof tb, &g->values[v].t), ts_value_label(g, v, lb, sizeof lb));
    }
}

ts_status ts_plan_dump(const ts_plan *p, ts_dump_kind kind, FILE *out) {
    if (!p || !out) return ts_fail(TS_ERR_INVALID, "dump: NULL argument");
    switch (kind) {
    case TS_DUMP_IR: ts_graph_print(p->graph, p->order, out); return TS_OK;
    case TS_DUMP_PLAN: dump_plan(p, out); return TS_OK;
    case TS_DUMP_MEMORY: dump_memory(p, out); return TS_OK;
    }
    return ts_fail(TS_ERR_INVALID, "dump: unknown kind %d", (int)kind);
}
