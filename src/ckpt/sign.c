/* Ed25519 keys and signatures (libsodium). Key files are one text line
 * after a header line, so they survive copy and paste:
 *
 *     tessel-ed25519-private-key
 *     <128 hex digits: libsodium's 64-byte secret key (seed then public key)>
 *
 *     tessel-ed25519-public-key
 *     <64 hex digits>
 *
 * A private key file readable by group or others is refused, as ssh does:
 * whoever can read it can sign checkpoints in the owner's name. */
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "ckpt_internal.h"

static const char SK_HEADER[] = "tessel-ed25519-private-key\n";
static const char PK_HEADER[] = "tessel-ed25519-public-key\n";

static ts_status sodium_ready(void) {
    if (sodium_init() < 0)
        return ts_fail(TS_ERR_INTERNAL, "libsodium failed to initialise (no entropy source?)");
    return TS_OK;
}

ts_status ts_ckpt_keygen(const char *private_key_path, const char *public_key_path) {
    if (!private_key_path || !public_key_path) return ts_fail(TS_ERR_INVALID, "keygen: NULL path");
    ts_status s = sodium_ready();
    if (s != TS_OK) return s;
    ck_key k;
    crypto_sign_keypair(k.pk, k.sk);
    char sk_text[sizeof SK_HEADER + 2 * CK_SK_BYTES + 2],
        pk_text[sizeof PK_HEADER + 2 * CK_PK_BYTES + 2];
    char hex[2 * CK_SK_BYTES + 1], pk_hex[2 * CK_PK_BYTES + 1];
    ts_hex(k.sk, CK_SK_BYTES, hex);
    snprintf(sk_text, sizeof sk_text, "%s%s\n", SK_HEADER, hex);
    ts_hex(k.pk, CK_PK_BYTES, pk_hex);
    snprintf(pk_text, sizeof pk_text, "%s%s\n", PK_HEADER, pk_hex);
    /* Write the public key first: if the private one then fails, no secret
     * was left lying around, and the user deletes one harmless file. */
    s = ck_write_sync(public_key_path, pk_text, strlen(pk_text), 0644, 1);
    if (s == TS_OK) {
        /* Created with O_EXCL and mode 0600 (the umask only clears bits),
         * so no other user can ever have had it open. */
        s = ck_write_sync(private_key_path, sk_text, strlen(sk_text), 0600, 1);
        if (s != TS_OK) unlink(public_key_path);
    }
    sodium_memzero(sk_text, sizeof sk_text);
    sodium_memzero(hex, sizeof hex);
    ck_key_wipe(&k);
    return s;
}

static ts_status load_key(const char *path, const char *header, unsigned char *out, size_t n,
                          const char *what) {
    char *text;
    ts_status s = ck_read_file(path, 4096, &text, NULL);
    if (s != TS_OK) {
        ts_error_prefix("%s", what);
        return s;
    }
    size_t hl = strlen(header);
    char *line = text + hl;
    if (strncmp(text, header, hl) != 0) {
        s = ts_fail(TS_ERR_FORMAT, "%s: not a %.*s file (first line must be '%.*s')", path,
                    (int)hl - 1, header, (int)hl - 1, header);
    } else {
        line[strcspn(line, "\r\n")] = '\0';
        if (!ck_unhex(line, out, n))
            s = ts_fail(TS_ERR_FORMAT, "%s: the key must be %zu hex digits on the second line",
                        path, 2 * n);
    }
    sodium_memzero(text, strlen(text));
    free(text);
    return s;
}

