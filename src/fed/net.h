/* net.h — the federated roles' transport: TCP with TLS 1.3 and mutual
 * certificate authentication (OpenSSL), framed messages with a length and a
 * SHA-256, and timeouts on every wait (docs/federated.md, "Transport").
 *
 *     ts_fed_tls tls = {"ca.pem", "me.pem", "me.key", 30.0};
 *     ts_fed_listener *l;  ts_fed_listen(&tls, "127.0.0.1", 0, &l);
 *     ts_fed_conn *c;      ts_fed_accept(l, &c);          // peer's CN: ts_fed_peer(c)
 *     ts_fed_send(c, TYPE, round, data, len);
 *     ts_fed_msg m;        ts_fed_recv(c, 1 << 30, &m);   // m.data freed by ts_fed_msg_free
 *
 * Both sides present a certificate signed by the run's CA (fed.tls.ca) and
 * check the other's; a client also checks that the server's certificate is
 * for the name it expects. A frame is
 *     "TSFD" | type u32 | round u64 | length u64 | payload | SHA-256(all before)
 * (integers little endian); a frame whose hash does not match is refused
 * (TS_ERR_FORMAT), so is one longer than the receiver's limit. */
#ifndef TS_FED_NET_H
#define TS_FED_NET_H

#include <stdint.h>
#include "core/core.h"

#define TS_FED_FRAME_HEADER 24
#define TS_FED_FRAME_HASH   32

typedef struct ts_fed_tls {
    const char *ca, *cert, *key; /* PEM files: the CA, this side's certificate and key */
    double timeout_s;            /* every connect, accept, read and write (> 0) */
} ts_fed_tls;

typedef struct ts_fed_msg {
    uint32_t type;
    uint64_t round, len;
    uint8_t *data;
} ts_fed_msg;

typedef struct ts_fed_conn ts_fed_conn;
typedef struct ts_fed_listener ts_fed_listener;

/* Listens on addr:port (a numeric IPv4 address; port 0: any free port). */
ts_status ts_fed_listen(const ts_fed_tls *tls, const char *addr, int port, ts_fed_listener **out);
int ts_fed_listener_port(const ts_fed_listener *l);
void ts_fed_listener_free(ts_fed_listener *l);
/* A function that sees every frame received, its hash checked, on the
 * connections a listener accepts from then on: exactly what that role
 * receives (tests use it to show what an aggregator can learn). */
typedef void (*ts_fed_tap_fn)(void *user, const char *peer, const ts_fed_msg *m);
void ts_fed_listener_tap(ts_fed_listener *l, ts_fed_tap_fn fn, void *user);
/* Waits up to the timeout for a connection and completes the TLS handshake
 * (the client's certificate checked against the CA). */
ts_status ts_fed_accept(ts_fed_listener *l, ts_fed_conn **out);
/* The same, waiting at most wait_s (and at most the timeout) for the
 * connection to arrive; the handshake is bounded by the timeout as above. */
ts_status ts_fed_accept_within(ts_fed_listener *l, double wait_s, ts_fed_conn **out);
/* Connects to host:port and checks that the server's certificate is signed by
 * the CA and issued to `server_name`. */
ts_status ts_fed_connect(const ts_fed_tls *tls, const char *host, int port, const char *server_name,
                         ts_fed_conn **out);
/* The peer certificate's common name. */
const char *ts_fed_peer(const ts_fed_conn *c);
/* The first queued OpenSSL error as text (this thread's buffer; the queue is
 * cleared); with an empty queue, strerror(errno) when errno_fallback and
 * errno is set, else "no detail". */
const char *ts_fed_ssl_err(int errno_fallback);
void ts_fed_close(ts_fed_conn *c);
/* Bytes sent and received on this connection, frames included. */
void ts_fed_conn_bytes(const ts_fed_conn *c, uint64_t *sent, uint64_t *received);

ts_status ts_fed_send(ts_fed_conn *c, uint32_t type, uint64_t round, const void *data,
                      uint64_t len);
/* The next frame, with a payload of at most max_len bytes. */
ts_status ts_fed_recv(ts_fed_conn *c, uint64_t max_len, ts_fed_msg *m);
void ts_fed_msg_free(ts_fed_msg *m);

/* The frame codec alone (for tests and the fuzzer): header and hash of a
 * payload; check a received header, payload and hash. */
void ts_fed_frame_seal(uint32_t type, uint64_t round, const void *data, uint64_t len,
                       uint8_t header[TS_FED_FRAME_HEADER], uint8_t hash[TS_FED_FRAME_HASH]);
ts_status ts_fed_frame_header(const uint8_t header[TS_FED_FRAME_HEADER], uint64_t max_len,
                              uint32_t *type, uint64_t *round, uint64_t *len);
ts_status ts_fed_frame_verify(const uint8_t header[TS_FED_FRAME_HEADER], const void *data,
                              uint64_t len, const uint8_t hash[TS_FED_FRAME_HASH]);
/* Sends raw bytes (tests use it to send a forged frame). */
ts_status ts_fed_send_raw(ts_fed_conn *c, const void *data, size_t len);

#endif
