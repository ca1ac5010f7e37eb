/* Text dumps of a plan: the graph, the instruction list, the memory plan.
 * The instruction list is printed from the program; the graph and the
 * memory plan's value table need the graph, so ts_compile renders them
 * (ts_render_dumps) when asked to with ts_compile_options.keep_dumps. */
#include <stdlib.h>
#include "plan/lower.h"

static const char *mib(char *buf, size_t n, size_t bytes) {
    snprintf(buf, n, "%.2f MiB", (double)bytes / (1024.0 * 1024.0));
    return buf;
}

static void dump_plan(const ts_plan *p, FILE *out) {
    const ts_program *prog = &p->prog;
    fprintf(out, "# %d instructions, %.3f GFLOP per step\n", prog->n_ins, prog->flops * 1e-9);
    for (int i = 0; i < prog->n_ins; i++) {
        const ts_instr *in = &prog->ins[i];
        char tb[128];
        fprintf(out, "%5d %-18s", i, in->name);
        for (int j = 0; j < in->n_out; j++) {
            const ts_operand *o = &in->out[j];
            fprintf(out, " %s@%zu", ts_shape_str(tb, sizeof tb, o->dtype, o->rank, o->dims),
                    o->off);
        }
        fprintf(out, " <-");
        for (int j = 0; j < in->n_in && j < 16; j++) fprintf(out, " @%zu", in->in[j].off);
        if (in->n_in > 16) fprintf(out, " ...(%d inputs)", in->n_in);
        ts_backend_instr_info bi = {0, 0};
        p->backend->instr_info(prog, &p->rt, i, &bi);
        if (bi.shared_scratch)
            fprintf(out, " scratch %zu (backend buffer)", p->rt.ins[i].k.scratch_bytes);
        else if (in->scratch_bytes)
            fprintf(out, " scratch %zu@%zu", in->scratch_bytes, in->scratch_off);
        fprintf(out, "  ; %s%s\n", in->label, bi.optimised ? " [optimised]" : "");
    }
}

static void dump_memory(const ts_program *prog, const ts_compiled_graph *cg, FILE *out) {
    const ts_arena_layout *m = &prog->layout;
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
            m->peak_live, m->naive_peak);
    fprintf(out, "in-place outputs: %d\n", m->n_inplace);
    fprintf(out, "# value offsets\n");
    const ts_graph *g = cg->graph;
    for (int v = 0; v < g->n_values; v++) {
        char tb[128], lb[32];
        fprintf(out, "%12zu %10zu %-28s %s\n", cg->mp.off[v], ts_type_bytes(&g->values[v].t),
                ts_type_str(tb, sizeof tb, &g->values[v].t), ts_value_label(g, v, lb, sizeof lb));
    }
}

/* What one of the dumps prints, as a string (malloc'ed). */
static ts_status render(const ts_program *prog, const ts_compiled_graph *cg, int memory,
                        char **out) {
    size_t len = 0;
    FILE *f = open_memstream(out, &len);
    if (!f)
        return ts_fail(TS_ERR_NOMEM, "compile: rendering the %s dump", memory ? "memory" : "IR");
    if (memory)
        dump_memory(prog, cg, f);
    else
        ts_graph_print(cg->graph, cg->order, f);
    if (fclose(f) != 0) {
        free(*out);
        *out = NULL;
        return ts_fail(TS_ERR_NOMEM, "compile: rendering the %s dump", memory ? "memory" : "IR");
    }
    return TS_OK;
}

ts_status ts_render_dumps(ts_program *prog, const ts_compiled_graph *cg) {
    if (!prog->opt.keep_dumps) return TS_OK;
    ts_status s = render(prog, cg, 0, &prog->dump_ir);
    return s == TS_OK ? render(prog, cg, 1, &prog->dump_memory) : s;
}

static ts_status print_kept(const char *text, const char *what, FILE *out) {
    if (!text)
        return ts_fail(TS_ERR_INVALID,
                       "dump: the %s dump needs the graph, which the plan does not keep; compile "
                       "with ts_compile_options.keep_dumps to have it rendered then",
                       what);
    fputs(text, out);
    return TS_OK;
}

ts_status ts_plan_dump(const ts_plan *p, ts_dump_kind kind, FILE *out) {
    if (!p || !out) return ts_fail(TS_ERR_INVALID, "dump: NULL argument");
    switch (kind) {
    case TS_DUMP_IR: return print_kept(p->prog.dump_ir, "IR", out);
    case TS_DUMP_PLAN: dump_plan(p, out); return TS_OK;
    case TS_DUMP_MEMORY: return print_kept(p->prog.dump_memory, "memory", out);
    }
    return ts_fail(TS_ERR_INVALID, "dump: unknown kind %d", (int)kind);
}
