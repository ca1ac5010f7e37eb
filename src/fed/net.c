/* net.c — TLS 1.3 connections with mutual certificate authentication and
 * hashed frames (net.h). Blocking sockets with SO_RCVTIMEO/SO_SNDTIMEO, so
 * every read, write and connect ends within the timeout. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>
#include "fed/net.h"

struct ts_fed_listener {
    SSL_CTX *ctx;
    int fd, port;
    double timeout_s;
    ts_fed_tap_fn tap;
    void *tap_user;
};

struct ts_fed_conn {
    SSL_CTX *ctx; /* owned by a client connection, NULL for accepted ones */
    SSL *ssl;
    int fd;
    char peer[256];
    uint64_t sent, received;
    ts_fed_tap_fn tap; /* from the listener (accepted connections) */
    void *tap_user;
};

const char *ts_fed_ssl_err(int errno_fallback) {
    static _Thread_local char buf[256];
    unsigned long e = ERR_get_error();
    if (e)
        ERR_error_string_n(e, buf, sizeof buf);
    else
        snprintf(buf, sizeof buf, "%s", errno_fallback && errno ? strerror(errno) : "no detail");
    ERR_clear_error();
    return buf;
}

static ts_status make_ctx(const ts_fed_tls *tls, int server, SSL_CTX **out) {
    *out = NULL;
    if (!tls->ca || !tls->cert || !tls->key)
        return ts_fail(TS_ERR_INVALID,
                       "fed: TLS needs a CA, a certificate and a key (fed.tls.ca, fed.tls.cert, "
                       "fed.tls.key)");
    if (!(tls->timeout_s > 0))
        return ts_fail(TS_ERR_INVALID, "fed: timeout %g s must be > 0", tls->timeout_s);
    SSL_CTX *ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    if (!ctx) return ts_fail(TS_ERR_NOMEM, "fed: SSL_CTX_new: %s", ts_fed_ssl_err(1));
    ts_status s = TS_OK;
    if (!SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION))
        s = ts_fail(TS_ERR_INTERNAL, "fed: TLS 1.3 unavailable: %s", ts_fed_ssl_err(1));
    else if (SSL_CTX_load_verify_locations(ctx, tls->ca, NULL) != 1)
        s = ts_fail(TS_ERR_IO, "fed: cannot load the CA %s: %s", tls->ca, ts_fed_ssl_err(1));
    else if (SSL_CTX_use_certificate_chain_file(ctx, tls->cert) != 1)
        s = ts_fail(TS_ERR_IO, "fed: cannot load the certificate %s: %s", tls->cert,
                    ts_fed_ssl_err(1));
    else if (SSL_CTX_use_PrivateKey_file(ctx, tls->key, SSL_FILETYPE_PEM) != 1)
        s = ts_fail(TS_ERR_IO, "fed: cannot load the key %s: %s", tls->key, ts_fed_ssl_err(1));
    else if (SSL_CTX_check_private_key(ctx) != 1)
        s = ts_fail(TS_ERR_INVALID, "fed: the key %s does not belong to %s", tls->key, tls->cert);
    if (s != TS_OK) {
        SSL_CTX_free(ctx);
        return s;
    }
    /* both sides must present a certificate the CA signed */
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | (server ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0), NULL);
    SSL_CTX_set_mode(ctx, SSL_MODE_AUTO_RETRY);
    *out = ctx;
    return TS_OK;
}

