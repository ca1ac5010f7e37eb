/* The cheap r^n of Damgård, Jurik and Nielsen (src/fed/paillier_djn.c):
 * the fixed-base table's hs^a equals mpz_powm for exponents at the edges of
 * its digits; ciphertexts made with it decrypt and add like any others (also
 * mixed with full-r^n ones, and made by several threads at once, the first
 * of which builds the table); v2 public key files carry hs, v1 files and
 * keys from n alone still work with full r^n; a bad hs is refused with the
 * key file named. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "fed/paillier_internal.h"

/* hs^a through the table against mpz_powm, a given as exp_bits bits */
static void check_pow(ts_paillier_pub *pk, const unsigned char *a, size_t len, const char *what) {
    mpz_t got, want, e;
    mpz_inits(got, want, e, NULL);
    mpz_import(e, len, -1, 1, 0, 0, a);
    mpz_powm(want, pk->hs, e, pk->n2);
    CHECK_OK(ts_paillier_djn_pow(pk, got, a, len));
    CHECK(mpz_cmp(got, want) == 0, "%d bits: table hs^a != mpz_powm for a = %s", pk->bits, what);
    mpz_clears(got, want, e, NULL);
}

static void test_table(ts_paillier_pub *pk) {
    int eb = ts_paillier_djn_exp_bits(pk);
    CHECK(eb == pk->bits / 2, "exponent of %d bits for n of %d", eb, pk->bits);
    size_t len = (size_t)(eb + 7) / 8;
    unsigned char a[4096 / 16];
    memset(a, 0, sizeof a);
    check_pow(pk, a, len, "0");
    a[0] = 1;
    check_pow(pk, a, len, "1");
    memset(a, 0xff, len);
    if (eb % 8) a[len - 1] &= (unsigned char)((1u << (eb % 8)) - 1);
    check_pow(pk, a, len, "2^bits - 1");
    /* single bits at and around every digit boundary (digits of 6 bits) */
    for (int bit = 0; bit < eb; bit++) {
        if (bit % 6 != 0 && bit % 6 != 5 && bit != eb - 1) continue;
        memset(a, 0, len);
        a[bit / 8] = (unsigned char)(1u << (bit % 8));
        char what[32];
        snprintf(what, sizeof what, "2^%d", bit);
        check_pow(pk, a, len, what);
    }
    for (int i = 0; i < 8; i++) {
        CHECK_OK(ts_fed_os_random(a, len));
        if (eb % 8) a[len - 1] &= (unsigned char)((1u << (eb % 8)) - 1);
        check_pow(pk, a, len, "random");
    }
    mpz_t r;
    mpz_init(r);
    CHECK(ts_paillier_djn_pow(pk, r, a, len + 1) == TS_ERR_INTERNAL,
          "an exponent of the wrong length accepted");
    mpz_clear(r);
}

/* round trips and sums with DJN ciphertexts, alone and mixed with full-r^n
 * ones made under the same n without hs */
