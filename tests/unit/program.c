/* The compiled program apart from its runtime state (backends/program.h,
 * runtime.h): every instruction carries its op's name, flags and reference
 * kernel copied from the registry, its operands' arena offsets match the
 * memory plan, the runtime binds each to the arena with prebuilt kernel
 * arguments, the update gate sits at the first update-phase instruction,
 * and the plan keeps no graph: the IR and memory dumps exist only when
 * ts_compile rendered them (keep_dumps), the IR one identical to the graph
 * the pipeline prints after its last pass. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "ops/op.h"
#include "plan/plan.h"

static ts_graph *small_graph(ts_val *loss) {
    ts_graph *g = ts_graph_new();
    ts_val x = ts_input(g, "x", TS_F32, 2, (int64_t[]){8, 5});
    ts_val y = ts_input(g, "y", TS_F32, 2, (int64_t[]){4, 6});
    ts_val w = ts_param(g, "fc.weight", TS_F32, 2, (int64_t[]){5, 3}, ts_init_uniform(-1, 1));
    ts_val b = ts_param(g, "fc.bias", TS_F32, 1, (int64_t[]){3}, ts_init_zeros());
    ts_val h = ts_relu(g, ts_add(g, ts_matmul(g, x, w, 0, 0), b));
    *loss = ts_mse_loss(g, ts_reshape(g, h, 2, (int64_t[]){4, 6}), y);
    return g;
}

static ts_status compile(ts_graph *g, ts_val loss, int keep_dumps, FILE *after_memplan, ts_plan **p,
                         ts_compiled_graph *kept) {
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
    ts_compile_options o = ts_compile_options_default();
    o.keep_dumps = keep_dumps;
    if (after_memplan) o.dump_after = "memplan", o.dump_to = after_memplan;
    return ts_compile_keep(g, &spec, &o, p, kept);
}

static char *dump(const ts_plan *p, ts_dump_kind kind, ts_status *s) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    *s = f ? ts_plan_dump(p, kind, f) : TS_ERR_NOMEM;
    if (f) fclose(f);
    return text;
}

static void check_program(const ts_plan *p, const ts_compiled_graph *kept) {
    const ts_program *prog = &p->prog;
    const ts_runtime *rt = &p->rt;
    int skipped = 0, first_update = -1;
    for (int k = 0; k < kept->n_order; k++) skipped += kept->mp.alias_skip[kept->order[k]] != 0;
    CHECK(skipped > 0, "the reshape should be a view (no instruction)");
    CHECK(prog->n_ins == kept->n_order - skipped,
          "%d instructions for %d scheduled nodes, %d views", prog->n_ins, kept->n_order, skipped);
    for (int i = 0; i < prog->n_ins; i++) {
        const ts_instr *in = &prog->ins[i];
        const ts_rt_instr *r = &rt->ins[i];
        const ts_op_def *def = ts_op_get(in->op);
        CHECK(in->name == def->name && in->flags == def->flags && in->kernel == def->kernel,
              "instruction %d (%s): name, flags or kernel not the registry's", i, def->name);
        if (first_update < 0 && (def->flags & TS_OPF_UPDATE)) first_update = i;
        CHECK(r->k.a == &in->a && r->k.label == in->label && r->k.ctx == &rt->ctx &&
                  r->k.in == r->in && r->k.out == r->out && r->k.n_in == in->n_in &&
                  r->k.n_out == in->n_out,
              "instruction %d (%s): kernel arguments not bound to it", i, in->name);
        for (int j = 0; j < in->n_in; j++)
            CHECK(r->in[j].data == ts_plan_at(p, in->in[j].off) &&
                      r->in[j].dtype == in->in[j].dtype &&
                      in->in[j].off + ts_operand_bytes(&in->in[j]) <= prog->layout.arena_bytes,
                  "instruction %d (%s): input %d not bound at its offset", i, in->name, j);
        for (int j = 0; j < in->n_out; j++)
            CHECK(r->out[j].data == ts_plan_at(p, in->out[j].off) &&
                      r->out[j].rank == in->out[j].rank,
                  "instruction %d (%s): output %d not bound at its offset", i, in->name, j);
    }
    CHECK(first_update >= 0 && prog->gate_ins == first_update,
          "the gate at %d, the first update-phase instruction at %d", prog->gate_ins, first_update);
    /* the named values: offsets from the memory plan, kinds from the graph */
    const ts_graph *g = kept->graph;
    int found = 0;
    for (int v = 0; v < g->n_values; v++) {
        const ts_value *val = &g->values[v];
        const ts_named *nm = val->name ? ts_plan_find(p, val->name) : NULL;
        if (!nm || val->kind == TS_VK_NODE) continue;
        found++;
        ts_named_kind want = val->kind == TS_VK_INPUT   ? TS_NAMED_INPUT
                             : val->kind == TS_VK_PARAM ? TS_NAMED_PARAM
                                                        : TS_NAMED_STATE;
        CHECK(nm->v.off == kept->mp.off[v] && nm->kind == want && nm->v.dtype == val->t.dtype &&
                  nm->v.rank == val->t.rank,
              "named value '%s' differs from the graph's", val->name);
    }
    CHECK(found >= 8, "%d leaves named (x, y, 2 params, 4 AdamW moments at least)", found);
    const ts_named *l = ts_plan_find(p, "loss");
    CHECK(l && prog->has_loss && l->v.off == prog->loss_off && prog->loss_dtype == TS_F32,
          "the loss is not where the program reads it");
}

