/* paillier_keys.c — Paillier key generation (primes from getrandom(2)),
 * the precomputed CRT constants, and the key files (docs/federated.md):
 *
 *     # tessel paillier private key v1          # tessel paillier public key v2
 *     bits 2048                                 bits 2048
 *     p <hex>                                   n <hex>
 *     q <hex>                                   hs <hex>
 *
 * A private key file is written 0600 and refused when group or others may
 * read it (like ssh refuses an open private key). hs, the DJN base of the
 * cheap r^n (paillier_djn.c), is public and drawn afresh with every public
 * half of a private key; a v1 public key (n alone) still loads, and its
 * encryptions compute full r^n. */
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "fed/paillier_internal.h"

#define PRIV_HEADER  "# tessel paillier private key v1"
#define PUB_HEADER   "# tessel paillier public key v2"
#define PUB_HEADER_1 "# tessel paillier public key v1"
#define KEY_FILE_MAX (64 * 1024)

static int bits_ok(int bits) {
    return bits == 1024 || bits == 2048 || bits == 3072 || bits == 4096;
}

ts_status ts_paillier_pub_from_n(const mpz_t n, ts_paillier_pub **out) {
    *out = NULL;
    int bits = (int)mpz_sizeinbase(n, 2);
    if (mpz_sgn(n) <= 0 || !bits_ok(bits) || mpz_even_p(n))
        return ts_fail(TS_ERR_INVALID,
                       "paillier: n of %d bits is not an odd 1024/2048/3072/4096-bit modulus",
                       bits);
    ts_paillier_pub *pk = calloc(1, sizeof *pk);
    if (!pk) return ts_fail(TS_ERR_NOMEM, "paillier: public key");
    mpz_init_set(pk->n, n);
    mpz_inits(pk->n2, pk->hs, NULL);
    mpz_mul(pk->n2, n, n);
    pk->bits = bits;
    pthread_mutex_init(&pk->fb_mu, NULL);
    *out = pk;
    return TS_OK;
}

ts_status ts_paillier_pub_from_n_hs(const mpz_t n, const mpz_t hs, ts_paillier_pub **out) {
    ts_status s = ts_paillier_pub_from_n(n, out);
    if (s != TS_OK) return s;
    if ((s = ts_paillier_check_hs((*out)->n, (*out)->n2, hs, "public key")) != TS_OK) {
        ts_paillier_pub_free(*out);
        *out = NULL;
        return s;
    }
    mpz_set((*out)->hs, hs);
    (*out)->has_hs = 1;
    return TS_OK;
}

void ts_paillier_pub_free(ts_paillier_pub *pk) {
    if (!pk) return;
    ts_paillier_pool_stop(pk);
    ts_paillier_djn_free(pk);
    pthread_mutex_destroy(&pk->fb_mu);
    mpz_clears(pk->n, pk->n2, pk->hs, NULL);
    free(pk);
}

void ts_paillier_priv_free(ts_paillier_priv *sk) {
    if (!sk) return;
    ts_paillier_mpz_wipe(sk->p);
    ts_paillier_mpz_wipe(sk->q);
    ts_paillier_mpz_wipe(sk->p2);
    ts_paillier_mpz_wipe(sk->q2);
    ts_paillier_mpz_wipe(sk->pm1);
    ts_paillier_mpz_wipe(sk->qm1);
    ts_paillier_mpz_wipe(sk->hp);
    ts_paillier_mpz_wipe(sk->hq);
    ts_paillier_mpz_wipe(sk->q_inv_p);
    ts_paillier_crt_free(sk->crt);
    mpz_clears(sk->n, sk->n2, NULL);
    free(sk);
}

