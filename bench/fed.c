/* One federated round's cost for a 1 M-parameter update and 3 clients
 * (docs/federated.md, "Measured"): plaintext FedAvg, masking (secure
 * aggregation) and Paillier with packing, split into the clients' encode +
 * encrypt, the aggregator's sum and the key holder's decrypt, with the bytes
 * each client uploads. No network: the crypto and the bytes it puts on it.
 *
 *     bench_fed [--params N] [--clients K] [--max-clients H] [--bits 2048|3072]
 *               [--scale S] [--clip C] [--reps R] [--rn-sample M] [--dec-sample D]
 *               [--no-fresh] [--cpu]
 *
 * Paillier encryption is timed twice: with r^n taken from a ring of M
 * precomputed values (what a full background pool provides) and with a
 * fresh r^n per ciphertext (no pool: the DJN hs^a of the key, paillier_djn.c).
 * Before the rounds, M r^n of each kind, the classic full r^n mod n² and
 * the DJN one, are timed on one thread, alternating in blocks of 8 (CPU
 * time of this thread, so other jobs on the machine count less). Every
 * decoded average is checked against the plaintext one within the
 * fixed-point bound. Medians of R rounds. After them, on one thread: D CRT
 * decryptions of the aggregate (the key holder's cost per ciphertext), and
 * the exponentiation each of its two halves does (c^(p-1) mod p², p of
 * bits/2 bits) three ways, alternating in blocks of 8: OpenSSL's
 * constant-time BN_mod_exp_mont_consttime (what the decryption uses, since
 * p - 1 is secret), GMP's constant-time mpz_powm_sec (used before) and
 * GMP's variable-time mpz_powm (the price of constant time); and a few
 * c^lambda mod n² (decryption without the CRT). --max-clients packs with headroom for H >= K
 * clients (as when H clients were admitted and K sent updates); --no-fresh leaves
 * out the encryption with a fresh r^n per ciphertext (the longest part). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "fed/mask.h"
#include "fed/pack.h"
#include "fed/paillier.h"
#include "fed/paillier_internal.h"
#include "fed/update.h"

/* CPU time of the calling thread (the r^n comparison runs on one). */
static double thread_cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Wall time, or with --cpu the process's CPU time (core-seconds, all
 * threads): on a shared machine the second says more about the code. */
static int use_cpu;
static double now(void) {
    struct timespec t;
    clock_gettime(use_cpu ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, ": %s\n", ts_last_error());                                                \
        exit(1);                                                                                   \
    } while (0)

enum { MAXK = 16, MAXR = 15 };

/* The key holder's cost per ciphertext, on one thread: D CRT decryptions of
 * the aggregate acc, and the exponentiation of each of their two halves,
 * c^(p-1) mod p² for a fresh prime p of bits/2 bits, by OpenSSL's
 * BN_mod_exp_mont_consttime (what the decryption uses), mpz_powm_sec and
 * mpz_powm, alternating in blocks of 8; then c^lambda mod n² (no CRT). */
