/* The packed attention_bwd with attention.out_low (set by passes/attn_bwd_low.c in bf16
 * plans): (do, qkv, o, lse) -> (dqkv rounded to bf16, its column sums f32 [3 * H * hd]).
 *
 * Without it the packed backward writes dqkv [B, T, 3, H, hd] in f32 and a sum with out_low
 * (ops/reduce.c) reads it back to write the qkv bias gradient (the column sums over B and T)
 * and the bf16 copy the qkv projection's GEMMs read: 12 MB written and read again per W3
 * layer. Here each work item, one (b, h) as in the f32 output's kernel
 * (ts_attn_bwd_item_low), accumulates the head's dq, dk and dv in its scratch slot instead
 * ([T][3][hd] f32, in L2), then rounds them into the bf16 output (ts_f32_to_bf16, the cast
 * op's rounding) and adds the head's columns over its T rows into per-(b, h) double partial
 * sums. The same f32 values are rounded the same way: the bf16 dqkv has the bits of the sum's
 * copy.
 *
 * The column sums: the sum adds a column's B * T rows in order into one double; here the T
 * rows of each b are added in order into a double (the same as the sum's for b = 0), and the
 * B partials are then added in b order after the parallel loop, into a double rounded once to
 * f32. The two doubles differ only by the rounding of the B - 1 partial additions (relative
 * 2^-53 each), so the f32 results differ only where the double lies within that distance of
 * a rounding boundary between two floats (a tie of f32 rounding): rare, and then by 1 ulp.
 * Every partial has a fixed slot and the final order is fixed: the bits do not depend on the
 * thread count. */
#include <omp.h>
#include "core/half.h"
#include "ops/attention_fused.h"

/* One slot: the low item's slot, then the head's f32 gradients [T][3 * hd]. */
static size_t slot_bytes(int64_t T, int64_t hd) {
    return ts_attn_bwd_low_slot_bytes(T, hd) +
           ts_attn_round64((size_t)(T * 3 * hd) * sizeof(float));
}

size_t ts_attn_bwd_low_out_scratch(const ts_type *q) {
    ts_attn_geom g;
    ts_attn_geom_of(q, &g);
    const int64_t BH = g.B * g.H;
    return (size_t)ts_attn_slots_for(BH) * slot_bytes(g.seq, g.hd) +
           ts_attn_round64((size_t)(BH * 3 * g.hd) * sizeof(double));
}

/* The head's gradients gr [T][3 * hd] rounded into dst (row t at t * ld, q, k and v parts gk
 * apart) and their columns summed over t in order into col [3 * hd]. */
TS_CLONES static void round_and_sum(uint16_t *dst, int64_t ld, int64_t gk, const float *gr,
                                    int64_t T, int64_t hd, double *col) {
    const int64_t w = 3 * hd;
    for (int64_t j = 0; j < w; j++) col[j] = 0;
    for (int64_t t = 0; t < T; t++) {
        const float *row = gr + t * w;
        for (int64_t j = 0; j < w; j++) col[j] += (double)row[j];
        for (int part = 0; part < 3; part++) {
            const float *src = row + part * hd;
            uint16_t *d = dst + t * ld + part * gk;
#pragma omp simd
            for (int64_t j = 0; j < hd; j++) d[j] = ts_f32_to_bf16(src[j]);
        }
    }
}

ts_status ts_attn_bwd_low_out(const ts_kargs *k) {
    ts_attn_geom g;
    ts_attn_geom_of_tensor(&k->in[1], &g);
    if (!g.packed || k->n_in != 4 || k->n_out != 2 || k->in[1].dtype != TS_F32 ||
        k->out[0].dtype != TS_BF16 || k->out[1].dtype != TS_F32)
        return ts_kernel_bad_dtype(k, "attention_bwd (out_low)", k->in[1].dtype);
    const int64_t BH = g.B * g.H, T_ = g.seq, hd = g.hd, gk = g.H * hd, w = 3 * hd;
    const size_t slot = slot_bytes(T_, hd), low = ts_attn_bwd_low_slot_bytes(T_, hd);
    const int64_t slots = ts_attn_slots_for(BH);
    if ((size_t)slots * slot + (size_t)(BH * w) * sizeof(double) > k->scratch_bytes)
        return ts_fail(TS_ERR_INTERNAL, "attention_bwd '%s': scratch too small", k->label);
    const float *dout = k->in[0].data, *q = k->in[1].data, *o = k->in[2].data;
    const float *lse = k->in[3].data;
    uint16_t *dqkv = k->out[0].data;
    float *sums = k->out[1].data;
    char *ws = k->scratch;
    double *part = (double *)(ws + (size_t)slots * slot); /* [B][H][3 * hd] */
    const float scale = (float)k->a->attention.scale;
    const int causal = k->a->attention.causal != 0;
    ts_attn_geom gs = g; /* the items write a head's gradients as [T][3][hd] rows */
    gs.ld_grad = w;
    const int nt = ts_attn_threads_for(slots, BH * T_ * T_ * hd);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        char *sl = ws + (size_t)omp_get_thread_num() * slot;
        float *gr = (float *)(sl + low);
#pragma omp for schedule(dynamic, 1)
        for (int64_t bh = 0; bh < BH; bh++) {
            int64_t hi, ho;
            ts_attn_head_offsets(&g, bh, &hi, &ho);
            ts_attn_bwd_item_low(dout + ho, q + hi, q + gk + hi, q + 2 * gk + hi, o + ho,
                                 lse + bh * T_, gr, gr + hd, gr + 2 * hd, &gs, scale, causal,
                                 (float *)sl);
            round_and_sum(dqkv + hi, g.ld_in, gk, gr, T_, hd, part + bh * w);
        }
    }
    /* column (part p, head h, d) of the sums: the partials of (b, h) in b order */
    for (int64_t h = 0; h < g.H; h++)
        for (int64_t j = 0; j < w; j++) {
            double acc = 0;
            for (int64_t b = 0; b < g.B; b++) acc += part[(b * g.H + h) * w + j];
            sums[j / hd * gk + h * hd + j % hd] = (float)acc;
        }
    return TS_OK;
}
