/* obs.c — Prometheus metrics of a federated role (obs.h), on the metrics
 * registry and /metrics endpoint of src/obs. */
#include "fed/obs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "obs/http.h"
#include "obs/metrics.h"

struct ts_fed_obs {
    ts_metrics *reg;
    ts_http_server *http;
    char *dir, *role;
    ts_metric *rounds, *round, *clients, *dropped, *dropped_total, *up, *down, *seconds;
    ts_metric *pool_total, *pool_round;
};

ts_status ts_fed_obs_create(const char *role, const char *dir, const char *addr, int port,
                            ts_fed_obs **out) {
    *out = NULL;
    ts_fed_obs *o = calloc(1, sizeof *o);
    if (!o) return ts_fail(TS_ERR_NOMEM, "fed: metrics");
    static const char *const client_label[] = {"client"}, *const phase_label[] = {"phase"},
                             *const result_label[] = {"result"};
    ts_status s = ts_metrics_create(&o->reg);
    if (s == TS_OK) s = ts_metrics_const_label(o->reg, "role", role);
    if (s == TS_OK)
        s = ts_metrics_counter(o->reg, "tessel_fed_rounds_total", "Federated rounds completed.", 0,
                               NULL, &o->rounds);
    if (s == TS_OK)
        s = ts_metrics_gauge(o->reg, "tessel_fed_round", "Last completed federated round.", 0, NULL,
                             &o->round);
    if (s == TS_OK)
        s = ts_metrics_gauge(o->reg, "tessel_fed_clients",
                             "Clients whose update the last round aggregated.", 0, NULL,
                             &o->clients);
    if (s == TS_OK)
        s = ts_metrics_gauge(o->reg, "tessel_fed_dropped", "Clients dropped in the last round.", 0,
                             NULL, &o->dropped);
    if (s == TS_OK)
        s = ts_metrics_counter(o->reg, "tessel_fed_dropped_total", "Clients dropped, all rounds.",
                               0, NULL, &o->dropped_total);
    if (s == TS_OK)
        s = ts_metrics_counter(o->reg, "tessel_fed_bytes_up_total",
                               "Update bytes from a client to the aggregator (frame payloads).", 1,
                               client_label, &o->up);
    if (s == TS_OK)
        s = ts_metrics_counter(o->reg, "tessel_fed_bytes_down_total",
                               "Global-model bytes from the aggregator to a client (frame "
                               "payloads).",
                               1, client_label, &o->down);
    if (s == TS_OK)
        s = ts_metrics_gauge(o->reg, "tessel_fed_seconds",
                             "Seconds the last round spent in a phase (train, encrypt, upload, "
                             "broadcast, updates, aggregate, keyholder, decrypt, round).",
                             1, phase_label, &o->seconds);
    if (s == TS_OK)
        s = ts_metrics_counter(o->reg, "tessel_fed_rn_pool_total",
                               "Encryptions that took a precomputed r^n from the pool (hit) or "
                               "computed their own (miss), all rounds.",
                               1, result_label, &o->pool_total);
    if (s == TS_OK)
        s = ts_metrics_gauge(o->reg, "tessel_fed_rn_pool_round",
                             "Encryptions of the last round that took a precomputed r^n (hit) or "
                             "computed their own (miss).",
                             1, result_label, &o->pool_round);
    if (s == TS_OK) ts_metric_lazy(o->up), ts_metric_lazy(o->down), ts_metric_lazy(o->seconds);
    if (s == TS_OK) ts_metric_lazy(o->pool_total), ts_metric_lazy(o->pool_round);
    if (s == TS_OK && dir && !(o->dir = strdup(dir))) s = ts_fail(TS_ERR_NOMEM, "fed: metrics");
    if (s == TS_OK && !(o->role = strdup(role))) s = ts_fail(TS_ERR_NOMEM, "fed: metrics");
    if (s == TS_OK && port > 0) s = ts_http_serve_metrics(o->reg, addr, port, &o->http);
    if (s != TS_OK) {
        ts_fed_obs_free(o);
        return s;
    }
    *out = o;
    return TS_OK;
}

void ts_fed_obs_free(ts_fed_obs *o) {
    if (!o) return;
    ts_http_stop(o->http);
    ts_metrics_free(o->reg);
    free(o->dir);
    free(o->role);
    free(o);
}

static void add_labelled(ts_metric *f, const char *value, double v) {
    ts_series *sr;
    if (ts_metric_series(f, (const char *[]){value}, &sr) == TS_OK) ts_series_inc(sr, v);
}

void ts_fed_obs_bytes(ts_fed_obs *o, const char *client, uint64_t up, uint64_t down) {
    if (!o) return;
    /* both families get the series, so a client that never sent shows 0 */
    add_labelled(o->up, client, (double)up);
    add_labelled(o->down, client, (double)down);
}

