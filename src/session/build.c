/* Model and plans: the evaluation metrics a model allows, the configured
 * graph compiled into the training plan (data parallel, ZeRO, gradient
 * monitors) and the inference plan evaluation runs, and the session's
 * batch buffers; and the model `tessel compile` compiles
 * (ts_session_build_model). See session_internal.h. */
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "models/fusion_mask.h"
#include "session/pipe_train.h"
#include "session/session_internal.h"

static size_t value_bytes(const ts_graph *g, ts_val v) {
    return (size_t)ts_numel(g, v) * ts_dtype_size(ts_dtype_of(g, v));
}

ts_status ts_sess_resolve_metrics(session *s) {
    ts_config *c = &s->c;
    if (!c->train.metrics[0])
        snprintf(c->train.metrics, sizeof c->train.metrics, "%s",
                 ts_model_of(c)->metrics ? ts_model_of(c)->metrics
                 : s->binary             ? "accuracy, auc"
                 : s->classifier         ? "accuracy"
                                         : "mse");
    ts_status st = ts_config_metrics(c, &s->want_acc, &s->want_mse);
    if (st != TS_OK) return st;
    const int classifies = s->classifier || s->binary;
    if (s->want_acc && !classifies)
        return ts_fail(TS_ERR_INVALID,
                       "train.metrics: accuracy needs a classifier (model.classes > 0 or a gpt "
                       "model); this model is a regression");
    if (s->want_mse && classifies)
        return ts_fail(TS_ERR_INVALID,
                       "train.metrics: mse needs a regression model; this one is a classifier "
                       "(use accuracy)");
    if ((st = ts_config_metric_flags(c, &s->metric_flags)) != TS_OK) return st;
    if ((s->metric_flags & (TS_METRIC_AUC | TS_METRIC_DICE | TS_METRIC_MIOU)) && !classifies)
        return ts_fail(TS_ERR_INVALID,
                       "train.metrics: auc, dice and miou need a classifier (model.classes > 0); "
                       "this model is a regression");
    return TS_OK;
}

