/* Gradient compression's figures after each step (docs/distributed.md,
 * "Gradient compression"): what this rank's last step exchanged, from
 * ts_plan_compress_stats, into metrics.jsonl (rank 0), the Prometheus
 * gauges tessel_compress_* (every rank, on its own port) and the
 * TensorBoard scalars compress/... (rank 0). */
#include <math.h>
#include <stdio.h>
#include "session/session_internal.h"

static const char *const NAMES[5] = {"tessel_compress_dense_bytes", "tessel_compress_sent_bytes",
                                     "tessel_compress_received_bytes", "tessel_compress_ratio",
                                     "tessel_compress_residual_norm"};
static const char *const HELP[5] = {
    "bytes of the gradients an uncompressed all-reduce would reduce, last step",
    "bytes this rank sent in the last step (indices, values, scales; PowerSGD's factors)",
    "bytes this rank received from its peers in the last step",
    "dense bytes over sent bytes, last step",
    "L2 norm of this rank's error-feedback residual after the last step"};

ts_status ts_sess_compress_observe(session *s, int64_t step, char *json, size_t n) {
    json[0] = 0;
    if (!s->c.dist.compress || s->nranks < 2) return TS_OK;
    ts_compress_stats cs;
    ts_status st = ts_plan_compress_stats(s->plan, &cs);
    if (st != TS_OK || cs.step != step || cs.sent_bytes <= 0) return st;
    const double v[5] = {cs.dense_bytes, cs.sent_bytes, cs.recv_bytes,
                         cs.dense_bytes / cs.sent_bytes, sqrt(cs.residual_sq)};
    /* the residual norm is NaN after a step whose gradients overflowed (loss
     * scaling): JSON has no NaN, so num() writes null */
    char ratio[32], norm[32];
    snprintf(json, n,
             ",\"comm_dense_bytes\":%.0f,\"comm_sent_bytes\":%.0f,\"comm_recv_bytes\":%.0f,"
             "\"compress_ratio\":%s,\"residual_norm\":%s,\"sent_values\":%lld",
             v[0], v[1], v[2], num(v[3], ratio, sizeof ratio), num(v[4], norm, sizeof norm),
             (long long)cs.sent_values);
    if (s->tm_made) {
        for (int i = 0; i < 5 && st == TS_OK; i++)
            if (!s->compress_m[i])
                st = ts_metrics_gauge(s->tm.reg, NAMES[i], HELP[i], 0, NULL, &s->compress_m[i]);
        for (int i = 0; i < 5 && st == TS_OK; i++) st = ts_metric_set(s->compress_m[i], v[i]);
        if (st != TS_OK) return st;
    }
    if (s->tb) {
        static const char *const tags[5] = {"compress/dense_bytes", "compress/sent_bytes",
                                            "compress/received_bytes", "compress/ratio",
                                            "compress/residual_norm"};
        st = ts_tfevents_scalars(s->tb, step, 5, tags, v);
    }
    return st;
}
