/* keysig.h — the key holder's signature on its Paillier public key
 * (docs/federated.md, "Trust model").
 *
 * The public key reaches the clients through the aggregator. So that an
 * aggregator cannot substitute a key of its own (and decrypt the updates),
 * the key holder signs the key's text with the private key of its TLS
 * certificate, and each client checks the signature, the certificate's
 * chain to the run's CA (fed.tls.ca) and that the certificate's common name
 * is the key holder's (fed.keyholder_name) before it encrypts anything.
 *
 * The PUBKEY payload (integers u32 little endian):
 *     text length | text (the public key file, paillier.h)
 *     | certificate length | the key holder's certificate (PEM, its chain
 *       file as given in fed.tls.cert)
 *     | signature length | signature
 * The signature covers "tessel fed paillier public key v1" and a zero byte
 * (so it cannot be taken for a signature made for another purpose), then
 * the text length and the text. RSA and EC keys sign with SHA-256 (the
 * key's default padding), Ed25519/Ed448 keys as they do.
 *
 *     uint8_t *msg; size_t len;
 *     ts_fed_pubkey_sign(&tls, text, strlen(text), &msg, &len);       // key holder
 *     const char *t; size_t tl;
 *     ts_fed_pubkey_verify(tls.ca, "keyholder", msg, len, &t, &tl);   // client
 *     ts_paillier_pub_from_text(t, tl, &pk);                          // t points into msg
 *     free(msg);
 */
#ifndef TS_FED_KEYSIG_H
#define TS_FED_KEYSIG_H

#include <stddef.h>
#include <stdint.h>
#include "fed/net.h"

/* The signed payload (malloc'd) of the public key text, signed with
 * tls->key; tls->cert is sent with it and must belong to that key. */
ts_status ts_fed_pubkey_sign(const ts_fed_tls *tls, const char *text, size_t text_len,
                             uint8_t **msg, size_t *msg_len);
/* The text of a signed payload, without checking the signature (the
 * aggregator, which only needs n to add ciphertexts). */
ts_status ts_fed_pubkey_text(const uint8_t *msg, size_t len, const char **text, size_t *text_len);
/* The text of a signed payload after checking that its certificate chains to
 * the CA file `ca`, is valid now, is issued to `keyholder_name` and made the
 * signature; otherwise an error naming what failed. *text points into msg. */
ts_status ts_fed_pubkey_verify(const char *ca, const char *keyholder_name, const uint8_t *msg,
                               size_t len, const char **text, size_t *text_len);

#endif
