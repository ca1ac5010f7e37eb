/* cuda.h — the CUDA backend plugin's internal state (src/backends/cuda;
 * reached only through the table backend.c hands the loader, plugin.h).
 *
 * One device allocation holds everything a step touches, laid out at
 * prepare:
 *
 *     [ arena (the memory plan's layout, byte for byte) | tables | scratch | GEMM workspace ]
 *
 * `tables` holds what kernels read besides tensors: the step values
 * (cu_step_vals: step number, learning rate, written before each step),
 * the error flag kernels raise on a bad index, and the pointer/size tables
 * of the fused optimizer and clipping instructions. `scratch` is shared by
 * the instructions (one stream runs them in order), sized to the largest
 * need. The host arena of the plan stays the mirror the plan reads and
 * writes: parameters go up once at prepare, inputs before every step, the
 * loss comes back after it, and anything else only when asked (to_host). */
#ifndef TS_CUDA_BE_H
#define TS_CUDA_BE_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include "backends/backend.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/plugin.h"

extern const ts_cuda_host *cu_host; /* set by the plugin's entry point */

/* ts_fail through the host library, with "backend cuda: " in front. */
ts_status cu_fail(ts_status s, const char *fmt, ...) TS_PRINTF(2, 3);
/* A CUDA runtime error as a TS_ERR_INTERNAL naming what failed. */
ts_status cu_err(cudaError_t e, const char *what, const char *label);

/* A GEMM planned at prepare (gemm.c). */
typedef struct cu_gemm {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc; /* cuBLAS's A (our b), B (our a), C = D */
    cublasLtMatmulAlgo_t algo;
    int use_c;           /* beta = 1: a post-op operand of the output's shape is C */
    size_t c_off;        /* its arena offset */
    int n_extra;         /* post-op adds left to eltwise programs (after the GEMM) */
    cu_ew_prog extra[2]; /* out += operand */
} cu_gemm;

/* What prepare decided for one instruction. */
typedef struct cu_op {
    cu_ew_prog ew;    /* elementwise ops, fused_eltwise, expand */
    cu_gemm *gemm;    /* matmul, matmul_epi */
    size_t table_off; /* adam_update, clip_coef: device tables (offset from the tables) */
    int n_groups;
    int64_t max_size;
    size_t scratch;       /* bytes of the shared scratch it uses */
    int attn_tc;          /* attention(_bwd) on tensor cores (attention_tc.cu): bf16 plans, hd 64 */
    struct cu_conv *conv; /* conv, conv_bwd_data, conv_bwd_weight: the cuDNN plan (conv.c) */
} cu_op;

typedef struct cu_state {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    struct cudnnContext *dnn; /* cudnnHandle_t on st->stream, made by the first conv (conv.c) */
    unsigned char *dev;       /* the one allocation */
    size_t dev_bytes;
    size_t tables_off, scratch_off, work_off, work_bytes, scratch_bytes;
    cu_step_vals *d_step; /* in the tables */
    int *d_err;
    cu_step_vals *h_step; /* pinned: what the next step copies up */
    float *h_loss;        /* pinned: the loss coming back */
    int *h_err;
    int host_registered; /* the host arena is page-locked (cudaHostRegister) */
    cu_op *ops;
    int n_ops;
    int use_graph;
    /* Captured once each: the whole step, and the two halves around the
     * update gate (used while a gate is installed). */
    cudaGraphExec_t g_all, g_pre, g_post;
    int device_dirty;         /* the device holds a step the host mirror has not seen */
    cudaEvent_t ev0, ev1;     /* profiling */
    int64_t kernels_per_step; /* nodes of the captured step graph, or kernels enqueued */
    double launch_us;         /* host time launching the last step's work */
    char name[96];            /* the GPU */
} cu_state;

/* Bytes of an operand (ts_operand_bytes calls into libtessel, which the
 * plugin does not link). */
static inline size_t cu_bytes(const ts_operand *o) {
    int64_t n = 1;
    for (int d = 0; d < o->rank; d++) n *= o->dims[d];
    return (size_t)n * cu_host->dtype_size(o->dtype);
}

/* The device address of arena offset off. */
static inline void *cu_at(const cu_state *st, size_t off) {
    return st->dev + off;
}

/* dispatch.c: check instruction i and plan its kernels (sizes st->ops[i]);
 * dispatch_run.c: run instruction i (enqueue on st->stream). */
ts_status cu_plan_ins(cu_state *st, const ts_program *prog, const ts_runtime *rt, int i);
ts_status cu_run_ins(cu_state *st, const ts_program *prog, int i);
/* The ops this backend runs (1) or not (0). */
int cu_supports_op(int op);
/* After the allocation exists: write the instruction's device tables. */
ts_status cu_write_tables(cu_state *st, const ts_program *prog, int i);
/* Bytes of tables instruction i needs. */
size_t cu_table_bytes(const ts_program *prog, int i);

/* gemm.c */
ts_status cu_gemm_plan(cu_state *st, const ts_program *prog, int i, cu_gemm **out);
ts_status cu_gemm_run(cu_state *st, const ts_program *prog, int i, const cu_gemm *g);
void cu_gemm_free(cu_gemm *g);

/* conv.c: conv, conv_bwd_data, conv_bwd_weight through cuDNN (f32, 1-d and
 * 2-d); refused when the plugin was built without cuDNN. plan: descriptors,
 * algorithm, the scratch bytes it needs; free: one plan; release: the
 * plan's cuDNN handle. */
struct cu_conv;
ts_status cu_conv_plan(cu_state *st, const ts_program *prog, int i, struct cu_conv **out,
                       size_t *scratch);
ts_status cu_conv_run(cu_state *st, const ts_program *prog, int i, const struct cu_conv *c);
void cu_conv_free(struct cu_conv *c);
void cu_conv_release(cu_state *st);

/* nvml.c: the device's utilisation (%), memory used (bytes) and power
 * (W) through the driver's libnvidia-ml, loaded at run time; 0 when NVML
 * is missing (the values are then NAN). */
int cu_nvml_read(int device, double *util, double *mem_used, double *power_w);

#endif
