/* The CPU backend's entry in the backend registry (backends/backend.h):
 * reference kernels of every op, oneDNN for matmuls and convolutions. */
#include "backends/backend.h"
#include "backends/cpu/cpu.h"

static int cpu_supports_op(int op) {
    return op >= 0 && op < TS_OP_COUNT; /* every op has a reference kernel */
}

static void cpu_profile(const ts_plan *p, int i, double *seconds, int64_t *calls) {
    *seconds = p->ins[i].prof_seconds;
    *calls = p->ins[i].prof_calls;
}

static void cpu_profile_reset(ts_plan *p) {
    for (int i = 0; i < p->n_ins; i++) p->ins[i].prof_seconds = 0, p->ins[i].prof_calls = 0;
}

static void cpu_instr_info(const ts_plan *p, int i, ts_backend_instr_info *out) {
    const ts_instr *in = &p->ins[i];
    out->optimised = in->backend && in->backend_free;
    out->shared_scratch = in->scratch_bytes && in->scratch == p->backend_scratch;
}

static void cpu_release(ts_plan *p) {
    for (int i = 0; i < p->n_ins; i++)
        if (p->ins[i].backend_free) {
            p->ins[i].backend_free(p->ins[i].backend);
            p->ins[i].backend = NULL;
            p->ins[i].backend_free = NULL;
        }
    ts_aligned_free(p->backend_scratch);
    p->backend_scratch = NULL;
    p->backend_scratch_bytes = 0;
}

const ts_backend ts_backend_cpu = {
    .name = "cpu",
    .dtypes = (1u << TS_F32) | (1u << TS_F64) | (1u << TS_F16) | (1u << TS_BF16) | (1u << TS_I32) |
              (1u << TS_I64) | (1u << TS_U8) | (1u << TS_F8E4M3) | (1u << TS_F8E5M2),
    .memory = TS_MEM_HOST,
    .supports_op = cpu_supports_op,
    .prepare = ts_cpu_prepare,
    .execute = ts_cpu_execute,
    .profile = cpu_profile,
    .profile_reset = cpu_profile_reset,
    .instr_info = cpu_instr_info,
    .release = cpu_release,
};
