/* kernels.h — the CUDA kernels of the CUDA backend plugin, as C functions
 * that enqueue one kernel (or a few) on a stream (eltwise.cu, shape.cu,
 * reduce.cu, norm_loss.cu, optim.cu, attention.cu, attention_tc.cu,
 * scatter.cu, bn_pool.cu). Every tensor is contiguous, row-major and in the device arena;
 * shapes are passed explicitly. Nothing here allocates or synchronises, so
 * each call can be captured into a CUDA graph. Each returns the launch's
 * cudaError_t as an int (0: cudaSuccess).
 *
 * Determinism: no kernel uses floating-point atomics; every reduction runs
 * in a fixed order given by the shapes alone, so a step's bits do not
 * depend on scheduling. */
#ifndef TS_CUDA_KERNELS_H
#define TS_CUDA_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *cu_stream; /* cudaStream_t */

#define CU_MAX_RANK     8
#define CU_EW_MAX_EXT   8  /* TS_FUSE_MAX_EXT (ops/fused.h) */
#define CU_EW_MAX_INSTR 16 /* TS_FUSE_MAX_INSTR */

/* An elementwise program (one thread per output element): registers
 * 0..n_ext-1 are the inputs read at the element's broadcast position,
 * register n_ext + t the result of instruction t, the last one is written
 * to out. A plain unary/binary op is a program of one instruction, a
 * fused_eltwise node's program is decoded into this form. */
typedef struct cu_ew_input {
    const void *p;
    int u8;                      /* 1: an unsigned char condition (where), else f32 */
    int full;                    /* 1: the output's shape (read at the element's index) */
    int64_t stride[CU_MAX_RANK]; /* in elements per output dim; 0 where broadcast */
} cu_ew_input;

typedef struct cu_ew_instr {
    int op;                         /* ts_op_id; -1: copy of src[0] */
    int src[3];                     /* registers */
    int fwd_op, side, approx, min_; /* unary_bwd: forward op, side; gelu: approx; maxmin_bwd */
    float exponent, slope, scale, shift;
} cu_ew_instr;

typedef struct cu_ew_prog {
    int n_ext, n_instr, rank;
    int64_t n;                 /* output elements */
    int64_t dims[CU_MAX_RANK]; /* output shape */
    cu_ew_input in[CU_EW_MAX_EXT];
    cu_ew_instr ins[CU_EW_MAX_INSTR];
    float *out;
} cu_ew_prog;

int cu_eltwise(const cu_ew_prog *p, cu_stream s);

/* y = cast(x): dtypes 0 f32, 1 bf16, 2 f16 (the cu_float kinds). */
enum { CU_F32 = 0, CU_BF16 = 1, CU_F16 = 2 };
int cu_cast(void *y, int yk, const void *x, int xk, int64_t n, cu_stream s);

/* y[o] = scale * sum of x over the reduced axes, for the output index o:
 * x has rank dims; axes is a bit mask; one block per output element, a
 * fixed tree inside the block. */
int cu_reduce_sum(float *y, const float *x, int rank, const int64_t *dims, int64_t axes,
                  double scale, cu_stream s);
/* The same when the reduced axes are the leading ones (a bias gradient:
 * x [rows, cols] summed over rows): coalesced column partials over fixed
 * blocks of rows, then their sum in block order; part: the doubles of
 * cu_col_sum_scratch. */
size_t cu_col_sum_scratch(int64_t rows, int64_t cols);
int cu_col_sum(float *y, const float *x, int64_t rows, int64_t cols, double scale, double *part,
               cu_stream s);

/* y = permute(x): output dim i is input dim perm[i]. */
int cu_permute(void *y, const void *x, int esize, int rank, const int64_t *xdims,
               const int64_t *perm, cu_stream s);
/* Copy a [outer, src_len, inner] block [outer, len, inner] from offset
 * src_start along the middle axis into [outer, dst_len, inner] at dst_start
 * (slice, concat, slice_bwd's interior). */
int cu_copy_axis(void *y, int64_t dst_len, int64_t dst_start, const void *x, int64_t src_len,
                 int64_t src_start, int64_t len, int64_t outer, int64_t inner, int esize,
                 cu_stream s);
int cu_zero(void *y, size_t bytes, cu_stream s);

/* gather: y[b, j, :] = x[b, idx[j], :] over [outer, extent, inner]; an index
 * outside [0, extent) writes zeros and sets *err to 1. */
