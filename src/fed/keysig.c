/* keysig.c — signing and checking the key holder's Paillier public key
 * (keysig.h): OpenSSL's EVP signatures with the key holder's TLS key, and
 * the certificate checked against the run's CA like a TLS peer's. */
#include "fed/keysig.h"
#include <errno.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <openssl/x509_vfy.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fed/wire.h"

/* What the signature covers before the text: the purpose, so a signature
 * made with the same key for something else (TLS handshakes sign their own
 * context string) is never taken for this one. */
static const char SIG_CONTEXT[] = "tessel fed paillier public key v1";
/* The largest certificate file sent along (a chain of a few certificates). */
enum { CERT_MAX = 32 << 10 };

/* The bytes signed: context, a zero byte, the text's length and the text. */
static uint8_t *signed_bytes(const char *text, size_t text_len, size_t *len) {
    *len = sizeof SIG_CONTEXT + 4 + text_len; /* sizeof includes the zero byte */
    uint8_t *b = malloc(*len);
    if (!b) return NULL;
    memcpy(b, SIG_CONTEXT, sizeof SIG_CONTEXT);
    put_u32(b + sizeof SIG_CONTEXT, (uint32_t)text_len);
    memcpy(b + sizeof SIG_CONTEXT + 4, text, text_len);
    return b;
}

/* SHA-256 for RSA and EC keys; none for the EdDSA keys, which hash themselves. */
static const EVP_MD *md_of(EVP_PKEY *k) {
    return EVP_PKEY_is_a(k, "ED25519") || EVP_PKEY_is_a(k, "ED448") ? NULL : EVP_sha256();
}

static ts_status read_file(const char *path, size_t most, uint8_t **data, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return ts_fail(TS_ERR_IO, "fed: cannot read %s: %s", path, strerror(errno));
    uint8_t *b = malloc(most + 1);
    size_t n = b ? fread(b, 1, most + 1, f) : 0;
    int err = ferror(f);
    fclose(f);
    if (!b) return ts_fail(TS_ERR_NOMEM, "fed: reading %s", path);
    if (err || n > most) {
        free(b);
        return err ? ts_fail(TS_ERR_IO, "fed: cannot read %s", path)
                   : ts_fail(TS_ERR_INVALID, "fed: %s is larger than %zu bytes", path, most);
    }
    *data = b;
    *len = n;
    return TS_OK;
}

/* The first certificate of PEM text. */
static X509 *first_cert(const uint8_t *pem, size_t len) {
    BIO *bio = BIO_new_mem_buf(pem, (int)len);
    X509 *x = bio ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
    BIO_free(bio);
    return x;
}

