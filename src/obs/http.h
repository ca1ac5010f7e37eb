/* http.h — the /metrics endpoint: a libmicrohttpd server on its own thread
 * that renders a metrics registry for each scrape.
 *
 *     ts_http_server *srv;
 *     if (ts_http_serve_metrics(m, NULL, 9400 + rank, &srv) != TS_OK)   // 127.0.0.1
 *         ... ts_last_error() names the address and why (port in use, ...)
 *     ...
 *     ts_http_stop(srv);   // before ts_metrics_free(m)
 *
 * Paths: GET/HEAD /metrics gives the text format 0.0.4
 * ("text/plain; version=0.0.4; charset=utf-8"); / gives a one-line pointer
 * to /metrics; anything else 404, and methods other than GET/HEAD 405. */
#ifndef TS_OBS_HTTP_H
#define TS_OBS_HTTP_H

#include "obs/metrics.h"

typedef struct ts_http_server ts_http_server;

/* Limits that keep scrapes answered while other clients misbehave: up to
 * TS_HTTP_MAX_CONNECTIONS open connections (fewer when the process may
 * open few files: a quarter of RLIMIT_NOFILE), each closed after
 * TS_HTTP_IDLE_TIMEOUT_S seconds without traffic. Clients that only
 * connect and wait thus hold a slot for at most that long, and it takes
 * hundreds of them at once to delay a scrape at all. */
enum { TS_HTTP_MAX_CONNECTIONS = 512, TS_HTTP_IDLE_TIMEOUT_S = 3 };

/* Serve `m` on addr:port. addr is a numeric IPv4 or IPv6 address (NULL:
 * "127.0.0.1", this host only; "0.0.0.0" or "::" listen on every
 * interface, so a Prometheus server on another host can scrape, and
 * anyone who can reach the port can read the metrics); port 0 picks a
 * free port (see ts_http_port). The registry must outlive the server.
 * Fails with TS_ERR_IO naming the address when the port is taken or
 * cannot be bound. */
ts_status ts_http_serve_metrics(ts_metrics *m, const char *addr, int port, ts_http_server **out);

/* The port the server listens on (the chosen one when 0 was asked). */
int ts_http_port(const ts_http_server *s);

/* Number of /metrics responses served so far. */
unsigned long ts_http_scrapes(const ts_http_server *s);

/* The connection limit this server was started with (see above). */
unsigned ts_http_connection_limit(const ts_http_server *s);

/* Stop serving: waits for the server thread, closes the socket and frees
 * the server. NULL is ignored. */
void ts_http_stop(ts_http_server *s);

#endif
