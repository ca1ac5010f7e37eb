/* Model dispatch through the registry: a finished config's graph, train
 * spec and compile options (ts_config_build), and the model's word and
 * keys. Checks of the model keys are model_checks.c's; each model's own
 * knowledge is its descriptor's (src/models/NAME.c). */
#include "frontend/config_models.h"
#include "backends/cpu/dnnl_caps.h"

#include <string.h>
#include "core/core.h"
#include "frontend/keys.h"
#include "passes/passes.h"

const char *ts_config_model_word(int name) {
    const ts_model_desc *d = ts_model_at(name);
    return d ? d->name : "?";
}

int cfg_model_uses(const ts_config *c, const ts_config_key *k) {
    const ts_model_desc *d = ts_model_of(c);
    return d && ts_model_uses(d, cfg_leaf(k->path));
}

ts_status ts_config_build(const ts_config *c, ts_graph **g, ts_model *m, ts_train_spec *spec,
                          ts_compile_options *opt) {
    return ts_config_build_graph(c, NULL, g, m, spec, opt);
}

ts_status ts_config_build_graph(const ts_config *c, const ts_config_graph *graph, ts_graph **g,
                                ts_model *m, ts_train_spec *spec, ts_compile_options *opt) {
    if (!c || !g || !m || !spec || !opt) return ts_fail(TS_ERR_INVALID, "config: NULL argument");
    if (!c->finished) return ts_fail(TS_ERR_INVALID, "config: call ts_config_finish first");
    *g = NULL;
    const ts_model_desc *d = ts_model_of(c);
    if (!d) return ts_fail(TS_ERR_INVALID, "config: model.name %d is no model", c->model.name);
    if (d->input == TS_MODEL_IN_GRAPH && !graph)
        return ts_fail(TS_ERR_INVALID,
                       "config: a %s is built on its graph: load the data (data.source graph) "
                       "and pass it to ts_config_build_graph",
                       d->name);
    ts_graph *gr = ts_graph_new();
    if (!gr) return ts_fail(TS_ERR_NOMEM, "config: out of memory for the graph");
    ts_status s = d->build(c, d->input == TS_MODEL_IN_GRAPH ? graph : NULL, gr, m);
    if (s != TS_OK) {
        ts_fail(s, "%s", ts_graph_error(gr));
        ts_error_prefix("building the %s model", d->name);
        ts_graph_free(gr);
        return s;
    }
    const double lr = c->train.lr, wd = c->train.weight_decay;
    *spec = ts_train_spec_default(m->loss);
    switch ((ts_cfg_optimizer)c->train.optimizer) {
    case TS_CFG_SGD:
        spec->opt = ts_sgd(lr, c->train.momentum, c->train.dampening, c->train.nesterov, wd);
        break;
    case TS_CFG_ADAM:
        spec->opt = ts_adam(lr, c->train.beta1, c->train.beta2, c->train.eps, wd);
        break;
    case TS_CFG_ADAMW:
        spec->opt = ts_adamw(lr, c->train.beta1, c->train.beta2, c->train.eps, wd);
        break;
    }
    static const ts_lr_kind kinds[] = {TS_LR_CONSTANT, TS_LR_LINEAR, TS_LR_COSINE};
    spec->schedule = (ts_lr_schedule){kinds[c->train.schedule], c->train.warmup_steps,
                                      c->train.total_steps, c->train.min_lr};
    spec->clip_grad_norm = c->train.clip_grad_norm;
    spec->fused_update = c->optim.fused_update;
    *opt = ts_compile_options_default();
    opt->seed = c->train.seed;
    opt->threads = c->train.threads;
    opt->max_mem_mb = c->dist.max_mem_mb;
    opt->debug_nan = c->compile.debug_nan;
    opt->no_simplify = c->compile.no_simplify;
    opt->naive_schedule = c->compile.naive_schedule;
    opt->no_inplace = c->compile.no_inplace;
    opt->no_fuse = c->compile.no_fuse;
    opt->no_fuse_norm = c->compile.no_fuse_norm;
    opt->no_fuse_ce = c->compile.no_fuse_ce;
    opt->no_recompute = c->compile.no_recompute;
    opt->no_weight_copies = c->compile.no_weight_copies;
    opt->no_gelu_grad = c->compile.no_gelu_grad;
    opt->no_attn_bwd_low_out = c->compile.no_attn_bwd_low_out;
    opt->no_qkv_low = c->compile.no_qkv_low;
    opt->discard_outputs = c->compile.discard_outputs;
    opt->max_memory_mb = c->compile.max_memory_mb;
    opt->backend = c->compile.backend == 1 ? "cuda" : NULL;
    opt->no_cuda_graph = c->compile.no_cuda_graph;
    opt->peft = (ts_peft_options){c->peft.targets[0] ? c->peft.targets : NULL,
                                  c->peft.r,
                                  c->peft.alpha,
                                  c->peft.use_rslora,
                                  c->peft.dropout,
                                  c->peft.adapter_after[0] ? c->peft.adapter_after : NULL,
                                  c->peft.adapter_hidden,
                                  (ts_peft_activation)c->peft.adapter_activation};
    ts_config_precision(c, &opt->precision); /* checked by ts_config_finish */
    /* oneDNN 2.6 has no bf16 matmul on a CPU without AVX-512: say so by key here rather than
     * with the plan's "matmul ... in bf16" error. A model without matmuls (a U-Net) still
     * trains: its bf16 convolutions fall back to the reference kernel. */
    if (c->compile.backend == 0 && opt->precision.compute == TS_BF16 &&
        !ts_cpu_supports_dtype_gemm(TS_BF16) && ts_precision_lowers_matmul(gr, &opt->precision)) {
        ts_graph_free(gr);
        return ts_fail(TS_ERR_INVALID,
                       "config: precision.default: bf16: %s (a plan without bf16 matmuls: "
                       "precision.default: fp32, or precision.keep_fp32: [matmul])",
                       ts_cpu_dtype_gemm_why(TS_BF16));
    }
    *g = gr;
    return TS_OK;
}