ts_status ts_fed_pubkey_sign(const ts_fed_tls *tls, const char *text, size_t text_len,
                             uint8_t **msg, size_t *msg_len) {
    *msg = NULL;
    *msg_len = 0;
    uint8_t *cert = NULL, *tbs = NULL, *out = NULL;
    size_t cert_len = 0, tbs_len = 0, sig_len = 0;
    EVP_PKEY *key = NULL;
    X509 *x = NULL;
    EVP_MD_CTX *md = NULL;
    ts_status s = read_file(tls->cert, CERT_MAX, &cert, &cert_len);
    if (s == TS_OK) {
        FILE *f = fopen(tls->key, "rb");
        if (f) key = PEM_read_PrivateKey(f, NULL, NULL, NULL);
        if (f) fclose(f);
        if (!key)
            s = ts_fail(TS_ERR_IO, "fed: cannot load the key %s to sign the public key: %s",
                        tls->key, f ? ts_fed_ssl_err(0) : strerror(errno));
    }
    if (s == TS_OK && !(x = first_cert(cert, cert_len)))
        s = ts_fail(TS_ERR_FORMAT, "fed: no certificate in %s: %s", tls->cert, ts_fed_ssl_err(0));
    if (s == TS_OK && X509_check_private_key(x, key) != 1)
        s = ts_fail(TS_ERR_INVALID, "fed: the key %s does not belong to %s", tls->key, tls->cert);
    if (s == TS_OK && text_len > UINT32_MAX)
        s = ts_fail(TS_ERR_INVALID, "fed: a public key text of %zu bytes", text_len);
    if (s == TS_OK && !(tbs = signed_bytes(text, text_len, &tbs_len)))
        s = ts_fail(TS_ERR_NOMEM, "fed: signing the public key");
    if (s == TS_OK &&
        (!(md = EVP_MD_CTX_new()) || EVP_DigestSignInit(md, NULL, md_of(key), NULL, key) != 1 ||
         EVP_DigestSign(md, NULL, &sig_len, tbs, tbs_len) != 1))
        s = ts_fail(TS_ERR_INTERNAL, "fed: cannot sign with %s: %s", tls->key, ts_fed_ssl_err(0));
    size_t total = 12 + text_len + cert_len + sig_len;
    if (s == TS_OK && !(out = malloc(total)))
        s = ts_fail(TS_ERR_NOMEM, "fed: the signed public key");
    if (s == TS_OK) {
        uint8_t *p = out;
        put_u32(p, (uint32_t)text_len);
        memcpy(p + 4, text, text_len);
        p += 4 + text_len;
        put_u32(p, (uint32_t)cert_len);
        memcpy(p + 4, cert, cert_len);
        p += 4 + cert_len;
        if (EVP_DigestSign(md, p + 4, &sig_len, tbs, tbs_len) != 1) {
            s = ts_fail(TS_ERR_INTERNAL, "fed: cannot sign with %s: %s", tls->key,
                        ts_fed_ssl_err(0));
        } else {
            put_u32(p, (uint32_t)sig_len); /* an ECDSA signature may come out shorter */
            *msg = out;
            *msg_len = (size_t)(p + 4 + sig_len - out);
            out = NULL;
        }
    }
    free(out);
    free(tbs);
    free(cert);
    EVP_MD_CTX_free(md);
    X509_free(x);
    EVP_PKEY_free(key);
    return s;
}

/* The three fields of a payload: text, certificate and signature. */
typedef struct fields {
    const uint8_t *at[3];
    size_t len[3];
} fields;

static ts_status split(const uint8_t *msg, size_t len, fields *f) {
    size_t off = 0;
    for (int i = 0; i < 3; i++) {
        if (len - off < 4 || get_u32(msg + off) > len - off - 4)
            return ts_fail(TS_ERR_FORMAT,
                           "fed: the public key message (%zu bytes) is not a signed public key "
                           "(text, certificate, signature): field %d is cut off",
                           len, i + 1);
        f->len[i] = get_u32(msg + off);
        f->at[i] = msg + off + 4;
        off += 4 + f->len[i];
    }
    if (off != len)
        return ts_fail(TS_ERR_FORMAT,
                       "fed: the public key message has %zu bytes after its signature", len - off);
    return TS_OK;
}

ts_status ts_fed_pubkey_text(const uint8_t *msg, size_t len, const char **text, size_t *text_len) {
    fields f;
    ts_status s = split(msg, len, &f);
    if (s != TS_OK) return s;
    *text = (const char *)f.at[0];
    *text_len = f.len[0];
    return TS_OK;
}

/* Checks the certificate chain (leaf, then any intermediates in the PEM) to
 * the CA file and the leaf's common name. */
