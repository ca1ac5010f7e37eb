/* Paillier on GMP (src/fed/paillier*.c): round trips, homomorphic sums and
 * scalar products, the r^n pool, key files and their mode check, and
 * interop with python-paillier through the committed fixtures
 * (tests/parity/gen_phe_fixture.py), and the decryption's exponentiation
 * (OpenSSL's, paillier_crt.c) against GMP's at the edges of its range. With FED_TESSEL_CT_OUT=FILE
 * the test also writes tessel ciphertexts under the phe key for that script to check. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "fed/paillier.h"
#include "fed/paillier_internal.h"

#define PHE_FIXTURE    "tests/parity/fixtures/phe_paillier.txt"
#define TESSEL_FIXTURE "tests/parity/fixtures/tessel_paillier.txt"

static const int64_t values[] = {0, 1, 42, -7, 123456789012345, -(INT64_C(1) << 62), INT64_MAX};
#define N_VALUES ((int)(sizeof values / sizeof values[0]))

static void check_arith(ts_paillier_priv *sk, ts_paillier_pub *pk, const char *label) {
    mpz_t m, c, c2, d, k;
    mpz_inits(m, c, c2, d, k, NULL);
    /* round trips of the signed values and of n - 1 */
    for (int i = 0; i < N_VALUES; i++) {
        int64_t back = 1;
        ts_paillier_encode_si(pk, m, values[i]);
        CHECK_OK(ts_paillier_encrypt(pk, c, m));
        CHECK(mpz_cmp(c, m) != 0 || values[i] == 1, "%s: ciphertext equals plaintext", label);
        CHECK_OK(ts_paillier_decrypt(sk, d, c));
        CHECK_OK(ts_paillier_decode_si(pk, d, &back));
        CHECK(back == values[i], "%s: round trip of %lld gave %lld", label, (long long)values[i],
              (long long)back);
    }
    mpz_sub_ui(m, *ts_paillier_n(pk), 1);
    CHECK_OK(ts_paillier_encrypt(pk, c, m));
    CHECK_OK(ts_paillier_decrypt(sk, d, c));
    CHECK(mpz_cmp(d, m) == 0, "%s: round trip of n - 1", label);
    /* two encryptions of the same value differ (fresh r) */
    mpz_set_ui(m, 5);
    CHECK_OK(ts_paillier_encrypt(pk, c, m));
    CHECK_OK(ts_paillier_encrypt(pk, c2, m));
    CHECK(mpz_cmp(c, c2) != 0, "%s: encryption is not randomised", label);
    /* sums: 5 + (-12) + 1000 */
    int64_t back = 0;
    ts_paillier_encode_si(pk, m, -12);
    CHECK_OK(ts_paillier_encrypt(pk, c2, m));
    CHECK_OK(ts_paillier_add(pk, c, c, c2));
    mpz_set_ui(m, 1000);
    CHECK_OK(ts_paillier_encrypt(pk, c2, m));
    CHECK_OK(ts_paillier_add(pk, c, c2, c));
    CHECK_OK(ts_paillier_decrypt(sk, d, c));
    CHECK_OK(ts_paillier_decode_si(pk, d, &back));
    CHECK(back == 993, "%s: homomorphic sum 5 - 12 + 1000 = %lld", label, (long long)back);
    /* scalar products: 993 · 7, and 993 · (n - 3) = -2979 */
    mpz_set_ui(k, 7);
    CHECK_OK(ts_paillier_mul(pk, c2, c, k));
    CHECK_OK(ts_paillier_decrypt(sk, d, c2));
    CHECK_OK(ts_paillier_decode_si(pk, d, &back));
    CHECK(back == 6951, "%s: 993 * 7 = %lld", label, (long long)back);
    ts_paillier_encode_si(pk, k, -3);
    CHECK_OK(ts_paillier_mul(pk, c2, c, k));
    CHECK_OK(ts_paillier_decrypt(sk, d, c2));
    CHECK_OK(ts_paillier_decode_si(pk, d, &back));
    CHECK(back == -2979, "%s: 993 * -3 = %lld", label, (long long)back);
    /* rerandomising keeps the plaintext and changes the ciphertext */
    CHECK_OK(ts_paillier_rerandomize(pk, c2, c));
    CHECK(mpz_cmp(c2, c) != 0, "%s: rerandomize changed nothing", label);
    CHECK_OK(ts_paillier_decrypt(sk, d, c2));
    CHECK(mpz_cmp_ui(d, 993) == 0, "%s: rerandomize changed the plaintext", label);
    /* invalid inputs are refused, never decrypted to garbage */
    mpz_set_ui(c, 0);
    CHECK(ts_paillier_decrypt(sk, d, c) == TS_ERR_FORMAT, "%s: zero ciphertext accepted", label);
    mpz_mul(c, *ts_paillier_n(pk), *ts_paillier_n(pk));
    CHECK(ts_paillier_decrypt(sk, d, c) == TS_ERR_FORMAT, "%s: ciphertext n² accepted", label);
    mpz_set(c, *ts_paillier_n(pk));
    CHECK(ts_paillier_check_ciphertext(pk, c) == TS_ERR_FORMAT, "%s: ciphertext n accepted", label);
    CHECK(ts_paillier_encrypt(pk, c2, c) == TS_ERR_INVALID, "%s: plaintext n accepted", label);
    mpz_clears(m, c, c2, d, k, NULL);
}

