/* dnnl_matmul_pack.h — a bf16 B packed into oneDNN 2.6's brgemm layout by tessel's own loops
 * (internal to dnnl_matmul_head.c, which packs B once per run where the plan asks for it).
 *
 *     if (trans_b && ts_mm_pack_layout_ok(md_w, K, N, &Kp, &Np))  // the primitive's B layout
 *         ts_mm_pack_bt(dst, bt, K, N, Kp, Np);                    // instead of a oneDNN reorder
 *
 * Why: a forward product X W^T reads its weight transposed (W stored [N, K]). oneDNN's reorder of
 * such a B into its packed layout took 0.21-1.1 ms for W3's 0.75-8 MiB weights on one Zen 5
 * thread (the fc2 weight: 1.0 ms), most of what the packed B saves in the product (3-7 %); this
 * packer takes 0.04-0.34 ms (docs/benchmarks.md, session 26). The layout is simple: for bf16 on
 * AVX512-BF16 the brgemm matmul asks for B [K, N] as blocks of 32 K x 64 N, N blocks outermost,
 * each block 16 pairs of rows with the pair's two values adjacent (the words vdpbf16ps
 * multiplies):
 *
 *     element (k, n) at (n / 64) * Kp * 64 + (k / 2) * 128 + (n % 64) * 2 + k % 2
 *
 * with K and N padded with zeros to Kp (a multiple of 32) and Np (of 64). A B stored [N, K]
 * already holds each pair in one 32-bit word of its row, so packing is transposing 16 x 16 blocks
 * of words; it writes exactly the bytes the reorder writes (tests/unit/dnnl_matmul_pack.c).
 *
 * Not for a plain B [K, N] (the input gradients' W): interleaving its rows this way is faster
 * than the reorder alone, but in W3's step the products after it ran 1-2 % slower than after
 * oneDNN's reorder (five alternated traces), so those keep the reorder. */
#ifndef TS_DNNL_MATMUL_PACK_H
#define TS_DNNL_MATMUL_PACK_H

#include <dnnl.h>
#include <stdint.h>

/* Whether `md` (the primitive's B) is that layout for a bf16 B of K x N; sets the padded sizes. */
int ts_mm_pack_layout_ok(const dnnl_memory_desc_t *md, int64_t K, int64_t N, int64_t *Kp,
                         int64_t *Np);

/* Pack B, given as bt (bf16, stored [N, K]), into dst (Np * Kp bf16, 64-byte aligned for
 * speed), the padding zero. */
void ts_mm_pack_bt(uint16_t *dst, const uint16_t *bt, int64_t K, int64_t N, int64_t Kp, int64_t Np);

#endif
