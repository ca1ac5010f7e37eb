/* dnnl_matmul_pack.c — bf16 B into oneDNN 2.6's brgemm layout (dnnl_matmul_pack.h). */
#include "backends/cpu/dnnl_matmul_pack.h"

#include <string.h>

enum { KB = 32, NB = 64 }; /* a block: 32 rows of K (16 pairs) by 64 columns of N */

int ts_mm_pack_layout_ok(const dnnl_memory_desc_t *md, int64_t K, int64_t N, int64_t *Kp,
                         int64_t *Np) {
    if (!md || md->ndims != 2 || md->data_type != dnnl_bf16 || md->format_kind != dnnl_blocked ||
        md->dims[0] != K || md->dims[1] != N || md->extra.flags != 0 || md->offset0 != 0)
        return 0;
    const dnnl_blocking_desc_t *b = &md->format_desc.blocking;
    const int64_t kp = md->padded_dims[0], np = md->padded_dims[1];
    if (b->inner_nblks != 3 || b->inner_blks[0] != 16 || b->inner_idxs[0] != 0 ||
        b->inner_blks[1] != NB || b->inner_idxs[1] != 1 || b->inner_blks[2] != 2 ||
        b->inner_idxs[2] != 0 || kp % KB != 0 || np % NB != 0 || kp < K || np < N ||
        b->strides[0] != KB * NB || b->strides[1] != kp * NB)
        return 0;
    *Kp = kp, *Np = np;
    return 1;
}

/* Element (k, n)'s offset in the packed layout. */
static inline int64_t packed_at(int64_t k, int64_t n, int64_t Kp) {
    return n / NB * Kp * NB + k / 2 * (2 * NB) + n % NB * 2 + k % 2;
}

/* Any shape, element by element (odd K, and CPUs without AVX-512). */
static void pack_generic(uint16_t *dst, const uint16_t *bt, int64_t K, int64_t N, int64_t Kp,
                         int64_t Np) {
    memset(dst, 0, (size_t)(Kp * Np) * sizeof *dst);
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) dst[packed_at(k, n, Kp)] = bt[n * K + k];
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define PACK_TARGET __attribute__((target("avx512f")))

static inline __mmask16 first16(int64_t n) {
    return n <= 0 ? (__mmask16)0 : n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}

/* r[i][j] -> r[j][i] for 16 x 16 32-bit words: pairs of rows interleaved (epi32), then pairs of
 * pairs (epi64), which leaves u[4i + c]'s 128-bit lane L holding column 4L + c of rows 4i..4i+3;
 * two rounds of lane shuffles gather each column's four lanes. */
static inline __attribute__((always_inline)) PACK_TARGET void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int c = 0; c < 4; c++) {
        const __m512i v01 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44),
                      w01 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44),
                      v23 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee),
                      w23 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
        r[c] = _mm512_shuffle_i32x4(v01, w01, 0x88);
        r[4 + c] = _mm512_shuffle_i32x4(v01, w01, 0xdd);
        r[8 + c] = _mm512_shuffle_i32x4(v23, w23, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(v23, w23, 0xdd);
    }
}

/* B stored [N, K], K even: row n's word p is element (2p, n) and (2p + 1, n) already paired,
 * so each panel is its 64 rows' words transposed, 16 x 16 at a time. */
PACK_TARGET static void pack_trans(uint16_t *dst, const uint16_t *bt, int64_t K, int64_t N,
                                   int64_t Kp, int64_t Np) {
    const int64_t KP = K / 2, KPp = Kp / 2;
    uint32_t *d = (uint32_t *)dst;
    for (int64_t q = 0; q < Np / NB; q++)
        for (int64_t p0 = 0; p0 < KPp; p0 += 16) {
            const __mmask16 m = first16(KP - p0);
            for (int64_t j0 = 0; j0 < NB; j0 += 16) {
                __m512i r[16];
                for (int i = 0; i < 16; i++) {
                    const int64_t n = q * NB + j0 + i;
                    r[i] = n < N ? _mm512_maskz_loadu_epi32(m, (const uint32_t *)(bt + n * K) + p0)
                                 : _mm512_setzero_si512();
                }
                transpose16(r);
                for (int i = 0; i < 16; i++)
                    _mm512_store_si512(d + q * KPp * NB + (p0 + i) * NB + j0, r[i]);
            }
        }
}

void ts_mm_pack_bt(uint16_t *dst, const uint16_t *bt, int64_t K, int64_t N, int64_t Kp,
                   int64_t Np) {
    if (!__builtin_cpu_supports("avx512f") || ((uintptr_t)dst & 63) != 0 || K % 2 != 0) {
        pack_generic(dst, bt, K, N, Kp, Np);
        return;
    }
    pack_trans(dst, bt, K, N, Kp, Np);
}
#else
void ts_mm_pack_bt(uint16_t *dst, const uint16_t *bt, int64_t K, int64_t N, int64_t Kp,
                   int64_t Np) {
    pack_generic(dst, bt, K, N, Kp, Np);
}
#endif
