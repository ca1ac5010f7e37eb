/* partition_config.c — the partition a config asks for (tessel/pipeline.h):
 * its model's forward graph, the devices file or this process's measured
 * speeds, and the dist.* pipeline keys. */
#include <string.h>
#include "tessel/config.h"
#include "tessel/pipeline.h"
#include "tessel/session.h"

ts_status ts_config_partition(ts_config *c, ts_partition **out) {
    if (!c || !out) return ts_fail(TS_ERR_INVALID, "partition: NULL config or output");
    ts_partition_options o = ts_partition_options_default();
    o.stages = c->pipe.stages;
    o.microbatches = c->pipe.microbatches;
    o.schedule = c->pipe.schedule ? TS_PIPE_GPIPE : TS_PIPE_1F1B;
    o.max_mem_mb = c->dist.max_mem_mb;
    ts_device_speed devs[TS_PIPE_MAX_STAGES];
    ts_status s = TS_OK;
    if (strcmp(c->pipe.devices, "measure") != 0) {
        int n = 0;
        if ((s = ts_devices_load(c->pipe.devices, devs, TS_PIPE_MAX_STAGES, &n)) != TS_OK) return s;
        o.devices = devs;
        o.n_devices = n;
    }
    if (c->model.batch % o.microbatches)
        return ts_fail(TS_ERR_INVALID,
                       "dist.microbatches %d does not divide model.batch %lld: each micro-batch "
                       "is model.batch / dist.microbatches rows",
                       o.microbatches, (long long)c->model.batch);
    /* the cost model sees one micro-batch: the model built at its rows */
    const int64_t batch = c->model.batch;
    c->model.batch = batch / o.microbatches;
    ts_graph *g = NULL;
    ts_model m;
    ts_train_spec spec;
    ts_compile_options opt;
    s = ts_session_build_model(c, &g, &m, &spec, &opt);
    c->model.batch = batch;
    if (s != TS_OK) return s;
    o.state_per_param = spec.opt.kind == TS_OPT_ADAM || spec.opt.kind == TS_OPT_ADAMW ? 2
                        : spec.opt.kind == TS_OPT_SGD && spec.opt.momentum > 0        ? 1
                                                                                      : 0;
    s = ts_partition_graph(g, m.loss, &o, out);
    ts_graph_free(g);
    return s;
}