static void set_timeouts(int fd, double t) {
    struct timeval tv = {(time_t)t, (suseconds_t)((t - (double)(time_t)t) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

ts_status ts_fed_listen(const ts_fed_tls *tls, const char *addr, int port, ts_fed_listener **out) {
    *out = NULL;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (port < 0 || port > 65535 || inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
        return ts_fail(TS_ERR_INVALID,
                       "fed: cannot listen on %s:%d (a numeric IPv4 address and a port)", addr,
                       port);
    ts_fed_listener *l = calloc(1, sizeof *l);
    if (!l) return ts_fail(TS_ERR_NOMEM, "fed: listener");
    l->fd = -1;
    l->timeout_s = tls->timeout_s;
    ts_status s = make_ctx(tls, 1, &l->ctx);
    if (s == TS_OK && (l->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
        s = ts_fail(TS_ERR_IO, "fed: socket: %s", strerror(errno));
    if (s == TS_OK) {
        int one = 1;
        setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        socklen_t sl = sizeof sa;
        if (bind(l->fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(l->fd, 64) != 0 ||
            getsockname(l->fd, (struct sockaddr *)&sa, &sl) != 0)
            s = ts_fail(TS_ERR_IO, "fed: cannot listen on %s:%d: %s", addr, port, strerror(errno));
        l->port = ntohs(sa.sin_port);
    }
    if (s != TS_OK) {
        ts_fed_listener_free(l);
        return s;
    }
    *out = l;
    return TS_OK;
}

int ts_fed_listener_port(const ts_fed_listener *l) {
    return l->port;
}

void ts_fed_listener_free(ts_fed_listener *l) {
    if (!l) return;
    if (l->fd >= 0) close(l->fd);
    SSL_CTX_free(l->ctx);
    free(l);
}

/* The peer's CN into c->peer. */
static void peer_name(ts_fed_conn *c) {
    X509 *x = SSL_get1_peer_certificate(c->ssl);
    snprintf(c->peer, sizeof c->peer, "?");
    if (!x) return;
    X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, c->peer, sizeof c->peer);
    X509_free(x);
}

static ts_status handshake_failed(ts_fed_conn *c, const char *what, int rc) {
    int e = SSL_get_error(c->ssl, rc);
    long v = SSL_get_verify_result(c->ssl);
    if (v != X509_V_OK)
        return ts_fail(TS_ERR_INVALID, "fed: %s: the peer's certificate is not accepted: %s", what,
                       X509_verify_cert_error_string(v));
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ||
        (e == SSL_ERROR_SYSCALL && (errno == EAGAIN || errno == EWOULDBLOCK)))
        return ts_fail(TS_ERR_IO, "fed: %s: TLS handshake timed out", what);
    return ts_fail(TS_ERR_INVALID, "fed: %s: TLS handshake failed: %s", what, ts_fed_ssl_err(1));
}

ts_status ts_fed_accept(ts_fed_listener *l, ts_fed_conn **out) {
    return ts_fed_accept_within(l, l->timeout_s, out);
}

ts_status ts_fed_accept_within(ts_fed_listener *l, double wait_s, ts_fed_conn **out) {
    *out = NULL;
    struct pollfd p = {.fd = l->fd, .events = POLLIN};
    int r;
    if (wait_s > l->timeout_s) wait_s = l->timeout_s;
    if (wait_s < 0) wait_s = 0;
    do r = poll(&p, 1, (int)(wait_s * 1000));
    while (r < 0 && errno == EINTR);
    if (r == 0) return ts_fail(TS_ERR_IO, "fed: no connection within %g s", wait_s);
    if (r < 0) return ts_fail(TS_ERR_IO, "fed: poll: %s", strerror(errno));
    int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) return ts_fail(TS_ERR_IO, "fed: accept: %s", strerror(errno));
    set_timeouts(fd, l->timeout_s);
    ts_fed_conn *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return ts_fail(TS_ERR_NOMEM, "fed: connection");
    }
    c->fd = fd;
    c->tap = l->tap;
    c->tap_user = l->tap_user;
    ts_status s = TS_OK;
    if (!(c->ssl = SSL_new(l->ctx)) || SSL_set_fd(c->ssl, fd) != 1)
        s = ts_fail(TS_ERR_NOMEM, "fed: SSL_new: %s", ts_fed_ssl_err(1));
    else if ((r = SSL_accept(c->ssl)) != 1)
        s = handshake_failed(c, "accepting a connection", r);
    if (s != TS_OK) {
        ts_fed_close(c);
        return s;
    }
    peer_name(c);
    *out = c;
    return TS_OK;
}

/* Roles start in any order, so a refused connection (nobody listens yet) is
 * tried again, 0.1 s later doubling up to 1 s, until timeout_s has passed;
 * any other failure ends at once. A fresh socket every time: one whose
 * connect() failed may not be reused. */
static ts_status connect_retrying(ts_fed_conn *c, const struct sockaddr_in *sa, double timeout_s,
                                  const char *host, int port) {
    const double start = ts_now();
    double delay = 0.1;
    for (;;) {
        if ((c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
            return ts_fail(TS_ERR_IO, "fed: socket: %s", strerror(errno));
        set_timeouts(c->fd, timeout_s); /* SO_SNDTIMEO bounds connect() too */
        if (connect(c->fd, (const struct sockaddr *)sa, sizeof *sa) == 0) return TS_OK;
        const int err = errno;
        close(c->fd);
        c->fd = -1;
        const double waited = ts_now() - start;
        if (err != ECONNREFUSED)
            return ts_fail(TS_ERR_IO, "fed: cannot connect to %s:%d: %s", host, port,
                           strerror(err));
        if (waited + delay > timeout_s)
            return ts_fail(TS_ERR_IO,
                           "fed: cannot connect to %s:%d: %s (tried for %.1f s, fed.timeout_s; "
                           "is the aggregator or key holder listening there?)",
                           host, port, strerror(err), waited);
        struct timespec pause = {(time_t)delay, (long)((delay - (double)(time_t)delay) * 1e9)};
        nanosleep(&pause, NULL);
        delay = delay * 2 > 1.0 ? 1.0 : delay * 2;
    }
}

ts_status ts_fed_connect(const ts_fed_tls *tls, const char *host, int port, const char *server_name,
                         ts_fed_conn **out) {
    *out = NULL;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (port < 1 || port > 65535 || inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return ts_fail(TS_ERR_INVALID,
                       "fed: cannot connect to %s:%d (a numeric IPv4 address and a port)", host,
                       port);
    ts_fed_conn *c = calloc(1, sizeof *c);
    if (!c) return ts_fail(TS_ERR_NOMEM, "fed: connection");
    c->fd = -1;
    ts_status s = make_ctx(tls, 0, &c->ctx);
    if (s == TS_OK) s = connect_retrying(c, &sa, tls->timeout_s, host, port);
    int r;
    if (s == TS_OK && (!(c->ssl = SSL_new(c->ctx)) || SSL_set_fd(c->ssl, c->fd) != 1 ||
                       SSL_set1_host(c->ssl, server_name) != 1))
        s = ts_fail(TS_ERR_NOMEM, "fed: SSL_new: %s", ts_fed_ssl_err(1));
    if (s == TS_OK && (r = SSL_connect(c->ssl)) != 1) s = handshake_failed(c, "connecting", r);
    if (s == TS_OK) {
        /* TLS 1.3: the server checks the client's certificate after the
         * client's handshake ends; a zero-byte peek surfaces its refusal now */
        char b;
        struct timeval tv = {0, 200 * 1000};
        setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        int k = SSL_peek(c->ssl, &b, 1);
        int e = k <= 0 ? SSL_get_error(c->ssl, k) : SSL_ERROR_NONE;
        if (k <= 0 && e != SSL_ERROR_WANT_READ &&
            !(e == SSL_ERROR_SYSCALL && (errno == EAGAIN || errno == EWOULDBLOCK)))
            s = ts_fail(
                TS_ERR_INVALID,
                "fed: %s:%d ended the connection after the handshake (it refused this side's "
                "certificate, or timed out): %s",
                host, port, ts_fed_ssl_err(1));
        ERR_clear_error();
        set_timeouts(c->fd, tls->timeout_s);
    }
    if (s != TS_OK) {
        ts_error_prefix("fed: connecting to %s:%d as %s", host, port, tls->cert);
        ts_fed_close(c);
        return s;
    }
    peer_name(c);
    *out = c;
    return TS_OK;
}

const char *ts_fed_peer(const ts_fed_conn *c) {
    return c->peer;
}

void ts_fed_conn_bytes(const ts_fed_conn *c, uint64_t *sent, uint64_t *received) {
    *sent = c->sent;
    *received = c->received;
}

void ts_fed_close(ts_fed_conn *c) {
    if (!c) return;
    if (c->ssl) {
        SSL_shutdown(c->ssl);
        SSL_free(c->ssl);
    }
    if (c->fd >= 0) close(c->fd);
    SSL_CTX_free(c->ctx);
    free(c);
}

static ts_status io_fail(ts_fed_conn *c, int rc, const char *what) {
    int e = SSL_get_error(c->ssl, rc);
    if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && errno == 0))
        return ts_fail(TS_ERR_IO, "fed: %s: %s closed the connection", what, c->peer);
    /* SO_RCVTIMEO/SO_SNDTIMEO expired: OpenSSL reports it as a retry */
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ||
        (e == SSL_ERROR_SYSCALL && (errno == EAGAIN || errno == EWOULDBLOCK)))
        return ts_fail(TS_ERR_IO, "fed: %s: %s timed out", what, c->peer);
    return ts_fail(TS_ERR_IO, "fed: %s: %s: %s", what, c->peer, ts_fed_ssl_err(1));
}

ts_status ts_fed_send_raw(ts_fed_conn *c, const void *data, size_t len) {
    const uint8_t *p = data;
    while (len > 0) {
        int chunk = len > (1u << 30) ? 1 << 30 : (int)len;
        errno = 0;
        int k = SSL_write(c->ssl, p, chunk);
        if (k <= 0) return io_fail(c, k, "sending");
        p += k;
        len -= (size_t)k;
        c->sent += (uint64_t)k;
    }
    return TS_OK;
}

static ts_status read_all(ts_fed_conn *c, void *data, size_t len) {
    uint8_t *p = data;
    while (len > 0) {
        int chunk = len > (1u << 30) ? 1 << 30 : (int)len;
        errno = 0;
        int k = SSL_read(c->ssl, p, chunk);
        if (k <= 0) return io_fail(c, k, "receiving");
        p += k;
        len -= (size_t)k;
        c->received += (uint64_t)k;
    }
    return TS_OK;
}

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void frame_hash(const uint8_t header[TS_FED_FRAME_HEADER], const void *data, uint64_t len,
                       uint8_t hash[TS_FED_FRAME_HASH]) {
    EVP_MD_CTX *h = EVP_MD_CTX_new();
    unsigned int n = 0;
    if (h && EVP_DigestInit_ex(h, EVP_sha256(), NULL) == 1 &&
        EVP_DigestUpdate(h, header, TS_FED_FRAME_HEADER) == 1 &&
        (len == 0 || EVP_DigestUpdate(h, data, (size_t)len) == 1) &&
        EVP_DigestFinal_ex(h, hash, &n) == 1 && n == 32) {
        EVP_MD_CTX_free(h);
        return;
    }
    EVP_MD_CTX_free(h);
    memset(hash, 0, TS_FED_FRAME_HASH); /* never matches a real frame's hash */
}

void ts_fed_frame_seal(uint32_t type, uint64_t round, const void *data, uint64_t len,
                       uint8_t header[TS_FED_FRAME_HEADER], uint8_t hash[TS_FED_FRAME_HASH]) {
    memcpy(header, "TSFD", 4);
    put_le(header + 4, type, 4);
    put_le(header + 8, round, 8);
    put_le(header + 16, len, 8);
    frame_hash(header, data, len, hash);
}

ts_status ts_fed_frame_header(const uint8_t header[TS_FED_FRAME_HEADER], uint64_t max_len,
                              uint32_t *type, uint64_t *round, uint64_t *len) {
    if (memcmp(header, "TSFD", 4) != 0)
        return ts_fail(TS_ERR_FORMAT, "fed: a frame without the TSFD mark");
    *type = (uint32_t)get_le(header + 4, 4);
    *round = get_le(header + 8, 8);
    *len = get_le(header + 16, 8);
    if (*len > max_len)
        return ts_fail(TS_ERR_FORMAT, "fed: a frame of %llu bytes, more than the %llu expected",
                       (unsigned long long)*len, (unsigned long long)max_len);
    return TS_OK;
}

ts_status ts_fed_frame_verify(const uint8_t header[TS_FED_FRAME_HEADER], const void *data,
                              uint64_t len, const uint8_t hash[TS_FED_FRAME_HASH]) {
    uint8_t want[TS_FED_FRAME_HASH];
    frame_hash(header, data, len, want);
    if (CRYPTO_memcmp(want, hash, sizeof want) != 0)
        return ts_fail(TS_ERR_FORMAT,
                       "fed: a frame of type %u, round %llu, whose SHA-256 does not match its "
                       "content (tampered or corrupted)",
                       (unsigned)get_le(header + 4, 4), (unsigned long long)get_le(header + 8, 8));
    return TS_OK;
}

ts_status ts_fed_send(ts_fed_conn *c, uint32_t type, uint64_t round, const void *data,
                      uint64_t len) {
    uint8_t header[TS_FED_FRAME_HEADER], hash[TS_FED_FRAME_HASH];
    ts_fed_frame_seal(type, round, data, len, header, hash);
    ts_status s = ts_fed_send_raw(c, header, sizeof header);
    if (s == TS_OK && len) s = ts_fed_send_raw(c, data, (size_t)len);
    if (s == TS_OK) s = ts_fed_send_raw(c, hash, sizeof hash);
    return s;
}

ts_status ts_fed_recv(ts_fed_conn *c, uint64_t max_len, ts_fed_msg *m) {
    memset(m, 0, sizeof *m);
    uint8_t header[TS_FED_FRAME_HEADER], hash[TS_FED_FRAME_HASH];
    ts_status s = read_all(c, header, sizeof header);
    if (s == TS_OK) s = ts_fed_frame_header(header, max_len, &m->type, &m->round, &m->len);
    if (s == TS_OK && !(m->data = malloc(m->len ? (size_t)m->len : 1)))
        s = ts_fail(TS_ERR_NOMEM, "fed: a frame of %llu bytes", (unsigned long long)m->len);
    if (s == TS_OK && m->len) s = read_all(c, m->data, (size_t)m->len);
    if (s == TS_OK) s = read_all(c, hash, sizeof hash);
    if (s == TS_OK) s = ts_fed_frame_verify(header, m->data, m->len, hash);
    if (s != TS_OK) {
        ts_error_prefix("from %s", c->peer);
        ts_fed_msg_free(m);
    } else if (c->tap) {
        c->tap(c->tap_user, c->peer, m);
    }
    return s;
}

void ts_fed_listener_tap(ts_fed_listener *l, ts_fed_tap_fn fn, void *user) {
    l->tap = fn;
    l->tap_user = user;
}

void ts_fed_msg_free(ts_fed_msg *m) {
    free(m->data);
    memset(m, 0, sizeof *m);
}
