/* Fixed-point packing (src/fed/pack.c) through real Paillier sums: the edge
 * of a slot (max_clients clients all sending ±clip), the stated error bound
 * on random weighted updates, overflow reported when more updates than the
 * slots have room for are added, and the parameter checks. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "fed/pack.h"
#include "fed/paillier.h"

/* Encrypts each client's packed update, adds the ciphertexts plaintext by
 * plaintext, decrypts and unpacks the sum of k updates into out. Returns the
 * status of the first unpack failure (TS_OK if none). */
static ts_status paillier_sum(ts_paillier_priv *sk, ts_paillier_pub *pk, const ts_fed_pack *p,
                              uint64_t **u, int clients, int k_decode, int64_t n, double *out) {
    mpz_t m, c, acc;
    mpz_inits(m, c, acc, NULL);
    ts_status bad = TS_OK;
    for (int64_t i = 0; i < ts_fed_pack_count(p, n); i++) {
        for (int j = 0; j < clients; j++) {
            CHECK_OK(ts_fed_pack_plain(p, u[j], n, i, m));
            CHECK_OK(ts_paillier_encrypt(pk, c, m));
            if (j == 0)
                mpz_set(acc, c);
            else
                CHECK_OK(ts_paillier_add(pk, acc, acc, c));
        }
        CHECK_OK(ts_paillier_decrypt(sk, m, acc));
        ts_status s = ts_fed_unpack_sum(p, m, i, n, k_decode, out);
        if (s != TS_OK && bad == TS_OK) bad = s;
    }
    mpz_clears(m, c, acc, NULL);
    return bad;
}

static void test_edge(ts_paillier_priv *sk, ts_paillier_pub *pk) {
    /* clip 1, scale 2^20: qmax = 2^20, 2·qmax·K with K = 8 is exactly 2^24,
     * a 25-bit slot filled to its limit; 1023 / 25 = 40 slots */
    enum { K = 8, N = 100 };
    ts_fed_pack p;
    CHECK_OK(ts_fed_pack_init(&p, 1 << 20, 1.0, K, 1024));
    CHECK(p.qmax == 1 << 20 && p.slot_bits == 25 && p.slots == 40, "qmax %lld slot %d slots %d",
          (long long)p.qmax, p.slot_bits, p.slots);
    CHECK(ts_fed_pack_count(&p, N) == 3, "plaintexts for %d values: %lld", N,
          (long long)ts_fed_pack_count(&p, N));
    float *x = malloc(N * sizeof *x);
    uint64_t *u[K + 1];
    double *out = malloc(N * sizeof *out);
    for (int j = 0; j <= K; j++) u[j] = malloc(N * sizeof **u);
    /* every client sends the largest value in every slot: +clip, and in a
     * second pattern -clip and +clip alternating (neighbours at both edges) */
    for (int pattern = 0; pattern < 2; pattern++) {
        for (int i = 0; i < N; i++) x[i] = pattern == 0 || i % 2 ? 5.0f : -5.0f; /* beyond clip */
        int64_t clipped = 0;
        for (int j = 0; j <= K; j++) CHECK_OK(ts_fed_quantize(&p, x, N, 1.0, u[j], &clipped));
        CHECK(clipped == N, "clipped %lld of %d", (long long)clipped, N);
        CHECK_OK(paillier_sum(sk, pk, &p, u, K, K, N, out));
        int exact = 1;
        for (int i = 0; i < N; i++) exact &= out[i] == (x[i] > 0 ? K * 1.0 : -K * 1.0);
        CHECK(exact, "pattern %d: %d clients at the edge do not sum to ±%d (out[0] %g out[1] %g)",
              pattern, K, K, out[0], out[1]);
        /* one more client than the slots have room for: refused by count, and
         * the real overflow (K + 1 sums decoded as K) reported, not wrapped */
        CHECK(paillier_sum(sk, pk, &p, u, K, K + 1, N, out) == TS_ERR_NUMERIC,
              "k > max_clients accepted");
        ts_status s = paillier_sum(sk, pk, &p, u, K + 1, K, N, out);
        CHECK(s == TS_ERR_NUMERIC && strstr(ts_last_error(), "overflow"),
              "pattern %d: overflow not reported: %s", pattern, ts_last_error());
    }
    for (int j = 0; j <= K; j++) free(u[j]);
    free(x);
    free(out);
}

