/* Fused scaled dot-product attention, forward and backward, flash-attention
 * style on the CPU:
 *
 *     o = softmax(scale * q k^T [+ causal mask]) v,   q, k, v, o [B, H, T, hd]
 *
 * No T x T matrix is ever stored. The forward walks each block of BS
 * queries over the key blocks it can see, keeping per row the running
 * maximum m and sum l of the online softmax; the output block accumulates
 * in o and is rescaled whenever the maximum grows. It returns o and
 * lse = m + log(l) [B, H, T], the only thing the backward keeps besides
 * the inputs. The backward recomputes each score block from q, k and lse:
 *
 *     p = exp(scale * q k^T - lse)     dv += p^T do      dp = do v^T
 *     ds = scale * p * (dp - D)        dq += ds k        dk += ds^T q
 *
 * with D = rowsum(do * o). Causal: key j is visible to query i when j <= i;
 * blocks entirely above the diagonal are skipped (about half the work), and
 * the masked entries of a diagonal block get p = 0.
 *
 * The block products are small GEMMs (BS x BS x hd) computed by mm_*, a
 * register-blocked kernel over 64-byte vectors (GCC vector extensions)
 * vectorised along the output row. Score blocks are computed transposed
 * (keys x queries, from a transposed copy of the q or do block made once
 * per query block), so the softmax statistics of a query run along the
 * vector axis and no k or v block is ever transposed.
 *
 * Threads and determinism. Forward work items are (b, h, query block),
 * backward items are (b, h): an item computes its outputs alone, in a fixed
 * order (dq of a block sums over key blocks in increasing order, dk and dv
 * of a key block over query blocks in increasing order), so results do not
 * depend on the thread count or on which thread ran an item. An item in
 * flight uses one scratch slot; scratch holds min(SLOTS, items) slots and
 * the parallel loop runs at most that many threads (slot = thread number).
 * Within one CPU family the bits are fixed; the AVX-512 build contracts
 * a * b + c into FMA in the GEMM kernel and exp (as oneDNN does in its
 * GEMMs), so the generic build differs in the last bits.
 *
 * Mixed precision (attention.low = 1, set by the precision pass in bf16
 * plans; f32 tensors, q, k and v also bf16): the same blocks, order and f32
 * softmax, but every block product rounds its operands to bf16 and
 * accumulates in f32 on AVX512-BF16 (attention_low.h): the items of
 * attention_items_low.c, which call the f32 block pieces exported below
 * (attention_fused.h). The drivers below address q, k and v in bytes of
 * their dtype for them.
 *
 * The op itself (inference, gradient, cost) is in attention.c.
 *
 * A row always sees key 0 when causal, so no row is fully masked. */
#include <math.h>
#include <omp.h>
#include <string.h>
#include "kern.h"
#include "ops/attention_fused.h"

#define BS       TS_ATTN_BS /* queries and keys per block */
#define SLOTS    64         /* work items in flight at most (scratch slots) */
#define LN       16         /* interleaved partial sums or maxima of a row reduction */
#define PAR_WORK (1 << 20)  /* B*H*T*T*hd below which a call runs on one thread */

/* a * b + c contracted into FMA where the target has it (see above), in
 * the GEMM kernel and the block functions that evaluate exp. */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define FMA_OK __attribute__((optimize("fp-contract=fast")))
#else
#define FMA_OK
#endif

typedef float vf32 __attribute__((vector_size(64)));
typedef double vf64 __attribute__((vector_size(64)));
typedef int32_t vi32 __attribute__((vector_size(64))); /* shuffle masks */
typedef int64_t vi64 __attribute__((vector_size(64)));

/* ---- vectorisable exp for f32 ------------------------------------------ */

/* exp in a form the compiler vectorises (a call to libm's expf cannot be),
 * for the arguments attention has: x <= 0 up to rounding (a score minus
 * its row's maximum or lse). Cephes' range reduction and degree-5
 * polynomial as softmax.c's vexpf (within 1 ulp; the same bits where no
 * FMA is contracted), with the special cases reduced to two clamps: x < -87
 * (and -inf) gives exp(-87) ~ 1.6e-38 instead of 0 (callers write the
 * masked entries' 0 themselves), x > 88 gives exp(88); NaN stays NaN.
 * About half the instructions of vexpf, which matters here: the exps of a
 * block cost as much as one of its GEMMs. */
static inline float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline float aexpf(float x) {
    x = x < -87.0f ? -87.0f : x; /* NaN passes both clamps */
    x = x > 88.0f ? 88.0f : x;
    float nf = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = x - nf * 0.693359375f;
    r = r - nf * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    /* n in [-126, 127]: 2^n is one normal float and the product is exact. */
    return p * u2f((uint32_t)((int32_t)nf + 127) << 23);
}

