/* fused.h — the ops the fusion pass builds (internal; see fused.c).
 *
 * fused_eltwise (TS_OP_FUSED_ELTWISE): inputs (x0, .., x{m-1}, program),
 * attrs a.fused (core/attrs.h): n_instr instructions, n_ext = m. The
 * program is an i64 constant of TS_FUSE_REC words per instruction, written
 * with ts_fuse_encode:
 * registers 0..m-1 hold the inputs (broadcast to the output's shape),
 * register m+t the result of instruction t; the last instruction's result
 * is the output.
 *
 *     int64_t prog[2 * TS_FUSE_REC];
 *     ts_fuse_encode(prog, TS_OP_ADD, (int[]){0, 1}, 2, &add_attrs);      // r2 = x0 + x1
 *     ts_fuse_encode(prog + TS_FUSE_REC, TS_OP_RELU, (int[]){2}, 1, &a);  // r3 = relu(r2)
 *
 * matmul_epi (TS_OP_MATMUL_EPI): inputs (a, b, operands of the add
 * post-ops in order), attrs a.matmul_epi (core/attrs.h): trans_a, trans_b
 * and low as matmul (low: bf16/f16 a and b, set by the precision pass after
 * fusion; the output and post-ops stay f32), n_post post-ops, post[p] = TS_EPI_ADD (operand: a bias
 * row [N] or the output's shape). There is no relu post-op: oneDNN's maps NaN to 0 where the relu
 * op keeps it (see passes/fuse.c).
 */
#ifndef TS_FUSED_H
#define TS_FUSED_H

#include "op.h"

#define TS_FUSE_REC 12 /* words per instruction: op, 3 sources, attributes */
/* An instruction's attributes: the first TS_FUSE_ATTR_WORDS words of its
 * ts_attrs, which hold every fusable op's (a.unary, a.unary_bwd, a.maxmin). */
#define TS_FUSE_ATTR_WORDS 8
#define TS_FUSE_MAX_INSTR  16  /* instructions per fused group */
#define TS_FUSE_MAX_EXT    8   /* external inputs per fused group */
#define TS_FUSE_TILE       512 /* elements per tile: every register of a tile stays in L1 */

enum { TS_EPI_MAX = TS_ATTR_EPI_MAX }; /* TS_EPI_ADD: core/attrs.h */

_Static_assert(4 + TS_FUSE_ATTR_WORDS == TS_FUSE_REC, "an instruction record is 12 words");
_Static_assert(sizeof(ts_unary_bwd_attrs) <= TS_FUSE_ATTR_WORDS * 8 &&
                   sizeof(ts_unary_attrs) <= TS_FUSE_ATTR_WORDS * 8 &&
                   sizeof(ts_maxmin_attrs) <= TS_FUSE_ATTR_WORDS * 8,
               "a fusable op's attributes fit an instruction record");

/* 1 if the op can be an instruction of fused_eltwise. */
int ts_fuse_op_ok(int op);
/* Write one instruction record (src: n_src register numbers). */
void ts_fuse_encode(int64_t *rec, int op, const int *src, int n_src, const ts_attrs *a);
/* 1 if x can be an add post-op operand of a matmul_epi with output `out`. */
int ts_mm_epi_operand_ok(const ts_type *x, const ts_type *out);
/* Apply a matmul_epi node's post-ops in place on k->out[0] (after the GEMM). */
ts_status ts_mm_epi_apply(const ts_kargs *k);

#endif
