/* SHA-256 through OpenSSL's EVP interface: streaming, of a buffer, of a
 * file. Used for data lineage, checkpoint files and the audit log. */
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "sha256.h"

ts_status ts_sha256_begin(ts_sha256 *h, const char *what) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(ctx);
        h->ctx = NULL;
        return ts_fail(TS_ERR_INTERNAL, "%s: cannot start SHA-256 (OpenSSL)", what);
    }
    h->ctx = ctx;
    return TS_OK;
}

void ts_sha256_update(ts_sha256 *h, const void *data, size_t n) {
    /* EVP_DigestUpdate only fails on a NULL or finished context, which the
     * begin/end pairing rules out. */
    if (n) EVP_DigestUpdate(h->ctx, data, n);
}

void ts_sha256_end(ts_sha256 *h, char hex[65]) {
    unsigned char md[32];
    unsigned int len = 0;
    EVP_DigestFinal_ex(h->ctx, md, &len);
    ts_hex(md, 32, hex);
    EVP_MD_CTX_free(h->ctx);
    h->ctx = NULL;
}

void ts_sha256_abort(ts_sha256 *h) {
    EVP_MD_CTX_free(h->ctx);
    h->ctx = NULL;
}

ts_status ts_sha256_mem(const void *data, size_t n, char hex[65]) {
    ts_sha256 h;
    ts_status s = ts_sha256_begin(&h, "sha256");
    if (s != TS_OK) return s;
    ts_sha256_update(&h, data, n);
    ts_sha256_end(&h, hex);
    return TS_OK;
}

ts_status ts_sha256_path(const char *path, char hex[65], int64_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ts_fail(errno == ENOENT ? TS_ERR_NOT_FOUND : TS_ERR_IO, "%s: cannot open: %s", path,
                       strerror(errno));
    const size_t bufsz = (size_t)1 << 20;
    unsigned char *buf = ts_alloc(bufsz, path);
    if (!buf) {
        close(fd);
        return TS_ERR_NOMEM;
    }
    ts_sha256 h;
    ts_status s = ts_sha256_begin(&h, path);
    int64_t total = 0;
    while (s == TS_OK) {
        ssize_t r = read(fd, buf, bufsz);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            s = ts_fail(TS_ERR_IO, "%s: read failed after %llu bytes: %s", path,
                        (unsigned long long)total, strerror(errno));
            ts_sha256_abort(&h);
            break;
        }
        if (r == 0) {
            ts_sha256_end(&h, hex);
            break;
        }
        ts_sha256_update(&h, buf, (size_t)r);
        total += (int64_t)r;
    }
    free(buf);
    close(fd);
    if (s == TS_OK && size) *size = total;
    return s;
}

void ts_hex(const unsigned char *b, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = '\0';
}