/* ---- kernels ----------------------------------------------------------- */

/* Pairwise sum of LN partials in a fixed order. */
static inline double comb(const double *a) {
    double s[LN / 2];
    for (int j = 0; j < LN / 2; j++) s[j] = a[j] + a[j + LN / 2];
    for (int w = LN / 4; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) s[j] += s[j + w];
    return s[0];
}

/* mm: C[m][n] = (acc ? C[m][n] : 0) + sum_k A[m*sam + k*sak] * B[k*ldb + n]
 * for m < M, n < N, k < K. Vectorised along n (4 rows x 4 vectors of
 * registers per tile), A read as broadcast scalars with any strides, so
 * A^T costs nothing. Each C element adds its K products in increasing k
 * whatever path (tile, single vector, scalar tail) computes it. */
#define DEF_MM(T, V, SFX)                                                                          \
    static inline __attribute__((always_inline))                                                   \
    FMA_OK void mm_rows_##SFX(const int mr, int64_t N, int64_t K, const T *A, int64_t sam,         \
                              int64_t sak, const T *B, int64_t ldb, T *C, int64_t ldc, int acc) {  \
        const int vl = (int)(sizeof(V) / sizeof(T));                                               \
        const V zero = {0};                                                                        \
        int64_t n = 0;                                                                             \
        for (; n + 4 * vl <= N; n += 4 * vl) {                                                     \
            V c[4][4];                                                                             \
            for (int r = 0; r < mr; r++)                                                           \
                for (int j = 0; j < 4; j++) {                                                      \
                    c[r][j] = zero;                                                                \
                    if (acc) memcpy(&c[r][j], C + r * ldc + n + j * vl, sizeof(V));                \
                }                                                                                  \
            for (int64_t k = 0; k < K; k++) {                                                      \
                V b[4];                                                                            \
                for (int j = 0; j < 4; j++) memcpy(&b[j], B + k * ldb + n + j * vl, sizeof(V));    \
                for (int r = 0; r < mr; r++) {                                                     \
                    T a = A[r * sam + k * sak];                                                    \
                    for (int j = 0; j < 4; j++) c[r][j] += a * b[j];                               \
                }                                                                                  \
            }                                                                                      \
            for (int r = 0; r < mr; r++)                                                           \
                for (int j = 0; j < 4; j++) memcpy(C + r * ldc + n + j * vl, &c[r][j], sizeof(V)); \
        }                                                                                          \
        for (; n + vl <= N; n += vl) {                                                             \
            V c[4];                                                                                \
            for (int r = 0; r < mr; r++) {                                                         \
                c[r] = zero;                                                                       \
                if (acc) memcpy(&c[r], C + r * ldc + n, sizeof(V));                                \
            }                                                                                      \
            for (int64_t k = 0; k < K; k++) {                                                      \
                V b;                                                                               \
                memcpy(&b, B + k * ldb + n, sizeof b);                                             \
                for (int r = 0; r < mr; r++) c[r] += A[r * sam + k * sak] * b;                     \
            }                                                                                      \
            for (int r = 0; r < mr; r++) memcpy(C + r * ldc + n, &c[r], sizeof(V));                \
        }                                                                                          \
        for (; n < N; n++)                                                                         \
            for (int r = 0; r < mr; r++) {                                                         \
                T c = acc ? C[r * ldc + n] : 0;                                                    \
                for (int64_t k = 0; k < K; k++) c += A[r * sam + k * sak] * B[k * ldb + n];        \
                C[r * ldc + n] = c;                                                                \
            }                                                                                      \
    }                                                                                              \
    TS_CLONES FMA_OK static void mm_##SFX(int64_t M, int64_t N, int64_t K, const T *A,             \
                                          int64_t sam, int64_t sak, const T *B, int64_t ldb, T *C, \
                                          int64_t ldc, int acc) {                                  \
        int64_t m = 0;                                                                             \
        for (; m + 4 <= M; m += 4)                                                                 \
            mm_rows_##SFX(4, N, K, A + m * sam, sam, sak, B, ldb, C + m * ldc, ldc, acc);          \
        for (; m < M; m++)                                                                         \
            mm_rows_##SFX(1, N, K, A + m * sam, sam, sak, B, ldb, C + m * ldc, ldc, acc);          \
    }
DEF_MM(float, vf32, f32)
DEF_MM(double, vf64, f64)