static void test_ciphertexts(ts_paillier_priv *sk, ts_paillier_pub *pk) {
    ts_paillier_pub *plain = NULL;
    CHECK_OK(ts_paillier_pub_from_n(*ts_paillier_n(pk), &plain));
    CHECK(plain && !ts_paillier_has_hs(plain), "a key from n alone has hs");
    CHECK(ts_paillier_has_hs(pk), "the public half of a private key has no hs");
    mpz_t m, c, c2, d, rn, acc;
    mpz_inits(m, c, c2, d, rn, acc, NULL);
    static const int64_t v[] = {0, 1, -1, 987654321, -(INT64_C(1) << 60), INT64_MAX};
    int64_t want = 0, back = 0;
    mpz_set_ui(acc, 1); /* E(0) with r = 1 */
    for (int i = 0; i < (int)(sizeof v / sizeof v[0]); i++) {
        ts_paillier_encode_si(pk, m, v[i]);
        CHECK_OK(ts_paillier_encrypt(pk, c, m));
        CHECK_OK(ts_paillier_check_ciphertext(pk, c));
        CHECK_OK(ts_paillier_decrypt(sk, d, c));
        CHECK_OK(ts_paillier_decode_si(pk, d, &back));
        CHECK(back == v[i], "DJN round trip of %lld gave %lld", (long long)v[i], (long long)back);
        /* the sum alternates DJN and full-r^n ciphertexts; the small values only */
        if (i < 4) {
            if (plain) CHECK_OK(ts_paillier_encrypt(i % 2 ? plain : pk, c2, m));
            CHECK_OK(ts_paillier_add(pk, acc, acc, c2));
            want += v[i];
        }
    }
    CHECK_OK(ts_paillier_decrypt(sk, d, acc));
    CHECK_OK(ts_paillier_decode_si(pk, d, &back));
    CHECK(back == want, "mixed homomorphic sum %lld, want %lld", (long long)back, (long long)want);
    /* a DJN r^n is an n-th residue: E(0) with it decrypts to 0, and two differ */
    CHECK_OK(ts_paillier_fresh_rn(pk, rn));
    mpz_set_ui(m, 0);
    CHECK_OK(ts_paillier_encrypt_rn(pk, c, m, rn));
    CHECK_OK(ts_paillier_decrypt(sk, d, c));
    CHECK(mpz_sgn(d) == 0, "E(0) with a DJN r^n does not decrypt to 0");
    CHECK_OK(ts_paillier_fresh_rn(pk, c2));
    CHECK(mpz_cmp(rn, c2) != 0, "two DJN r^n are equal");
    /* scalar product and rerandomising */
    mpz_set_ui(m, 12);
    CHECK_OK(ts_paillier_encrypt(pk, c, m));
    mpz_set_ui(m, 11);
    CHECK_OK(ts_paillier_mul(pk, c2, c, m));
    CHECK_OK(ts_paillier_rerandomize(pk, c, c2));
    CHECK(mpz_cmp(c, c2) != 0, "rerandomize changed nothing");
    CHECK_OK(ts_paillier_decrypt(sk, d, c));
    CHECK(mpz_cmp_ui(d, 132) == 0, "E(12)^11 rerandomised is not 132");
    mpz_clears(m, c, c2, d, rn, acc, NULL);
    ts_paillier_pub_free(plain);
}

/* several threads encrypt at once under a key whose table is not built */
typedef struct job {
    ts_paillier_pub *pk;
    mpz_t c[4];
    int id, bad;
} job;

static void *encrypt_job(void *arg) {
    job *j = arg;
    mpz_t m;
    mpz_init(m);
    for (int i = 0; i < 4; i++) {
        mpz_init(j->c[i]);
        mpz_set_ui(m, (unsigned long)(100 * j->id + i));
        if (ts_paillier_encrypt(j->pk, j->c[i], m) != TS_OK) j->bad = 1;
    }
    mpz_clear(m);
    return NULL;
}