static void set_phase(ts_fed_obs *o, const char *phase, double v) {
    ts_series *sr;
    if (v >= 0 && ts_metric_series(o->seconds, (const char *[]){phase}, &sr) == TS_OK)
        ts_series_set(sr, v);
}

/* DIR/metrics.prom through a temporary file and a rename, so a collector
 * never reads half a file; neither name is followed if it is a link. */
static ts_status write_file(ts_fed_obs *o) {
    char *text = NULL, path[1100], tmp[1100];
    size_t len = 0;
    ts_status s = ts_metrics_render(o->reg, &text, &len);
    if (s != TS_OK) return s;
    snprintf(path, sizeof path, "%s/metrics.prom", o->dir);
    snprintf(tmp, sizeof tmp, "%s/.metrics.prom.tmp", o->dir);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        s = ts_fail(TS_ERR_IO, "fed: cannot write %s: %s", tmp, strerror(errno));
    } else {
        ssize_t w = write(fd, text, len);
        if (close(fd) != 0 || w != (ssize_t)len)
            s = ts_fail(TS_ERR_IO, "fed: writing %s failed", tmp);
        else if (rename(tmp, path) != 0)
            s = ts_fail(TS_ERR_IO, "fed: cannot rename %s to %s: %s", tmp, path, strerror(errno));
        if (s != TS_OK) unlink(tmp);
    }
    free(text);
    return s;
}

/* The round's phases (those >= 0) as one line of DIR/rounds.jsonl. */
static ts_status append_line(ts_fed_obs *o, const ts_fed_obs_round_info *r) {
    const char *name[] = {"train",     "encrypt",   "upload",  "broadcast", "updates",
                          "aggregate", "keyholder", "decrypt", "round"};
    const double v[] = {r->train_s,     r->encrypt_s,   r->upload_s,  r->broadcast_s, r->updates_s,
                        r->aggregate_s, r->keyholder_s, r->decrypt_s, r->round_s};
    char line[1024], path[1100];
    size_t len =
        (size_t)snprintf(line, sizeof line, "{\"role\": \"%s\", \"round\": %d", o->role, r->round);
    for (size_t i = 0; i < sizeof v / sizeof *v; i++)
        if (v[i] >= 0)
            len +=
                (size_t)snprintf(line + len, sizeof line - len, ", \"%s_s\": %.6f", name[i], v[i]);
    if (r->has_pool)
        len += (size_t)snprintf(line + len, sizeof line - len,
                                ", \"rn_pool_hits\": %lld, \"rn_pool_misses\": %lld",
                                (long long)r->pool_hits, (long long)r->pool_misses);
    snprintf(line + len, sizeof line - len, "}\n");
    snprintf(path, sizeof path, "%s/rounds.jsonl", o->dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return ts_fail(TS_ERR_IO, "fed: cannot write %s: %s", path, strerror(errno));
    size_t want = strlen(line);
    ssize_t w = write(fd, line, want);
    if (close(fd) != 0 || w != (ssize_t)want)
        return ts_fail(TS_ERR_IO, "fed: writing %s failed", path);
    return TS_OK;
}

ts_status ts_fed_obs_round(ts_fed_obs *o, const ts_fed_obs_round_info *r) {
    if (!o) return TS_OK;
    ts_metric_inc(o->rounds, 1);
    ts_metric_set(o->round, r->round);
    if (r->clients >= 0) ts_metric_set(o->clients, r->clients);
    if (r->dropped >= 0) {
        ts_metric_set(o->dropped, r->dropped);
        ts_metric_inc(o->dropped_total, r->dropped);
    }
    set_phase(o, "train", r->train_s);
    set_phase(o, "encrypt", r->encrypt_s);
    set_phase(o, "upload", r->upload_s);
    set_phase(o, "broadcast", r->broadcast_s);
    set_phase(o, "updates", r->updates_s);
    set_phase(o, "aggregate", r->aggregate_s);
    set_phase(o, "keyholder", r->keyholder_s);
    set_phase(o, "decrypt", r->decrypt_s);
    set_phase(o, "round", r->round_s);
    if (r->has_pool) {
        static const char *const res[2] = {"hit", "miss"};
        const int64_t v[2] = {r->pool_hits, r->pool_misses};
        for (int i = 0; i < 2; i++) {
            ts_series *sr;
            add_labelled(o->pool_total, res[i], (double)v[i]);
            if (ts_metric_series(o->pool_round, (const char *[]){res[i]}, &sr) == TS_OK)
                ts_series_set(sr, (double)v[i]);
        }
    }
    ts_status s = o->dir ? write_file(o) : TS_OK;
    if (s == TS_OK && o->dir) s = append_line(o, r);
    return s;
}
