/* The arithmetic of gradient compression: see compress.h. */
#include "dist/compress.h"
#include <math.h>
#include <string.h>
#include "core/fp8.h"
#include "core/half.h"
#include "tessel/compile.h"

int ts_topk_value_bytes(int values) {
    return values == TS_CVAL_F32 ? 4 : values == TS_CVAL_BF16 ? 2 : 1;
}

double ts_topk_ratio_at(double ratio, int64_t warmup, int64_t step) {
    const double start = 0.25;
    if (warmup <= 0 || step > warmup || ratio >= start) return ratio;
    if (step < 1) step = 1;
    /* start * (ratio / start)^(step / warmup): 0.25 falling to ratio at step == warmup */
    double r = start * pow(ratio / start, (double)step / (double)warmup);
    return r > ratio ? r : ratio;
}

int64_t ts_topk_k(int64_t n, double share) {
    double k = ceil(share * (double)n);
    if (k < 1) k = 1;
    if (k > (double)n) k = (double)n;
    return (int64_t)k;
}

size_t ts_topk_payload_bytes(int64_t k, int values) {
    size_t b = TS_TOPK_HEADER + (size_t)k * (4 + (size_t)ts_topk_value_bytes(values));
    return (b + 3) & ~(size_t)3;
}

void ts_topk_select(const float *x, int64_t n, int64_t k, uint32_t *hist, uint32_t *idx) {
    uint32_t *h1 = hist, *h2 = hist + TS_TOPK_HIST;
    memset(h1, 0, sizeof(uint32_t) * TS_TOPK_HIST);
    memset(h2, 0, sizeof(uint32_t) * TS_TOPK_HIST);
    if (k <= 0 || n <= 0) return;
    if (k > n) k = n;
    for (int64_t i = 0; i < n; i++) h1[ts_topk_key(x[i]) >> 16]++;
    /* The top 16 bits of the k-th largest key: h. */
    int64_t cum = 0, gt = 0;
    int h = TS_TOPK_HIST - 1;
    for (; h > 0; h--) {
        if (cum + h1[h] >= k) break;
        cum += h1[h];
    }
    gt = cum; /* keys with top bits above h */
    for (int64_t i = 0; i < n; i++) {
        uint32_t key = ts_topk_key(x[i]);
        if ((int)(key >> 16) == h) h2[key & 0xffffu]++;
    }
    int l = TS_TOPK_HIST - 1;
    cum = gt;
    for (; l > 0; l--) {
        if (cum + h2[l] >= k) break;
        cum += h2[l];
    }
    const uint32_t thr = ((uint32_t)h << 16) | (uint32_t)l;
    int64_t eq_take = k - cum, m = 0; /* keys above thr: cum; of those equal, the first eq_take */
    for (int64_t i = 0; i < n && m < k; i++) {
        uint32_t key = ts_topk_key(x[i]);
        if (key > thr || (key == thr && eq_take-- > 0)) idx[m++] = (uint32_t)i;
    }
}

/* The power-of-two scale that brings the largest |v| into the format's
 * range (1 for bf16 and f32, and when nothing finite is sent). */
static float value_scale(const float *acc, const uint32_t *idx, int64_t k, int values) {
    if (values != TS_CVAL_E4M3 && values != TS_CVAL_E5M2) return 1.0f;
    double m = 0;
    for (int64_t j = 0; j < k; j++) {
        double a = fabs((double)acc[idx[j]]);
        if (isfinite(a) && a > m) m = a;
    }
    if (m == 0) return 1.0f;
    int e;
    double f = frexp(m / (values == TS_CVAL_E4M3 ? 448.0 : 57344.0), &e); /* f * 2^e */
    if (f == 0.5) e--;      /* m / max <= 2^e, the smallest such power */
    if (e < -126) e = -126; /* a normal f32 */
    return (float)ldexp(1.0, e);
}

static inline float dec_value(const unsigned char *vals, int values, int64_t j, float scale) {
    switch (values) {
    case TS_CVAL_E4M3: return ts_fp8_dec_e4m3(vals[j]) * scale;
    case TS_CVAL_E5M2: return ts_fp8_dec_e5m2(vals[j]) * scale;
    case TS_CVAL_BF16: {
        uint16_t b;
        memcpy(&b, vals + 2 * j, 2);
        return ts_bf16_to_f32(b);
    }
    default: {
        float f;
        memcpy(&f, vals + 4 * j, 4);
        return f;
    }
    }
}