int main(void) {
    ts_val loss;
    ts_graph *g = small_graph(&loss);
    CHECK_OK(ts_graph_status(g));

    /* keep_dumps: the IR dump is the graph the pipeline prints after memplan */
    char *after = NULL;
    size_t after_len = 0;
    FILE *mem = open_memstream(&after, &after_len);
    ts_plan *p = NULL;
    ts_compiled_graph kept = {0};
    CHECK_OK(compile(g, loss, 1, mem, &p, &kept));
    fclose(mem);
    if (p) {
        check_program(p, &kept);
        ts_status s;
        char *ir = dump(p, TS_DUMP_IR, &s);
        CHECK_OK(s);
        CHECK(ir && after && after_len > 0 && strcmp(ir, after) == 0,
              "the kept IR dump differs from the graph after memplan:\n%s---\n%s", ir ? ir : "",
              after ? after : "");
        char *memd = dump(p, TS_DUMP_MEMORY, &s);
        CHECK_OK(s);
        int rows = 0;
        const char *t = memd ? strstr(memd, "# value offsets\n") : NULL;
        for (; t && (t = strchr(t, '\n')) && t[1]; t++) rows++;
        CHECK(memd && strstr(memd, "arena ") && rows == kept.graph->n_values,
              "the memory dump lists %d values, the graph has %d", rows,
              kept.graph ? kept.graph->n_values : -1);
        free(ir);
        free(memd);
        /* the program runs: one step on zero inputs */
        CHECK_OK(ts_plan_step(p));
        CHECK(ts_plan_step_count(p) == 1, "one step counted");
    }
    ts_plan_free(p);
    ts_compiled_graph_free(&kept);
    free(after);

    /* without keep_dumps the plan has no graph to print */
    CHECK_OK(compile(g, loss, 0, NULL, &p, NULL));
    if (p) {
        ts_status s;
        char *text = dump(p, TS_DUMP_IR, &s);
        CHECK(s == TS_ERR_INVALID && strstr(ts_last_error(), "keep_dumps"),
              "IR dump without keep_dumps: %s, %s", ts_status_name(s), ts_last_error());
        free(text);
        text = dump(p, TS_DUMP_MEMORY, &s);
        CHECK(s == TS_ERR_INVALID && strstr(ts_last_error(), "keep_dumps"),
              "memory dump without keep_dumps: %s, %s", ts_status_name(s), ts_last_error());
        free(text);
        text = dump(p, TS_DUMP_PLAN, &s);
        CHECK_OK(s);
        CHECK(text && strstr(text, "matmul") && strstr(text, "adam"),
              "the plan dump lacks its instructions: %s", text ? text : "");
        free(text);
        CHECK(p->prog.dump_ir == NULL && p->prog.dump_memory == NULL, "dumps rendered unasked");
    }
    ts_plan_free(p);
    ts_graph_free(g);
    return check_summary("program");
}