ts_status ck_key_load_secret(const char *path, ck_key *k) {
    memset(k, 0, sizeof *k);
    ts_status s = sodium_ready();
    if (s != TS_OK) return s;
    struct stat st;
    if (stat(path, &st) != 0)
        return ts_fail(TS_ERR_IO, "private key %s: %s", path, strerror(errno));
    if (st.st_mode & 077)
        return ts_fail(TS_ERR_INVALID,
                       "private key %s: readable by others (mode %03o); run chmod 600 on it", path,
                       (unsigned)(st.st_mode & 0777));
    s = load_key(path, SK_HEADER, k->sk, CK_SK_BYTES, "private key");
    if (s != TS_OK) return s;
    /* The secret key embeds its public key; rederive it to catch a file
     * whose halves do not belong together. */
    unsigned char pk[CK_PK_BYTES];
    crypto_sign_ed25519_sk_to_pk(pk, k->sk);
    unsigned char seed[32], pk2[CK_PK_BYTES], sk2[CK_SK_BYTES];
    crypto_sign_ed25519_sk_to_seed(seed, k->sk);
    crypto_sign_seed_keypair(pk2, sk2, seed);
    int ok = memcmp(pk, pk2, CK_PK_BYTES) == 0;
    sodium_memzero(seed, sizeof seed);
    sodium_memzero(sk2, sizeof sk2);
    if (!ok) {
        ck_key_wipe(k);
        return ts_fail(TS_ERR_FORMAT, "private key %s: damaged (its public half does not match)",
                       path);
    }
    memcpy(k->pk, pk, CK_PK_BYTES);
    k->has_secret = 1;
    return TS_OK;
}

ts_status ck_key_load_public(const char *path, ck_key *k) {
    memset(k, 0, sizeof *k);
    ts_status s = sodium_ready();
    if (s != TS_OK) return s;
    /* "ed25519:<64 hex digits>": the key itself (ts_ckpt_public_key_of). */
    if (!strncmp(path, "ed25519:", 8)) {
        if (!ck_unhex(path + 8, k->pk, CK_PK_BYTES))
            return ts_fail(TS_ERR_INVALID,
                           "public key '%.80s': needs 64 hex digits after "
                           "'ed25519:'",
                           path);
        return TS_OK;
    }
    return load_key(path, PK_HEADER, k->pk, CK_PK_BYTES, "public key");
}

ts_status ts_ckpt_public_key_of(const char *private_key_path, char out[73]) {
    if (!private_key_path || !out) return ts_fail(TS_ERR_INVALID, "public_key_of: NULL argument");
    out[0] = '\0';
    ck_key k;
    ts_status s = ck_key_load_secret(private_key_path, &k);
    if (s != TS_OK) return s;
    char hex[2 * CK_PK_BYTES + 1];
    ts_hex(k.pk, CK_PK_BYTES, hex);
    snprintf(out, 73, "ed25519:%s", hex);
    ck_key_wipe(&k);
    return TS_OK;
}

void ck_sign(const ck_key *k, const void *msg, size_t n, char out[2 * CK_SIG_BYTES + 1]) {
    unsigned char sig[CK_SIG_BYTES];
    crypto_sign_detached(sig, NULL, msg, n, k->sk);
    ts_hex(sig, CK_SIG_BYTES, out);
}

int ck_verify(const unsigned char pk[CK_PK_BYTES], const void *msg, size_t n, const char *sig_hex) {
    unsigned char sig[CK_SIG_BYTES];
    if (sodium_init() < 0 || !ck_unhex(sig_hex, sig, CK_SIG_BYTES)) return 0;
    return crypto_sign_verify_detached(sig, msg, n, pk) == 0;
}

void ck_key_wipe(ck_key *k) {
    sodium_memzero(k, sizeof *k);
}

ts_status ts_ckpt_sign_text(const char *private_key_path, const void *msg, size_t n, char sig[129],
                            char public_key[73]) {
    if (!private_key_path || !msg || !sig || !public_key)
        return ts_fail(TS_ERR_INVALID, "sign_text: NULL argument");
    ck_key k;
    ts_status s = ck_key_load_secret(private_key_path, &k);
    if (s != TS_OK) return s;
    ck_sign(&k, msg, n, sig);
    char hex[2 * CK_PK_BYTES + 1];
    ts_hex(k.pk, CK_PK_BYTES, hex);
    snprintf(public_key, 73, "ed25519:%s", hex);
    ck_key_wipe(&k);
    return TS_OK;
}

ts_status ts_sha256_bytes(const void *data, size_t n, char hex[65]) {
    if ((!data && n) || !hex) return ts_fail(TS_ERR_INVALID, "sha256_bytes: NULL argument");
    return ts_sha256_mem(data ? data : "", n, hex);
}
