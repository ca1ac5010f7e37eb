/* The CUDA backend plugin's table (plugin.h): prepare (checks, the one
 * device allocation, parameters up, kernels planned), execute (inputs up,
 * the step as one CUDA-graph launch, the loss back), release, and the
 * to_host / to_device hooks the plan calls when it reads or writes named
 * values.
 *
 * The CUDA graph. The first step runs the instructions once while the
 * stream is being captured (cudaStreamBeginCapture ... EndCapture,
 * cudaGraphInstantiate), then launches the graph; every later step is one
 * cudaGraphLaunch. Nothing in the graph changes between steps: kernels read
 * the step number and learning rate from device memory (cu_step_vals),
 * which the host writes with one small copy before the launch. With an
 * update gate installed (ts_plan_set_update_gate) the step is two graphs,
 * the instructions before the gate and those from it, and the host asks the
 * gate in between (after a synchronisation); compile.no_cuda_graph launches
 * every kernel every step instead, for checking. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backends/cuda/cuda.h"

const ts_cuda_host *cu_host;

#define WORKSPACE_BYTES ((size_t)32 << 20) /* cuBLASLt's, as cuBLAS's default on Hopper */
#define ALIGN(x)        (((x) + 255) & ~(size_t)255)

ts_status cu_fail(ts_status s, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cu_host->fail(s, "backend cuda: %s", msg);
}

ts_status cu_err(cudaError_t e, const char *what, const char *label) {
    return cu_fail(TS_ERR_INTERNAL, "%s%s%s%s: %s (%s)", what, label ? " '" : "",
                   label ? label : "", label ? "'" : "", cudaGetErrorString(e),
                   cudaGetErrorName(e));
}

#define CK(call, what)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) return cu_err(e_, what, NULL);                                      \
    } while (0)

static cu_state *state_of(const ts_runtime *rt) {
    return (cu_state *)rt->backend_scratch;
}

static int cuda_supports(int op) {
    return cu_supports_op(op);
}

/* The GPU this process uses: device 0 of those visible (one process per
 * GPU: CUDA_VISIBLE_DEVICES or the launcher picks it). */
static ts_status pick_device(int *dev) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1)
        return cu_fail(TS_ERR_UNSUPPORTED, "no GPU/driver (cudaGetDeviceCount: %s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    *dev = 0;
    return TS_OK;
}

static void free_state(const ts_program *prog, cu_state *st) {
    if (!st) return;
    cudaSetDevice(st->device);
    if (st->stream) cudaStreamSynchronize(st->stream);
    if (st->g_all) cudaGraphExecDestroy(st->g_all);
    if (st->g_pre) cudaGraphExecDestroy(st->g_pre);
    if (st->g_post) cudaGraphExecDestroy(st->g_post);
    for (int i = 0; st->ops && i < st->n_ops && i < prog->n_ins; i++) {
        cu_gemm_free(st->ops[i].gemm);
        cu_conv_free(st->ops[i].conv);
    }
    free(st->ops);
    if (st->lt) cublasLtDestroy(st->lt);
    cu_conv_release(st);
    if (st->ev0) cudaEventDestroy(st->ev0);
    if (st->ev1) cudaEventDestroy(st->ev1);
    if (st->stream) cudaStreamDestroy(st->stream);
    if (st->dev) cudaFree(st->dev);
    if (st->h_step) cudaFreeHost(st->h_step);
    free(st);
}

static void cuda_release(const ts_program *prog, ts_runtime *rt) {
    cu_state *st = state_of(rt);
    if (!st) return;
    if (st->host_registered) cudaHostUnregister(rt->arena);
    free_state(prog, st);
    rt->backend_scratch = NULL;
    rt->backend_scratch_bytes = 0;
}

/* What the plan's runtime must look like for this backend: one private
 * arena (no shared parameters, borrowed state or comm segment). */
static ts_status check_runtime(const ts_program *prog, const ts_runtime *rt) {
    if (rt->params || rt->temps || rt->arena_skip || rt->arena_from_comm)
        return cu_fail(TS_ERR_UNSUPPORTED,
                       "plans sharing parameters or an arena (ZeRO, plan sharing, comm segments) "
                       "are not supported on this backend yet");
    if (prog->n_buckets > 0)
        return cu_fail(TS_ERR_UNSUPPORTED,
                       "data parallelism (gradient buckets) is not supported on this backend yet "
                       "(NCCL is not wired in; docs/cuda.md)");
    if (prog->opt.debug_nan)
        return cu_fail(TS_ERR_UNSUPPORTED, "compile.debug_nan is not supported on this backend");
    return TS_OK;
}