ts_status ts_paillier_pub_of(const ts_paillier_priv *sk, ts_paillier_pub **out) {
    /* DJN: hs = (-h²)^n mod n² for h uniform in Z*_n */
    mpz_t h, hs;
    mpz_inits(h, hs, NULL);
    ts_status s = ts_paillier_random_unit(sk->n, sk->bits, h);
    if (s == TS_OK) {
        mpz_mul(h, h, h);
        mpz_neg(h, h);
        mpz_mod(h, h, sk->n);
        mpz_powm(hs, h, sk->n, sk->n2);
        s = ts_paillier_pub_from_n_hs(sk->n, hs, out);
    }
    ts_paillier_mpz_wipe(h);
    mpz_clear(hs);
    return s;
}

/* h = L_pr(g^(pr-1) mod pr²)^-1 mod pr with g = n + 1. */
static int crt_h(mpz_t h, const mpz_t n, const mpz_t pr, const mpz_t pr2, const mpz_t prm1) {
    mpz_add_ui(h, n, 1);
    mpz_mod(h, h, pr2);
    mpz_powm_sec(h, h, prm1, pr2);
    mpz_sub_ui(h, h, 1);
    mpz_divexact(h, h, pr);
    return mpz_invert(h, h, pr) != 0;
}

ts_status ts_paillier_priv_from_pq(const mpz_t p, const mpz_t q, ts_paillier_priv **out) {
    *out = NULL;
    size_t pb = mpz_sizeinbase(p, 2), qb = mpz_sizeinbase(q, 2);
    if (mpz_sgn(p) <= 0 || mpz_sgn(q) <= 0 || mpz_cmp(p, q) == 0 || pb != qb)
        return ts_fail(TS_ERR_INVALID,
                       "paillier: p and q must be distinct primes of the same size "
                       "(%zu and %zu bits)",
                       pb, qb);
    if (mpz_probab_prime_p(p, 30) == 0 || mpz_probab_prime_p(q, 30) == 0)
        return ts_fail(TS_ERR_INVALID, "paillier: p or q is not prime");
    ts_paillier_priv *sk = calloc(1, sizeof *sk);
    if (!sk) return ts_fail(TS_ERR_NOMEM, "paillier: private key");
    mpz_inits(sk->p, sk->q, sk->n, sk->n2, sk->p2, sk->q2, sk->pm1, sk->qm1, sk->hp, sk->hq,
              sk->q_inv_p, NULL);
    mpz_set(sk->p, p);
    mpz_set(sk->q, q);
    mpz_mul(sk->n, p, q);
    mpz_mul(sk->n2, sk->n, sk->n);
    mpz_mul(sk->p2, p, p);
    mpz_mul(sk->q2, q, q);
    mpz_sub_ui(sk->pm1, p, 1);
    mpz_sub_ui(sk->qm1, q, 1);
    sk->bits = (int)mpz_sizeinbase(sk->n, 2);
    ts_status s = TS_OK;
    mpz_t phi, g;
    mpz_inits(phi, g, NULL);
    mpz_mul(phi, sk->pm1, sk->qm1);
    mpz_gcd(g, phi, sk->n);
    if (!bits_ok(sk->bits))
        s = ts_fail(TS_ERR_INVALID, "paillier: n has %d bits, not 1024/2048/3072/4096", sk->bits);
    else if (mpz_cmp_ui(g, 1) != 0)
        s = ts_fail(TS_ERR_INVALID, "paillier: gcd(n, (p-1)(q-1)) != 1");
    else if (!crt_h(sk->hp, sk->n, sk->p, sk->p2, sk->pm1) ||
             !crt_h(sk->hq, sk->n, sk->q, sk->q2, sk->qm1) ||
             mpz_invert(sk->q_inv_p, sk->q, sk->p) == 0)
        s = ts_fail(TS_ERR_INVALID, "paillier: the CRT constants do not exist for these p and q");
    else
        s = ts_paillier_crt_init(sk->p2, sk->q2, sk->pm1, sk->qm1, &sk->crt);
    ts_paillier_mpz_wipe(phi);
    mpz_clear(g);
    if (s != TS_OK) {
        ts_paillier_priv_free(sk);
        return s;
    }
    *out = sk;
    return TS_OK;
}