static void decrypt_sample(const ts_paillier_priv *sk, const uint8_t *acc, int64_t count,
                           size_t wct, int bits, int d) {
    mpz_t c, m, p, p2, e, o;
    mpz_inits(c, m, p, p2, e, o, NULL);
    double tc = thread_cpu();
    for (int i = 0; i < d; i++) {
        mpz_import(c, wct, 1, 1, 1, 0, acc + (size_t)(i % count) * wct);
        if (ts_paillier_decrypt(sk, m, c) != TS_OK) DIE("decrypt sample");
    }
    double t_dec = (thread_cpu() - tc) / d;
    unsigned char seed[32];
    if (ts_fed_os_random(seed, sizeof seed) != TS_OK) DIE("seed");
    gmp_randstate_t rs;
    gmp_randinit_default(rs);
    mpz_import(o, sizeof seed, 1, 1, 0, 0, seed);
    gmp_randseed(rs, o);
    mpz_urandomb(p, rs, (mp_bitcnt_t)bits / 2);
    mpz_setbit(p, (mp_bitcnt_t)bits / 2 - 1);
    mpz_nextprime(p, p);
    mpz_mul(p2, p, p);
    mpz_sub_ui(e, p, 1);
    mpz_t *base = malloc((size_t)d * sizeof *base);
    for (int i = 0; i < d; i++) {
        mpz_init(base[i]);
        mpz_urandomm(base[i], rs, p2);
    }
    /* the same exponentiation through OpenSSL (what the decryption uses) */
    ts_paillier_crt *crt;
    ts_paillier_dec_scratch *ws;
    if (ts_paillier_crt_init(p2, p2, e, e, &crt) != TS_OK ||
        ts_paillier_dec_scratch_new(crt, &ws) != TS_OK)
        DIE("CRT tables");
    double t_sec = 0, t_ossl = 0, t_var = 0;
    for (int b = 0; b < d; b += 8) {
        tc = thread_cpu();
        for (int i = b; i < b + 8 && i < d; i++) mpz_powm_sec(o, base[i], e, p2);
        t_sec += thread_cpu() - tc;
        tc = thread_cpu();
        for (int i = b; i < b + 8 && i < d; i++)
            if (ts_paillier_crt_pow(crt, ws, 0, m, base[i]) != TS_OK) DIE("crt pow");
        t_ossl += thread_cpu() - tc;
        if (mpz_cmp(o, m) != 0) DIE("OpenSSL and GMP disagree");
        tc = thread_cpu();
        for (int i = b; i < b + 8 && i < d; i++) mpz_powm(o, base[i], e, p2);
        t_var += thread_cpu() - tc;
    }
    t_sec /= d;
    t_ossl /= d;
    t_var /= d;
    /* without the CRT: c^lambda mod n² (lambda of bits bits), a few */
    mpz_t q, n2, lam;
    mpz_inits(q, n2, lam, NULL);
    mpz_urandomb(q, rs, (mp_bitcnt_t)bits / 2);
    mpz_setbit(q, (mp_bitcnt_t)bits / 2 - 1);
    mpz_nextprime(q, q);
    mpz_mul(n2, p, q);
    mpz_mul(n2, n2, n2);
    mpz_sub_ui(o, q, 1);
    mpz_lcm(lam, e, o);
    int dl = d < 8 ? d : 8;
    tc = thread_cpu();
    for (int i = 0; i < dl; i++) mpz_powm_sec(o, base[i], lam, n2);
    double t_lam = (thread_cpu() - tc) / dl;
    printf("key holder, one thread's CPU time, mean of %d: CRT decryption %.3f ms per ciphertext "
           "(%.1f core-seconds for the %lld of an update); each of its 2 exponentiations "
           "c^(p-1) mod p² (%d-bit p): OpenSSL BN_mod_exp_mont_consttime (used) %.3f ms, "
           "mpz_powm_sec %.3f ms (%.2fx), mpz_powm (not constant time) %.3f ms (%.2fx); "
           "without the CRT, c^lambda mod n² by mpz_powm_sec (mean of %d): %.3f ms\n",
           d, t_dec * 1e3, t_dec * (double)count, (long long)count, bits / 2, t_ossl * 1e3,
           t_sec * 1e3, t_sec / t_ossl, t_var * 1e3, t_var / t_ossl, dl, t_lam * 1e3);
    mpz_clears(q, n2, lam, NULL);
    ts_paillier_dec_scratch_free(ws);
    ts_paillier_crt_free(crt);
    for (int i = 0; i < d; i++) mpz_clear(base[i]);
    free(base);
    gmp_randclear(rs);
    mpz_clears(c, m, p, p2, e, o, NULL);
}

