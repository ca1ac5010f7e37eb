/* The packed attention_bwd with attention.out_low (set by passes/attn_bwd_low.c in bf16
 * plans): (do, qkv, o, lse) -> (dqkv rounded to bf16, its column sums f32 [3 * H * hd]); the
 * qkv f32, or bf16 where the qkv projection writes it so (passes/qkv_low.c).
 *
 * Without it the packed backward writes dqkv [B, T, 3, H, hd] in f32 and a sum with out_low
 * (ops/reduce.c) reads it back to write the qkv bias gradient (the column sums over B and T)
 * and the bf16 copy the qkv projection's GEMMs read: 12 MB written and read again per W3
 * layer. Here each work item, one (b, h) as in the f32 output's kernel
 * (ts_attn_bwd_item_low), accumulates the head's dq, dk and dv in its scratch slot instead
 * ([T][3][hd] f32, in L2), and as soon as a block of rows is final (ts_attn_bwd_item_low_fin:
 * dq's after its query block, dk's and dv's during the last query block) rounds it into the
 * bf16 output (ts_f32_to_bf16, the cast op's rounding) and adds its columns into per-(b, h)
 * double partial sums, so the stores overlap the item's block products. The same f32 values
 * are rounded the same way: the bf16 dqkv has the bits of the sum's copy.
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
#include <string.h>
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

/* What an item's fin rounds from and to: the head's gradients gr [T][3 * hd], its rows in
 * the bf16 output (ld apart, the q, k and v parts gk apart), its column partial sums. */
typedef struct fin_ctx {
    const float *gr;
    uint16_t *dst;
    int64_t T, hd, ld, gk;
    double *col; /* [3 * hd] */
} fin_ctx;

#define PF 8 /* rows ahead whose output lines are fetched for writing */

/* 16 lanes: the rounding of ts_f32_to_bf16 on 32-bit lanes (a NaN made quiet, else round to
 * nearest even), narrowed at the end: GCC vector extensions, one AVX-512 register in the
 * avx512f clone (the scalar loop vectorises with 8-lane packs and blends). */
typedef uint32_t vu32 __attribute__((vector_size(64)));
typedef uint16_t vu16 __attribute__((vector_size(32)));
typedef float vf8 __attribute__((vector_size(32)));
typedef double vd8 __attribute__((vector_size(64)));
static inline __attribute__((always_inline)) void bf16_16(uint16_t *d, const float *f) {
    vu32 u;
    memcpy(&u, f, sizeof u);
    const vu32 nan = (vu32)((u & 0x7fffffffu) > 0x7f800000u); /* all ones where NaN */
    const vu32 r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;
    const vu16 b = __builtin_convertvector((r & ~nan) | (q & nan), vu16);
    memcpy(d, &b, sizeof b);
}

/* Rows [t0, t0 + n) of part p rounded into the output and added into its columns' sums in
 * increasing t (each column's double accumulator is loaded, takes the rows in order, and is
 * stored back: the same additions as one pass over every row). 64 columns at a time, their
 * sums in registers; the columns beyond a multiple of 16 one by one. */