ts_status ts_sess_build(session *s) {
    ts_train_spec spec;
    ts_compile_options opt;
    /* With N ranks the graph is built for model.batch / N rows (the
     * session's buffers hold the whole batch; each rank feeds its rows). */
    ts_config lc = s->c;
    lc.model.batch /= s->nslices; /* nranks, or dist.reproducible's micro-batches */
    /* gradient monitors for observe and alerts; a masked loss under shape buckets */
    ts_status st = ts_sess_shape_graph(s, &lc, &s->g, &s->m, &spec, &opt);
    /* pipeline stages: a rank compiles only its stage (ts_sess_pipe_setup),
     * rank 0 the whole model too where the run needs it there */
    const int whole = s->c.pipe.stages <= 1 || ts_sess_pipe_holds_whole(s);
    if (st == TS_OK && whole) st = ts_compile(s->g, &spec, &opt, &s->plan);
    opt.monitors = 0;
    opt.comm = NULL; /* the evaluation plan is this rank's alone */
    if (st != TS_OK) return st;
    s->in_name = ts_name(s->g, s->m.input);
    s->tgt_name = ts_name(s->g, s->m.target);
    s->out_name = ts_name(s->g, s->m.output);
    s->xb = value_bytes(s->g, s->m.input);
    s->yb = value_bytes(s->g, s->m.target);
    s->outb = value_bytes(s->g, s->m.output);
    if (s->all) {
        /* The model's inputs hold a batch of the dataset's examples. */
        const size_t B = (size_t)lc.model.batch;
        if (s->xb != B * ts_dataset_x_bytes(s->all) || s->yb != B * ts_dataset_y_bytes(s->all) ||
            ts_dtype_of(s->g, s->m.input) != s->all->x_dtype ||
            ts_dtype_of(s->g, s->m.target) != s->all->y_dtype)
            return ts_fail(TS_ERR_INTERNAL,
                           "the model's inputs (%zu, %zu bytes) do not hold a batch of the "
                           "data (%zu, %zu bytes per example)",
                           s->xb, s->yb, ts_dataset_x_bytes(s->all), ts_dataset_y_bytes(s->all));
    }
    const size_t data_flags =
        s->all && s->all->valid ? (size_t)s->c.model.batch * (size_t)s->all->valid_cols : 0;
    if (!(s->bx = ts_alloc(s->xb * (size_t)s->nslices, "batch")) ||
        !(s->by = ts_alloc(s->yb * (size_t)s->nslices + data_flags, "batch")))
        return TS_ERR_NOMEM;
    /* data.valid: the loader writes the batch's flags after its targets */
    if (data_flags) s->data_valid = (uint8_t *)s->by + s->yb * (size_t)s->nslices;
    if (s->c.model.source_mask) {
        if (s->c.pipe.stages > 1 || s->c.dist.reproducible)
            return ts_fail(TS_ERR_INVALID,
                           "model.source_mask: not with %s yet (its input valid is fed by the "
                           "one-plan and shape-bucket steps only)",
                           s->c.pipe.stages > 1 ? "pipeline stages" : "dist.reproducible");
        const size_t rows = (size_t)lc.model.batch * (size_t)(s->nslices + 1);
        if (!(s->valid = ts_alloc(rows * TS_FUSION_SOURCES, "source flags"))) return TS_ERR_NOMEM;
    }
    if ((st = ts_sess_shape_setup(s)) != TS_OK) return st;
    if (((s->val && s->val->n) || s->test) && whole) { /* rank 0 evaluates */
        /* Evaluation runs an inference plan of the same graph: forward only,
         * no dropout, its own arena; parameters are copied in by name. */
        if ((st = ts_compile(s->g, NULL, &opt, &s->eval)) != TS_OK) return st;
        if (!(s->bout = ts_alloc(s->outb, "model output"))) return TS_ERR_NOMEM;
        for (int i = 0; i < ts_plan_persistent_count(s->plan); i++) {
            ts_persistent pv;
            if (ts_plan_persistent(s->plan, i, &pv) == TS_OK && pv.bytes > s->pbuf_bytes)
                s->pbuf_bytes = pv.bytes;
        }
        /* ZeRO-3: the parameters are not persistent; eval.c gathers each
         * through this buffer (whole 4-byte words) */
        for (int i = 0; i < ts_plan_param_count(s->plan); i++) {
            ts_dtype dt;
            int rank;
            int64_t dims[TS_MAX_RANK];
            if (ts_plan_value_info(s->plan, ts_plan_param_name(s->plan, i), &dt, &rank, dims) !=
                TS_OK)
                continue;
            size_t bytes = ts_dtype_size(dt);
            for (int d = 0; d < rank; d++) bytes *= (size_t)dims[d];
            bytes = (bytes + 3) / 4 * 4;
            if (bytes > s->pbuf_bytes) s->pbuf_bytes = bytes;
        }
        if (!(s->pbuf = ts_alloc(s->pbuf_bytes ? s->pbuf_bytes : 1, "parameter copy")))
            return TS_ERR_NOMEM;
    }
    if (s->classifier || s->binary) {
        /* Logits per target: the output's values over the targets' count
         * (a binary model's scores are taken as two logits {0, z}). */
        const int64_t width =
            s->binary ? 2 : (int64_t)((s->outb / sizeof(float)) / (s->yb / sizeof(int64_t)));
        if ((st = ts_metric_acc_init(&s->macc, s->metric_flags & ~(unsigned)TS_METRIC_ACCURACY,
                                     width)) != TS_OK)
            return st;
    }
    return TS_OK;
}

/* The configured model; a whole-graph model (gcn) is built on its graph,
 * so its data is read (and the config fitted to it) first. */
ts_status ts_session_build_model(ts_config *c, ts_graph **g, ts_model *m, ts_train_spec *spec,
                                 ts_compile_options *opt) {
    if (ts_model_of(c)->input != TS_MODEL_IN_GRAPH) return ts_config_build(c, g, m, spec, opt);
    ts_zoo_graph gr;
    ts_dataset *all, *train, *val, *test;
    ts_config_data_shape shape = {0, 0, 0, 0, 0, 0};
    ts_status s = ts_zoo_load_graph(c, &gr, &all, &train, &val, &test, &shape);
    if (s != TS_OK) return s;
    ts_dataset_free(all), ts_dataset_free(train), ts_dataset_free(val), ts_dataset_free(test);
    s = ts_config_fit_data(c, &shape);
    ts_config_graph cg = ts_zoo_graph_of(&gr);
    if (s == TS_OK) s = ts_config_build_graph(c, &cg, g, m, spec, opt);
    ts_zoo_graph_free(&gr);
    return s;
}
