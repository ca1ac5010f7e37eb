/* The /metrics endpoint under abusive clients (issue 16), on loopback only:
 *
 * - with a NULL address it listens on 127.0.0.1 alone: another loopback
 *   address (127.0.0.2) can still bind the same port, which a listener on
 *   0.0.0.0 would refuse;
 * - 64 clients that connect and send nothing do not delay a scrape: it is
 *   answered well within the idle timeout (so not by waiting for them);
 * - the server closes those idle connections after about
 *   TS_HTTP_IDLE_TIMEOUT_S seconds;
 * - even with more idle clients than the connection limit, a scrape is
 *   answered once the idle ones time out.
 * Every wait is bounded by poll() deadlines. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "obs/http.h"
#include "obs/metrics.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int connect_to(const char *ip, int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, ip, &a.sin_addr);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* GET /metrics; 1 when a 200 response with tessel_loss arrived before
 * `deadline_s` seconds passed, *took the time it took. */
static int scrape_within(int port, double deadline_s, double *took) {
    const double t0 = now();
    *took = -1;
    int fd = connect_to("127.0.0.1", port);
    if (fd < 0) return 0;
    static const char req[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req, sizeof req - 1) != (ssize_t)(sizeof req - 1)) {
        close(fd);
        return 0;
    }
    char buf[1 << 16];
    size_t n = 0;
    int done = 0;
    while (!done && n < sizeof buf - 1) {
        const double left = deadline_s - (now() - t0);
        struct pollfd p = {fd, POLLIN, 0};
        if (left <= 0 || poll(&p, 1, (int)(left * 1000) + 1) <= 0) break;
        ssize_t k = read(fd, buf + n, sizeof buf - 1 - n);
        if (k <= 0)
            done = 1;
        else
            n += (size_t)k;
    }
    close(fd);
    buf[n] = 0;
    *took = now() - t0;
    return done && !strncmp(buf, "HTTP/1.", 7) && !strncmp(buf + 8, " 200 ", 5) &&
           strstr(buf, "tessel_loss{rank=\"0\"}") != NULL;
}

/* Wait until the server has closed each of fds[0..n) (EOF or reset), at
 * most `deadline_s`; returns how many it closed. */
static int closed_within(const int *fds, int n, double deadline_s) {
    const double t0 = now();
    char *gone = calloc((size_t)n, 1);
    int closed = 0;
    while (gone && closed < n && now() - t0 < deadline_s) {
        for (int i = 0; i < n; i++) {
            if (gone[i]) continue;
            struct pollfd p = {fds[i], POLLIN, 0};
            char c;
            if (poll(&p, 1, 0) == 1 && read(fds[i], &c, 1) <= 0) gone[i] = 1, closed++;
        }
        if (closed < n) usleep(50000);
    }
    free(gone);
    return closed;
}

int main(void) {
    ts_train_metrics tm;
    CHECK_OK(ts_train_metrics_create(0, &tm));
    ts_step_metrics sm = ts_step_metrics_empty();
    sm.step = 1;
    sm.loss = 0.5;
    CHECK_OK(ts_train_metrics_step(&tm, &sm));
    ts_http_server *srv = NULL;
    CHECK_OK(ts_http_serve_metrics(tm.reg, NULL, 0, &srv));
    const int port = ts_http_port(srv);
    CHECK(srv && port > 0, "server on port %d", port);
    if (!srv) return check_summary("unit/http_limits");

    /* Loopback only: 127.0.0.2 can take the same port (a wildcard
     * listener would make this bind fail with EADDRINUSE). */
    int probe = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, "127.0.0.2", &a.sin_addr);
    CHECK(probe >= 0 && bind(probe, (struct sockaddr *)&a, sizeof a) == 0,
          "NULL address: 127.0.0.2:%d is taken too (%s): the server listens beyond 127.0.0.1", port,
          strerror(errno));
    if (probe >= 0) close(probe);
    CHECK(ts_http_connection_limit(srv) >= 64 &&
              ts_http_connection_limit(srv) <= TS_HTTP_MAX_CONNECTIONS,
          "connection limit %u", ts_http_connection_limit(srv));

    /* 64 idle clients, then a scrape: answered at once, not after the
     * idle ones time out. */
    enum { IDLE = 64 };
    int idle[IDLE], opened = 0;
    for (int i = 0; i < IDLE; i++)
        if ((idle[i] = connect_to("127.0.0.1", port)) >= 0) opened++;
    CHECK(opened == IDLE, "opened %d of %d idle connections", opened, IDLE);
    usleep(200000); /* let the server accept them all */
    double took;
    const double bound = TS_HTTP_IDLE_TIMEOUT_S * 0.5;
    CHECK(scrape_within(port, bound, &took),
          "with %d idle connections a scrape was not answered within %.1f s (took %.2f s)", IDLE,
          bound, took);
    printf("scrape with %d idle connections: %.3f s\n", IDLE, took);

    /* The server closes idle connections after the idle timeout. */
    const double t0 = now();
    int closed = closed_within(idle, opened, TS_HTTP_IDLE_TIMEOUT_S + 4.0);
    CHECK(closed == opened, "the server closed %d of %d idle connections within %d s", closed,
          opened, TS_HTTP_IDLE_TIMEOUT_S + 4);
    CHECK(now() - t0 >= TS_HTTP_IDLE_TIMEOUT_S - 1.5,
          "idle connections were closed after %.2f s, before the %d s timeout", now() - t0,
          TS_HTTP_IDLE_TIMEOUT_S);
    printf("idle connections closed after %.2f s\n", now() - t0);
    for (int i = 0; i < IDLE; i++)
        if (idle[i] >= 0) close(idle[i]);

    /* More idle clients than the limit: the scrape waits at most about
     * one idle timeout, until the first ones are closed. */
    const int many = (int)ts_http_connection_limit(srv) + 16;
    int *fds = malloc(sizeof(int) * (size_t)many), got = 0;
    for (int i = 0; fds && i < many; i++)
        if ((fds[i] = connect_to("127.0.0.1", port)) >= 0) got++;
    CHECK(got == many, "opened %d of %d idle connections", got, many);
    usleep(200000);
    const double over = TS_HTTP_IDLE_TIMEOUT_S + 4.0;
    CHECK(scrape_within(port, over, &took),
          "with %d idle connections (limit %u) a scrape was not answered within %.1f s", many,
          ts_http_connection_limit(srv), over);
    printf("scrape with %d idle connections (limit %u): %.3f s\n", many,
           ts_http_connection_limit(srv), took);
    for (int i = 0; fds && i < many; i++)
        if (fds[i] >= 0) close(fds[i]);
    free(fds);

    ts_http_stop(srv);
    ts_train_metrics_free(&tm);
    return check_summary("unit/http_limits");
}