TS_CLONES static void round_part(const fin_ctx *c, int64_t t0, int64_t n, int p) {
    const int64_t hd = c->hd, w = 3 * hd, ld = c->ld;
    const float *src = c->gr + p * hd;
    uint16_t *dst = c->dst + p * c->gk;
    double *col = c->col + p * hd;
    const int64_t hv = hd / 16 * 16;
    for (int64_t j0 = 0; j0 < hv; j0 += 64) {
        const int nv = (int)((hv - j0 < 64 ? hv - j0 : 64) / 16);
        vd8 acc[8];
        memcpy(acc, col + j0, sizeof(double) * 16 * (size_t)nv);
        for (int64_t t = t0; t < t0 + n; t++) {
            const float *r = src + t * w + j0;
            uint16_t *d = dst + t * ld + j0;
            if (t + PF < t0 + n) /* output rows are 3 * H * hd apart: no hardware prefetch */
                __builtin_prefetch(d + PF * ld, 1), __builtin_prefetch(d + PF * ld + 32, 1);
            for (int v = 0; v < nv; v++) {
                vf8 lo, hi;
                memcpy(&lo, r + 16 * v, sizeof lo);
                memcpy(&hi, r + 16 * v + 8, sizeof hi);
                bf16_16(d + 16 * v, r + 16 * v);
                acc[2 * v] += __builtin_convertvector(lo, vd8);
                acc[2 * v + 1] += __builtin_convertvector(hi, vd8);
            }
        }
        memcpy(col + j0, acc, sizeof(double) * 16 * (size_t)nv);
    }
    for (int64_t t = t0; t < t0 + n && hv < hd; t++)
        for (int64_t j = hv; j < hd; j++) {
            col[j] += (double)src[t * w + j];
            dst[t * ld + j] = ts_f32_to_bf16(src[t * w + j]);
        }
}

/* ts_attn_bwd_fin_fn: dq rows (what 0, part 0) or dk and dv rows (1: parts 1 and 2) are
 * final. */
static void fin(void *ctx, int64_t t0, int64_t n, int what) {
    for (int p = what ? 1 : 0; p < (what ? 3 : 1); p++) round_part(ctx, t0, n, p);
}

ts_status ts_attn_bwd_low_out(const ts_kargs *k) {
    ts_attn_geom g;
    ts_attn_geom_of_tensor(&k->in[1], &g);
    if (!g.packed || k->n_in != 4 || k->n_out != 2 ||
        (k->in[1].dtype != TS_F32 && k->in[1].dtype != TS_BF16) || k->out[0].dtype != TS_BF16 ||
        k->out[1].dtype != TS_F32)
        return ts_kernel_bad_dtype(k, "attention_bwd (out_low)", k->in[1].dtype);
    const int64_t BH = g.B * g.H, T_ = g.seq, hd = g.hd, gk = g.H * hd, w = 3 * hd;
    const size_t slot = slot_bytes(T_, hd), low = ts_attn_bwd_low_slot_bytes(T_, hd);
    const int64_t slots = ts_attn_slots_for(BH);
    if ((size_t)slots * slot + (size_t)(BH * w) * sizeof(double) > k->scratch_bytes)
        return ts_fail(TS_ERR_INTERNAL, "attention_bwd '%s': scratch too small", k->label);
    const float *dout = k->in[0].data, *o = k->in[2].data;
    const char *q = k->in[1].data; /* f32 or bf16 (passes/qkv_low.c): es bytes an element */
    const int64_t es = (int64_t)ts_dtype_size(k->in[1].dtype);
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
            fin_ctx c = {gr, dqkv + hi, T_, hd, g.ld_in, gk, part + bh * w};
            for (int64_t j = 0; j < w; j++) c.col[j] = 0;
            ts_attn_geom gi = gs; /* the next head's q, k, v, do and o rows */
            if (bh + 1 < BH) {
                int64_t nh, no;
                ts_attn_head_offsets(&g, bh + 1, &nh, &no);
                for (int j = 0; j < 3; j++)
                    ts_attn_prefetch_add(&gi, q + (j * gk + nh) * es, g.ld_in * es, hd * es);
                ts_attn_prefetch_add(&gi, dout + no, g.ld_out * 4, hd * 4);
                ts_attn_prefetch_add(&gi, o + no, g.ld_out * 4, hd * 4);
            }
            ts_attn_bwd_item_low_fin(dout + ho, q + hi * es, q + (gk + hi) * es,
                                     q + (2 * gk + hi) * es, o + ho, lse + bh * T_, gr, gr + hd,
                                     gr + 2 * hd, &gi, scale, causal, (float *)sl, fin, &c);
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
