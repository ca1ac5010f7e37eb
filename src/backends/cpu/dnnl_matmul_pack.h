/* dnnl_matmul_pack.h — a bf16 B packed into oneDNN 2.6's brgemm layout by tessel's own loops
 * (internal to dnnl_matmul_head.c, which packs B once per run where the plan asks for it).
 *
 *     if (ts_mm_pack_layout_ok(md_w, K, N, &Kp, &Np))       // the primitive's chosen B layout
 *         ts_mm_pack_b(dst, b, K, N, Kp, Np, trans_b);       // instead of a oneDNN reorder
 *
 * Why: oneDNN's reorder into that layout took 0.12-1.04 ms for W3's 0.75-2 MiB weights on one
 * Zen 5 thread (the fc2 weight transposed: 1.04 ms), which ate most of what a packed B saves in
 * the product (4-9 %: docs/benchmarks.md, session 26). The layout is simple: for bf16 on
 * AVX512-BF16 the brgemm matmul asks for B [K, N] as blocks of 32 K x 64 N, N blocks outermost,
 * each block 16 pairs of rows with the pair's two values adjacent (the words vdpbf16ps
 * multiplies):
 *
 *     element (k, n) at (n / 64) * Kp * 64 + (k / 2) * 128 + (n % 64) * 2 + k % 2
 *
 * with K and N padded with zeros to Kp (a multiple of 32) and Np (of 64). The packers write
 * exactly the bytes the reorder writes (tests/unit/dnnl_matmul_pack.c compares them), from a
 * plain B [K, N] (two rows interleaved) or a transposed one stored [N, K] (whose rows already
 * hold the pairs: 16 x 16 blocks of 32-bit words transposed). */
#ifndef TS_DNNL_MATMUL_PACK_H
#define TS_DNNL_MATMUL_PACK_H

#include <dnnl.h>
#include <stdint.h>

/* Whether `md` (the primitive's B) is that layout for a bf16 B of K x N; sets the padded sizes. */
int ts_mm_pack_layout_ok(const dnnl_memory_desc_t *md, int64_t K, int64_t N, int64_t *Kp,
                         int64_t *Np);

/* Pack b (bf16, [K, N], or stored [N, K] when trans_b) into dst (Np * Kp bf16, 64-byte aligned
 * for speed), the padding zero. */
void ts_mm_pack_b(uint16_t *dst, const uint16_t *b, int64_t K, int64_t N, int64_t Kp, int64_t Np,
                  int trans_b);

#endif
