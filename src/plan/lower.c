/* Lowering: the scheduled, memory-planned graph becomes a program (see
 * backends/program.h). Everything a backend or the plan needs later is
 * copied out of the graph and the op registry here, so that neither is
 * needed once ts_compile returns. */
#include <stdlib.h>
#include <string.h>
#include "plan/lower.h"

static void set_operand(ts_operand *o, const ts_type *t, size_t off) {
    o->dtype = t->dtype;
    o->rank = t->rank;
    memcpy(o->dims, t->dims, sizeof o->dims);
    o->off = off;
}

/* The label names the value in messages: its own name, or for an unnamed
 * value "%id = op(inputs)" so a NaN report is still readable. */
static char *make_label(const ts_graph *g, const ts_node *n, const char *op) {
    char lb[64], buf[600];
    size_t k = 0;
    if (n->n_out && g->values[n->out[0]].name) {
        snprintf(buf, sizeof buf, "%s", g->values[n->out[0]].name);
    } else {
        if (n->n_out) k = (size_t)snprintf(buf, sizeof buf, "%%%d = ", n->out[0]);
        k += (size_t)snprintf(buf + k, sizeof buf - k, "%s(", op);
        for (int j = 0; j < n->n_in && j < 3 && k < sizeof buf; j++)
            k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%s", j ? ", " : "",
                                  ts_value_label(g, n->in[j], lb, sizeof lb));
        if (k < sizeof buf) snprintf(buf + k, sizeof buf - k, "%s)", n->n_in > 3 ? ", ..." : "");
    }
    return ts_strdup(buf);
}

static ts_status lower_instrs(ts_program *prog, const ts_compiled_graph *cg, int *node_of) {
    const ts_graph *g = cg->graph;
    const ts_memplan *mp = &cg->mp;
    prog->ins = ts_zalloc(sizeof(ts_instr) * (size_t)(cg->n_order + 1), "plan instructions");
    if (!prog->ins) return TS_ERR_NOMEM;
    for (int k = 0; k < cg->n_order; k++) {
        int i = cg->order[k];
        const ts_node *n = &g->nodes[i];
        const ts_op_def *def = ts_op_get(n->op);
        if (mp->alias_skip[i]) continue;
        node_of[prog->n_ins] = i;
        ts_instr *in = &prog->ins[prog->n_ins++];
        in->op = n->op;
        in->name = def->name;
        in->flags = def->flags;
        in->kernel = def->kernel;
        in->a = n->a;
        in->n_in = n->n_in;
        in->n_out = n->n_out;
        in->flops = def->cost ? def->cost(g, n) : 0;
        prog->flops += in->flops;
        in->in = ts_alloc(sizeof(ts_operand) * (size_t)(n->n_in + 1), "plan instruction");
        if (!in->in) return TS_ERR_NOMEM;
        for (int j = 0; j < n->n_in; j++)
            set_operand(&in->in[j], &g->values[n->in[j]].t, mp->off[n->in[j]]);
        for (int j = 0; j < n->n_out; j++)
            set_operand(&in->out[j], &g->values[n->out[j]].t, mp->off[n->out[j]]);
        in->scratch_off = mp->scratch_off[i];
        in->scratch_bytes = mp->scratch_bytes[i];
        if (!(in->label = make_label(g, n, def->name))) return TS_ERR_NOMEM;
        if (prog->gate_ins < 0 && (in->flags & TS_OPF_UPDATE)) prog->gate_ins = prog->n_ins - 1;
    }
    return TS_OK;
}

static ts_status add_named(ts_program *prog, const ts_compiled_graph *cg, const char *name,
                           int32_t v, int *named_of) {
    ts_named *nm = &prog->named[prog->n_named];
    if (!(nm->name = ts_strdup(name))) return TS_ERR_NOMEM;
    const ts_value *val = &cg->graph->values[v];
    set_operand(&nm->v, &val->t, cg->mp.off[v]);
    nm->kind = val->kind == TS_VK_INPUT   ? TS_NAMED_INPUT
               : val->kind == TS_VK_PARAM ? TS_NAMED_PARAM
               : val->kind == TS_VK_STATE ? TS_NAMED_STATE
                                          : TS_NAMED_VALUE;
    nm->is_grad = val->grad_of >= 0;
    named_of[v] = prog->n_named++;
    return TS_OK;
}

