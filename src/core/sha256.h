/* sha256.h — SHA-256 (OpenSSL EVP) and hex encoding.
 *
 *     ts_sha256 h;
 *     if (ts_sha256_begin(&h, "manifest") == TS_OK) {
 *         ts_sha256_update(&h, buf, n);
 *         ts_sha256_end(&h, hex);            // 64 lower-case hex digits + NUL
 *     }
 *     ts_sha256_path("train.csv", hex, &bytes); // a whole file, streamed
 */
#ifndef TS_CORE_SHA256_H
#define TS_CORE_SHA256_H

#include <stddef.h>
#include <stdint.h>
#include "core.h"

typedef struct ts_sha256 {
    void *ctx; /* EVP_MD_CTX */
} ts_sha256;

ts_status ts_sha256_begin(ts_sha256 *h, const char *what);
void ts_sha256_update(ts_sha256 *h, const void *data, size_t n);
/* Finish into 64 lower-case hex digits and release the context. */
void ts_sha256_end(ts_sha256 *h, char hex[65]);
/* Release a context without finishing it (error paths). */
void ts_sha256_abort(ts_sha256 *h);
ts_status ts_sha256_mem(const void *data, size_t n, char hex[65]);
/* Hash a whole file by reading it; *size gets its length (may be NULL). */
ts_status ts_sha256_path(const char *path, char hex[65], int64_t *size);
/* n bytes as 2n lower-case hex digits plus NUL. */
void ts_hex(const unsigned char *b, size_t n, char *out);

#endif