/* A random probable prime of exactly `bits` bits with its top two bits set
 * (so a product of two has exactly 2·bits bits). */
static ts_status random_prime(mpz_t p, int bits) {
    unsigned char buf[4096 / 16];
    size_t nb = (size_t)bits / 8;
    for (int tries = 0; tries < 64; tries++) {
        ts_status s = ts_fed_os_random(buf, nb);
        if (s != TS_OK) return s;
        buf[0] |= 0xC0;
        buf[nb - 1] |= 1;
        mpz_import(p, nb, 1, 1, 0, 0, buf);
        sodium_memzero(buf, sizeof buf);
        mpz_nextprime(p, p);
        /* nextprime's own test is probabilistic too: more Miller-Rabin rounds */
        if ((int)mpz_sizeinbase(p, 2) == bits && mpz_probab_prime_p(p, 40) > 0) return TS_OK;
    }
    return ts_fail(TS_ERR_INTERNAL, "paillier: no %d-bit prime found", bits);
}

ts_status ts_paillier_keygen(int bits, ts_paillier_priv **out) {
    *out = NULL;
    if (!bits_ok(bits))
        return ts_fail(TS_ERR_INVALID, "paillier: key size %d not 1024/2048/3072/4096", bits);
    mpz_t p, q, d;
    mpz_inits(p, q, d, NULL);
    ts_status s;
    for (;;) {
        if ((s = random_prime(p, bits / 2)) != TS_OK || (s = random_prime(q, bits / 2)) != TS_OK)
            break;
        /* |p - q| must not be small (Fermat factoring): at least 2^(bits/2 - 100) */
        mpz_sub(d, p, q);
        mpz_abs(d, d);
        if (mpz_sizeinbase(d, 2) < (size_t)bits / 2 - 100) continue;
        s = ts_paillier_priv_from_pq(p, q, out);
        break;
    }
    ts_paillier_mpz_wipe(p);
    ts_paillier_mpz_wipe(q);
    ts_paillier_mpz_wipe(d);
    return s;
}

/* ---- key files ---- */

static ts_status write_key_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return ts_fail(TS_ERR_IO, "paillier: cannot write key file %s: %s", path, strerror(errno));
    ts_status s = TS_OK;
    /* an existing file keeps its mode through O_TRUNC: set it */
    if (fchmod(fd, 0600) != 0)
        s = ts_fail(TS_ERR_IO, "paillier: chmod 600 %s: %s", path, strerror(errno));
    size_t len = strlen(text), done = 0;
    while (s == TS_OK && done < len) {
        ssize_t k = write(fd, text + done, len - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            s = ts_fail(TS_ERR_IO, "paillier: writing %s: %s", path, strerror(errno));
        else
            done += (size_t)k;
    }
    if (s == TS_OK && fsync(fd) != 0)
        s = ts_fail(TS_ERR_IO, "paillier: fsync %s: %s", path, strerror(errno));
    if (close(fd) != 0 && s == TS_OK)
        s = ts_fail(TS_ERR_IO, "paillier: close %s: %s", path, strerror(errno));
    return s;
}

/* Reads a whole key file (at most KEY_FILE_MAX bytes); with `secret`, refuses
 * a file group or others can read. */
