/* Gradient monitors on the host side (monitor.h): groups, update ratio and
 * windowed baselines. The per-gradient sums come from the plan's monitor
 * nodes, so a step's statistics cost no pass over the gradients here. */
#include "obs/monitor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"

static const char *const metric_names[TS_MON_COUNT] = {"loss", "grad_norm", "grad_variance",
                                                       "update_ratio", "nonfinite_grads"};

const char *ts_mon_metric_name(int metric) {
    return metric >= 0 && metric < TS_MON_COUNT ? metric_names[metric] : "?";
}

int ts_mon_metric_find(const char *name) {
    for (int i = 0; name && i < TS_MON_COUNT; i++)
        if (!strcmp(metric_names[i], name)) return i;
    return -1;
}

/* ---- baselines ---------------------------------------------------------- */

ts_status ts_baseline_init(ts_baseline *b, int window, int warmup) {
    memset(b, 0, sizeof *b);
    if (window < 1 || warmup < 0)
        return ts_fail(TS_ERR_INVALID, "baseline: window %d must be >= 1, warm-up %d >= 0", window,
                       warmup);
    b->window = window;
    b->warmup = warmup;
    b->ring = ts_zalloc(sizeof(double) * (size_t)window, "baseline window");
    return b->ring ? TS_OK : TS_ERR_NOMEM;
}

void ts_baseline_free(ts_baseline *b) {
    free(b->ring);
    memset(b, 0, sizeof *b);
}

void ts_baseline_push(ts_baseline *b, double v) {
    if (!b->ring || !isfinite(v)) return;
    if (ts_baseline_ready(b)) {
        /* An anomaly must not become the baseline it is judged against,
         * yet a new level must: clip, never drop (see monitor.h). */
        const double mu = ts_baseline_mean(b), reach = 3 * ts_baseline_std(b) + fabs(mu);
        if (v > mu + reach) v = mu + reach;
        if (v < mu - reach) v = mu - reach;
    }
    b->ring[b->head] = v;
    b->head = (b->head + 1) % b->window;
    if (b->n < b->window) b->n++;
    b->pushed++;
}

int ts_baseline_ready(const ts_baseline *b) {
    return b->n > 0 && b->pushed >= b->warmup;
}

double ts_baseline_mean(const ts_baseline *b) {
    if (b->n == 0) return NAN;
    double s = 0;
    for (int i = 0; i < b->n; i++) s += b->ring[i];
    return s / b->n;
}

double ts_baseline_std(const ts_baseline *b) {
    if (b->n == 0) return NAN;
    const double mu = ts_baseline_mean(b);
    double s = 0;
    for (int i = 0; i < b->n; i++) s += (b->ring[i] - mu) * (b->ring[i] - mu);
    return sqrt(s / b->n);
}

double ts_baseline_z(const ts_baseline *b, double v) {
    if (!ts_baseline_ready(b)) return NAN;
    const double mu = ts_baseline_mean(b), sd = ts_baseline_std(b);
    if (sd > 0) return (v - mu) / sd;
    return v == mu ? 0 : (v > mu ? INFINITY : -INFINITY);
}

/* ---- groups --------------------------------------------------------------- */

static void group_name(const char *param, char *out, size_t n) {
    const char *dot = strrchr(param, '.');
    size_t len = dot ? (size_t)(dot - param) : strlen(param);
    if (len >= n) len = n - 1;
    memcpy(out, param, len);
    out[len] = 0;
}

void ts_monitor_free(ts_monitor *m) {
    if (!m) return;
    for (int i = 0; i < TS_MON_COUNT; i++) ts_baseline_free(&m->base[i]);
    free(m->groups);
    free(m->group_of);
    free(m->before);
    free(m->now);
    free(m);
}

static size_t f32_param_elems(const ts_plan *p, int i) {
    ts_dtype dt;
    int rank;
    int64_t dims[TS_MAX_RANK];
    if (ts_plan_value_info(p, ts_plan_param_name(p, i), &dt, &rank, dims) != TS_OK || dt != TS_F32)
        return 0;
    size_t n = 1;
    for (int d = 0; d < rank; d++) n *= (size_t)dims[d];
    return n;
}