static ts_status build_named(ts_program *prog, const ts_compiled_graph *cg, int32_t loss,
                             int *named_of) {
    const ts_graph *g = cg->graph;
    prog->named = ts_zalloc(sizeof(ts_named) * (size_t)(g->n_values + 2), "plan names");
    if (!prog->named) return TS_ERR_NOMEM;
    ts_status s = TS_OK;
    for (int v = 0; v < g->n_values && s == TS_OK; v++) {
        const ts_value *val = &g->values[v];
        int addressable = val->kind == TS_VK_PARAM || val->kind == TS_VK_STATE ||
                          val->kind == TS_VK_INPUT || val->is_output || val->grad_of >= 0;
        if (addressable && val->name) s = add_named(prog, cg, val->name, v, named_of);
    }
    int has_loss_name = 0;
    for (int i = 0; i < prog->n_named && !has_loss_name; i++)
        has_loss_name = !strcmp(prog->named[i].name, "loss");
    if (s == TS_OK && loss >= 0 && !has_loss_name) s = add_named(prog, cg, "loss", loss, named_of);
    return s;
}

static void set_layout(ts_arena_layout *l, const ts_compiled_graph *cg) {
    const ts_memplan *m = &cg->mp;
    l->arena_bytes = m->arena_bytes;
    l->param_off = m->param_off, l->param_bytes = m->param_bytes;
    l->grad_off = m->grad_off, l->grad_bytes = m->grad_bytes;
    l->state_off = m->state_off, l->state_bytes = m->state_bytes;
    l->io_off = m->io_off, l->io_bytes = m->io_bytes;
    l->temp_off = m->temp_off, l->temp_bytes = m->temp_bytes;
    l->naive_bytes = m->naive_bytes;
    l->n_inplace = m->n_inplace;
    l->zero_grad_bytes = m->zero_grad_bytes;
    l->zero_grad_peak = m->zero_grad_peak;
    l->zero_shard_bytes = m->zero_shard_bytes;
    l->zero_param_bytes = m->zero_param_bytes;
    l->zero_param_peak = m->zero_param_peak;
}

ts_status ts_lower(ts_program *prog, const ts_compiled_graph *cg, int32_t loss) {
    const ts_graph *g = cg->graph;
    set_layout(&prog->layout, cg);
    prog->gate_ins = -1;
    int *node_of = ts_alloc(sizeof(int) * (size_t)(cg->n_order + 1), "lowering");
    int *named_of = ts_alloc(sizeof(int) * (size_t)(g->n_values + 1), "lowering");
    ts_status s = node_of && named_of ? TS_OK : TS_ERR_NOMEM;
    for (int v = 0; s == TS_OK && v < g->n_values; v++) named_of[v] = -1;
    if (s == TS_OK) s = lower_instrs(prog, cg, node_of);
    if (s == TS_OK) s = build_named(prog, cg, loss, named_of);
    if (s == TS_OK && loss >= 0) {
        prog->has_loss = 1;
        prog->loss_off = cg->mp.off[loss];
        prog->loss_dtype = g->values[loss].t.dtype;
    }
    if (s == TS_OK) s = ts_lower_shard_layout(prog, g, node_of, named_of);
    free(node_of);
    free(named_of);
    return s;
}

void ts_program_free(ts_program *prog) {
    for (int i = 0; prog->ins && i < prog->n_ins; i++) {
        free(prog->ins[i].in);
        free(prog->ins[i].label);
    }
    free(prog->ins);
    for (int i = 0; i < prog->n_named; i++) free(prog->named[i].name);
    free(prog->named);
    free(prog->shards);
    free(prog->dump_ir);
    free(prog->dump_memory);
    memset(prog, 0, sizeof *prog);
}