/* Block kernels of one (query block, key block) pair. Scores are kept
 * transposed, s[j*BS + i] for key j and query i, so every row operation
 * (maximum, sum, exp with the row's m or lse) runs along the vector axis
 * with no horizontal reduction. Key j is visible to query i from column
 * first(j) on: 0, or with the causal mask j - diag where diag is the query
 * block's start minus the key block's start. */
static inline int64_t first(int causal, int64_t j, int64_t diag, int64_t nq) {
    if (!causal || j <= diag) return 0;
    return j - diag < nq ? j - diag : nq;
}

#define DEF_ROWS(T, SFX, EXP, LOG)                                                                 \
    /* Online softmax over one key block: s becomes p = exp(scale*s - m_new) (0 at masked keys),   \
     * m the new maxima, l and the output rows o (NULL: not yet written) rescaled by exp(m_old -   \
     * m_new). tmp: 3*BS. */                                                                       \
    TS_CLONES FMA_OK static void fwd_block_##SFX(T *s, int64_t nq, int64_t nk, T *m, T *l, T *o,   \
                                                 int64_t hd, int64_t ldo, T scale, int causal,     \
                                                 int64_t diag, T *tmp) {                           \
        T *mx = tmp, *al = tmp + BS, *rs = tmp + 2 * BS;                                           \
        for (int64_t i = 0; i < nq; i++) mx[i] = m[i], rs[i] = 0;                                  \
        for (int64_t j = 0; j < nk; j++) {                                                         \
            T *sj = s + j * BS;                                                                    \
            for (int64_t i = first(causal, j, diag, nq); i < nq; i++) {                            \
                T x = sj[i] * scale;                                                               \
                sj[i] = x;                                                                         \
                mx[i] = x > mx[i] ? x : mx[i];                                                     \
            }                                                                                      \
        }                                                                                          \
        for (int64_t i = 0; i < nq; i++)                                                           \
            al[i] = EXP(m[i] - mx[i]); /* unused at first (m = -inf) */                            \
        for (int64_t j = 0; j < nk; j++) {                                                         \
            T *sj = s + j * BS;                                                                    \
            int64_t i = 0, i0 = first(causal, j, diag, nq);                                        \
            for (; i < i0; i++) sj[i] = 0;                                                         \
            for (; i < nq; i++) {                                                                  \
                T e = EXP(sj[i] - mx[i]);                                                          \
                sj[i] = e;                                                                         \
                rs[i] += e;                                                                        \
            }                                                                                      \
        }                                                                                          \
        for (int64_t i = 0; i < nq; i++) {                                                         \
            l[i] = l[i] * al[i] + rs[i];                                                           \
            m[i] = mx[i];                                                                          \
            if (o)                                                                                 \
                for (int64_t d = 0; d < hd; d++) o[i * ldo + d] *= al[i];                          \
        }                                                                                          \
    }                                                                                              \
    /* o /= l and lse = m + log(l) once every key block is in. */                                  \
    TS_CLONES static void fwd_final_##SFX(T *o, T *lse, const T *m, const T *l, int64_t nq,        \
                                          int64_t hd, int64_t ldo) {                               \
        for (int64_t i = 0; i < nq; i++) {                                                         \
            T inv = 1 / l[i];                                                                      \
            for (int64_t d = 0; d < hd; d++) o[i * ldo + d] *= inv;                                \
            lse[i] = m[i] + LOG(l[i]);                                                             \
        }                                                                                          \
    }                                                                                              \
    /* Backward: s becomes p = exp(scale*s - lse) (0 at masked keys). */                           \
    TS_CLONES FMA_OK static void bwd_p_##SFX(T *s, int64_t nq, int64_t nk, const T *lse, T scale,  \
                                             int causal, int64_t diag) {                           \
        for (int64_t j = 0; j < nk; j++) {                                                         \
            T *sj = s + j * BS;                                                                    \
            int64_t i = 0, i0 = first(causal, j, diag, nq);                                        \
            for (; i < i0; i++) sj[i] = 0;                                                         \
            for (; i < nq; i++) sj[i] = EXP(sj[i] * scale - lse[i]);                               \
        }                                                                                          \
    }                                                                                              \
    /* dp becomes ds = scale * p * (dp - D). */                                                    \
    TS_CLONES static void bwd_ds_##SFX(T *dp, const T *p, int64_t nq, int64_t nk, const T *D,      \
                                       T scale) {                                                  \
        for (int64_t j = 0; j < nk; j++) {                                                         \
            T *r = dp + j * BS;                                                                    \
            const T *pj = p + j * BS;                                                              \
            for (int64_t i = 0; i < nq; i++) r[i] = scale * (pj[i] * (r[i] - D[i]));               \
        }                                                                                          \
    }                                                                                              \
    /* D[i] = sum_d do[i][d] * o[i][d], accumulated in double. */                                  \
    TS_CLONES static void bwd_rowdot_##SFX(T *D, const T *dout, const T *o, int64_t n, int64_t hd, \
                                           int64_t ldo) {                                          \
        for (int64_t i = 0; i < n; i++) {                                                          \
            const T *a = dout + i * ldo, *b = o + i * ldo;                                         \
            double acc[LN] = {0}, s = 0;                                                           \
            int64_t d = 0;                                                                         \
            for (; d + LN <= hd; d += LN)                                                          \
                for (int t = 0; t < LN; t++) acc[t] += (double)a[d + t] * (double)b[d + t];        \
            for (; d < hd; d++) s += (double)a[d] * (double)b[d];                                  \
            D[i] = (T)(s + comb(acc));                                                             \
        }                                                                                          \
    }

