/* eltwise.h — the chunk functions of the elementwise ops, for kernels that
 * run several of them over one tile (the fused elementwise op, GEMM
 * epilogues) (internal).
 *
 * Each function is the very code the op's own kernel runs on its chunks, so
 * a fused kernel that feeds it the same element values produces the same
 * bits. All are f32; o may equal an input (in place).
 *
 *     ts_unary_chunk_fn f = ts_unary_chunk_f32(TS_OP_GELU, &attrs);
 *     if (f) f(dst, src, n, &attrs);                  // dst[i] = gelu(src[i])
 *     ts_binary_row_fn add = ts_binary_row_f32(TS_OP_ADD);
 *     add(dst, a, bias, n, 1, 0);                     // dst[i] = a[i] + bias[0]
 */
#ifndef TS_ELTWISE_H
#define TS_ELTWISE_H

#include "op.h"

/* o[i] = f(x[i]) with the op's attributes a. */
typedef void (*ts_unary_chunk_fn)(void *o, const void *x, int64_t n, const ts_attrs *a);
/* o[i] = f(dy[i], s[i]) for unary_bwd; a: the forward attributes (see below). */
typedef void (*ts_unary_bwd_chunk_fn)(void *o, const void *dy, const void *s, int64_t n,
                                      const ts_attrs *a);
/* o[i] = f(a[i*sa], b[i*sb]), sa and sb in {0, 1}. */
typedef void (*ts_binary_row_fn)(void *o, const void *a, const void *b, int64_t n, int64_t sa,
                                 int64_t sb);
/* o[i] = f(c[i*sc], a[i*sa], b[i*sb]) (where: c is u8; maxmin_bwd: c is dy). */
typedef void (*ts_ternary_row_fn)(void *o, const void *c, const void *a, const void *b, int64_t n,
                                  int64_t sc, int64_t sa, int64_t sb);

/* NULL for an op that is not a unary elementwise op with an f32 chunk
 * function (cast included: it changes dtype). */
ts_unary_chunk_fn ts_unary_chunk_f32(int op, const ts_attrs *a);
/* For a unary_bwd node's attributes a; *fwd receives the attributes to pass
 * to the function. NULL if the node's forward op has no rule. */
ts_unary_bwd_chunk_fn ts_unary_bwd_chunk_f32(const ts_attrs *a, ts_attrs *fwd);
/* add, sub, mul, div, maximum, minimum; NULL otherwise. */
ts_binary_row_fn ts_binary_row_f32(int op);
/* where, maxmin_bwd (attributes select max/min and the side); NULL otherwise. */
ts_ternary_row_fn ts_ternary_row_f32(int op, const ts_attrs *a);

#endif
