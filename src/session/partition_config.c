/* partition_config.c — the partition a config asks for (tessel/pipeline.h):
 * its model's forward graph at one micro-batch's rows, the devices file or
 * measured speeds, and the dist.* pipeline keys. */
#include "session/stages.h"
#include <string.h>
#include "tessel/config.h"
#include "tessel/pipeline.h"
#include "tessel/session.h"

ts_status ts_stage_partition(ts_config *c, const ts_device_speed *measured, int n_measured,
                             ts_stage_model *sm, ts_partition **out) {
    memset(sm, 0, sizeof *sm); /* the caller frees sm->g on every path */
    ts_partition_options o = ts_partition_options_default();
    o.stages = c->pipe.stages;
    o.microbatches = c->pipe.microbatches;
    o.schedule = c->pipe.schedule ? TS_PIPE_GPIPE : TS_PIPE_1F1B;
    o.max_mem_mb = c->dist.max_mem_mb;
    o.threads = c->train.threads;
    ts_device_speed devs[TS_PIPE_MAX_STAGES];
    ts_status s = TS_OK;
    if (strcmp(c->pipe.devices, "measure") != 0) {
        int n = 0;
        if ((s = ts_devices_load(c->pipe.devices, devs, TS_PIPE_MAX_STAGES, &n)) != TS_OK) return s;
        o.devices = devs;
        o.n_devices = n;
    } else if (measured) {
        o.devices = measured;
        o.n_devices = n_measured;
    }
    if (c->model.batch % o.microbatches)
        return ts_fail(TS_ERR_INVALID,
                       "dist.microbatches %d does not divide model.batch %lld: each micro-batch "
                       "is model.batch / dist.microbatches rows",
                       o.microbatches, (long long)c->model.batch);
    /* the stages run one micro-batch at a time: the model built at its rows */
    const int64_t batch = c->model.batch;
    c->model.batch = batch / o.microbatches;
    s = ts_session_build_model(c, &sm->g, &sm->m, &sm->spec, &sm->opt);
    c->model.batch = batch;
    if (s != TS_OK) return s;
    const ts_optimizer *op = &sm->spec.opt;
    o.state_per_param = op->kind == TS_OPT_ADAM || op->kind == TS_OPT_ADAMW ? 2
                        : op->kind == TS_OPT_SGD && op->momentum > 0        ? 1
                                                                            : 0;
    s = ts_partition_graph(sm->g, sm->m.loss, &o, out);
    if (s != TS_OK) {
        ts_graph_free(sm->g);
        sm->g = NULL;
    }
    return s;
}

ts_status ts_config_partition(ts_config *c, ts_partition **out) {
    if (!c || !out) return ts_fail(TS_ERR_INVALID, "partition: NULL config or output");
    ts_stage_model sm;
    ts_status s = ts_stage_partition(c, NULL, 0, &sm, out);
    ts_graph_free(sm.g);
    return s;
}