static void test_keys_and_pool(void) {
    ts_paillier_priv *sk = NULL;
    ts_paillier_pub *pk = NULL;
    CHECK_OK(ts_paillier_keygen(2048, &sk));
    if (!sk) return;
    CHECK_OK(ts_paillier_pub_of(sk, &pk));
    CHECK(ts_paillier_bits(pk) == 2048, "2048-bit key has %d bits", ts_paillier_bits(pk));
    check_arith(sk, pk, "2048");
    /* the pool: encryptions take precomputed r^n once the thread has made some */
    CHECK_OK(ts_paillier_pool_start(pk, 4, 1));
    CHECK(ts_paillier_pool_start(pk, 4, 1) == TS_ERR_INVALID, "second pool accepted");
    int64_t hits = 0, misses = 0;
    mpz_t m, c, d;
    mpz_inits(m, c, d, NULL);
    for (int i = 0; i < 400 && hits == 0; i++) {
        usleep(50 * 1000);
        mpz_set_ui(m, (unsigned long)i);
        CHECK_OK(ts_paillier_encrypt(pk, c, m));
        CHECK_OK(ts_paillier_decrypt(sk, d, c));
        CHECK(mpz_cmp(d, m) == 0, "pool encryption %d does not decrypt", i);
        ts_paillier_pool_stats(pk, &hits, &misses);
    }
    CHECK(hits > 0, "the pool never supplied an r^n (misses %lld)", (long long)misses);
    check_arith(sk, pk, "2048 with pool");
    ts_paillier_pool_stop(pk);
    ts_paillier_pool_stop(pk); /* stopping twice is harmless */
    /* several threads fill a pool to its capacity and no further; every
     * value they made encrypts correctly */
    CHECK(ts_paillier_pool_start(pk, 8, 0) == TS_ERR_INVALID, "0 pool threads accepted");
    CHECK(ts_paillier_pool_start(pk, 8, 257) == TS_ERR_INVALID, "257 pool threads accepted");
    CHECK_OK(ts_paillier_pool_start(pk, 8, 3));
    int full = 0;
    for (int i = 0; i < 600 && !full; i++) {
        usleep(20 * 1000);
        pthread_mutex_lock(&pk->pool->mu);
        full = pk->pool->count == 8;
        CHECK(pk->pool->count + pk->pool->busy <= 8, "pool over capacity: %d + %d busy",
              pk->pool->count, pk->pool->busy);
        pthread_mutex_unlock(&pk->pool->mu);
    }
    CHECK(full, "3 threads did not fill a pool of 8");
    for (int i = 0; i < 12; i++) { /* 8 from the pool, then computed here */
        mpz_set_ui(m, 1000u + (unsigned)i);
        CHECK_OK(ts_paillier_encrypt(pk, c, m));
        CHECK_OK(ts_paillier_decrypt(sk, d, c));
        CHECK(mpz_cmp(d, m) == 0, "3-thread pool encryption %d does not decrypt", i);
    }
    ts_paillier_pool_stats(pk, &hits, &misses);
    CHECK(hits >= 8, "a full pool of 8 gave %lld hits", (long long)hits);
    ts_paillier_pool_stop(pk);
    /* freeing a key whose pool runs stops and frees the pool (ASan checks) */
    CHECK_OK(ts_paillier_pool_start(pk, 2, 2));
    mpz_clears(m, c, d, NULL);
    ts_paillier_pub_free(pk);
    ts_paillier_priv_free(sk);

    CHECK(ts_paillier_keygen(1000, &sk) == TS_ERR_INVALID, "1000-bit key accepted");
    CHECK_OK(ts_paillier_keygen(3072, &sk));
    if (!sk) return;
    CHECK_OK(ts_paillier_pub_of(sk, &pk));
    CHECK(ts_paillier_bits(pk) == 3072, "3072-bit key has %d bits", ts_paillier_bits(pk));
    check_arith(sk, pk, "3072");
    ts_paillier_pub_free(pk);
    ts_paillier_priv_free(sk);
}