static ts_status cuda_prepare(const ts_program *prog, ts_runtime *rt) {
    /* No GPU first: on such a machine nothing else matters. */
    int dev;
    ts_status s = pick_device(&dev);
    if (s != TS_OK) return s;
    if ((s = check_runtime(prog, rt)) != TS_OK) return s;
    for (int i = 0; i < prog->n_ins; i++)
        if (!cu_supports_op(prog->ins[i].op))
            return cu_fail(TS_ERR_UNSUPPORTED,
                           "unsupported op %s (instruction %d, '%s'): no CUDA "
                           "kernel yet (docs/cuda.md lists the ops)",
                           prog->ins[i].name, i, prog->ins[i].label ? prog->ins[i].label : "");
    cu_state *st = calloc(1, sizeof *st);
    if (!st) return cu_fail(TS_ERR_NOMEM, "backend state");
    rt->backend_scratch = st; /* release frees it from here, whatever fails below */
    st->device = dev;
    st->use_graph = !prog->opt.no_cuda_graph && !prog->opt.profile;
    CK(cudaSetDevice(dev), "cudaSetDevice");
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
        snprintf(st->name, sizeof st->name, "%.95s", prop.name);
    CK(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    CK(cudaEventCreate(&st->ev0), "cudaEventCreate");
    CK(cudaEventCreate(&st->ev1), "cudaEventCreate");
    if (cublasLtCreate(&st->lt) != CUBLAS_STATUS_SUCCESS)
        return cu_fail(TS_ERR_INTERNAL, "cublasLtCreate failed");
    st->n_ops = prog->n_ins;
    st->ops = calloc((size_t)(prog->n_ins ? prog->n_ins : 1), sizeof *st->ops);
    if (!st->ops) return cu_fail(TS_ERR_NOMEM, "instruction plans (%d)", prog->n_ins);
    st->work_bytes = WORKSPACE_BYTES;
    /* The allocation's layout. Device pointers are needed while planning
     * (GEMM bias pointers, elementwise inputs), so the size is found first
     * with st->dev = NULL and the planning redone after the allocation. */
    size_t tables = ALIGN(sizeof(cu_step_vals)) + ALIGN(sizeof(int));
    for (int i = 0; i < prog->n_ins; i++) {
        st->ops[i].table_off = tables;
        tables += ALIGN(cu_table_bytes(prog, i));
    }
    st->tables_off = ALIGN(prog->layout.arena_bytes);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < prog->n_ins; i++) {
            cu_gemm_free(st->ops[i].gemm);
            st->ops[i].gemm = NULL;
            cu_conv_free(st->ops[i].conv);
            st->ops[i].conv = NULL;
            if ((s = cu_plan_ins(st, prog, rt, i)) != TS_OK) return s;
            if (st->ops[i].scratch > st->scratch_bytes) st->scratch_bytes = st->ops[i].scratch;
        }
        if (pass) break;
        st->scratch_off = st->tables_off + ALIGN(tables);
        st->work_off = st->scratch_off + ALIGN(st->scratch_bytes);
        st->dev_bytes = st->work_off + st->work_bytes;
        size_t free_b = 0, total_b = 0;
        CK(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
        /* a capability of this GPU, not a failure: TS_ERR_UNSUPPORTED (exit 2) */
        cudaError_t e = st->dev_bytes > free_b ? cudaErrorMemoryAllocation
                                               : cudaMalloc((void **)&st->dev, st->dev_bytes);
        if (e == cudaErrorMemoryAllocation)
            return cu_fail(TS_ERR_UNSUPPORTED,
                           "too little device memory: the step needs %.1f MiB (arena %.1f MiB), "
                           "the GPU has %.1f MiB free of %.1f MiB",
                           st->dev_bytes / 1048576.0, prog->layout.arena_bytes / 1048576.0,
                           free_b / 1048576.0, total_b / 1048576.0);
        if (e != cudaSuccess) return cu_err(e, "cudaMalloc of the arena", NULL);
        st->d_step = (cu_step_vals *)(st->dev + st->tables_off);
        st->d_err = (int *)(st->dev + st->tables_off + ALIGN(sizeof(cu_step_vals)));
    }
    for (int i = 0; i < prog->n_ins; i++)
        if ((s = cu_write_tables(st, prog, i)) != TS_OK) return s;
    /* Pinned host memory for what crosses every step, and the host arena
     * page-locked so reads and writes of named values run at full speed. */
    CK(cudaMallocHost((void **)&st->h_step, 256), "cudaMallocHost");
    st->h_loss = (float *)((char *)st->h_step + 64);
    st->h_err = (int *)((char *)st->h_step + 128);
    if (prog->layout.arena_bytes && cudaHostRegister(rt->arena, prog->layout.arena_bytes,
                                                     cudaHostRegisterDefault) == cudaSuccess)
        st->host_registered = 1;
    else
        (void)cudaGetLastError(); /* pageable copies still work */
    /* Everything the compile wrote (initial parameters, state, constants). */
    CK(cudaMemcpy(st->dev, rt->arena, prog->layout.arena_bytes, cudaMemcpyHostToDevice),
       "copying the arena to the device");
    CK(cudaMemset(st->d_err, 0, sizeof(int)), "cudaMemset");
    return TS_OK;
}