int cu_gather(void *y, const void *x, const void *idx, int idx64, int64_t nidx, int64_t outer,
              int64_t extent, int64_t inner, int esize, int *err, cu_stream s);

/* scatter_add: y = zeros [outer, extent, inner]; y[b, idx[j], :] += dy[b, j, :]
 * summed in increasing j (a stable sort of the indices, then one segment
 * per output row): no atomics. keys/vals/keys2/vals2/temp: scratch of
 * cu_scatter_add_scratch bytes. */
size_t cu_scatter_add_scratch(int64_t nidx, int64_t extent);
int cu_scatter_add(float *y, const float *dy, const void *idx, int idx64, int64_t nidx,
                   int64_t outer, int64_t extent, int64_t inner, void *scratch,
                   size_t scratch_bytes, int *err, cu_stream s);

/* LayerNorm over the last axis d of rows rows; w, b may be NULL. */
int cu_layer_norm(float *y, float *mean, float *rstd, const float *x, const float *w,
                  const float *b, int64_t rows, int64_t d, double eps, cu_stream s);
/* dx (and dw, db when not NULL; partial needs 2 * ceil(rows / 32) * d
 * doubles of scratch) of LayerNorm. */
int cu_layer_norm_bwd(float *dx, float *dw, float *db, const float *dy, const float *x,
                      const float *mean, const float *rstd, const float *w, int64_t rows, int64_t d,
                      double *partial, cu_stream s);
size_t cu_layer_norm_bwd_scratch(int64_t rows, int64_t d);

/* Cross-entropy of logits [n, c] against targets (i32/i64) with an optional
 * class weight; loss = sum w(l - x_t) / sum w over rows whose target is not
 * ign. part: 3 * n doubles of scratch; a target outside [0, c) sets *err. */
int cu_cross_entropy(float *loss, float *lse, const float *x, const void *tg, int tg64,
                     const float *wt, int64_t n, int64_t c, int64_t ign, double *part, int *err,
                     cu_stream s);
int cu_cross_entropy_bwd(float *dx, const float *dl, const float *x, const float *lse,
                         const void *tg, int tg64, const float *wt, int64_t n, int64_t c,
                         int64_t ign, double *part, int *err, cu_stream s);

/* One Adam/AdamW update of n_groups (p, g, m, v) groups in one launch:
 * ptrs[4 * i + 0..3] and sizes[i] in device memory (written once at
 * prepare); the step number and learning rate are read from *step on the
 * device; coef (NULL: 1) is the clip coefficient. */
typedef struct cu_step_vals {
    double lr;
    int64_t step, opt_step;
} cu_step_vals;
/* torch.optim.SGD over groups (p, g[, buf]) (per = 2 or 3), src/ops/optim.c's
 * arithmetic: the buffer starts as d_p on the first applied update. */
int cu_sgd(float *const *ptrs, const int64_t *sizes, int n_groups, int per, int64_t max_size,
           const cu_step_vals *step, const float *coef, double momentum, double dampening,
           double wd, int nesterov, cu_stream s);
int cu_adam(float *const *ptrs, const int64_t *sizes, int n_groups, int64_t max_size,
            const cu_step_vals *step, const float *coef, int decoupled, double beta1, double beta2,
            double eps, double wd, cu_stream s);
/* coef = min(1, max_norm / (sqrt(sum of squares of every tensor) + 1e-6)):
 * ptrs/sizes as above, part: n_groups doubles of scratch. */
int cu_clip_coef(float *coef, const float *const *ptrs, const int64_t *sizes, int n_groups,
                 double max_norm, double *part, cu_stream s);

/* GradScaler's unscale: every gradient (ptrs/sizes as above) times
 * 1 / *scale in place; *found = 1 if any element was not finite, else 0.
 * flags: n_groups ints of scratch (a group's flag is only ever set to 1). */
int cu_unscale(float *found, float *const *ptrs, const int64_t *sizes, int n_groups,
               int64_t max_size, const float *scale, int *flags, cu_stream s);

/* grad_stats: out[0..3] = sum of squares, sum, non-finite elements,
 * elements of x[n] (f64 sums over CU_STATS_BLOCKS fixed chunks, then in
 * chunk order); part: 3 * CU_STATS_BLOCKS doubles of scratch. */
#define CU_STATS_BLOCKS 512
int cu_grad_stats(double *out, const float *x, int64_t n, double *part, cu_stream s);