DEF_ROWS(float, f32, aexpf, logf)
DEF_ROWS(double, f64, exp, log)

/* Scratch of one forward slot (q block transposed, scores, m, l and 3
 * rows of temporaries) and one backward slot (q and do blocks transposed,
 * p, ds, D), rounded up to whole 64-byte lines. */
static size_t round64(size_t bytes) {
    return (bytes + 63) & ~(size_t)63;
}
static size_t fwd_slot_bytes(int64_t hd, size_t es) {
    return round64((size_t)(hd * BS + BS * BS + 5 * BS) * es);
}
static size_t bwd_slot_bytes(int64_t T, int64_t hd, size_t es) {
    return round64((size_t)(2 * hd * BS + 2 * BS * BS + T) * es);
}
static int64_t nblocks(int64_t T) {
    return (T + BS - 1) / BS;
}
static int64_t slots_for(int64_t items) {
    return items < SLOTS ? items : SLOTS;
}
/* Threads for a kernel call: one per slot at most, and one for a small
 * problem (work = B*H*T*T*hd), where starting a team costs more than it
 * saves. */
static int threads_for(int64_t slots, int64_t work) {
    int nt = omp_get_max_threads();
    if (work < PAR_WORK) return 1;
    return nt < slots ? nt : (int)slots;
}