double ts_topk_encode(float *acc, const uint32_t *idx, int64_t k, int values, void *payload) {
    unsigned char *p = payload;
    const float scale = value_scale(acc, idx, k, values);
    const uint32_t k32 = (uint32_t)k;
    memcpy(p, &scale, 4);
    memcpy(p + 4, &k32, 4);
    memcpy(p + TS_TOPK_HEADER, idx, sizeof(uint32_t) * (size_t)k);
    unsigned char *vals = p + TS_TOPK_HEADER + 4 * (size_t)k;
    double sent = 0;
    for (int64_t j = 0; j < k; j++) {
        float v = acc[idx[j]];
        switch (values) {
        case TS_CVAL_E4M3: vals[j] = ts_fp8_enc_e4m3(v / scale, 1); break;
        case TS_CVAL_E5M2: vals[j] = ts_fp8_enc_e5m2(v / scale, 1); break;
        case TS_CVAL_BF16: {
            uint16_t b = ts_f32_to_bf16(v);
            memcpy(vals + 2 * j, &b, 2);
            break;
        }
        default: memcpy(vals + 4 * j, &v, 4); break;
        }
        float q = dec_value(vals, values, j, scale);
        acc[idx[j]] = v - q; /* exact: q is 0 or within a factor of 2 of v */
        sent += (double)q * (double)q;
    }
    size_t used = TS_TOPK_HEADER + (size_t)k * (4 + (size_t)ts_topk_value_bytes(values));
    size_t total = ts_topk_payload_bytes(k, values);
    memset(p + used, 0, total - used);
    return sent;
}

int64_t ts_topk_payload_k(const void *payload) {
    uint32_t k;
    memcpy(&k, (const unsigned char *)payload + 4, 4);
    return (int64_t)k;
}

void ts_topk_encode_skipped(int64_t k, int values, void *payload) {
    unsigned char *p = payload;
    const float scale = NAN;
    const uint32_t k32 = (uint32_t)k;
    memcpy(p, &scale, 4);
    memcpy(p + 4, &k32, 4);
    for (uint32_t j = 0; j < k32; j++) memcpy(p + TS_TOPK_HEADER + 4 * (size_t)j, &j, 4);
    memset(p + TS_TOPK_HEADER + 4 * (size_t)k, 0,
           ts_topk_payload_bytes(k, values) - TS_TOPK_HEADER - 4 * (size_t)k);
}

int ts_topk_payload_skipped(const void *payload) {
    float scale;
    memcpy(&scale, payload, 4);
    return isnan(scale);
}

void ts_topk_decode_at(const void *payload, int values, int64_t j, uint32_t *index, float *q) {
    const unsigned char *p = payload;
    float scale;
    memcpy(&scale, p, 4);
    const int64_t k = ts_topk_payload_k(payload);
    memcpy(index, p + TS_TOPK_HEADER + 4 * (size_t)j, 4);
    *q = dec_value(p + TS_TOPK_HEADER + 4 * (size_t)k, values, j, scale);
}

float ts_compress_clip_scale(const float *const *seg, const int64_t *len, int n_seg, float inv,
                             double clip, int ranks) {
    if (!(clip > 0)) return 1.0f;
    double ss = 0;
    for (int j = 0; j < n_seg; j++)
        for (int64_t i = 0; i < len[j]; i++) {
            const float gi = inv == 1.0f ? seg[j][i] : seg[j][i] * inv;
            ss += (double)gi * (double)gi;
        }
    const double thr = clip / sqrt((double)ranks), nrm = sqrt(ss);
    return nrm > thr ? (float)(thr / nrm) : 1.0f;
}

void ts_psgd_orthonormalise(float *p, int64_t n, int r) {
    for (int c = 0; c < r; c++) {
        for (int j = 0; j < c; j++) {
            double dot = 0;
            for (int64_t i = 0; i < n; i++) dot += (double)p[i * r + j] * (double)p[i * r + c];
            for (int64_t i = 0; i < n; i++)
                p[i * r + c] = (float)((double)p[i * r + c] - dot * (double)p[i * r + j]);
        }
        double nrm = 0;
        for (int64_t i = 0; i < n; i++) nrm += (double)p[i * r + c] * (double)p[i * r + c];
        nrm = sqrt(nrm);
        for (int64_t i = 0; i < n; i++)
            p[i * r + c] = nrm > 1e-30 ? (float)((double)p[i * r + c] / nrm) : 0.0f;
    }
}

int ts_psgd_matrix(int rank, const int64_t *dims, int64_t min_elems, int64_t max_elems, int r,
                   int64_t *n, int64_t *m) {
    *n = *m = 0;
    if (rank < 2) return 0;
    int64_t numel = 1;
    for (int d = 0; d < rank; d++) numel *= dims[d];
    *n = dims[0];
    *m = dims[0] > 0 ? numel / dims[0] : 0;
    return numel >= min_elems && (max_elems <= 0 || numel <= max_elems) && r < *n && r < *m;
}