static void test_key_files(const char *dir) {
    char priv[512], pub[512], bad[512];
    snprintf(priv, sizeof priv, "%s/key.priv", dir);
    snprintf(pub, sizeof pub, "%s/key.pub", dir);
    snprintf(bad, sizeof bad, "%s/bad.priv", dir);
    ts_paillier_priv *sk = NULL, *sk2 = NULL;
    ts_paillier_pub *pk = NULL, *pk2 = NULL;
    CHECK_OK(ts_paillier_keygen(1024, &sk));
    if (!sk) return;
    CHECK_OK(ts_paillier_pub_of(sk, &pk));
    CHECK_OK(ts_paillier_priv_save(sk, priv));
    CHECK_OK(ts_paillier_pub_save(pk, pub));
    struct stat st;
    CHECK(stat(priv, &st) == 0 && (st.st_mode & 0777) == 0600, "private key mode %o",
          st.st_mode & 0777);
    CHECK_OK(ts_paillier_priv_load(priv, &sk2));
    CHECK_OK(ts_paillier_pub_load(pub, &pk2));
    if (sk2 && pk2) {
        /* encrypt under the loaded public key, decrypt with the first key and the reverse */
        mpz_t m, c, d;
        mpz_inits(m, c, d, NULL);
        mpz_set_ui(m, 31337);
        CHECK_OK(ts_paillier_encrypt(pk2, c, m));
        CHECK_OK(ts_paillier_decrypt(sk, d, c));
        CHECK(mpz_cmp(d, m) == 0, "loaded public key encrypts differently");
        CHECK_OK(ts_paillier_encrypt(pk, c, m));
        CHECK_OK(ts_paillier_decrypt(sk2, d, c));
        CHECK(mpz_cmp(d, m) == 0, "loaded private key decrypts differently");
        mpz_clears(m, c, d, NULL);
    }
    ts_paillier_priv_free(sk2);
    ts_paillier_pub_free(pk2);
    sk2 = NULL;
    pk2 = NULL;
    /* a private key group or others can read is refused, naming file and mode */
    CHECK(chmod(priv, 0640) == 0, "chmod");
    CHECK(ts_paillier_priv_load(priv, &sk2) == TS_ERR_INVALID && !sk2, "0640 private key accepted");
    CHECK(strstr(ts_last_error(), priv) && strstr(ts_last_error(), "0640"), "message: %s",
          ts_last_error());
    CHECK(chmod(priv, 0604) == 0, "chmod");
    CHECK(ts_paillier_priv_load(priv, &sk2) == TS_ERR_INVALID, "0604 private key accepted");
    /* saving again over it makes it 0600 again */
    CHECK_OK(ts_paillier_priv_save(sk, priv));
    CHECK(stat(priv, &st) == 0 && (st.st_mode & 0777) == 0600, "rewritten mode %o",
          st.st_mode & 0777);
    /* malformed files */
    FILE *f = fopen(bad, "w");
    if (f) {
        fputs("# tessel paillier private key v1\nbits 1024\np 12zz\nq 17\n", f);
        fclose(f);
    }
    chmod(bad, 0600);
    CHECK(ts_paillier_priv_load(bad, &sk2) == TS_ERR_FORMAT, "bad hex accepted");
    CHECK(ts_paillier_priv_load(pub, &sk2) != TS_OK, "public key file loaded as private");
    CHECK(ts_paillier_pub_load(priv, &pk2) == TS_ERR_FORMAT || !pk2,
          "private key file loaded as public");
    ts_paillier_pub_free(pk2);
    ts_paillier_pub_free(pk);
    ts_paillier_priv_free(sk);
    unlink(priv);
    unlink(pub);
    unlink(bad);
}