static void test_threads(ts_paillier_priv *sk) {
    ts_paillier_pub *pk = NULL;
    CHECK_OK(ts_paillier_pub_of(sk, &pk));
    if (!pk) return;
    enum { T = 4 };
    job jobs[T];
    pthread_t th[T];
    for (int t = 0; t < T; t++) {
        jobs[t] = (job){.pk = pk, .id = t};
        CHECK(pthread_create(&th[t], NULL, encrypt_job, &jobs[t]) == 0, "pthread_create");
    }
    mpz_t d;
    mpz_init(d);
    for (int t = 0; t < T; t++) {
        pthread_join(th[t], NULL);
        CHECK(!jobs[t].bad, "thread %d: encryption failed", t);
        for (int i = 0; i < 4; i++) {
            CHECK_OK(ts_paillier_decrypt(sk, d, jobs[t].c[i]));
            CHECK(mpz_cmp_ui(d, (unsigned long)(100 * t + i)) == 0, "thread %d value %d", t, i);
            mpz_clear(jobs[t].c[i]);
        }
    }
    mpz_clear(d);
    ts_paillier_pub_free(pk);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* a v2 public key file with hs replaced by `hs` (hex) must be refused with
 * the file named */
static void check_bad_hs(const char *path, const ts_paillier_pub *pk, const mpz_t hs,
                         const char *what) {
    char *text = NULL;
    gmp_asprintf(&text, "# tessel paillier public key v2\nbits %d\nn %Zx\nhs %Zx\n", pk->bits,
                 pk->n, hs);
    write_text(path, text);
    free(text);
    ts_paillier_pub *bad = NULL;
    ts_status s = ts_paillier_pub_load(path, &bad);
    CHECK(s == TS_ERR_FORMAT && !bad, "hs %s accepted (%s)", what, ts_status_name(s));
    CHECK(strstr(ts_last_error(), path) && strstr(ts_last_error(), "hs"),
          "hs %s: the message does not name the file and hs: %s", what, ts_last_error());
    ts_paillier_pub_free(bad);
}

static void test_files(const char *dir, ts_paillier_priv *sk) {
    char path[512], old[512];
    snprintf(path, sizeof path, "%s/key.pub", dir);
    snprintf(old, sizeof old, "%s/old.pub", dir);
    ts_paillier_pub *pk = NULL, *pk2 = NULL;
    CHECK_OK(ts_paillier_pub_of(sk, &pk));
    if (!pk) return;
    /* v2: hs survives the file */
    CHECK_OK(ts_paillier_pub_save(pk, path));
    CHECK_OK(ts_paillier_pub_load(path, &pk2));
    if (pk2) {
        CHECK(ts_paillier_has_hs(pk2) && mpz_cmp(pk2->hs, pk->hs) == 0, "hs lost in the file");
        test_ciphertexts(sk, pk2);
    }
    ts_paillier_pub_free(pk2);
    pk2 = NULL;
    /* v1 (n alone, what earlier versions wrote): loads, encrypts with full r^n */
    char *text = NULL;
    gmp_asprintf(&text, "# tessel paillier public key v1\nbits %d\nn %Zx\n", pk->bits, pk->n);
    write_text(old, text);
    CHECK_OK(ts_paillier_pub_load(old, &pk2));
    if (pk2) {
        CHECK(!ts_paillier_has_hs(pk2), "a v1 key file has hs");
        mpz_t m, c, d;
        mpz_inits(m, c, d, NULL);
        mpz_set_ui(m, 4242);
        CHECK_OK(ts_paillier_encrypt(pk2, c, m));
        CHECK_OK(ts_paillier_decrypt(sk, d, c));
        CHECK(mpz_cmp(d, m) == 0, "v1 key: round trip");
        mpz_clears(m, c, d, NULL);
        /* its text is v1 again, not a v2 without hs */
        char *back = NULL;
        CHECK_OK(ts_paillier_pub_to_text(pk2, &back));
        CHECK(back && strcmp(back, text) == 0, "a v1 key's text changed: %s", back ? back : "");
        free(back);
    }
    free(text);
    ts_paillier_pub_free(pk2);
    /* bad hs values */
    mpz_t hs;
    mpz_init(hs);
    mpz_mul_ui(hs, pk->n, 3);
    check_bad_hs(path, pk, hs, "3n (not coprime to n)");
    mpz_add_ui(hs, pk->n2, 5);
    check_bad_hs(path, pk, hs, "n² + 5");
    mpz_set(hs, pk->n2);
    check_bad_hs(path, pk, hs, "n²");
    mpz_set_ui(hs, 1);
    check_bad_hs(path, pk, hs, "1");
    mpz_set_ui(hs, 0);
    check_bad_hs(path, pk, hs, "0");
    mpz_sub_ui(hs, pk->n2, 1);
    check_bad_hs(path, pk, hs, "n² - 1 (order 2)");
    mpz_clear(hs);
    /* a v2 file without its hs line */
    gmp_asprintf(&text, "# tessel paillier public key v2\nbits %d\nn %Zx\n", pk->bits, pk->n);
    write_text(path, text);
    free(text);
    pk2 = NULL;
    CHECK(ts_paillier_pub_load(path, &pk2) == TS_ERR_FORMAT && !pk2, "v2 without hs accepted");
    CHECK(strstr(ts_last_error(), path) && strstr(ts_last_error(), "hs"), "message: %s",
          ts_last_error());
    ts_paillier_pub_free(pk);
    unlink(path);
    unlink(old);
}

int main(void) {
    char dir[] = "/tmp/tessel_fed_djn_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    static const int sizes[] = {1024, 2048};
    for (int i = 0; i < 2; i++) {
        ts_paillier_priv *sk = NULL;
        ts_paillier_pub *pk = NULL;
        CHECK_OK(ts_paillier_keygen(sizes[i], &sk));
        if (!sk) continue;
        CHECK_OK(ts_paillier_pub_of(sk, &pk));
        if (pk) {
            test_table(pk);
            test_ciphertexts(sk, pk);
        }
        ts_paillier_pub_free(pk);
        if (i == 0) {
            test_threads(sk);
            test_files(dir, sk);
        }
        ts_paillier_priv_free(sk);
    }
    rmdir(dir);
    return check_summary("unit/fed_djn");
}
