/* The weights' low-precision copies outside the step (passes/weight_copies.c): the
 * optimizer's update rewrites a bf16 / f16 copy of each weight a GEMM reads, so every
 * other writer of the weights has to rewrite the copy too. */
#include <stdint.h>
#include "core/half.h"
#include "plan/plan.h"

void ts_plan_refresh_copies(ts_plan *p, size_t param_off) {
    const ts_program *prog = &p->prog;
    for (int i = 0; i < prog->n_ins; i++) {
        const ts_instr *in = &prog->ins[i];
        ts_update_layout L;
        if (!ts_update_layout_of(in->op, &in->a, in->n_in, &L)) continue;
        for (int j = 0; j < L.n_low; j++) {
            const ts_operand *w = &in->in[j * L.gs], *c = &in->in[L.first_copy + j];
            if (param_off != SIZE_MAX && w->off != param_off) continue;
            const float *src = (const float *)ts_plan_at(p, w->off);
            uint16_t *dst = (uint16_t *)ts_plan_at(p, c->off);
            const int64_t n = ts_shape_numel(w->rank, w->dims);
            if (c->dtype == TS_BF16)
                ts_f32_to_bf16_n(dst, src, n);
            else
                ts_f32_to_f16_n(dst, src, n);
        }
    }
    p->rt.copies_stale = 0;
}