#define DEF_ITEMS(T, V, VI, SFX)                                                                   \
    /* dst[d*BS + i] = src[i*lds + d] for i < n, d < hd: a block with rows along the vector axis.  \
     * Whole L x L tiles (L lanes) are transposed in registers; the edges element by element. */   \
    TS_CLONES static void transpose_##SFX(T *dst, const T *src, int64_t n, int64_t hd,             \
                                          int64_t lds) {                                           \
        enum { L = sizeof(V) / sizeof(T) };                                                        \
        int64_t nt = n / L * L, dt = hd / L * L;                                                   \
        /* Stage s (w = L/2 >> s) exchanges bit w of the row and column indices: elements (r, c)   \
         * and (r^w, c^w) whose bit w differs swap; after every bit the tile is transposed. */     \
        VI lo[4], hi[4];                                                                           \
        for (int st = 0, w = L / 2; w >= 1; st++, w /= 2)                                          \
            for (int c = 0; c < L; c++) {                                                          \
                lo[st][c] = c & w ? L + c - w : c;                                                 \
                hi[st][c] = c & w ? L + c : c + w;                                                 \
            }                                                                                      \
        for (int64_t i0 = 0; i0 < nt; i0 += L)                                                     \
            for (int64_t d0 = 0; d0 < dt; d0 += L) {                                               \
                V r[L];                                                                            \
                _Pragma("GCC unroll 16") for (int i = 0; i < L; i++)                               \
                    memcpy(&r[i], src + (i0 + i) * lds + d0, sizeof(V));                           \
                _Pragma("GCC unroll 4") for (int st = 0, w = L / 2; w >= 1; st++, w /= 2) {        \
                    _Pragma("GCC unroll 16") for (int i = 0; i < L; i++) if (!(i & w)) {           \
                        V a = r[i], b = r[i + w];                                                  \
                        r[i] = __builtin_shuffle(a, b, lo[st]);                                    \
                        r[i + w] = __builtin_shuffle(a, b, hi[st]);                                \
                    }                                                                              \
                }                                                                                  \
                _Pragma("GCC unroll 16") for (int i = 0; i < L; i++)                               \
                    memcpy(dst + (d0 + i) * BS + i0, &r[i], sizeof(V));                            \
            }                                                                                      \
        for (int64_t d = 0; d < hd; d++)                                                           \
            for (int64_t i = d < dt ? nt : 0; i < n; i++) dst[d * BS + i] = src[i * lds + d];      \
    }                                                                                              \
    /* The query blocks from q0 to q1 of one (b, h): q, k, v, o point at the head, whose rows      \
     * lie g->ld_in (q, k, v) and g->ld_out (o) elements apart. */                                 \
    static void fwd_item_##SFX(const void *qv, const void *kv, const void *vv, T *o, T *lse,       \
                               const ts_attn_geom *g, int64_t q0, int64_t q1, T scale, int causal, \
                               T *ws) {                                                            \
        const T *q = qv, *k = kv, *v = vv;                                                         \
        int64_t hd = g->hd, li = g->ld_in, lo = g->ld_out;                                         \
        T *qt = ws, *s = qt + hd * BS, *m = s + BS * BS, *l = m + BS, *tmp = l + BS;               \
        for (; q0 < q1; q0 += BS) {                                                                \
            int64_t nq = q1 - q0 < BS ? q1 - q0 : BS, kend = causal ? q0 + nq : g->seq;            \
            T *ob = o + q0 * lo;                                                                   \
            for (int64_t i = 0; i < nq; i++) m[i] = (T)-INFINITY, l[i] = 0;                        \
            transpose_##SFX(qt, q + q0 * li, nq, hd, li);                                          \
            for (int64_t k0 = 0; k0 < kend; k0 += BS) {                                            \
                int64_t nk = kend - k0 < BS ? kend - k0 : BS;                                      \
                mm_##SFX(nk, nq, hd, k + k0 * li, li, 1, qt, BS, s, BS, 0); /* s^T = k q^T */      \
                /* The first key block writes o (no rescale, no accumulation). */                  \
                fwd_block_##SFX(s, nq, nk, m, l, k0 ? ob : NULL, hd, lo, scale, causal, q0 - k0,   \
                                tmp);                                                              \
                mm_##SFX(nq, hd, nk, s, 1, BS, v + k0 * li, li, ob, lo, k0 > 0); /* o += p v */    \
            }                                                                                      \
            fwd_final_##SFX(ob, lse + q0, m, l, nq, hd, lo);                                       \
        }                                                                                          \
    }                                                                                              \
    typedef void fwd_item_fn_##SFX(const void *, const void *, const void *, T *, T *,             \
                                   const ts_attn_geom *, int64_t, int64_t, T, int, T *);           \
    /* item: fwd_item_##SFX, or for f32 fwd_item_low; slot: its scratch bytes; heads: an item is   \
     * a whole (b, h) where there are enough of them for the threads (the bf16 item packs the      \
     * head's k and v once), else one query block of one. */                                       \
    static ts_status fwd_##SFX(const ts_kargs *k, fwd_item_fn_##SFX *item, size_t slot,            \
                               int heads) {                                                        \
        ts_attn_geom g;                                                                            \
        ts_attn_geom_of_tensor(&k->in[0], &g);                                                     \
        int64_t BH = g.B * g.H, T_ = g.seq, hd = g.hd;                                             \
        int64_t nqb = nblocks(T_), items = BH * nqb, slots = slots_for(items);                     \
        if ((size_t)slots * slot > k->scratch_bytes)                                               \
            return ts_fail(TS_ERR_INTERNAL, "attention '%s': scratch too small", k->label);        \
        /* packed: k and v are the next two of the three [H, hd] groups of a position's row; es:   \
         * their element's bytes (bf16 q, k, v for the bf16 items: attention_items_low.c) */       \
        const int64_t es = (int64_t)ts_dtype_size(k->in[0].dtype);                                 \
        const char *q = k->in[0].data;                                                             \
        const char *kk = g.packed ? q + g.H * hd * es : k->in[1].data;                             \
        const char *v = g.packed ? q + 2 * g.H * hd * es : k->in[2].data;                          \
        T *o = k->out[0].data, *lse = k->out[1].data, scale = (T)k->a->attention.scale;            \
        int causal = k->a->attention.causal != 0;                                                  \
        char *ws = k->scratch;                                                                     \
        int nt = threads_for(slots, BH * T_ * T_ * hd);                                            \
        if (heads && BH >= 4 * (int64_t)nt) items = BH, nqb = 1;                                   \
        _Pragma("omp parallel num_threads(nt) if (nt > 1)") {                                      \
            T *w = (T *)(ws + (size_t)omp_get_thread_num() * slot);                                \
            /* The last query blocks see the most keys: hand them out first. */                    \
            _Pragma("omp for schedule(dynamic, 1)") for (int64_t it = 0; it < items; it++) {       \
                int64_t bh = it % BH, qb = nqb - 1 - it / BH, hi, ho;                              \
                int64_t q0 = items == BH ? 0 : qb * BS, q1 = items == BH ? T_ : q0 + BS;           \
                ts_attn_head_offsets(&g, bh, &hi, &ho);                                            \
                ts_attn_geom gi = g; /* whole heads: the next head's q, k and v rows */            \
                if (items == BH && bh + 1 < BH) {                                                  \
                    int64_t nh, no;                                                                \
                    ts_attn_head_offsets(&g, bh + 1, &nh, &no);                                    \
                    const char *srcs[3] = {q, kk, v};                                              \
                    for (int j = 0; j < 3; j++)                                                    \
                        ts_attn_prefetch_add(&gi, srcs[j] + nh * es, g.ld_in * es, hd * es);       \
                }                                                                                  \
                item(q + hi * es, kk + hi * es, v + hi * es, o + ho, lse + bh * T_, &gi, q0,       \
                     q1 < T_ ? q1 : T_, scale, causal, w);                                         \
            }                                                                                      \
        }                                                                                          \
        return TS_OK;                                                                              \
    }                                                                                              \
    /* One (b, h): every pointer at the head (row strides in g). Query blocks outside, key blocks  \
     * inside: dq of a block sums over key blocks in order, dk and dv of a key block over query    \
     * blocks in order. */                                                                         \
    static void bwd_item_##SFX(const T *dout, const void *qv, const void *kv, const void *vv,      \
                               const T *o, const T *lse, T *dq, T *dk, T *dv,                      \
                               const ts_attn_geom *g, T scale, int causal, T *ws) {                \
        const T *q = qv, *k = kv, *v = vv;                                                         \
        /* lg: the gradients' rows, laid out as their inputs' */                                   \
        int64_t T_ = g->seq, hd = g->hd, li = g->ld_in, lo = g->ld_out, lg = g->ld_grad;           \
        T *qt = ws, *dot = qt + hd * BS, *p = dot + hd * BS, *ds = p + BS * BS, *D = ds + BS * BS; \
        bwd_rowdot_##SFX(D, dout, o, T_, hd, lo);                                                  \
        for (int64_t q0 = 0; q0 < T_; q0 += BS) {                                                  \
            int64_t nq = T_ - q0 < BS ? T_ - q0 : BS, kend = causal ? q0 + nq : T_;                \
            const T *qb = q + q0 * li, *dob = dout + q0 * lo;                                      \
            T *dqb = dq + q0 * lg;                                                                 \
            transpose_##SFX(qt, qb, nq, hd, li);                                                   \
            transpose_##SFX(dot, dob, nq, hd, lo);                                                 \
            for (int64_t k0 = 0; k0 < kend; k0 += BS) {                                            \
                int64_t nk = kend - k0 < BS ? kend - k0 : BS;                                      \
                const T *kb = k + k0 * li, *vb = v + k0 * li;                                      \
                T *dkb = dk + k0 * lg, *dvb = dv + k0 * lg;                                        \
                mm_##SFX(nk, nq, hd, kb, li, 1, qt, BS, p, BS, 0); /* s^T = k q^T */               \
                bwd_p_##SFX(p, nq, nk, lse + q0, scale, causal, q0 - k0);                          \
                /* The first query block to see a key block writes its dk, dv; the first key       \
                 * block writes dq (so no output needs zeroing). */                                \
                int first_q = q0 == (causal ? k0 : 0);                                             \
                mm_##SFX(nk, hd, nq, p, BS, 1, dob, lo, dvb, lg, !first_q); /* dv += p^T do */     \
                mm_##SFX(nk, nq, hd, vb, li, 1, dot, BS, ds, BS, 0);        /* dp^T = v do^T */    \
                bwd_ds_##SFX(ds, p, nq, nk, D + q0, scale);                                        \
                mm_##SFX(nq, hd, nk, ds, 1, BS, kb, li, dqb, lg, k0 > 0);   /* dq += ds k */       \
                mm_##SFX(nk, hd, nq, ds, BS, 1, qb, li, dkb, lg, !first_q); /* dk += ds^T q */     \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    typedef void bwd_item_fn_##SFX(const T *, const void *, const void *, const void *, const T *, \
                                   const T *, T *, T *, T *, const ts_attn_geom *, T, int, T *);   \
    static ts_status bwd_##SFX(const ts_kargs *k, bwd_item_fn_##SFX *item, size_t slot) {          \
        ts_attn_geom g;                                                                            \
        ts_attn_geom_of_tensor(&k->in[1], &g);                                                     \
        int64_t BH = g.B * g.H, T_ = g.seq, hd = g.hd;                                             \
        int64_t slots = slots_for(BH);                                                             \
        if ((size_t)slots * slot > k->scratch_bytes)                                               \
            return ts_fail(TS_ERR_INTERNAL, "attention_bwd '%s': scratch too small", k->label);    \
        /* split: (do, q, k, v, o, lse) -> (dq, dk, dv); packed: (do, qkv, o, lse) -> (dqkv) */    \
        int64_t gk = g.H * hd, es = (int64_t)ts_dtype_size(k->in[1].dtype); /* q, k, v's */        \
        const T *dout = k->in[0].data;                                                             \
        const char *q = k->in[1].data;                                                             \
        const char *kk = g.packed ? q + gk * es : k->in[2].data,                                   \
                   *v = g.packed ? q + 2 * gk * es : k->in[3].data;                                \
        const T *o = k->in[g.packed ? 2 : 4].data, *lse = k->in[g.packed ? 3 : 5].data;            \
        T *dq = k->out[0].data;                                                                    \
        T *dk = g.packed ? dq + gk : k->out[1].data,                                               \
          *dv = g.packed ? dq + 2 * gk : k->out[2].data;                                           \
        T scale = (T)k->a->attention.scale;                                                        \
        int causal = k->a->attention.causal != 0;                                                  \
        char *ws = k->scratch;                                                                     \
        int nt = threads_for(slots, BH * T_ * T_ * hd);                                            \
        _Pragma("omp parallel num_threads(nt) if (nt > 1)") {                                      \
            T *w = (T *)(ws + (size_t)omp_get_thread_num() * slot);                                \
            _Pragma("omp for schedule(dynamic, 1)") for (int64_t bh = 0; bh < BH; bh++) {          \
                int64_t hi, ho;                                                                    \
                ts_attn_head_offsets(&g, bh, &hi, &ho);                                            \
                item(dout + ho, q + hi * es, kk + hi * es, v + hi * es, o + ho, lse + bh * T_,     \
                     dq + hi, dk + hi, dv + hi, &g, scale, causal, w);                             \
            }                                                                                      \
        }                                                                                          \
        return TS_OK;                                                                              \
    }

DEF_ITEMS(float, vf32, vi32, f32)
DEF_ITEMS(double, vf64, vi64, f64)

/* ---- the f32 pieces the bf16 items share (attention_fused.h) ----------- */

int64_t ts_attn_slots_for(int64_t items) {
    return slots_for(items);
}
int ts_attn_threads_for(int64_t slots, int64_t work) {
    return threads_for(slots, work);
}
size_t ts_attn_round64(size_t bytes) {
    return round64(bytes);
}
size_t ts_attn_fwd_slot_bytes(int64_t hd, size_t es) {
    return fwd_slot_bytes(hd, es);
}
size_t ts_attn_bwd_slot_bytes(int64_t T, int64_t hd, size_t es) {
    return bwd_slot_bytes(T, hd, es);
}
void ts_attn_fwd_block_f32(float *s, int64_t nq, int64_t nk, float *m, float *l, float *o,
                           int64_t hd, int64_t ldo, float scale, int causal, int64_t diag,
                           float *tmp) {
    fwd_block_f32(s, nq, nk, m, l, o, hd, ldo, scale, causal, diag, tmp);
}
void ts_attn_fwd_final_f32(float *o, float *lse, const float *m, const float *l, int64_t nq,
                           int64_t hd, int64_t ldo) {
    fwd_final_f32(o, lse, m, l, nq, hd, ldo);
}
void ts_attn_bwd_p_f32(float *s, int64_t nq, int64_t nk, const float *lse, float scale, int causal,
                       int64_t diag) {
    bwd_p_f32(s, nq, nk, lse, scale, causal, diag);
}
void ts_attn_bwd_ds_f32(float *dp, const float *p, int64_t nq, int64_t nk, const float *D,
                        float scale) {
    bwd_ds_f32(dp, p, nq, nk, D, scale);
}
void ts_attn_bwd_rowdot_f32(float *D, const float *dout, const float *o, int64_t n, int64_t hd,
                            int64_t ldo) {
    bwd_rowdot_f32(D, dout, o, n, hd, ldo);
}

/* ---- the geometry of the two forms ------------------------------------------------------- */

void ts_attn_geom_of(const ts_type *q, ts_attn_geom *g) {
    memset(g, 0, sizeof *g); /* no prefetch streams */
    g->packed = q->rank == 5;
    g->in_bf16 = q->dtype == TS_BF16;
    if (g->packed) {
        g->B = q->dims[0], g->seq = q->dims[1], g->H = q->dims[3], g->hd = q->dims[4];
        g->ld_in = 3 * g->H * g->hd;
        g->ld_out = g->H * g->hd;
    } else {
        g->B = q->dims[0], g->H = q->dims[1], g->seq = q->dims[2], g->hd = q->dims[3];
        g->ld_in = g->ld_out = g->hd;
    }
    g->ld_grad = g->ld_in;
}

void ts_attn_geom_of_tensor(const ts_tensor *q, ts_attn_geom *g) {
    ts_type t = {.dtype = q->dtype, .rank = q->rank};
    memcpy(t.dims, q->dims, sizeof t.dims);
    ts_attn_geom_of(&t, g);
}

void ts_attn_head_offsets(const ts_attn_geom *g, int64_t bh, int64_t *in, int64_t *out) {
    if (!g->packed) {
        *in = *out = bh * g->seq * g->hd;
        return;
    }
    int64_t b = bh / g->H, h = bh % g->H;
    *in = b * g->seq * g->ld_in + h * g->hd;
    *out = b * g->seq * g->ld_out + h * g->hd;
}

void ts_attn_prefetch_add(ts_attn_geom *g, const void *p, int64_t ld_bytes, int64_t row_bytes) {
    if (g->pf_n >= (int)(sizeof g->pf / sizeof g->pf[0])) return;
    g->pf[g->pf_n] = p, g->pf_ld[g->pf_n] = ld_bytes, g->pf_bytes[g->pf_n] = row_bytes;
    g->pf_n++;
}

void ts_attn_prefetch_part(const ts_attn_geom *g, int64_t part, int64_t parts) {
    const int64_t r0 = g->seq * part / parts, r1 = g->seq * (part + 1) / parts;
    for (int j = 0; j < g->pf_n; j++)
        for (int64_t r = r0; r < r1; r++)
            for (int64_t b = 0; b < g->pf_bytes[j]; b += 64)
                __builtin_prefetch(g->pf[j] + r * g->pf_ld[j] + b, 0, 3);
}

/* ---- the kernels of attention and attention_bwd --------------------------- */

ts_status ts_attn_fwd(const ts_kargs *k) {
    ts_attn_geom g;
    ts_attn_geom_of_tensor(&k->in[0], &g);
    const ts_dtype dt = k->in[0].dtype;
    if (k->a->attention.low && (dt == TS_F32 || dt == TS_BF16)) /* bf16: q, k, v only */
        return fwd_f32(k, ts_attn_fwd_item_low, ts_attn_fwd_low_slot_bytes(g.seq, g.hd), 1);
    switch (dt) {
    case TS_F32: return fwd_f32(k, fwd_item_f32, fwd_slot_bytes(g.hd, sizeof(float)), 0);
    case TS_F64: return fwd_f64(k, fwd_item_f64, fwd_slot_bytes(g.hd, sizeof(double)), 0);
    default: return ts_kernel_bad_dtype(k, "attention", dt);
    }
}

ts_status ts_attn_bwd(const ts_kargs *k) {
    ts_attn_geom g;
    ts_attn_geom_of_tensor(&k->in[1], &g);
    const ts_dtype dt = k->in[1].dtype;
    if (k->a->attention.low && (dt == TS_F32 || dt == TS_BF16)) { /* bf16: q, k, v only */
        if (k->a->attention.out_low) return ts_attn_bwd_low_out(k);
        return bwd_f32(k, ts_attn_bwd_item_low, ts_attn_bwd_low_slot_bytes(g.seq, g.hd));
    }
    switch (dt) {
    case TS_F32: return bwd_f32(k, bwd_item_f32, bwd_slot_bytes(g.seq, g.hd, sizeof(float)));
    case TS_F64: return bwd_f64(k, bwd_item_f64, bwd_slot_bytes(g.seq, g.hd, sizeof(double)));
    default: return ts_kernel_bad_dtype(k, "attention_bwd", dt);
    }
}

size_t ts_attn_fwd_scratch(const ts_type *q, int low) {
    ts_attn_geom g;
    ts_attn_geom_of(q, &g);
    int64_t items = g.B * g.H * nblocks(g.seq);
    size_t slot = low ? ts_attn_fwd_low_slot_bytes(g.seq, g.hd)
                      : fwd_slot_bytes(g.hd, ts_dtype_size(q->dtype));
    return (size_t)slots_for(items) * slot;
}

size_t ts_attn_bwd_scratch(const ts_type *q, int low) {
    ts_attn_geom g;
    ts_attn_geom_of(q, &g);
    size_t slot = low ? ts_attn_bwd_low_slot_bytes(g.seq, g.hd)
                      : bwd_slot_bytes(g.seq, g.hd, ts_dtype_size(q->dtype));
    return (size_t)slots_for(g.B * g.H) * slot;
}