/* "name value" lines of a fixture; returns the value of `name` or NULL. */
static const char *fixture_get(char *const *names, char *const *vals, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0) return vals[i];
    return NULL;
}

static int fixture_read(const char *path, char **names, char **vals, int cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    static char buf[64 * 1024];
    int n = 0;
    while (n < cap && fgets(buf, sizeof buf, f)) {
        if (buf[0] == '#' || buf[0] == '\n') continue;
        char *sp = strchr(buf, ' ');
        if (!sp) continue;
        *sp = 0;
        sp[strcspn(sp + 1, "\n") + 1] = 0;
        names[n] = strdup(buf);
        vals[n] = strdup(sp + 1);
        n++;
    }
    fclose(f);
    return n;
}

static void test_phe_interop(const char *dir) {
    char *names[64], *vals[64];
    int nf = fixture_read(PHE_FIXTURE, names, vals, 64);
    CHECK(nf > 3, "cannot read %s", PHE_FIXTURE);
    if (nf <= 3) return;
    mpz_t n, p, q, c, d, acc;
    mpz_inits(n, p, q, c, d, acc, NULL);
    mpz_set_str(n, fixture_get(names, vals, nf, "n"), 16);
    mpz_set_str(p, fixture_get(names, vals, nf, "p"), 16);
    mpz_set_str(q, fixture_get(names, vals, nf, "q"), 16);
    ts_paillier_priv *sk0 = NULL, *sk = NULL;
    ts_paillier_pub *pk = NULL;
    CHECK_OK(ts_paillier_priv_from_pq(p, q, &sk0));
    /* through a key file, as the key holder would load it */
    char kpath[512];
    snprintf(kpath, sizeof kpath, "%s/phe.priv", dir);
    if (sk0) CHECK_OK(ts_paillier_priv_save(sk0, kpath));
    CHECK_OK(ts_paillier_priv_load(kpath, &sk));
    if (sk) CHECK_OK(ts_paillier_pub_of(sk, &pk));
    if (!sk || !pk) goto done;
    CHECK(mpz_cmp(*ts_paillier_n(pk), n) == 0, "n of the phe key differs from p·q");
    /* phe's ciphertexts decrypt with tessel, and their tessel sum too */
    int64_t total = 0;
    int count = 0;
    mpz_set_ui(acc, 1); /* E(0) with r = 1 */
    for (int i = 0;; i++) {
        char cn[16], mn[16];
        snprintf(cn, sizeof cn, "c%d", i);
        snprintf(mn, sizeof mn, "m%d", i);
        const char *cs = fixture_get(names, vals, nf, cn), *ms = fixture_get(names, vals, nf, mn);
        if (!cs || !ms) break;
        int64_t want = strtoll(ms, NULL, 10), got = 0;
        mpz_set_str(c, cs, 16);
        CHECK_OK(ts_paillier_decrypt(sk, d, c));
        CHECK_OK(ts_paillier_decode_si(pk, d, &got));
        CHECK(got == want, "phe c%d: tessel decrypts %lld, phe encrypted %lld", i, (long long)got,
              (long long)want);
        if (i < 6) { /* leave INT64_MAX out of the sum */
            CHECK_OK(ts_paillier_add(pk, acc, acc, c));
            total += want;
        }
        count++;
    }
    CHECK(count == N_VALUES, "%d phe ciphertexts, expected %d", count, N_VALUES);
    int64_t got = 0;
    CHECK_OK(ts_paillier_decrypt(sk, d, acc));
    CHECK_OK(ts_paillier_decode_si(pk, d, &got));
    CHECK(got == total, "sum of phe ciphertexts: %lld, expected %lld", (long long)got,
          (long long)total);

    /* the committed tessel-made fixture (checked by phe in the script) decrypts here too */
    char *tn[64], *tv[64];
    int nt = fixture_read(TESSEL_FIXTURE, tn, tv, 64);
    CHECK(nt > 2, "cannot read %s", TESSEL_FIXTURE);
    for (int i = 0; nt > 2; i++) {
        char cn[16], mn[16];
        snprintf(cn, sizeof cn, "c%d", i);
        snprintf(mn, sizeof mn, "m%d", i);
        const char *cs = fixture_get(tn, tv, nt, cn), *ms = fixture_get(tn, tv, nt, mn);
        if (!cs || !ms) break;
        int64_t back = 0;
        mpz_set_str(c, cs, 16);
        CHECK_OK(ts_paillier_decrypt(sk, d, c));
        CHECK_OK(ts_paillier_decode_si(pk, d, &back));
        CHECK(back == strtoll(ms, NULL, 10), "tessel fixture c%d decrypts to %lld", i,
              (long long)back);
    }
    for (int i = 0; i < nt; i++) free(tn[i]), free(tv[i]);

    /* FED_TESSEL_CT_OUT: tessel ciphertexts for gen_phe_fixture.py check */
    const char *out = getenv("FED_TESSEL_CT_OUT");
    if (out) {
        FILE *f = fopen(out, "w");
        CHECK(f != NULL, "cannot write %s", out);
        if (f) {
            fprintf(f, "# tessel paillier ciphertexts under the phe fixture key "
                       "(gen_phe_fixture.py check)\n");
            gmp_fprintf(f, "n %Zx\n", n);
            mpz_set_ui(acc, 1);
            for (int i = 0; i < N_VALUES - 1; i++) {
                ts_paillier_encode_si(pk, d, values[i]);
                CHECK_OK(ts_paillier_encrypt(pk, c, d));
                CHECK_OK(ts_paillier_add(pk, acc, acc, c));
                gmp_fprintf(f, "m%d %lld\nc%d %Zx\n", i, (long long)values[i], i, c);
            }
            gmp_fprintf(f, "sum %Zx\n", acc);
            fclose(f);
        }
    }
done:
    unlink(kpath);
    ts_paillier_pub_free(pk);
    ts_paillier_priv_free(sk);
    ts_paillier_priv_free(sk0);
    mpz_clears(n, p, q, c, d, acc, NULL);
    for (int i = 0; i < nf; i++) free(names[i]), free(vals[i]);
}