static ts_status check_cert(const char *ca, const char *want, const fields *f, X509 **leaf) {
    *leaf = NULL;
    BIO *bio = f->len[1] <= CERT_MAX ? BIO_new_mem_buf(f->at[1], (int)f->len[1]) : NULL;
    X509 *x = bio ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
    STACK_OF(X509) *more = sk_X509_new_null();
    X509 *y;
    while (bio && more && (y = PEM_read_bio_X509(bio, NULL, NULL, NULL)))
        if (!sk_X509_push(more, y)) X509_free(y);
    ERR_clear_error(); /* the end of the PEM text */
    BIO_free(bio);
    X509_STORE *store = X509_STORE_new();
    X509_STORE_CTX *ctx = X509_STORE_CTX_new();
    ts_status s = TS_OK;
    char cn[256] = "";
    if (f->len[1] > CERT_MAX) {
        s = ts_fail(TS_ERR_FORMAT,
                    "fed: the Paillier public key comes with a certificate of %zu bytes, more "
                    "than %d",
                    f->len[1], CERT_MAX);
    } else if (!x) {
        s = ts_fail(TS_ERR_FORMAT,
                    "fed: the Paillier public key is not the key holder's: its signer's "
                    "certificate cannot be read");
    } else if (!store || !ctx || !more) {
        s = ts_fail(TS_ERR_NOMEM, "fed: checking the public key's certificate");
    } else if (X509_STORE_load_locations(store, ca, NULL) != 1) {
        s = ts_fail(TS_ERR_IO, "fed: cannot load the CA %s: %s", ca, ts_fed_ssl_err(0));
    } else if (X509_STORE_CTX_init(ctx, store, x, more) != 1) {
        s = ts_fail(TS_ERR_INTERNAL, "fed: X509_STORE_CTX_init: %s", ts_fed_ssl_err(0));
    } else if (X509_verify_cert(ctx) != 1) {
        s = ts_fail(TS_ERR_INVALID,
                    "fed: the Paillier public key is not the key holder's: the signer's "
                    "certificate is not accepted by the CA %s: %s",
                    ca, X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx)));
    } else if (X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof cn) <
                   0 ||
               strcmp(cn, want) != 0) {
        s = ts_fail(TS_ERR_INVALID,
                    "fed: the Paillier public key is not the key holder's: it is signed by '%s', "
                    "not by '%s' (fed.keyholder_name)",
                    cn, want);
    } else if ((X509_get_extension_flags(x) & EXFLAG_KUSAGE) &&
               !(X509_get_key_usage(x) & KU_DIGITAL_SIGNATURE)) {
        /* a certificate whose key usage leaves out signatures may not sign */
        s = ts_fail(TS_ERR_INVALID,
                    "fed: the Paillier public key is not the key holder's: the certificate of "
                    "'%s' does not allow digital signatures (its key usage)",
                    cn);
    }
    X509_STORE_CTX_free(ctx);
    X509_STORE_free(store);
    sk_X509_pop_free(more, X509_free);
    if (s == TS_OK)
        *leaf = x;
    else
        X509_free(x);
    return s;
}

ts_status ts_fed_pubkey_verify(const char *ca, const char *keyholder_name, const uint8_t *msg,
                               size_t len, const char **text, size_t *text_len) {
    if (!ca || !keyholder_name)
        return ts_fail(TS_ERR_INVALID,
                       "fed: checking the public key needs the CA and the key holder's name "
                       "(fed.tls.ca, fed.keyholder_name)");
    fields f;
    ts_status s = split(msg, len, &f);
    X509 *leaf = NULL;
    if (s == TS_OK) s = check_cert(ca, keyholder_name, &f, &leaf);
    size_t tbs_len = 0;
    uint8_t *tbs = s == TS_OK ? signed_bytes((const char *)f.at[0], f.len[0], &tbs_len) : NULL;
    if (s == TS_OK && !tbs) s = ts_fail(TS_ERR_NOMEM, "fed: checking the public key");
    EVP_MD_CTX *md = s == TS_OK ? EVP_MD_CTX_new() : NULL;
    if (s == TS_OK) {
        EVP_PKEY *k = X509_get0_pubkey(leaf);
        int ok = md && k && EVP_DigestVerifyInit(md, NULL, md_of(k), NULL, k) == 1 &&
                 EVP_DigestVerify(md, f.at[2], f.len[2], tbs, tbs_len) == 1;
        ERR_clear_error();
        if (!ok)
            s = ts_fail(TS_ERR_INVALID,
                        "fed: the Paillier public key is not the key holder's: the signature of "
                        "'%s' does not match the key (altered or replaced on the way)",
                        keyholder_name);
    }
    EVP_MD_CTX_free(md);
    free(tbs);
    X509_free(leaf);
    if (s == TS_OK) {
        *text = (const char *)f.at[0];
        *text_len = f.len[0];
    }
    return s;
}
