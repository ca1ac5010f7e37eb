/* The CPU backend's entry in the backend registry (backends/backend.h):
 * reference kernels of every op, oneDNN for matmuls and convolutions. */
#include "backends/backend.h"
#include "backends/cpu/cpu.h"
#include "backends/cpu/dnnl_matmul.h"

static int cpu_supports_op(int op) {
    return op >= 0 && op < TS_OP_COUNT; /* every op has a reference kernel */
}

static void cpu_profile(const ts_program *prog, const ts_runtime *rt, int i, double *seconds,
                        int64_t *calls) {
    (void)prog;
    *seconds = rt->ins[i].prof_seconds;
    *calls = rt->ins[i].prof_calls;
}

static void cpu_profile_reset(const ts_program *prog, ts_runtime *rt) {
    for (int i = 0; i < prog->n_ins; i++) rt->ins[i].prof_seconds = 0, rt->ins[i].prof_calls = 0;
}

static void cpu_instr_info(const ts_program *prog, const ts_runtime *rt, int i,
                           ts_backend_instr_info *out) {
    const ts_rt_instr *r = &rt->ins[i];
    out->optimised = r->k.backend && r->backend_free;
    (void)prog;
    out->shared_scratch = r->k.scratch_bytes && r->k.scratch == rt->backend_scratch;
}

static void cpu_release(const ts_program *prog, ts_runtime *rt) {
    for (int i = 0; rt->ins && i < prog->n_ins; i++)
        if (rt->ins[i].backend_free) {
            rt->ins[i].backend_free(rt->ins[i].k.backend);
            rt->ins[i].k.backend = NULL;
            rt->ins[i].backend_free = NULL;
        }
    ts_aligned_free(rt->backend_scratch);
    rt->backend_scratch = NULL;
    rt->backend_scratch_bytes = 0;
}

const ts_backend ts_backend_cpu = {
    .name = "cpu",
    .dtypes = (1u << TS_F32) | (1u << TS_F64) | (1u << TS_F16) | (1u << TS_BF16) | (1u << TS_I32) |
              (1u << TS_I64) | (1u << TS_U8) | (1u << TS_F8E4M3) | (1u << TS_F8E5M2),
    .memory = TS_MEM_HOST,
    .supports_op = cpu_supports_op,
    .row_chunks_exact = ts_mm_row_chunks_exact,
    .prepare = ts_cpu_prepare,
    .execute = ts_cpu_execute,
    .execute_range = ts_cpu_execute_range,
    .profile = cpu_profile,
    .profile_reset = cpu_profile_reset,
    .instr_info = cpu_instr_info,
    .release = cpu_release,
};
