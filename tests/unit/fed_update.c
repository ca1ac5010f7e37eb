/* Whole updates under Paillier (src/fed/update.c): three clients' packed,
 * weighted updates encrypted, added and decrypted in parallel decode to the
 * FedAvg average within the fixed-point bound, whatever the thread count;
 * an out-of-range ciphertext and a corrupted aggregate are refused. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "fed/update.h"

enum { K = 3, N = 3000 };

int main(void) {
    ts_paillier_priv *sk = NULL;
    ts_paillier_pub *pk = NULL;
    CHECK_OK(ts_paillier_keygen(1024, &sk));
    if (sk) CHECK_OK(ts_paillier_pub_of(sk, &pk));
    if (!pk) return check_summary("unit/fed_update");
    CHECK_OK(ts_paillier_pool_start(pk, 64, 2));
    ts_fed_pack p;
    CHECK_OK(ts_fed_pack_init(&p, 1 << 20, 1.0, K, 1024));
    int64_t count = ts_fed_pack_count(&p, N);
    size_t w = ts_fed_ct_bytes(pk);
    CHECK(w == 256, "ciphertext of %zu bytes at 1024 bits", w);
    static float x[K][N];
    static uint64_t u[N];
    static double ref[N], out[N], out1[N];
    const double wt[K] = {0.2, 0.3, 0.5};
    uint8_t *ct = malloc((size_t)count * w), *acc = malloc((size_t)count * w);
    ts_fed_aggregate_init(pk, acc, count);
    for (int j = 0; j < K; j++) {
        for (int i = 0; i < N; i++) {
            x[j][i] = (float)((i * 7 + j * 13) % 200) / 100.0f - 1.0f;
            ref[i] += wt[j] * x[j][i];
        }
        CHECK_OK(ts_fed_quantize(&p, x[j], N, wt[j], u, NULL));
        CHECK_OK(ts_fed_encrypt_update(pk, &p, u, N, ct, NULL, 0));
        CHECK_OK(ts_fed_aggregate(pk, acc, ct, count));
    }
    CHECK_OK(ts_fed_decrypt_sum(sk, &p, acc, N, K, out));
    /* what the aggregator receives holds none of the plaintext: no 8-byte run
     * of any packed plaintext of the last client's update occurs in its
     * ciphertexts */
    int leaks = 0;
    mpz_t m;
    mpz_init(m);
    for (int64_t i = 0; i < count; i++) {
        uint8_t plain[128] = {0};
        size_t got = 0;
        CHECK_OK(ts_fed_pack_plain(&p, u, N, i, m));
        mpz_export(plain, &got, 1, 1, 1, 0, m);
        for (size_t o = 0; o + 8 <= got; o += 8)
            leaks += memmem(ct, (size_t)count * w, plain + o, 8) != NULL;
    }
    mpz_clear(m);
    CHECK(leaks == 0, "%d runs of plaintext bytes appear in the ciphertexts", leaks);
    double worst = 0;
    for (int i = 0; i < N; i++) worst = fmax(worst, fabs(out[i] - ref[i]));
    CHECK(worst <= ts_fed_pack_bound(&p, K), "FedAvg error %g above the bound %g", worst,
          ts_fed_pack_bound(&p, K));
    /* one thread decodes the same sums */
    omp_set_num_threads(1);
    CHECK_OK(ts_fed_decrypt_sum(sk, &p, acc, N, K, out1));
    CHECK(memcmp(out, out1, sizeof out) == 0, "decoded sums depend on the thread count");
    omp_set_num_threads(2);
    /* a ciphertext of n² or more (all bytes 0xff) is refused by the aggregator */
    memset(ct + 5 * w, 0xff, w);
    CHECK(ts_fed_aggregate(pk, acc, ct, count) == TS_ERR_FORMAT &&
              strstr(ts_last_error(), "ciphertext 5"),
          "out-of-range ciphertext: %s", ts_last_error());
    /* a corrupted aggregate: a multiple of p is refused; a random one decodes to an overflow */
    ts_fed_aggregate_init(pk, acc, count);
    memset(acc + 2 * w, 0, w);
    CHECK(ts_fed_decrypt_sum(sk, &p, acc, N, K, out) == TS_ERR_FORMAT, "zero ciphertext decrypted");
    ts_fed_aggregate_init(pk, acc, count);
    acc[3 * w + 100] ^= 0x10;
    CHECK(ts_fed_decrypt_sum(sk, &p, acc, N, K, out) == TS_ERR_NUMERIC &&
              strstr(ts_last_error(), "overflow"),
          "corrupted aggregate decoded: %s", ts_last_error());
    free(ct);
    free(acc);
    ts_paillier_pub_free(pk);
    ts_paillier_priv_free(sk);
    return check_summary("unit/fed_update");
}
