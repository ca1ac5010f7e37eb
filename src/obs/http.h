/* http.h — the /metrics endpoint: a libmicrohttpd server on its own thread
 * that renders a metrics registry for each scrape.
 *
 *     ts_http_server *srv;
 *     if (ts_http_serve_metrics(m, NULL, 9400 + rank, &srv) != TS_OK)
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

/* Serve `m` on addr:port. addr is a numeric IPv4 or IPv6 address (NULL:
 * "0.0.0.0", every interface, so a Prometheus server on another host can
 * scrape); port 0 picks a free port (see ts_http_port). The registry must
 * outlive the server. Fails with TS_ERR_IO naming the address when the
 * port is taken or cannot be bound. */
ts_status ts_http_serve_metrics(ts_metrics *m, const char *addr, int port, ts_http_server **out);

/* The port the server listens on (the chosen one when 0 was asked). */
int ts_http_port(const ts_http_server *s);

/* Number of /metrics responses served so far. */
unsigned long ts_http_scrapes(const ts_http_server *s);

/* Stop serving: waits for the server thread, closes the socket and frees
 * the server. NULL is ignored. */
void ts_http_stop(ts_http_server *s);

#endif