/* Fused causal/non-causal attention, q k v o [B, H, T, hd], lse [B, H, T];
 * hd <= 256. The backward recomputes the probabilities from lse; dq per
 * query row, dk and dv per key row (no atomics). delta: B*H*T floats. */
int cu_attention(float *o, float *lse, const float *q, const float *k, const float *v, int64_t bh,
                 int64_t t, int64_t hd, int causal, float scale, cu_stream s);
int cu_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                     const float *k, const float *v, const float *o, const float *lse, float *delta,
                     int64_t bh, int64_t t, int64_t hd, int causal, float scale, cu_stream s);

/* Where attention's rows lie, in elements: head bh = b H + h of q (and dq; k, v, dk, dv
 * have their own bases) starts at b sb_in + h sh_in with positions ld_in apart; of o and
 * do at b sb_out + h sh_out, ld_out apart. Split [B, H, T, hd]: sb = H T hd, sh = T hd,
 * ld = hd. Packed qkv [B, T, 3, H, hd] (k, v at H hd and 2 H hd from q; o [B, T, H, hd]):
 * sb_in = 3 T H hd, sh_in = hd, ld_in = 3 H hd; sb_out = T H hd, sh_out = hd, ld_out = H hd. */
typedef struct cu_attn_geom {
    int64_t B, H, t;
    int64_t sb_in, sh_in, ld_in, sb_out, sh_out, ld_out;
} cu_attn_geom;

/* The tensor-core attention's head size (TS_CUDA_PACKED_ATTENTION_HD in plugin.h). */
#define CU_ATTN_TC_HD 64

/* The same attention on bf16 tensor cores (attention_tc.cu) for bf16 plans, split or packed:
 * head size 64, B*H <= 65535, every pointer 16-byte aligned (cu_attention_tc_ok);
 * cu_attention_tc_setup raises the kernels' shared-memory limit (once per plan; 0 or a
 * cudaError). delta: B*H*T floats of scratch. */
int cu_attention_tc_ok(int64_t hd, const void *const *ptrs, int n);
int cu_attention_tc_setup(void);
int cu_attention_tc(float *o, float *lse, const float *q, const float *k, const float *v,
                    const cu_attn_geom *g, int causal, float scale, cu_stream s);
int cu_attention_bwd_tc(float *dq, float *dk, float *dv, const float *dout, const float *q,
                        const float *k, const float *v, const float *o, const float *lse,
                        float *delta, const cu_attn_geom *g, int causal, float scale, cu_stream s);

/* batch_norm (bn_pool.cu, src/ops/batchnorm.c's arithmetic): x of n batch
 * items, c channels and s spatial elements per item, channels first [n, c, s]
 * or channels last (cl) [n, s, c]. Training: batch statistics (biased
 * variance), running statistics rm, rv updated with momentum (unbiased
 * variance); else rm, rv normalise. mean_o, rstd_o: the statistics used.
 * w, b may be NULL (no affine); relu: the fused ReLU. scratch:
 * cu_batch_norm_scratch bytes (the backward's too). */
size_t cu_batch_norm_scratch(int64_t n, int64_t c, int64_t s);
int cu_batch_norm(float *y, float *mean_o, float *rstd_o, float *rm, float *rv, const float *x,
                  const float *w, const float *b, int64_t n, int64_t c, int64_t s, int cl,
                  int training, int relu, double momentum, double eps, void *scratch, cu_stream st);
/* dx, and dw, db when not NULL; b (the bias) is read for the fused ReLU's
 * mask only (NULL without relu or affine). */
int cu_batch_norm_bwd(float *dx, float *dw, float *db, const float *dy, const float *x,
                      const float *mean, const float *rstd, const float *w, const float *b,
                      int64_t n, int64_t c, int64_t s, int cl, int relu, void *scratch,
                      cu_stream st);

/* pool / pool_bwd (src/ops/pool.c): mode 0 max, 1 avg, 2 avg counting the
 * padding, 3 adaptive avg; spatial dims right-aligned in 3 slots (unused
 * leading slots 1, stride 1, padding 0); cl: channels last. The backward
 * reads x in max mode only (the first maximum of each window again). */
typedef struct cu_pool_geo {
    int mode, cl;
    int64_t N, C;
    int64_t in[3], out[3], k[3], s[3], p[3];
} cu_pool_geo;
int cu_pool(float *y, const float *x, const cu_pool_geo *q, cu_stream s);
int cu_pool_bwd(float *dx, const float *dy, const float *x, const cu_pool_geo *q, cu_stream s);

#ifdef __cplusplus
}
#endif
#endif