int main(int argc, char **argv) {
    int64_t n = 1000000;
    int k = 3, bits = 2048, reps = 3, sample = 256, dec_sample = 64, headroom = 0, fresh = 1;
    double scale = 1 << 20, clip = 1.0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--cpu") || !strcmp(argv[i], "--no-fresh")) {
            if (argv[i][2] == 'c')
                use_cpu = 1;
            else
                fresh = 0;
            memmove(&argv[i], &argv[i + 1], (size_t)(argc - i - 1) * sizeof *argv);
            argc--;
            i--;
        }
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--params"))
            n = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--clients"))
            k = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--bits"))
            bits = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--scale"))
            scale = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--clip"))
            clip = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rn-sample"))
            sample = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dec-sample"))
            dec_sample = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--max-clients"))
            headroom = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_fed: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (headroom == 0) headroom = k;
    if (n < 1 || k < 2 || k > MAXK || reps < 1 || reps > MAXR || sample < 1 || dec_sample < 1 ||
        headroom < k) {
        fprintf(stderr,
                "bench_fed: params >= 1, clients in [2, %d], max-clients >= clients, reps in "
                "[1, %d], samples >= 1\n",
                MAXK, MAXR);
        return 2;
    }
    printf("federated round (%s): %lld parameters, %d clients, %d OpenMP threads, median of %d\n",
           use_cpu ? "CPU seconds, all threads" : "wall seconds", (long long)n, k,
           omp_get_max_threads(), reps);
    /* client updates: smooth values in [-0.5, 0.5], FedAvg weights by sample count 1, 2, 3, ... */
    float *x[MAXK];
    double w[MAXK], wsum = 0, *ref = malloc((size_t)n * sizeof *ref),
                    *out = malloc((size_t)n * sizeof *out);
    uint64_t *u[MAXK];
    for (int j = 0; j < k; j++) wsum += j + 1;
    for (int j = 0; j < k; j++) {
        w[j] = (j + 1) / wsum;
        x[j] = malloc((size_t)n * sizeof *x[j]);
        u[j] = malloc((size_t)n * sizeof *u[j]);
        for (int64_t i = 0; i < n; i++)
            x[j][i] = (float)(0.5 * sin(0.001 * (double)i * (j + 1) + j));
    }
    ts_fed_pack pack;
    if (ts_fed_pack_init(&pack, scale, clip, headroom, bits) != TS_OK) DIE("pack");
    double t_plain[MAXR], t_q[MAXR], t_menc[MAXR], t_magg[MAXR], t_mfin[MAXR], t_enc[MAXR],
        t_encf[MAXR], t_agg[MAXR], t_dec[MAXR];

    /* plaintext FedAvg: the aggregator sums weighted float updates */

    double plain_bytes = 4.0 * (double)n;

    /* masking: quantise, mask (k clients), sum, unmask */
    ts_fed_pack mpack;
    if (ts_fed_pack_init(&mpack, scale, clip, k, 0) != TS_OK || mpack.slot_bits > 32)
        DIE("masking needs 32-bit slots");
    uint32_t *y = malloc((size_t)n * sizeof *y), *sum = malloc((size_t)n * sizeof *sum),
             *xq = malloc((size_t)n * 4);
    uint64_t *sum64 = malloc((size_t)n * sizeof *sum64);
    double worst_m = 0;

    double mask_bytes = 4.0 * (double)n + 2 * TS_MASK_KEYBYTES + (double)k * TS_MASK_BOX +
                        (double)(k + 1) * sizeof(ts_mask_share);

    /* Paillier with packing */
    ts_paillier_priv *sk;
    ts_paillier_pub *pk;
    double t0 = now();
    if (ts_paillier_keygen(bits, &sk) != TS_OK || ts_paillier_pub_of(sk, &pk) != TS_OK)
        DIE("keygen");
    double t_keygen = now() - t0;
    /* the same n without hs: every r^n a full exponentiation (a v1 key) */
    ts_paillier_pub *pk_full;
    if (ts_paillier_pub_from_n(*ts_paillier_n(pk), &pk_full) != TS_OK) DIE("public key from n");
    mpz_t *ring = malloc((size_t)sample * sizeof *ring);
    for (int i = 0; i < sample; i++) mpz_init(ring[i]);
    double tc = thread_cpu();
    if (ts_paillier_fresh_rn(pk, ring[0]) != TS_OK) DIE("DJN table");
    double t_table = thread_cpu() - tc, t_full = 0, t_djn = 0;
    for (int b = 0; b < sample; b += 8) {
        tc = thread_cpu();
        for (int i = b; i < b + 8 && i < sample; i++)
            if (ts_paillier_fresh_rn(pk_full, ring[i]) != TS_OK) DIE("full r^n");
        t_full += thread_cpu() - tc;
        tc = thread_cpu();
        for (int i = b; i < b + 8 && i < sample; i++)
            if (ts_paillier_fresh_rn(pk, ring[i]) != TS_OK) DIE("DJN r^n");
        t_djn += thread_cpu() - tc;
    }
    t_full /= sample;
    t_djn /= sample;
    printf("r^n mod n² (%d-bit n), one thread's CPU time, mean of %d each, alternating: full "
           "r^n %.3f ms, DJN hs^a (%d-bit a) %.3f ms, %.1fx faster; its table: %.3f s once per "
           "key\n",
           bits, sample, t_full * 1e3, bits / 2, t_djn * 1e3, t_full / t_djn, t_table);
    fflush(stdout);
    int64_t count = ts_fed_pack_count(&pack, n);
    size_t wct = ts_fed_ct_bytes(pk);
    uint8_t *ct = malloc((size_t)count * wct), *acc = malloc((size_t)count * wct);
    double worst_p = 0;

    /* the three modes in turn within each repetition, so a change in the
     * machine's load touches all of them alike */
    for (int r = 0; r < reps; r++) {
        {
            double t0 = now();
            for (int64_t i = 0; i < n; i++) {
                double s = 0;
                for (int j = 0; j < k; j++) s += w[j] * (double)x[j][i];
                ref[i] = s;
            }
            t_plain[r] = now() - t0;
        }
        {
            ts_mask_client *c[MAXK + 1];
            ts_mask_server *sv;
            ts_mask_keys keys[MAXK + 1];
            uint8_t u1[MAXK + 1] = {0}, *boxes = malloc((size_t)(k + 1) * k * TS_MASK_BOX);
            if (ts_mask_server_new(k, k / 2 + 1, (uint64_t)r, n, &sv) != TS_OK) DIE("mask server");
            for (int j = 1; j <= k; j++) {
                if (ts_mask_client_new(j, k, k / 2 + 1, (uint64_t)r, &c[j]) != TS_OK)
                    DIE("mask client");
                ts_mask_client_keys(c[j], &keys[j]);
                ts_mask_server_keys(sv, j, &keys[j]);
                u1[j] = 1;
            }
            for (int j = 1; j <= k; j++)
                if (ts_mask_client_share(c[j], keys, u1, boxes + (size_t)j * k * TS_MASK_BOX) !=
                    TS_OK)
                    DIE("share");
            for (int j = 1; j <= k; j++)
                for (int v = 1; v <= k; v++)
                    if (v != j &&
                        ts_mask_client_accept(
                            c[v], j, boxes + ((size_t)j * k + (size_t)(v - 1)) * TS_MASK_BOX))
                        DIE("accept");
            double tq = 0, te = 0, ta = 0;
            for (int j = 1; j <= k; j++) {
                double t0 = now();
                if (ts_fed_quantize(&mpack, x[j - 1], n, w[j - 1], u[j - 1], NULL) != TS_OK)
                    DIE("quantize");
                for (int64_t i = 0; i < n; i++) xq[i] = (uint32_t)u[j - 1][i];
                double t1 = now();
                if (ts_mask_client_mask(c[j], u1, xq, n, y) != TS_OK) DIE("mask");
                double t2 = now();
                if (ts_mask_server_add(sv, j, y) != TS_OK) DIE("add");
                tq += t1 - t0;
                te += t2 - t1;
                ta += now() - t2;
            }
            ts_mask_share sh[MAXK + 1];
            double t0 = now();
            for (int j = 1; j <= k; j++)
                if (ts_mask_client_unmask(c[j], u1, u1, sh) != TS_OK ||
                    ts_mask_server_shares(sv, j, sh) != TS_OK)
                    DIE("unmask");
            int count = 0;
            if (ts_mask_server_finish(sv, u1, sum, &count) != TS_OK) DIE("finish");
            for (int64_t i = 0; i < n; i++) sum64[i] = sum[i];
            if (ts_fed_decode_sums(&mpack, sum64, n, count, out) != TS_OK) DIE("decode");
            t_mfin[r] = now() - t0;
            t_q[r] = tq / k;
            t_menc[r] = te / k;
            t_magg[r] = ta;
            for (int64_t i = 0; i < n; i++) worst_m = fmax(worst_m, fabs(out[i] - ref[i]));
            for (int j = 1; j <= k; j++) ts_mask_client_free(c[j]);
            ts_mask_server_free(sv);
            free(boxes);
        }
        {
            double te = 0, tf = 0, ta = 0;
            ts_fed_aggregate_init(pk, acc, count);
            for (int j = 0; j < k; j++) {
                double t1 = now();
                if (ts_fed_quantize(&pack, x[j], n, w[j], u[j], NULL) != TS_OK) DIE("quantize");
                if (ts_fed_encrypt_update(pk, &pack, u[j], n, ct, (const mpz_t *)ring, sample) !=
                    TS_OK)
                    DIE("encrypt");
                double t2 = now();
                /* again with a fresh DJN r^n per ciphertext (no pool); the
                 * aggregate takes these */
                if (fresh && (ts_fed_quantize(&pack, x[j], n, w[j], u[j], NULL) != TS_OK ||
                              ts_fed_encrypt_update(pk, &pack, u[j], n, ct, NULL, 0) != TS_OK))
                    DIE("encrypt with fresh r^n");
                double t3 = now();
                if (ts_fed_aggregate(pk, acc, ct, count) != TS_OK) DIE("aggregate");
                te += t2 - t1;
                tf += t3 - t2;
                ta += now() - t3;
            }
            double t3 = now();
            if (ts_fed_decrypt_sum(sk, &pack, acc, n, k, out) != TS_OK) DIE("decrypt");
            t_dec[r] = now() - t3;
            t_enc[r] = te / k;
            t_encf[r] = tf / k;
            t_agg[r] = ta;
            for (int64_t i = 0; i < n; i++) worst_p = fmax(worst_p, fabs(out[i] - ref[i]));
        }
    }
    double pail_bytes = (double)count * (double)wct;
    double bound = ts_fed_pack_bound(&pack, k);

    double mp = ts_median(t_plain, reps), mq = ts_median(t_q, reps), mme = ts_median(t_menc, reps),
           mma = ts_median(t_magg, reps), mmf = ts_median(t_mfin, reps),
           mpe = ts_median(t_enc, reps), mpa = ts_median(t_agg, reps), mpd = ts_median(t_dec, reps),
           mpf = ts_median(t_encf, reps);
    printf("fixed point: scale %g, clip %g, %d-bit slots (headroom for %d clients), bound %.3g; "
           "largest error: masking %.3g, paillier %.3g\n",
           scale, clip, pack.slot_bits, headroom, bound, worst_m, worst_p);
    printf("%-22s %12s %8s %12s %12s %12s %12s %8s\n", "mode", "MB up/client", "x plain",
           "encode+enc", "aggregate", "unmask/dec", "round s", "x plain");
    double rp = mp, rm = mq + mme + mma + mmf, rpa = mpe + mpa + mpd;
    printf("%-22s %12.2f %8.2f %12.4f %12.4f %12.4f %12.4f %8.2f\n", "plaintext FedAvg",
           plain_bytes / 1e6, 1.0, 0.0, mp, 0.0, rp, 1.0);
    printf("%-22s %12.2f %8.2f %12.4f %12.4f %12.4f %12.4f %8.1f\n", "masking", mask_bytes / 1e6,
           mask_bytes / plain_bytes, mq + mme, mma, mmf, rm, rm / rp);
    printf("%-22s %12.2f %8.2f %12.4f %12.4f %12.4f %12.4f %8.1f\n", "paillier, full pool",
           pail_bytes / 1e6, pail_bytes / plain_bytes, mpe, mpa, mpd, rpa, rpa / rp);
    double rpf = mpf + mpa + mpd;
    if (fresh)
        printf("%-22s %12.2f %8.2f %12.4f %12.4f %12.4f %12.4f %8.1f\n", "paillier, fresh DJN r^n",
               pail_bytes / 1e6, pail_bytes / plain_bytes, mpf, mpa, mpd, rpf, rpf / rp);
    decrypt_sample(sk, acc, count, wct, bits, dec_sample);
    printf("paillier %d-bit: keygen %.2f s; %lld ciphertexts of %zu bytes per update (%d slots "
           "each; one value "
           "per ciphertext would be %.0f MB); the r^n for one update: %.1f core-seconds full, "
           "%.1f DJN\n",
           bits, t_keygen, (long long)count, wct, pack.slots, (double)n * (double)wct / 1e6,
           t_full * (double)count, t_djn * (double)count);
    int ok = worst_m <= bound && worst_p <= bound;
    if (!ok) printf("ERROR: a decoded average is off by more than the bound\n");
    for (int i = 0; i < sample; i++) mpz_clear(ring[i]);
    free(ring);
    free(ct);
    free(acc);
    ts_paillier_pub_free(pk);
    ts_paillier_pub_free(pk_full);
    ts_paillier_priv_free(sk);
    for (int j = 0; j < k; j++) free(x[j]), free(u[j]);
    free(ref);
    free(out);
    free(y);
    free(sum);
    free(sum64);
    free(xq);
    return ok ? 0 : 1;
}