static void test_bound(ts_paillier_priv *sk, ts_paillier_pub *pk) {
    /* 3 clients, FedAvg weights by sample count (100, 250, 650), random
     * updates in [-0.5, 0.5]: the decoded sum is within 3 · 0.5 / scale of
     * the weighted sum in double */
    enum { K = 3, N = 1000 };
    const double w[K] = {0.1, 0.25, 0.65};
    ts_fed_pack p;
    CHECK_OK(ts_fed_pack_init(&p, 1 << 16, 1.0, 16, 1024));
    float *x[K];
    uint64_t *u[K];
    double *out = malloc(N * sizeof *out);
    uint32_t st = 12345;
    for (int j = 0; j < K; j++) {
        x[j] = malloc(N * sizeof *x[j]);
        u[j] = malloc(N * sizeof *u[j]);
        for (int i = 0; i < N; i++) {
            st = st * 1664525u + 1013904223u;
            x[j][i] = (float)((st >> 8) / 16777216.0 - 0.5);
        }
        CHECK_OK(ts_fed_quantize(&p, x[j], N, w[j], u[j], NULL));
    }
    CHECK_OK(paillier_sum(sk, pk, &p, u, K, K, N, out));
    double worst = 0, bound = ts_fed_pack_bound(&p, K);
    for (int i = 0; i < N; i++) {
        double want = 0;
        for (int j = 0; j < K; j++) want += w[j] * (double)x[j][i];
        double e = fabs(out[i] - want);
        if (e > worst) worst = e;
    }
    CHECK(worst <= bound, "largest error %g above the bound %g", worst, bound);
    CHECK(worst > 0, "no rounding at all: the test does not exercise the bound");
    /* the same sums from plain integers (the masking mode's decoder) */
    uint64_t *sum = calloc(N, sizeof *sum);
    for (int j = 0; j < K; j++)
        for (int i = 0; i < N; i++) sum[i] += u[j][i];
    double *out2 = malloc(N * sizeof *out2);
    CHECK_OK(ts_fed_decode_sums(&p, sum, N, K, out2));
    CHECK(memcmp(out, out2, N * sizeof *out) == 0, "plain and Paillier sums decode differently");
    sum[7] = (uint64_t)(2 * p.qmax) * K + 1;
    CHECK(ts_fed_decode_sums(&p, sum, N, K, out2) == TS_ERR_NUMERIC,
          "slot above its limit accepted");
    for (int j = 0; j < K; j++) free(x[j]), free(u[j]);
    free(out);
    free(out2);
    free(sum);
}

static void test_params(void) {
    ts_fed_pack p;
    CHECK(ts_fed_pack_init(&p, 0, 1, 4, 2048) == TS_ERR_INVALID, "scale 0 accepted");
    CHECK(ts_fed_pack_init(&p, 1, -1, 4, 2048) == TS_ERR_INVALID, "negative clip accepted");
    CHECK(ts_fed_pack_init(&p, 1, 1, 0, 2048) == TS_ERR_INVALID, "0 clients accepted");
    CHECK(ts_fed_pack_init(&p, 0x1p60, 1, 4, 2048) == TS_ERR_INVALID,
          "62-bit slot overflow accepted");
    CHECK(strstr(ts_last_error(), "fed.scale"), "message names the keys: %s", ts_last_error());
    CHECK(ts_fed_pack_init(&p, 0x1p40, 1, 4, 32) == TS_ERR_INVALID,
          "slot wider than the plaintext accepted");
    CHECK_OK(ts_fed_pack_init(&p, 0x1p40, 1, 4, 0));
    CHECK(p.slots == 0 && p.slot_bits == 44, "no plaintext: slots %d bits %d", p.slots,
          p.slot_bits);
    /* 2048-bit n, 42-bit slots: the 48 slots of the estimate */
    CHECK_OK(ts_fed_pack_init(&p, 0x1p38, 1, 4, 2048));
    CHECK(p.slot_bits == 42 && p.slots == 48, "2048: %d slots of %d bits", p.slots, p.slot_bits);
    float bad[3] = {0, NAN, 1};
    uint64_t u[3];
    CHECK(ts_fed_quantize(&p, bad, 3, 1.0, u, NULL) == TS_ERR_NUMERIC &&
              strstr(ts_last_error(), "value 1"),
          "NaN accepted: %s", ts_last_error());
    CHECK(ts_fed_quantize(&p, bad, 1, 1.5, u, NULL) == TS_ERR_INVALID, "weight 1.5 accepted");
    u[0] = (uint64_t)(2 * p.qmax) + 1;
    mpz_t m;
    mpz_init(m);
    CHECK(ts_fed_pack_plain(&p, u, 1, 0, m) == TS_ERR_NUMERIC, "encoding above 2·qmax packed");
    CHECK(ts_fed_pack_plain(&p, u, 1, 1, m) == TS_ERR_INVALID,
          "plaintext index past the end accepted");
    mpz_clear(m);
}

int main(void) {
    ts_paillier_priv *sk = NULL;
    ts_paillier_pub *pk = NULL;
    CHECK_OK(ts_paillier_keygen(1024, &sk));
    if (sk) CHECK_OK(ts_paillier_pub_of(sk, &pk));
    if (pk) CHECK_OK(ts_paillier_pool_start(pk, 32, 1));
    if (sk && pk) {
        test_edge(sk, pk);
        test_bound(sk, pk);
    }
    test_params();
    ts_paillier_pub_free(pk);
    ts_paillier_priv_free(sk);
    return check_summary("unit/fed_pack");
}
