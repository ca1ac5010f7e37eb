/* kernel.h — what a kernel sees (internal): its tensors, its arguments and
 * the step it runs in, and the flags an op carries.
 *
 * Ops (src/ops) define kernels with these types; the compiled program
 * (src/backends/program.h) stores them and backends call kernels through
 * them, without knowing the graph IR:
 *
 *     ts_status my_kernel(const ts_kargs *k) {
 *         const float *x = k->in[0].data;
 *         float *y = k->out[0].data;
 *         for (int64_t i = 0; i < ts_tensor_numel(&k->out[0]); i++) y[i] = 2 * x[i];
 *         return TS_OK;
 *     }
 */
#ifndef TS_KERNEL_H
#define TS_KERNEL_H

#include <stddef.h>
#include <stdint.h>
#include "core/attrs.h"
#include "core/core.h"
#include "tessel/graph.h" /* TS_MAX_RANK */

/* Outputs of one node or instruction, at most. */
#define TS_MAX_OUT 4

/* A tensor as a kernel sees it: contiguous, row-major. */
typedef struct ts_tensor {
    ts_dtype dtype;
    int rank;
    int64_t dims[TS_MAX_RANK];
    void *data;
} ts_tensor;

static inline int64_t ts_tensor_numel(const ts_tensor *t) {
    return ts_shape_numel(t->rank, t->dims);
}

/* What the runtime tells a kernel about the step being run. */
typedef struct ts_step_ctx {
    int64_t step;  /* 1-based index of this step */
    uint64_t seed; /* compile seed */
    double lr;     /* learning rate for this step (schedule applied) */
    /* 1-based count of applied updates including this one (the optimizer's
     * t: a step the update gate skips does not count). 0: not counted
     * separately, the optimizer kernels use `step`. */
    int64_t opt_step;
} ts_step_ctx;

typedef struct ts_kargs {
    const ts_attrs *a;
    int n_in, n_out;
    const ts_tensor *in;
    const ts_tensor *out;
    void *scratch; /* scratch_bytes from the op's scratch(); 64-byte aligned */
    size_t scratch_bytes;
    const ts_step_ctx *ctx;
    const char *label; /* name of the first output, for messages */
    void *backend;     /* backend state for this instruction (optimised kernels) */
} ts_kargs;

typedef ts_status (*ts_kernel_fn)(const ts_kargs *k);

/* What an op is, as flags (ts_op_def.flags; copied into every instruction
 * of the compiled program, so a backend reads them without the registry). */
enum {
    TS_OPF_ELEMENTWISE = 1 << 0, /* output[i] depends on inputs at i (after broadcast) */
    TS_OPF_SIDE_EFFECT = 1 << 1, /* writes its inputs in place (optimizer): never removed */
    TS_OPF_ALIAS = 1 << 2,       /* output 0 is input 0's memory reinterpreted (reshape) */
    TS_OPF_INPLACE = 1 << 3,     /* output 0 may share input 0's memory when sizes match */
    TS_OPF_RANDOM = 1 << 4,      /* draws random numbers: never merged or folded */
    TS_OPF_UPDATE = 1 << 5,      /* update phase (clip coefficient, optimizer): the update
                                    gate (ts_plan_set_update_gate) may skip it */
    TS_OPF_MONITOR = 1 << 6,     /* reads a gradient into a small monitor output: scheduled
                                    as soon as it is ready, always before the update phase */
    TS_OPF_INPLACE_IN1 = 1 << 7  /* output 0 may share input 1's memory when sizes match */
};

#endif