static ts_status read_key_file(const char *path, int secret, char **out) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return ts_fail(TS_ERR_IO, "paillier: cannot open key file %s: %s", path, strerror(errno));
    struct stat st;
    ts_status s = TS_OK;
    if (fstat(fd, &st) != 0)
        s = ts_fail(TS_ERR_IO, "paillier: stat %s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        s = ts_fail(TS_ERR_IO, "paillier: key file %s is not a regular file", path);
    else if (secret && (st.st_mode & 077))
        s = ts_fail(TS_ERR_INVALID,
                    "paillier: private key file %s has mode %04o: group or others can access it; "
                    "it must be 0600 (chmod 600 %s)",
                    path, (unsigned)(st.st_mode & 07777), path);
    else if (st.st_size > KEY_FILE_MAX)
        s = ts_fail(TS_ERR_FORMAT, "paillier: key file %s is larger than %d bytes", path,
                    KEY_FILE_MAX);
    char *buf = NULL;
    if (s == TS_OK && !(buf = calloc((size_t)st.st_size + 1, 1)))
        s = ts_fail(TS_ERR_NOMEM, "paillier: %s", path);
    size_t done = 0;
    while (s == TS_OK && done < (size_t)st.st_size) {
        ssize_t k = read(fd, buf + done, (size_t)st.st_size - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            s = ts_fail(TS_ERR_IO, "paillier: reading %s: %s", path,
                        k < 0 ? strerror(errno) : "short");
        else
            done += (size_t)k;
    }
    close(fd);
    if (s != TS_OK) {
        if (buf) sodium_memzero(buf, (size_t)st.st_size);
        free(buf);
        return s;
    }
    *out = buf;
    return TS_OK;
}

/* Parses "header\nbits B\nk1 HEX\n[k2 HEX\n]" into vals (n_vals of them). */
static ts_status parse_key(const char *path, char *text, const char *header,
                           const char *const *keys, mpz_t *vals, int n_vals, int *bits) {
    char *save = NULL, *line = strtok_r(text, "\n", &save);
    if (!line || strcmp(line, header) != 0)
        return ts_fail(TS_ERR_FORMAT, "paillier: %s: first line is not \"%s\"", path, header);
    line = strtok_r(NULL, "\n", &save);
    if (!line || sscanf(line, "bits %d", bits) != 1 || !bits_ok(*bits))
        return ts_fail(TS_ERR_FORMAT,
                       "paillier: %s: second line must be \"bits 1024|2048|3072|4096\"", path);
    for (int i = 0; i < n_vals; i++) {
        line = strtok_r(NULL, "\n", &save);
        size_t kl = strlen(keys[i]);
        if (!line || strncmp(line, keys[i], kl) != 0 || line[kl] != ' ' || line[kl + 1] == 0 ||
            strspn(line + kl + 1, "0123456789abcdefABCDEF") != strlen(line + kl + 1) ||
            mpz_set_str(vals[i], line + kl + 1, 16) != 0)
            return ts_fail(TS_ERR_FORMAT, "paillier: %s: line %d must be \"%s <hex>\"", path, i + 3,
                           keys[i]);
    }
    if (strtok_r(NULL, "\n", &save))
        return ts_fail(TS_ERR_FORMAT, "paillier: %s: unexpected text after the key", path);
    return TS_OK;
}

ts_status ts_paillier_priv_save(const ts_paillier_priv *sk, const char *path) {
    size_t cap = 128 + 2 * ((size_t)sk->bits / 4 + 4);
    char *text = malloc(cap);
    if (!text) return ts_fail(TS_ERR_NOMEM, "paillier: %s", path);
    gmp_snprintf(text, cap, PRIV_HEADER "\nbits %d\np %Zx\nq %Zx\n", sk->bits, sk->p, sk->q);
    ts_status s = write_key_file(path, text);
    sodium_memzero(text, cap);
    free(text);
    return s;
}

ts_status ts_paillier_pub_to_text(const ts_paillier_pub *pk, char **text) {
    size_t cap = 128 + 3 * ((size_t)pk->bits / 4 + 4);
    if (!(*text = malloc(cap))) return ts_fail(TS_ERR_NOMEM, "paillier: public key text");
    if (pk->has_hs)
        gmp_snprintf(*text, cap, PUB_HEADER "\nbits %d\nn %Zx\nhs %Zx\n", pk->bits, pk->n, pk->hs);
    else /* a key from n alone: the v1 text, which says there is no hs */
        gmp_snprintf(*text, cap, PUB_HEADER_1 "\nbits %d\nn %Zx\n", pk->bits, pk->n);
    return TS_OK;
}

ts_status ts_paillier_pub_save(const ts_paillier_pub *pk, const char *path) {
    char *text;
    ts_status s = ts_paillier_pub_to_text(pk, &text);
    if (s != TS_OK) return s;
    s = write_key_file(path, text);
    free(text);
    return s;
}

ts_status ts_paillier_priv_load(const char *path, ts_paillier_priv **out) {
    *out = NULL;
    char *text;
    ts_status s = read_key_file(path, 1, &text);
    if (s != TS_OK) return s;
    size_t len = strlen(text);
    static const char *const keys[2] = {"p", "q"};
    mpz_t v[2];
    mpz_inits(v[0], v[1], NULL);
    int bits = 0;
    s = parse_key(path, text, PRIV_HEADER, keys, v, 2, &bits);
    if (s == TS_OK) s = ts_paillier_priv_from_pq(v[0], v[1], out);
    if (s == TS_OK && (*out)->bits != bits) {
        s = ts_fail(TS_ERR_FORMAT, "paillier: %s says bits %d but p·q has %d", path, bits,
                    (*out)->bits);
        ts_paillier_priv_free(*out);
        *out = NULL;
    }
    if (s != TS_OK) ts_error_prefix("loading private key %s", path);
    ts_paillier_mpz_wipe(v[0]);
    ts_paillier_mpz_wipe(v[1]);
    sodium_memzero(text, len);
    free(text);
    return s;
}

static ts_status pub_parse(const char *path, char *text, ts_paillier_pub **out);

ts_status ts_paillier_pub_from_text(const char *text, size_t len, ts_paillier_pub **out) {
    *out = NULL;
    if (len > KEY_FILE_MAX)
        return ts_fail(TS_ERR_FORMAT, "paillier: a public key of %zu bytes", len);
    char *copy = malloc(len + 1);
    if (!copy) return ts_fail(TS_ERR_NOMEM, "paillier: public key text");
    memcpy(copy, text, len);
    copy[len] = 0;
    if (strlen(copy) != len) {
        free(copy);
        return ts_fail(TS_ERR_FORMAT, "paillier: a public key with a NUL byte");
    }
    return pub_parse("(received public key)", copy, out);
}

ts_status ts_paillier_pub_load(const char *path, ts_paillier_pub **out) {
    *out = NULL;
    char *text;
    ts_status s = read_key_file(path, 0, &text);
    if (s != TS_OK) return s;
    return pub_parse(path, text, out);
}

/* Parses a public key's text (freed here): v2 (n and hs) or v1 (n alone,
 * said once in the log: every encryption then computes a full r^n). */
static ts_status pub_parse(const char *path, char *text, ts_paillier_pub **out) {
    ts_status s;
    static const char *const keys[2] = {"n", "hs"};
    int v1 = strncmp(text, PUB_HEADER_1 "\n", strlen(PUB_HEADER_1) + 1) == 0;
    mpz_t v[2];
    mpz_inits(v[0], v[1], NULL);
    int bits = 0;
    s = parse_key(path, text, v1 ? PUB_HEADER_1 : PUB_HEADER, keys, v, v1 ? 1 : 2, &bits);
    if (s == TS_OK && v1) {
        s = ts_paillier_pub_from_n(v[0], out);
        if (s == TS_OK)
            ts_logf(TS_LOG_WARN,
                    "paillier: %s is a v1 public key (no DJN base hs): every encryption computes "
                    "a full r^n mod n², about ten times the cost; a key holder of this version "
                    "sends v2 keys",
                    path);
    } else if (s == TS_OK) {
        s = ts_paillier_pub_from_n_hs(v[0], v[1], out);
        if (s != TS_OK) ts_error_prefix("%s", path);
    }
    if (s == TS_OK && (*out)->bits != bits) {
        s = ts_fail(TS_ERR_FORMAT, "paillier: %s says bits %d but n has %d", path, bits,
                    (*out)->bits);
        ts_paillier_pub_free(*out);
        *out = NULL;
    }
    mpz_clears(v[0], v[1], NULL);
    free(text);
    return s;
}
