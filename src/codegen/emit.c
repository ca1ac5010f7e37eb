/* tessel compile --emit-c: compiles the configured step as `tessel train`
 * does (one process, the session's data path) and writes it out as a
 * standalone C program (docs/aot.md). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "codegen/codegen.h"
#include "tessel/codegen.h"

/* config.yaml: the config resolved (file and --set overrides), loadable by
 * `tessel train`; its hash in the manifest names exactly what was emitted. */
static ts_status write_config(cg_ctx *g, const ts_config *c) {
    cg_mem m;
    ts_status s = cg_mem_open(&m);
    if (s != TS_OK) return s;
    if ((s = ts_config_write(c, m.f)) != TS_OK) {
        cg_mem_free(&m);
        return s;
    }
    return cg_mem_write(g, &m, "config.yaml");
}

ts_status ts_emit_c(const ts_config *c, const char *config_path, const char *dir) {
    if (!c || !config_path || !dir || !*dir)
        return ts_fail(TS_ERR_INVALID, "emit-c: NULL or empty argument");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return ts_fail(TS_ERR_IO, "emit-c: cannot make %s: %s", dir, strerror(errno));
    struct session *ss = NULL;
    ts_graph *gr = NULL;
    ts_plan *plan = NULL;
    ts_model m;
    ts_train_spec spec;
    ts_compile_options opt;
    ts_status s = cg_data_load(c, &ss);
    if (s == TS_OK) s = cg_data_build(ss, &gr, &m, &spec, &opt);
    if (s == TS_OK) s = ts_compile(gr, &spec, &opt, &plan);
    cg_ctx g;
    memset(&g, 0, sizeof g);
    if (s == TS_OK) {
        g.plan = plan;
        g.prog = &plan->prog;
        g.rt = &plan->rt;
        g.dir = dir;
        g.config_path = config_path;
        g.in_name = ts_name(gr, m.input);
        g.tgt_name = ts_name(gr, m.target);
        g.steps = cg_data_config(ss)->train.steps;
        if (!g.prog->has_loss || g.prog->gate_ins < 0)
            s = ts_fail(TS_ERR_UNSUPPORTED, "emit-c: the config compiles no training step");
        else if (plan->rt.scaler)
            s = ts_fail(TS_ERR_UNSUPPORTED,
                        "emit-c: loss scaling (precision.loss_scale) skips updates at run "
                        "time; the emitted step applies every update, so it is not emitted");
        else if (!g.in_name || !g.tgt_name)
            s = ts_fail(TS_ERR_INTERNAL, "emit-c: the model's input or target has no name");
        else if (g.steps < 1)
            s = ts_fail(TS_ERR_INVALID, "emit-c: train.steps must be at least 1");
    }
    if (s == TS_OK) s = write_config(&g, c);
    if (s == TS_OK) s = cg_write_kernels(&g);
    if (s == TS_OK) s = cg_write_init(&g);
    if (s == TS_OK) s = cg_write_constants(&g);
    if (s == TS_OK) s = cg_write_step(&g);
    if (s == TS_OK) s = cg_write_data(&g, ss);
    if (s == TS_OK) s = cg_write_main(&g);
    if (s == TS_OK) s = cg_write_manifest(&g);
    if (s != TS_OK) ts_error_prefix("--emit-c %s", dir);
    for (int i = 0; i < g.n_files; i++) free(g.files[i]);
    ts_plan_free(plan);
    ts_graph_free(gr);
    cg_data_free(ss);
    return s;
}