/* base^(p-1) mod p² through OpenSSL equals mpz_powm_sec's for bases 0, 1,
 * p, p² - 1, values with leading zero bytes and random ones, for both
 * halves of a key (p and q). */
static void test_crt_pow(void) {
    ts_paillier_priv *sk = NULL;
    CHECK_OK(ts_paillier_keygen(1024, &sk));
    if (!sk) return;
    ts_paillier_dec_scratch *w = NULL;
    CHECK_OK(ts_paillier_dec_scratch_new(sk->crt, &w));
    gmp_randstate_t rs;
    gmp_randinit_default(rs);
    gmp_randseed_ui(rs, 7);
    mpz_t b, want, got;
    mpz_inits(b, want, got, NULL);
    for (int which = 0; w && which < 2; which++) {
        const mpz_t *pr = which ? &sk->q : &sk->p, *pr2 = which ? &sk->q2 : &sk->p2,
                    *e = which ? &sk->qm1 : &sk->pm1;
        for (int k = 0; k < 24; k++) {
            if (k == 0) mpz_set_ui(b, 0);
            if (k == 1) mpz_set_ui(b, 1);
            if (k == 2) mpz_set(b, *pr);
            if (k == 3) mpz_sub_ui(b, *pr2, 1);
            if (k == 4) mpz_urandomb(b, rs, 40); /* many leading zero bytes */
            if (k >= 5) mpz_urandomm(b, rs, *pr2);
            mpz_powm_sec(want, b, *e, *pr2);
            CHECK_OK(ts_paillier_crt_pow(sk->crt, w, which, got, b));
            CHECK(mpz_cmp(want, got) == 0, "CRT power %d of base %d differs from GMP's", which, k);
        }
    }
    /* a base wider than p² is refused, not raised */
    mpz_set(b, sk->p2);
    mpz_mul_2exp(b, b, 64);
    CHECK(ts_paillier_crt_pow(sk->crt, w, 0, got, b) == TS_ERR_INTERNAL, "a base wider than p²");
    mpz_clears(b, want, got, NULL);
    gmp_randclear(rs);
    ts_paillier_dec_scratch_free(w);
    ts_paillier_priv_free(sk);
}

int main(void) {
    char dir[] = "/tmp/tessel_fed_paillier_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    test_phe_interop(dir);
    test_key_files(dir);
    test_keys_and_pool();
    test_crt_pow();
    rmdir(dir);
    return check_summary("unit/fed_paillier");
}
