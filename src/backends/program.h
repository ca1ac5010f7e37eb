/* program.h — a compiled program (internal): what ts_compile hands a
 * backend, and never changes once compiled.
 *
 * A program is the flat list of instructions the passes scheduled, each
 * with everything a backend needs to run it (the op's id, name, flags and
 * reference kernel copied at lowering, its attributes, the types and arena
 * offsets of its operands, its scratch and a label), where the arena's
 * regions lie, and the table of the values a user addresses by name. It
 * holds no graph and no memory: the state one run of it changes (the arena,
 * the step, kernels a backend chose) is a ts_runtime (runtime.h).
 *
 *     for (int i = 0; i < prog->n_ins; i++) {
 *         const ts_instr *in = &prog->ins[i];
 *         if (in->op == TS_OP_MATMUL && in->in[0].dtype == TS_F32) ...   // in->in[0].off
 *     }
 *
 * Built by src/plan/compile.c (lowering the final graph); read by src/plan
 * and by backends, which include this header and runtime.h, never the IR's
 * (ir/ir.h) or the passes' headers. */
#ifndef TS_PROGRAM_H
#define TS_PROGRAM_H

#include <stddef.h>
#include <stdint.h>
#include "core/kernel.h"
#include "ops/op_ids.h"
#include "tessel/plan.h"

/* An operand of an instruction or a named value: dtype, shape and where it
 * lies in the arena. */
typedef struct ts_operand {
    ts_dtype dtype;
    int rank;
    int64_t dims[TS_MAX_RANK];
    size_t off; /* offset in the arena (ts_arena_layout) */
} ts_operand;

static inline size_t ts_operand_bytes(const ts_operand *o) {
    return (size_t)ts_shape_numel(o->rank, o->dims) * ts_dtype_size(o->dtype);
}

typedef struct ts_instr {
    int op;              /* ts_op_id */
    const char *name;    /* the op's name (static) */
    unsigned flags;      /* the op's TS_OPF_* (core/kernel.h) */
    ts_kernel_fn kernel; /* the op's reference kernel */
    ts_attrs a;
    int n_in, n_out;
    ts_operand *in; /* n_in (owned) */
    ts_operand out[TS_MAX_OUT];
    size_t scratch_off, scratch_bytes; /* the reference kernel's scratch in the arena */
    char *label;                       /* names the first output in messages (owned) */
    double flops;                      /* of one execution (the op's cost model) */
} ts_instr;

/* The arena's regions, in bytes from its start (memplan's layout). */
typedef struct ts_arena_layout {
    size_t arena_bytes;
    size_t param_off, param_bytes;
    size_t grad_off, grad_bytes;
    size_t state_off, state_bytes;
    size_t io_off, io_bytes; /* inputs and constants */
    size_t temp_off, temp_bytes;
    size_t naive_bytes; /* every value its own buffer, plus scratch */
    int n_inplace;      /* outputs sharing their input's memory */
    /* ZeRO-2: gradient buckets planned inside the temporaries */
    size_t zero_grad_bytes, zero_grad_peak, zero_shard_bytes;
    /* ZeRO-3: the buckets' gathered parameters, planned inside the temporaries */
    size_t zero_param_bytes, zero_param_peak;
    size_t peak_live, naive_peak; /* live temporaries: the schedule's peak, build order's */
    int n_recomputed;             /* activations recomputed under compile.max_memory_mb */
    double recompute_flops;       /* the FLOPs that adds per step */
    size_t arena_no_recompute;    /* the arena without it (0: no limit was set) */
    const char *schedule;         /* the order kept: "build order", "greedy" or "search" */
} ts_arena_layout;

/* What a named value is. */
typedef enum ts_named_kind {
    TS_NAMED_VALUE = 0, /* computed by the step (an output, a gradient, the loss) */
    TS_NAMED_INPUT,     /* fed before each step */
    TS_NAMED_PARAM,     /* a trainable parameter */
    TS_NAMED_STATE      /* persistent state (optimizer moments, the loss scale, ...) */
} ts_named_kind;

/* A value the user can address by name. */
typedef struct ts_named {
    char *name;   /* owned */
    ts_operand v; /* dtype, shape and arena offset */
    ts_named_kind kind;
    int is_grad; /* the final gradient of a parameter */
} ts_named;

typedef struct ts_program {
    ts_instr *ins;
    int n_ins;
    /* The update gate: the first update-phase instruction (TS_OPF_UPDATE)
     * of the schedule, -1 without one; a backend asks the runtime's gate
     * there whether the update-phase instructions run. */
    int gate_ins;
    ts_arena_layout layout;
    ts_named *named;
    int n_named;
    int has_loss; /* a training program: the loss below and an update */
    size_t loss_off;
    ts_dtype loss_dtype;
    ts_train_spec spec;     /* trainable cleared */
    ts_compile_options opt; /* the strings (read during compile only) cleared */
    double flops;           /* per step */
    int n_buckets;          /* data parallelism: gradient buckets (distribute pass) */
    int zero_shared;        /* ZeRO: one copy of the parameters shared by the ranks */
    ts_shard_piece *shards; /* ZeRO: the sharded state's layout (names point into named) */
    int n_shards;
    /* With opt.keep_dumps: the dumps that need the graph, rendered while
     * compiling (TS_DUMP_IR, TS_DUMP_MEMORY); NULL otherwise. */
    char *dump_ir, *dump_memory;
} ts_program;

#endif
