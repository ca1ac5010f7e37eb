/* http.c — /metrics over libmicrohttpd. MHD runs its own polling thread
 * (epoll on Linux, so many idle sockets cost nothing per poll); each
 * request renders the registry under the registry's mutex, so the
 * training thread's lock-free updates never wait for a scrape. Idle
 * clients are bounded by a generous connection limit and a short idle
 * timeout (http.h), so they cannot lock scrapers out. */
#include "obs/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include "core/core.h"

struct ts_http_server {
    struct MHD_Daemon *daemon;
    ts_metrics *metrics;
    int port;
    unsigned limit;
    atomic_ulong scrapes;
};

static const char content_type[] = "text/plain; version=0.0.4; charset=utf-8";

/* MHD's own messages (a client that hung up, a malformed request) are
 * about one connection, not the run: debug level, through tessel's log. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    ts_logf(TS_LOG_DEBUG, "metrics server: %s", msg);
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *text) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(r, "Allow", "GET, HEAD");
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_data_size, void **req_cls) {
    (void)version, (void)upload_data, (void)upload_data_size, (void)req_cls;
    ts_http_server *s = cls;
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD are served\n");
    if (!strcmp(url, "/")) return reply(c, MHD_HTTP_OK, "tessel metrics exporter: see /metrics\n");
    if (strcmp(url, "/metrics")) return reply(c, MHD_HTTP_NOT_FOUND, "not found; try /metrics\n");

    char *text;
    size_t len;
    if (ts_metrics_render(s->metrics, &text, &len) != TS_OK) {
        /* The message is thread-local to this server thread: log it here,
         * the training thread would never see it. */
        ts_logf(TS_LOG_WARN, "metrics server: %s", ts_last_error());
        return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "rendering the metrics failed\n");
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    atomic_fetch_add(&s->scrapes, 1);
    return ok;
}

/* Binding once ourselves turns MHD's bare "could not start" into the
 * reason (EADDRINUSE, EACCES below 1024, EADDRNOTAVAIL for a foreign
 * address). SO_REUSEADDR as MHD sets it, so a port held only by TIME_WAIT
 * connections of a previous run is not reported as taken. */
static ts_status probe_bind(const struct sockaddr *sa, socklen_t len, const char *where) {
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return ts_fail(TS_ERR_IO, "metrics server on %s: cannot create a socket: %s", where,
                       strerror(errno));
    int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    int rc = bind(fd, sa, len), err = errno;
    close(fd);
    if (rc == 0) return TS_OK;
    if (err == EADDRINUSE)
        return ts_fail(TS_ERR_IO,
                       "metrics server on %s: port already in use (another tessel rank or "
                       "exporter?); pick another port, ranks use base port + rank",
                       where);
    if (err == EACCES)
        return ts_fail(TS_ERR_IO,
                       "metrics server on %s: permission denied (ports below 1024 need "
                       "privileges)",
                       where);
    return ts_fail(TS_ERR_IO, "metrics server on %s: cannot bind: %s", where, strerror(err));
}

/* TS_HTTP_MAX_CONNECTIONS, or a quarter of the descriptors this process
 * may open when that is fewer: the run's data, checkpoint and log files
 * need the rest. */
static unsigned connection_limit(void) {
    struct rlimit rl;
    unsigned lim = TS_HTTP_MAX_CONNECTIONS;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur / 4 < lim)
        lim = rl.rlim_cur / 4 < 8 ? 8 : (unsigned)(rl.rlim_cur / 4);
    return lim;
}

ts_status ts_http_serve_metrics(ts_metrics *m, const char *addr, int port, ts_http_server **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "metrics server: NULL output pointer");
    *out = NULL;
    if (!m) return ts_fail(TS_ERR_INVALID, "metrics server: NULL registry");
    if (port < 0 || port > 65535)
        return ts_fail(TS_ERR_INVALID, "metrics server: port %d is outside 0..65535", port);
    /* This host only unless the caller names an interface: the metrics
     * describe the run (paths in labels, throughput, the build). */
    if (!addr) addr = "127.0.0.1";

    struct sockaddr_in in4;
    struct sockaddr_in6 in6;
    memset(&in4, 0, sizeof in4);
    memset(&in6, 0, sizeof in6);
    const struct sockaddr *sa;
    socklen_t sa_len;
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
    char where[96];
    if (inet_pton(AF_INET, addr, &in4.sin_addr) == 1) {
        in4.sin_family = AF_INET;
        in4.sin_port = htons((uint16_t)port);
        sa = (const struct sockaddr *)&in4;
        sa_len = sizeof in4;
        snprintf(where, sizeof where, "%s:%d", addr, port);
    } else if (inet_pton(AF_INET6, addr, &in6.sin6_addr) == 1) {
        in6.sin6_family = AF_INET6;
        in6.sin6_port = htons((uint16_t)port);
        sa = (const struct sockaddr *)&in6;
        sa_len = sizeof in6;
        flags |= MHD_USE_IPv6;
        snprintf(where, sizeof where, "[%s]:%d", addr, port);
    } else {
        return ts_fail(TS_ERR_INVALID,
                       "metrics server: '%s' is not a numeric IPv4 or IPv6 address (e.g. "
                       "0.0.0.0, 127.0.0.1, ::)",
                       addr);
    }
    if (port) {
        ts_status st = probe_bind(sa, sa_len, where);
        if (st != TS_OK) return st;
    }

    ts_http_server *s = ts_zalloc(sizeof *s, "metrics server");
    if (!s) return TS_ERR_NOMEM;
    s->metrics = m;
    s->limit = connection_limit();
    atomic_init(&s->scrapes, 0);
    s->daemon = MHD_start_daemon(
        flags, (uint16_t)port, NULL, NULL, handle, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_SOCK_ADDR, sa, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)TS_HTTP_IDLE_TIMEOUT_S,
        MHD_OPTION_CONNECTION_LIMIT, s->limit, MHD_OPTION_END);
    if (!s->daemon) {
        free(s);
        /* The probe bound, so what is left is a port taken in between or
         * the server thread failing to start. */
        return ts_fail(TS_ERR_IO,
                       "metrics server on %s: libmicrohttpd could not start (port taken "
                       "meanwhile, or no thread/socket available)",
                       where);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info && info->port ? info->port : port;
    if (!s->port) {
        MHD_stop_daemon(s->daemon);
        free(s);
        return ts_fail(TS_ERR_IO, "metrics server on %s: cannot tell which port was chosen", where);
    }
    ts_logf(TS_LOG_INFO, "metrics server: serving /metrics on %s port %d", addr, s->port);
    *out = s;
    return TS_OK;
}

int ts_http_port(const ts_http_server *s) {
    return s ? s->port : 0;
}

unsigned ts_http_connection_limit(const ts_http_server *s) {
    return s ? s->limit : 0;
}

unsigned long ts_http_scrapes(const ts_http_server *s) {
    return s ? atomic_load(&((ts_http_server *)s)->scrapes) : 0;
}

void ts_http_stop(ts_http_server *s) {
    if (!s) return;
    /* Joins the server thread and closes the listening socket and every
     * connection; no handler runs after this returns. */
    MHD_stop_daemon(s->daemon);
    free(s);
}