ts_status ts_monitor_new(const ts_plan *p, int window, int warmup, int update_ratio_every,
                         ts_monitor **out) {
    *out = NULL;
    const int nm = ts_plan_monitor_count(p);
    if (nm <= 0)
        return ts_fail(TS_ERR_INVALID, "monitor: the plan has no monitor nodes (compile it with "
                                       "ts_compile_options.monitors)");
    ts_monitor *m = ts_zalloc(sizeof *m, "monitor");
    if (!m) return TS_ERR_NOMEM;
    ts_status s = TS_OK;
    m->groups = ts_zalloc(sizeof *m->groups * (size_t)nm, "monitor groups");
    m->group_of = ts_zalloc(sizeof(int) * (size_t)nm, "monitor groups");
    if (!m->groups || !m->group_of) s = TS_ERR_NOMEM;
    m->n_mon = nm;
    for (int i = 0; i < nm && s == TS_OK; i++) {
        ts_grad_monitor gm;
        if ((s = ts_plan_monitor(p, i, &gm)) != TS_OK) break;
        char g[128];
        group_name(gm.param, g, sizeof g);
        int k = 0;
        while (k < m->n_groups && strcmp(m->groups[k].name, g)) k++;
        if (k == m->n_groups) snprintf(m->groups[m->n_groups++].name, sizeof g, "%s", g);
        m->group_of[i] = k;
    }
    for (int i = 0; i < TS_MON_COUNT && s == TS_OK; i++)
        s = ts_baseline_init(&m->base[i], window, warmup);
    m->update_ratio_every = update_ratio_every;
    if (s == TS_OK && update_ratio_every > 0) {
        size_t most = 1;
        for (int i = 0; i < ts_plan_param_count(p); i++) {
            const size_t n = f32_param_elems(p, i);
            m->before_n += n;
            if (n > most) most = n;
        }
        m->before = ts_alloc(sizeof(float) * (m->before_n + 1), "parameters before update");
        m->now = ts_alloc(sizeof(float) * most, "update ratio");
        if (!m->before || !m->now) s = TS_ERR_NOMEM;
    }
    for (int i = 0; i < TS_MON_COUNT; i++) m->value[i] = NAN;
    if (s != TS_OK) {
        ts_monitor_free(m);
        return s;
    }
    *out = m;
    return TS_OK;
}

/* Population variance from a sum and a sum of squares, clamped at 0 (the
 * difference of two rounded sums can dip below). */
static double variance(double sumsq, double sum, int64_t n) {
    if (n <= 0) return NAN;
    const double mu = sum / (double)n, v = sumsq / (double)n - mu * mu;
    return v > 0 || !isfinite(v) ? v : 0;
}

ts_status ts_monitor_read(ts_monitor *m, const ts_plan *p, double loss) {
    for (int k = 0; k < m->n_groups; k++) {
        ts_monitor_group *g = &m->groups[k];
        g->sumsq = g->sum = 0;
        g->nonfinite = g->numel = 0;
    }
    double sq = 0, sum = 0;
    int64_t bad = 0, n = 0;
    for (int i = 0; i < m->n_mon; i++) {
        ts_grad_monitor gm;
        ts_status s = ts_plan_monitor(p, i, &gm);
        if (s != TS_OK) return s;
        ts_monitor_group *g = &m->groups[m->group_of[i]];
        g->sumsq += gm.sumsq;
        g->sum += gm.sum;
        g->nonfinite += gm.nonfinite;
        g->numel += gm.numel;
        sq += gm.sumsq, sum += gm.sum, bad += gm.nonfinite, n += gm.numel;
    }
    for (int k = 0; k < m->n_groups; k++) {
        ts_monitor_group *g = &m->groups[k];
        g->norm = sqrt(g->sumsq);
        g->variance = variance(g->sumsq, g->sum, g->numel);
        g->update_ratio = NAN;
    }
    m->value[TS_MON_LOSS] = loss;
    m->value[TS_MON_GRAD_NORM] = sqrt(sq);
    m->value[TS_MON_GRAD_VARIANCE] = variance(sq, sum, n);
    m->value[TS_MON_NONFINITE] = (double)bad;
    m->value[TS_MON_UPDATE_RATIO] = NAN;
    m->have_before = 0;
    return TS_OK;
}