/* Enqueue instructions [lo, hi) (update-phase ones left out with skip).
 * With opt.profile (never captured) each instruction is timed by a pair
 * of events around it, waited for at once. */
static ts_status enqueue(cu_state *st, const ts_program *prog, ts_runtime *rt, int lo, int hi,
                         int skip) {
    for (int i = lo; i < hi; i++) {
        if (skip && (prog->ins[i].flags & TS_OPF_UPDATE)) continue;
        if (prog->opt.profile) CK(cudaEventRecord(st->ev0, st->stream), "cudaEventRecord");
        ts_status s = cu_run_ins(st, prog, i);
        if (s != TS_OK) {
            cu_host->error_prefix("instruction %d (%s)", i, prog->ins[i].name);
            return s;
        }
        if (prog->opt.profile) {
            float ms = 0;
            CK(cudaEventRecord(st->ev1, st->stream), "cudaEventRecord");
            CK(cudaEventSynchronize(st->ev1), "profiling an instruction");
            CK(cudaEventElapsedTime(&ms, st->ev0, st->ev1), "cudaEventElapsedTime");
            rt->ins[i].prof_seconds += ms * 1e-3;
            rt->ins[i].prof_calls++;
        }
    }
    return TS_OK;
}

/* Capture [lo, hi) once into *exec. */
static ts_status capture(cu_state *st, const ts_program *prog, ts_runtime *rt, int lo, int hi,
                         cudaGraphExec_t *exec) {
    cudaGraph_t g = NULL;
    CK(cudaStreamBeginCapture(st->stream, cudaStreamCaptureModeThreadLocal),
       "cudaStreamBeginCapture");
    ts_status s = enqueue(st, prog, rt, lo, hi, 0);
    cudaError_t e = cudaStreamEndCapture(st->stream, &g);
    if (s != TS_OK) {
        if (g) cudaGraphDestroy(g);
        return s;
    }
    if (e != cudaSuccess) return cu_err(e, "cudaStreamEndCapture", NULL);
    size_t nodes = 0;
    if (cudaGraphGetNodes(g, NULL, &nodes) == cudaSuccess) /* the gate's halves add up */
        st->kernels_per_step = (lo == 0 ? 0 : st->kernels_per_step) + (int64_t)nodes;
    e = cudaGraphInstantiate(exec, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) return cu_err(e, "cudaGraphInstantiate", NULL);
    /* the graph's work goes to the device now, not inside the first launch */
    e = cudaGraphUpload(*exec, st->stream);
    return e == cudaSuccess ? TS_OK : cu_err(e, "cudaGraphUpload", NULL);
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

/* Run [lo, hi): the captured graph (captured now if it is not yet) or
 * every kernel. */
static ts_status run_part(cu_state *st, const ts_program *prog, ts_runtime *rt, int lo, int hi,
                          int skip, cudaGraphExec_t *exec) {
    if (!st->use_graph || skip) {
        double t0 = now_us();
        ts_status s = enqueue(st, prog, rt, lo, hi, skip);
        st->launch_us += now_us() - t0;
        return s;
    }
    if (!*exec) {
        ts_status s = capture(st, prog, rt, lo, hi, exec);
        if (s != TS_OK) return s;
    }
    double t0 = now_us();
    cudaError_t e = cudaGraphLaunch(*exec, st->stream);
    st->launch_us += now_us() - t0;
    return e == cudaSuccess ? TS_OK : cu_err(e, "cudaGraphLaunch", NULL);
}

/* Named values of at most SMALL bytes (the loss scaler's scale, growth
 * tracker and found_inf flag, scalar parameters and their moments) are
 * mirrored every step: copied back after it, and the persistent state among
 * them copied up before the next. The host's copy is then always current,
 * and what the host changed between steps (the GradScaler's update of the
 * scale, src/plan/scaler.c) reaches the device. */
#define SMALL 16

static int is_small(const ts_named *nm) {
    return nm->kind != TS_NAMED_INPUT && cu_bytes(&nm->v) <= SMALL;
}

static size_t loss_bytes(const ts_program *prog) {
    return prog->loss_dtype == TS_F64 ? sizeof(double) : sizeof(float);
}

/* Wait for the stream; a kernel's bad index comes back as the error flag. */
static ts_status finish(cu_state *st, const ts_program *prog, ts_runtime *rt) {
    CK(cudaMemcpyAsync(st->h_err, st->d_err, sizeof(int), cudaMemcpyDeviceToHost, st->stream),
       "reading the error flag");
    if (prog->has_loss)
        CK(cudaMemcpyAsync(st->h_loss, cu_at(st, prog->loss_off), loss_bytes(prog),
                           cudaMemcpyDeviceToHost, st->stream),
           "reading the loss");
    for (int j = 0; j < prog->n_named; j++)
        if (is_small(&prog->named[j])) {
            const ts_operand *v = &prog->named[j].v;
            CK(cudaMemcpyAsync(rt->arena + v->off, cu_at(st, v->off), cu_bytes(v),
                               cudaMemcpyDeviceToHost, st->stream),
               "reading a small value");
        }
    /* the gradient monitors' statistics: the plan reads them from the host */
    for (int i = 0; i < prog->n_ins; i++)
        if (prog->ins[i].op == TS_OP_GRAD_STATS) {
            const ts_operand *o = &prog->ins[i].out[0];
            CK(cudaMemcpyAsync(rt->arena + o->off, cu_at(st, o->off), cu_bytes(o),
                               cudaMemcpyDeviceToHost, st->stream),
               "reading a gradient monitor");
        }
    CK(cudaStreamSynchronize(st->stream), "the step");
    if (*st->h_err) {
        cudaMemset(st->d_err, 0, sizeof(int));
        return cu_fail(TS_ERR_INVALID,
                       "a gather, scatter_add or cross_entropy read an index or target outside "
                       "its range (the CPU backend names the element: run the same step there)");
    }
    return TS_OK;
}

static ts_status cuda_execute(const ts_program *prog, ts_runtime *rt, int *skipped) {
    cu_state *st = state_of(rt);
    *skipped = 0;
    CK(cudaSetDevice(st->device), "cudaSetDevice");
    /* Inputs and the small state (is_small) up, then this step's values
     * (read by the kernels on the device). */
    for (int j = 0; j < prog->n_named; j++) {
        const ts_named *nm = &prog->named[j];
        if (nm->kind != TS_NAMED_INPUT && !(nm->kind == TS_NAMED_STATE && is_small(nm))) continue;
        CK(cudaMemcpyAsync(cu_at(st, nm->v.off), rt->arena + nm->v.off, cu_bytes(&nm->v),
                           cudaMemcpyHostToDevice, st->stream),
           "copying an input to the device");
    }
    st->h_step->lr = rt->ctx.lr;
    st->h_step->step = rt->ctx.step;
    st->h_step->opt_step = rt->ctx.opt_step;
    CK(cudaMemcpyAsync(st->d_step, st->h_step, sizeof(cu_step_vals), cudaMemcpyHostToDevice,
                       st->stream),
       "copying the step values");
    st->device_dirty = 1;
    st->launch_us = 0;
    ts_status s;
    if (prog->gate_ins < 0 || !rt->gate_fn) {
        if ((s = run_part(st, prog, rt, 0, prog->n_ins, 0, &st->g_all)) != TS_OK) return s;
    } else {
        if ((s = run_part(st, prog, rt, 0, prog->gate_ins, 0, &st->g_pre)) != TS_OK) return s;
        if ((s = finish(st, prog, rt)) != TS_OK) return s;
        ts_gate_decision d = TS_GATE_APPLY;
        if ((s = rt->gate_fn(rt->owner, rt->gate_user, &d)) != TS_OK) {
            cu_host->error_prefix("step %lld, update gate", (long long)rt->ctx.step);
            return s;
        }
        if (d != TS_GATE_APPLY && d != TS_GATE_SKIP)
            return cu_fail(TS_ERR_INVALID, "step %lld: the update gate returned %d",
                           (long long)rt->ctx.step, (int)d);
        *skipped = d == TS_GATE_SKIP;
        if ((s = run_part(st, prog, rt, prog->gate_ins, prog->n_ins, *skipped, &st->g_post)) !=
            TS_OK)
            return s;
    }
    if ((s = finish(st, prog, rt)) != TS_OK) return s;
    if (prog->has_loss) memcpy(rt->arena + prog->loss_off, st->h_loss, loss_bytes(prog));
    return TS_OK;
}

static ts_status cuda_to_host(const ts_program *prog, ts_runtime *rt, size_t off, size_t bytes) {
    cu_state *st = state_of(rt);
    (void)prog;
    if (!st || !bytes) return TS_OK;
    CK(cudaSetDevice(st->device), "cudaSetDevice");
    CK(cudaMemcpy(rt->arena + off, cu_at(st, off), bytes, cudaMemcpyDeviceToHost),
       "copying a value to the host");
    return TS_OK;
}

static ts_status cuda_to_device(const ts_program *prog, ts_runtime *rt, size_t off, size_t bytes) {
    cu_state *st = state_of(rt);
    (void)prog;
    if (!st || !bytes) return TS_OK;
    CK(cudaSetDevice(st->device), "cudaSetDevice");
    CK(cudaMemcpy(cu_at(st, off), rt->arena + off, bytes, cudaMemcpyHostToDevice),
       "copying a value to the device");
    return TS_OK;
}

/* With opt.profile the step runs without the graph, each instruction
 * timed on the device by events (enqueue). */
static void cuda_profile(const ts_program *prog, const ts_runtime *rt, int i, double *seconds,
                         int64_t *calls) {
    (void)prog;
    *seconds = rt->ins[i].prof_seconds;
    *calls = rt->ins[i].prof_calls;
}

static void cuda_profile_reset(const ts_program *prog, ts_runtime *rt) {
    for (int i = 0; i < prog->n_ins; i++) rt->ins[i].prof_seconds = 0, rt->ins[i].prof_calls = 0;
}

static void cuda_instr_info(const ts_program *prog, const ts_runtime *rt, int i,
                            ts_backend_instr_info *out) {
    (void)prog, (void)rt, (void)i;
    out->optimised = 1; /* every instruction runs a CUDA kernel */
    out->shared_scratch = 0;
}

static ts_status cuda_device_info(const ts_program *prog, const ts_runtime *rt,
                                  ts_device_info *out) {
    const cu_state *st = state_of(rt);
    (void)prog;
    memset(out, 0, sizeof *out);
    if (!st) return cu_fail(TS_ERR_INVALID, "device_info: the plan has no device state");
    memcpy(out->name, st->name, sizeof out->name);
    out->graph = st->use_graph;
    out->kernels_per_step = st->kernels_per_step;
    out->launch_us = st->launch_us;
    out->device_bytes = (double)st->dev_bytes;
    cu_nvml_read(st->device, &out->util_pct, &out->mem_used_bytes, &out->power_w);
    return TS_OK;
}

static const ts_backend table = {
    .name = "cuda",
    .dtypes = (1u << TS_F32) | (1u << TS_BF16) | (1u << TS_F16) | (1u << TS_I32) | (1u << TS_I64) |
              (1u << TS_U8),
    .memory = TS_MEM_DEVICE,
    .supports_op = cuda_supports,
    .prepare = cuda_prepare,
    .execute = cuda_execute,
    .profile = cuda_profile,
    .profile_reset = cuda_profile_reset,
    .instr_info = cuda_instr_info,
    .release = cuda_release,
    .to_host = cuda_to_host,
    .to_device = cuda_to_device,
    .device_info = cuda_device_info,
};

__attribute__((visibility("default"))) const ts_backend *
ts_cuda_plugin_v1(const ts_cuda_host *host);

const ts_backend *ts_cuda_plugin_v1(const ts_cuda_host *host) {
    if (!host || host->abi != TS_CUDA_PLUGIN_ABI || host->program_size != sizeof(ts_program) ||
        host->runtime_size != sizeof(ts_runtime))
        return NULL;
    cu_host = host;
    return &table;
}
