/* backend.h — the interface between a compiled program and what runs it.
 *
 * A backend is one table of functions, registered by name in
 * src/backends/registry.c (adding one = a folder with its files plus one
 * line there). ts_compile looks the backend up by
 * ts_compile_options.backend (NULL or "cpu": the CPU backend) and the plan
 * only ever calls down through the table, handing it the immutable program
 * (program.h) and the runtime state it may change (runtime.h):
 *
 *     const ts_backend *be = ts_backend_find(opt->backend);   // NULL: unknown
 *     be->prepare(prog, rt);             // once, after lowering
 *     be->execute(prog, rt, &skipped);   // every step
 *     be->release(prog, rt);             // in ts_plan_free
 *
 * prepare may replace an instruction's kernel (rt->ins[i].fn) and attach
 * per-instruction state (rt->ins[i].k.backend, backend_free); execute runs
 * every instruction once and asks the runtime's update gate at
 * prog->gate_ins. A backend includes this header (and so program.h and
 * runtime.h), never the graph IR's or the plan's. */
#ifndef TS_BACKEND_H
#define TS_BACKEND_H

#include <stdint.h>
#include "backends/runtime.h"
#include "core/core.h"
#include "tessel/compile.h"

/* Where a backend's tensors live. */
typedef enum ts_memory_kind {
    TS_MEM_HOST = 0, /* ordinary host memory (the arena is malloc'ed or a comm segment) */
    TS_MEM_DEVICE    /* device memory the host cannot address directly */
} ts_memory_kind;

/* What a backend says about one instruction (dumps). */
typedef struct ts_backend_instr_info {
    int optimised;      /* runs a backend kernel instead of the op's reference kernel */
    int shared_scratch; /* its scratch is the backend's shared buffer, not the arena's */
} ts_backend_instr_info;

typedef struct ts_backend {
    const char *name;
    uint32_t dtypes;            /* bit (1u << ts_dtype) for each dtype it runs */
    ts_memory_kind memory;      /* where its tensors live */
    int (*supports_op)(int op); /* 1 if it runs op (a ts_op_id) */
    /* 1 if a matmul computed in chunks of rows gives every row the bits of
     * the whole product (the chunk_ce pass relies on it); NULL: yes. */
    int (*row_chunks_exact)(void);
    /* The head size its packed attention (one qkv [B, T, 3, H, hd] read in place,
     * passes/attention_qkv.c) runs for, at this compute precision: 0 any, > 0 only that
     * one, -1 none. NULL: any on host backends, none on device backends. */
    int64_t (*packed_attention_hd)(ts_dtype compute);
    /* Once per program, after lowering and binding: choose kernels,
     * create their state. */
    ts_status (*prepare)(const ts_program *prog, ts_runtime *rt);
    /* One step: every instruction once; *skipped: the update gate skipped
     * the update phase. */
    ts_status (*execute)(const ts_program *prog, ts_runtime *rt, int *skipped);
    /* Instructions [lo, hi) only, the update gate not asked (pipeline
     * stages run a step's forward, backward and update apart); NULL: the
     * backend cannot. */
    ts_status (*execute_range)(const ts_program *prog, ts_runtime *rt, int lo, int hi);
    /* Time spent in instruction i so far and how often it ran (with
     * ts_compile_options.profile), and forgetting it. */
    void (*profile)(const ts_program *prog, const ts_runtime *rt, int i, double *seconds,
                    int64_t *calls);
    void (*profile_reset)(const ts_program *prog, ts_runtime *rt);
    void (*instr_info)(const ts_program *prog, const ts_runtime *rt, int i,
                       ts_backend_instr_info *out);
    /* Free what prepare made (the plan frees its own memory). */
    void (*release)(const ts_program *prog, ts_runtime *rt);
    /* Device backends (TS_MEM_DEVICE) only, NULL otherwise: the host arena
     * mirrors the device's; to_host makes its bytes [off, off + bytes)
     * current before the plan reads them (ts_plan_read), to_device sends
     * bytes the plan wrote there (ts_plan_write_param) to the device. */
    ts_status (*to_host)(const ts_program *prog, ts_runtime *rt, size_t off, size_t bytes);
    ts_status (*to_device)(const ts_program *prog, ts_runtime *rt, size_t off, size_t bytes);
    /* Device backends: the device and the last step (ts_plan_device_info). */
    ts_status (*device_info)(const ts_program *prog, const ts_runtime *rt, ts_device_info *out);
} ts_backend;

/* The backend registered under name (NULL: "cpu"), or NULL if none. */
const ts_backend *ts_backend_find(const char *name);
/* The registered backends, in registry order. */
int ts_backend_count(void);
const ts_backend *ts_backend_at(int i);
/* ts_backend_find with a TS_ERR_INVALID naming the unknown backend and the
 * known ones. */
ts_status ts_backend_lookup(const char *name, const ts_backend **out);

#endif
