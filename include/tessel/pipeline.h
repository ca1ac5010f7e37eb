/* tessel/pipeline.h — placing a model's stages on devices by a cost model
 * (pipeline parallelism, docs/distributed.md "Pipeline stages").
 *
 *     ts_device_speed d[4];
 *     int nd;
 *     if (ts_devices_load("devices.txt", d, 4, &nd) != TS_OK) puts(ts_last_error());
 *     ts_partition_options o = ts_partition_options_default();
 *     o.stages = 2; o.microbatches = 8; o.devices = d; o.n_devices = nd;
 *     ts_partition *part;
 *     if (ts_partition_graph(g, loss, &o, &part) == TS_OK) {
 *         ts_partition_print(part, stdout);      // tessel compile --dump partition
 *         ts_partition_free(part);
 *     }
 *
 * The forward graph (before ts_compile) is cut at activation boundaries:
 * positions of the build order where exactly one activation is alive
 * across the cut (between the blocks of a transformer, the layers of an
 * MLP). Each op costs its FLOPs (forward, and twice that backward) on the
 * device's GEMM speed when it is matrix work (matmul, attention,
 * convolution, sparse products), otherwise the bytes it reads and writes
 * on the device's memory speed. The search picks the S-1 cuts that
 * minimise the slowest stage's time per micro-batch (compute plus sending
 * its activations and receiving their gradients over the device's link),
 * under each device's memory limit (parameters, gradients, optimizer
 * state, and the activations of the micro-batches in flight).
 */
#ifndef TESSEL_PIPELINE_H
#define TESSEL_PIPELINE_H

#include <stdio.h>
#include "tessel/graph.h"
#include "tessel/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_PIPE_MAX_STAGES 64

/* One device (a pipeline stage's process): measured or from dist.devices. */
typedef struct ts_device_speed {
    char name[32];
    double gemm_gflops; /* matrix work, GFLOP/s */
    double mem_gbps;    /* memory-bound work, GB/s of bytes read + written */
    double link_gbps;   /* to its neighbouring stages, GB/s */
    double mem_mb;      /* memory limit in MiB (0: none) */
} ts_device_speed;

/* Reads a devices file: one device per line, `name gemm_gflops mem_gbps
 * link_gbps [mem_mb]`, blank lines and `#` comments ignored. Errors name the
 * file and line. */
ts_status ts_devices_load(const char *path, ts_device_speed *out, int max, int *n);

/* Measures this process's speeds briefly (about 0.2 s) on `threads`
 * threads (0: OpenMP's default): a 256x512x512 matmul plan, an add over
 * 4 Mi floats, a memcpy of 16 MiB (the link of processes on one host). */
ts_status ts_device_measure(int threads, ts_device_speed *out);

typedef enum ts_pipe_schedule { TS_PIPE_1F1B = 0, TS_PIPE_GPIPE = 1 } ts_pipe_schedule;

typedef struct ts_partition_options {
    int stages;                     /* S >= 1 */
    int microbatches;               /* M >= 1 */
    ts_pipe_schedule schedule;      /* how many micro-batches a stage keeps */
    const ts_device_speed *devices; /* stage s runs on devices[s % n_devices] */
    int n_devices;                  /* 0: every stage on the measured speed of this process */
    double max_mem_mb;              /* limit for devices without their own (0: none) */
    int state_per_param;            /* optimizer tensors per parameter (AdamW 2, SGD momentum 1) */
    int threads;                    /* measuring: the threads a stage runs on (0: default) */
} ts_partition_options;

ts_partition_options ts_partition_options_default(void);

typedef struct ts_partition_stage {
    int first_op, n_ops;       /* the stage's forward ops, in build order */
    int first_unit, last_unit; /* the units (pieces between candidate cuts) */
    const char *device;        /* its device's name */
    double compute_s;          /* forward + backward of one micro-batch */
    double xfer_s;             /* activations out + gradients in, and back */
    double time_s;             /* compute_s + xfer_s */
    double mem_bytes;          /* persistent + in-flight activations */
    double param_bytes;        /* parameters alone */
    int inflight;              /* micro-batches whose activations it keeps */
    int n_params;
    char cut_value[64];  /* the activation sent to the next stage ("" last) */
    long long cut_bytes; /* its bytes per micro-batch */
} ts_partition_stage;

typedef struct ts_partition ts_partition;

/* Cuts the forward graph of `loss` (build order) into o->stages stages.
 * Fails naming why: fewer candidate cuts than stages-1, or no split fits
 * the memory limits (then the smallest need per stage is given). */
ts_status ts_partition_graph(const ts_graph *g, ts_val loss, const ts_partition_options *o,
                             ts_partition **out);
int ts_partition_stages(const ts_partition *p);
const ts_partition_stage *ts_partition_stage_at(const ts_partition *p, int s);
/* The slowest stage's time per micro-batch (the objective). */
double ts_partition_objective(const ts_partition *p);
/* The even split (units shared out equally, the first stages taking the
 * remainder) evaluated by the same model, for comparison: its objective,
 * or -1 when it does not fit the memory limits. */
double ts_partition_even_objective(const ts_partition *p);
/* Step time and bubble share (idle share of stage time) predicted by
 * simulating the schedule with the stages' estimated times. */
void ts_partition_predict(const ts_partition *p, double *step_s, double *bubble);
/* The `--dump partition` text: cuts, then per stage its ops, memory, time. */
ts_status ts_partition_print(const ts_partition *p, FILE *out);
void ts_partition_free(ts_partition *p);

/* The partition a config asks for (dist.pipeline_stages, dist.microbatches,
 * dist.pipeline_schedule, dist.devices, dist.max_mem_mb) of its model's
 * forward graph, as `tessel compile --dump partition` prints it. The
 * config must be finished. */
struct ts_config;
ts_status ts_config_partition(struct ts_config *c, ts_partition **out);

#ifdef __cplusplus
}
#endif
#endif
