#include "small_gpt.h"
#include "check.h"

ts_plan *small_gpt_plan(const ts_compile_options *o, ts_compiled_graph *kept) {
    ts_graph *g = ts_graph_new();
    ts_gpt_config c = {.batch = SMALL_GPT_B,
                       .ctx = SMALL_GPT_T,
                       .vocab = SMALL_GPT_V,
                       .d_model = 40,
                       .n_layers = 2,
                       .n_heads = 4};
    ts_model m;
    CHECK_OK(ts_build_gpt(g, &c, &m));
    ts_train_spec spec = ts_train_spec_default(m.loss);
    spec.opt = ts_sgd(0.1, 0, 0, 0, 0);
    ts_plan *p = NULL;
    CHECK_OK(ts_compile_keep(g, &spec, o, &p, kept));
    ts_graph_free(g);
    return p;
}