/* Visit every f32 parameter with its slice of m->before. */
typedef ts_status (*param_fn)(ts_monitor *m, const ts_plan *p, int i, const char *name, float *b,
                              size_t n);

static ts_status each_param(ts_monitor *m, const ts_plan *p, param_fn fn) {
    size_t off = 0;
    for (int i = 0; i < ts_plan_param_count(p); i++) {
        size_t n = f32_param_elems(p, i);
        if (!n) continue;
        ts_status s = fn(m, p, i, ts_plan_param_name(p, i), m->before + off, n);
        if (s != TS_OK) return s;
        off += n;
    }
    return TS_OK;
}

static ts_status copy_param(ts_monitor *m, const ts_plan *p, int i, const char *name, float *b,
                            size_t n) {
    (void)m, (void)i;
    return ts_plan_read(p, name, b, n * sizeof(float));
}

ts_status ts_monitor_before_update(ts_monitor *m, const ts_plan *p) {
    /* Called in the update gate: the step being run is one past the count. */
    const int64_t step = ts_plan_step_count(p) + 1;
    if (m->update_ratio_every <= 0 || step % m->update_ratio_every) return TS_OK;
    ts_status s = each_param(m, p, copy_param);
    m->have_before = s == TS_OK;
    return s;
}

static int group_of_param(const ts_monitor *m, const char *name) {
    char g[128];
    group_name(name, g, sizeof g);
    for (int k = 0; k < m->n_groups; k++)
        if (!strcmp(m->groups[k].name, g)) return k;
    return -1;
}

/* One parameter after the update against its copy from before: sums of
 * squares of p and of the difference, in double. Exact: the difference is
 * the update the optimizer applied, whatever the optimizer. */
static ts_status diff_param(ts_monitor *m, const ts_plan *p, int i, const char *name, float *b,
                            size_t n) {
    (void)i;
    const int k = group_of_param(m, name);
    if (k < 0) return TS_OK; /* a parameter without a gradient: not monitored */
    float *now = m->now;
    ts_status s = ts_plan_read(p, name, now, n * sizeof(float));
    if (s == TS_OK) {
        double ps = 0, ds = 0;
        for (size_t j = 0; j < n; j++) {
            const double d = (double)now[j] - (double)b[j];
            ps += (double)b[j] * (double)b[j];
            ds += d * d;
        }
        m->groups[k].p_sumsq += ps;
        m->groups[k].d_sumsq += ds;
    }
    return s;
}

ts_status ts_monitor_after_update(ts_monitor *m, const ts_plan *p) {
    if (!m->have_before) return TS_OK;
    for (int k = 0; k < m->n_groups; k++) m->groups[k].p_sumsq = m->groups[k].d_sumsq = 0;
    ts_status s = each_param(m, p, diff_param);
    if (s != TS_OK) return s;
    double ps = 0, ds = 0;
    for (int k = 0; k < m->n_groups; k++) {
        ts_monitor_group *g = &m->groups[k];
        g->update_ratio = g->p_sumsq > 0 ? sqrt(g->d_sumsq / g->p_sumsq) : NAN;
        ps += g->p_sumsq, ds += g->d_sumsq;
    }
    m->value[TS_MON_UPDATE_RATIO] = ps > 0 ? sqrt(ds / ps) : NAN;
    return TS_OK;
}

void ts_monitor_commit(ts_monitor *m, int push) {
    for (int i = 0; push && i < TS_MON_COUNT; i++) ts_baseline_push(&m->base[i], m->value[i]);
}
