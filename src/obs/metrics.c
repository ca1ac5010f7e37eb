/* metrics.c — the metrics registry and its Prometheus text rendering
 * (format 0.0.4, https://prometheus.io/docs/instrumenting/exposition_formats/). */
#include "obs/metrics.h"

#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/core.h"
#include "tessel/tessel.h"

/* A family may hold this many series; past it the labels are almost
 * certainly unbounded (a step number or a path as a label value), which
 * would make every scrape and the Prometheus server grow without limit. */
#define MAX_SERIES 10000

struct ts_series {
    ts_metric *family;
    char **values; /* one per family label */
    /* Counter and gauge: the value. Histogram: the sum of observations.
     * Doubles are kept as their bit pattern so updates are plain atomics. */
    _Atomic uint64_t bits;
    /* Histogram: n_bounds + 1 per-bucket (not cumulative) counts, the last
     * for values above every bound. The count is their sum, so _count and
     * the +Inf bucket always agree even while observations race a render. */
    _Atomic uint64_t *buckets;
    /* Set by the first update; a lazy family renders only touched series. */
    atomic_int touched;
};

struct ts_metric {
    ts_metrics *reg;
    ts_metric_type type;
    char *name, *help;
    int n_labels;
    char *labels[TS_METRIC_MAX_LABELS];
    int n_bounds;
    double *bounds;
    ts_series **series;
    int n_series, cap_series;
    atomic_int lazy;
};

struct ts_metrics {
    pthread_mutex_t mu;
    ts_metric **fams;
    int n_fams, cap_fams;
    int n_const;
    char *const_names[TS_METRIC_MAX_LABELS], *const_values[TS_METRIC_MAX_LABELS];
};

/* ---- atomics on doubles ---------------------------------------------------- */

static uint64_t d2u(double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static double u2d(uint64_t u) {
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* Relaxed ordering: each value is independent and a scrape only needs to
 * see some recent value of each, not a consistent snapshot across them. */
static void atomic_add_double(_Atomic uint64_t *a, double delta) {
    uint64_t old = atomic_load_explicit(a, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(a, &old, d2u(u2d(old) + delta),
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
}

/* ---- validation ---------------------------------------------------------- */

static int is_alpha_(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static int is_digit(char c) {
    return c >= '0' && c <= '9';
}

static int valid_metric_name(const char *s) {
    if (!s || !(is_alpha_(*s) || *s == ':')) return 0;
    for (s++; *s; s++)
        if (!(is_alpha_(*s) || is_digit(*s) || *s == ':')) return 0;
    return 1;
}

static int valid_label_name(const char *s) {
    if (!s || !is_alpha_(*s) || (s[0] == '_' && s[1] == '_')) return 0;
    for (s++; *s; s++)
        if (!(is_alpha_(*s) || is_digit(*s))) return 0;
    return 1;
}

/* Prometheus requires UTF-8 in label values and help text; a stray Latin-1
 * byte would make the whole scrape fail, so it is refused at the source. */
static int valid_utf8(const char *str) {
    const unsigned char *s = (const unsigned char *)str;
    while (*s) {
        int n;
        uint32_t cp;
        if (*s < 0x80) {
            s++;
            continue;
        } else if ((*s & 0xe0) == 0xc0) {
            n = 1, cp = *s & 0x1f;
        } else if ((*s & 0xf0) == 0xe0) {
            n = 2, cp = *s & 0x0f;
        } else if ((*s & 0xf8) == 0xf0) {
            n = 3, cp = *s & 0x07;
        } else {
            return 0;
        }
        s++;
        for (int i = 0; i < n; i++, s++) {
            if ((*s & 0xc0) != 0x80) return 0;
            cp = (cp << 6) | (*s & 0x3f);
        }
        /* overlong forms, surrogates and values past U+10FFFF */
        if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
            (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
            return 0;
    }
    return 1;
}

static const char *type_name(ts_metric_type t) {
    switch (t) {
    case TS_METRIC_COUNTER: return "counter";
    case TS_METRIC_GAUGE: return "gauge";
    case TS_METRIC_HISTOGRAM: return "histogram";
    }
    return "untyped";
}

/* The sample names a family produces: a histogram's name itself is not a
 * sample, but another family of that name would still clash in queries. */
static int sample_names(const ts_metric *f, char out[4][256]) {
    snprintf(out[0], 256, "%s", f->name);
    if (f->type != TS_METRIC_HISTOGRAM) return 1;
    snprintf(out[1], 256, "%s_bucket", f->name);
    snprintf(out[2], 256, "%s_sum", f->name);
    snprintf(out[3], 256, "%s_count", f->name);
    return 4;
}

/* ---- registry ------------------------------------------------------------ */

ts_status ts_metrics_create(ts_metrics **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "metrics: NULL output pointer");
    *out = NULL;
    ts_metrics *m = ts_zalloc(sizeof *m, "metrics registry");
    if (!m) return TS_ERR_NOMEM;
    if (pthread_mutex_init(&m->mu, NULL)) {
        free(m);
        return ts_fail(TS_ERR_INTERNAL, "metrics: cannot create the registry mutex");
    }
    *out = m;
    return TS_OK;
}

static void series_free(ts_series *s, int n_labels) {
    if (!s) return;
    if (s->values)
        for (int i = 0; i < n_labels; i++) free(s->values[i]);
    free(s->values);
    free(s->buckets);
    free(s);
}

static void family_free(ts_metric *f) {
    if (!f) return;
    for (int i = 0; i < f->n_series; i++) series_free(f->series[i], f->n_labels);
    free(f->series);
    for (int i = 0; i < f->n_labels; i++) free(f->labels[i]);
    free(f->name);
    free(f->help);
    free(f->bounds);
    free(f);
}

void ts_metrics_free(ts_metrics *m) {
    if (!m) return;
    for (int i = 0; i < m->n_fams; i++) family_free(m->fams[i]);
    free(m->fams);
    for (int i = 0; i < m->n_const; i++) {
        free(m->const_names[i]);
        free(m->const_values[i]);
    }
    pthread_mutex_destroy(&m->mu);
    free(m);
}

ts_status ts_metrics_const_label(ts_metrics *m, const char *name, const char *value) {
    if (!m || !value) return ts_fail(TS_ERR_INVALID, "metrics: NULL registry or label value");
    if (!valid_label_name(name) || !strcmp(name, "le"))
        return ts_fail(TS_ERR_INVALID,
                       "metrics: '%s' is not a valid constant label name (letters, digits and "
                       "'_', not starting with a digit or '__', not 'le')",
                       name ? name : "(null)");
    if (!valid_utf8(value))
        return ts_fail(TS_ERR_INVALID, "metrics: value of label '%s' is not valid UTF-8", name);
    ts_status st = TS_OK;
    pthread_mutex_lock(&m->mu);
    int at = -1;
    for (int i = 0; i < m->n_const; i++)
        if (!strcmp(m->const_names[i], name)) at = i;
    for (int i = 0; i < m->n_fams && st == TS_OK; i++)
        for (int j = 0; j < m->fams[i]->n_labels; j++)
            if (!strcmp(m->fams[i]->labels[j], name))
                st = ts_fail(TS_ERR_INVALID,
                             "metrics: constant label '%s' is already a label of family '%s'", name,
                             m->fams[i]->name);
    if (st == TS_OK && at < 0 && m->n_const == TS_METRIC_MAX_LABELS)
        st = ts_fail(TS_ERR_INVALID, "metrics: more than %d constant labels", TS_METRIC_MAX_LABELS);
    char *v = NULL, *n = NULL;
    if (st == TS_OK) {
        v = ts_strdup(value);
        n = at < 0 ? ts_strdup(name) : NULL;
        if (!v || (at < 0 && !n)) st = ts_fail(TS_ERR_NOMEM, "metrics: constant label '%s'", name);
    }
    if (st == TS_OK) {
        if (at < 0) {
            m->const_names[m->n_const] = n;
            m->const_values[m->n_const++] = v;
        } else {
            free(m->const_values[at]);
            m->const_values[at] = v;
        }
    } else {
        free(v);
        free(n);
    }
    pthread_mutex_unlock(&m->mu);
    return st;
}

static ts_status series_new(ts_metric *f, const char *const *values, ts_series **out) {
    ts_series *s = ts_zalloc(sizeof *s, "metric series");
    if (!s) return TS_ERR_NOMEM;
    s->family = f;
    atomic_init(&s->bits, d2u(0.0));
    atomic_init(&s->touched, 0);
    if (f->n_labels) {
        s->values = ts_zalloc(sizeof(char *) * (size_t)f->n_labels, "metric label values");
        if (!s->values) goto nomem;
        for (int i = 0; i < f->n_labels; i++)
            if (!(s->values[i] = ts_strdup(values[i]))) goto nomem;
    }
    if (f->type == TS_METRIC_HISTOGRAM) {
        s->buckets =
            ts_alloc(sizeof(_Atomic uint64_t) * (size_t)(f->n_bounds + 1), "histogram buckets");
        if (!s->buckets) goto nomem;
        for (int i = 0; i <= f->n_bounds; i++) atomic_init(&s->buckets[i], 0);
    }
    *out = s;
    return TS_OK;
nomem:
    series_free(s, f->n_labels);
    return ts_fail(TS_ERR_NOMEM, "metrics: out of memory for a series of '%s'", f->name);
}

/* Appends a new series to f; the caller holds the registry mutex. */
static ts_status family_add_series(ts_metric *f, const char *const *values, ts_series **out) {
    if (f->n_series >= MAX_SERIES)
        return ts_fail(TS_ERR_INVALID,
                       "metrics: family '%s' already has %d series; a label with unbounded "
                       "values (a step, an id) would exhaust the Prometheus server",
                       f->name, MAX_SERIES);
    if (ts_grow((void **)&f->series, &f->cap_series, f->n_series + 1, sizeof(ts_series *),
                "metric series list") != TS_OK)
        return TS_ERR_NOMEM;
    ts_series *s = NULL;
    ts_status st = series_new(f, values, &s);
    if (st != TS_OK) return st;
    f->series[f->n_series++] = s;
    *out = s;
    return TS_OK;
}

static ts_status family_register(ts_metrics *m, ts_metric_type type, const char *name,
                                 const char *help, int n_labels, const char *const *labels,
                                 int n_bounds, const double *bounds, ts_metric **out) {
    if (out) *out = NULL;
    if (!m || !out) return ts_fail(TS_ERR_INVALID, "metrics: NULL registry or output pointer");
    if (!valid_metric_name(name) || strlen(name) > 200)
        return ts_fail(TS_ERR_INVALID,
                       "metrics: '%s' is not a valid metric name (letters, digits, '_' and ':', "
                       "not starting with a digit, at most 200 characters)",
                       name ? name : "(null)");
    if (help && !valid_utf8(help))
        return ts_fail(TS_ERR_INVALID, "metrics: help text of '%s' is not valid UTF-8", name);
    if (n_labels < 0 || n_labels > TS_METRIC_MAX_LABELS || (n_labels && !labels))
        return ts_fail(TS_ERR_INVALID, "metrics: '%s': %d labels (0 to %d allowed)", name, n_labels,
                       TS_METRIC_MAX_LABELS);
    for (int i = 0; i < n_labels; i++) {
        if (!valid_label_name(labels[i]))
            return ts_fail(TS_ERR_INVALID,
                           "metrics: '%s': '%s' is not a valid label name (letters, digits and "
                           "'_', not starting with a digit or '__')",
                           name, labels[i] ? labels[i] : "(null)");
        if (type == TS_METRIC_HISTOGRAM && !strcmp(labels[i], "le"))
            return ts_fail(TS_ERR_INVALID,
                           "metrics: histogram '%s' cannot have a label 'le': it names buckets",
                           name);
        for (int j = 0; j < i; j++)
            if (!strcmp(labels[i], labels[j]))
                return ts_fail(TS_ERR_INVALID, "metrics: '%s': label '%s' given twice", name,
                               labels[i]);
    }
    if (type == TS_METRIC_HISTOGRAM) {
        if (n_bounds > 0 && bounds && isinf(bounds[n_bounds - 1]) && bounds[n_bounds - 1] > 0)
            n_bounds--;
        if (n_bounds < 0 || n_bounds > TS_METRIC_MAX_BUCKETS || (n_bounds && !bounds))
            return ts_fail(TS_ERR_INVALID, "metrics: histogram '%s': %d bucket bounds (0 to %d)",
                           name, n_bounds, TS_METRIC_MAX_BUCKETS);
        for (int i = 0; i < n_bounds; i++) {
            if (!isfinite(bounds[i]))
                return ts_fail(TS_ERR_INVALID,
                               "metrics: histogram '%s': bound %d is not finite (the +Inf "
                               "bucket is implicit)",
                               name, i);
            if (i && !(bounds[i] > bounds[i - 1]))
                return ts_fail(TS_ERR_INVALID,
                               "metrics: histogram '%s': bounds must increase, but bound %d "
                               "(%g) <= bound %d (%g)",
                               name, i, bounds[i], i - 1, bounds[i - 1]);
        }
    }

    ts_metric *f = ts_zalloc(sizeof *f, "metric family");
    if (!f) return TS_ERR_NOMEM;
    f->reg = m;
    atomic_init(&f->lazy, 0);
    f->type = type;
    f->name = ts_strdup(name);
    f->help = ts_strdup(help ? help : "");
    f->n_bounds = type == TS_METRIC_HISTOGRAM ? n_bounds : 0;
    if (f->n_bounds) {
        f->bounds = ts_alloc(sizeof(double) * (size_t)f->n_bounds, "histogram bounds");
        if (f->bounds) memcpy(f->bounds, bounds, sizeof(double) * (size_t)f->n_bounds);
    }
    int ok = f->name && f->help && (!f->n_bounds || f->bounds);
    for (int i = 0; i < n_labels && ok; i++, f->n_labels++)
        ok = !!(f->labels[i] = ts_strdup(labels[i]));
    if (!ok) {
        family_free(f);
        return ts_fail(TS_ERR_NOMEM, "metrics: out of memory registering '%s'", name);
    }

    ts_status st = TS_OK;
    pthread_mutex_lock(&m->mu);
    char mine[4][256], theirs[4][256];
    int n_mine = sample_names(f, mine);
    for (int i = 0; i < m->n_fams && st == TS_OK; i++) {
        int n_theirs = sample_names(m->fams[i], theirs);
        for (int a = 0; a < n_mine && st == TS_OK; a++)
            for (int b = 0; b < n_theirs && st == TS_OK; b++)
                if (!strcmp(mine[a], theirs[b]))
                    st = ts_fail(TS_ERR_INVALID,
                                 "metrics: '%s' clashes with the already registered %s '%s'", name,
                                 type_name(m->fams[i]->type), m->fams[i]->name);
    }
    for (int i = 0; i < n_labels && st == TS_OK; i++)
        for (int j = 0; j < m->n_const && st == TS_OK; j++)
            if (!strcmp(labels[i], m->const_names[j]))
                st = ts_fail(TS_ERR_INVALID,
                             "metrics: '%s': label '%s' is already a constant label of the "
                             "registry",
                             name, labels[i]);
    if (st == TS_OK && m->n_const + n_labels > TS_METRIC_MAX_LABELS)
        st = ts_fail(TS_ERR_INVALID, "metrics: '%s': more than %d labels with the constant ones",
                     name, TS_METRIC_MAX_LABELS);
    ts_series *single = NULL;
    if (st == TS_OK && n_labels == 0) st = family_add_series(f, NULL, &single);
    if (st == TS_OK)
        st = ts_grow((void **)&m->fams, &m->cap_fams, m->n_fams + 1, sizeof(ts_metric *),
                     "metric family list");
    if (st == TS_OK) m->fams[m->n_fams++] = f;
    pthread_mutex_unlock(&m->mu);
    if (st != TS_OK) {
        family_free(f);
        return st;
    }
    *out = f;
    return TS_OK;
}

ts_status ts_metrics_counter(ts_metrics *m, const char *name, const char *help, int n_labels,
                             const char *const *labels, ts_metric **out) {
    return family_register(m, TS_METRIC_COUNTER, name, help, n_labels, labels, 0, NULL, out);
}

ts_status ts_metrics_gauge(ts_metrics *m, const char *name, const char *help, int n_labels,
                           const char *const *labels, ts_metric **out) {
    return family_register(m, TS_METRIC_GAUGE, name, help, n_labels, labels, 0, NULL, out);
}

ts_status ts_metrics_histogram(ts_metrics *m, const char *name, const char *help, int n_labels,
                               const char *const *labels, int n_bounds, const double *bounds,
                               ts_metric **out) {
    return family_register(m, TS_METRIC_HISTOGRAM, name, help, n_labels, labels, n_bounds, bounds,
                           out);
}

ts_status ts_metrics_exp_buckets(double start, double factor, int n, double *out) {
    if (!out || !(start > 0) || !(factor > 1) || n < 1 || n > TS_METRIC_MAX_BUCKETS)
        return ts_fail(TS_ERR_INVALID,
                       "metrics: exponential buckets need start > 0, factor > 1 and 1..%d "
                       "buckets (got %g, %g, %d)",
                       TS_METRIC_MAX_BUCKETS, start, factor, n);
    double v = start;
    for (int i = 0; i < n; i++, v *= factor) out[i] = v;
    if (!isfinite(out[n - 1]))
        return ts_fail(TS_ERR_INVALID, "metrics: exponential buckets overflow at %g * %g^%d", start,
                       factor, n - 1);
    return TS_OK;
}

ts_status ts_metric_series(ts_metric *f, const char *const *values, ts_series **out) {
    if (!f || !out) return ts_fail(TS_ERR_INVALID, "metrics: NULL family or output pointer");
    *out = NULL;
    if (f->n_labels && !values)
        return ts_fail(TS_ERR_INVALID, "metrics: '%s' needs %d label values", f->name, f->n_labels);
    for (int i = 0; i < f->n_labels; i++) {
        if (!values[i])
            return ts_fail(TS_ERR_INVALID, "metrics: '%s': value of label '%s' is NULL", f->name,
                           f->labels[i]);
        if (!valid_utf8(values[i]))
            return ts_fail(TS_ERR_INVALID, "metrics: '%s': value of label '%s' is not UTF-8",
                           f->name, f->labels[i]);
    }
    ts_metrics *m = f->reg;
    ts_status st = TS_OK;
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < f->n_series && !*out; i++) {
        int same = 1;
        for (int j = 0; j < f->n_labels && same; j++)
            same = !strcmp(f->series[i]->values[j], values[j]);
        if (same) *out = f->series[i];
    }
    if (!*out) st = family_add_series(f, values, out);
    pthread_mutex_unlock(&m->mu);
    return st;
}

void ts_metric_lazy(ts_metric *f) {
    if (f) atomic_store(&f->lazy, 1);
}

/* ---- updates --------------------------------------------------------------- */

ts_status ts_series_inc(ts_series *s, double delta) {
    if (!s) return ts_fail(TS_ERR_INVALID, "metrics: NULL series");
    ts_metric *f = s->family;
    if (f->type == TS_METRIC_HISTOGRAM)
        return ts_fail(TS_ERR_INVALID, "metrics: '%s' is a histogram: observe, do not add",
                       f->name);
    if (f->type == TS_METRIC_COUNTER && !(delta >= 0))
        return ts_fail(TS_ERR_INVALID, "metrics: counter '%s' can only grow (delta %g)", f->name,
                       delta);
    atomic_add_double(&s->bits, delta);
    atomic_store_explicit(&s->touched, 1, memory_order_relaxed);
    return TS_OK;
}

ts_status ts_series_set(ts_series *s, double value) {
    if (!s) return ts_fail(TS_ERR_INVALID, "metrics: NULL series");
    if (s->family->type != TS_METRIC_GAUGE)
        return ts_fail(TS_ERR_INVALID, "metrics: '%s' is a %s: only gauges can be set",
                       s->family->name, type_name(s->family->type));
    atomic_store_explicit(&s->bits, d2u(value), memory_order_relaxed);
    atomic_store_explicit(&s->touched, 1, memory_order_relaxed);
    return TS_OK;
}

ts_status ts_series_observe(ts_series *s, double value) {
    if (!s) return ts_fail(TS_ERR_INVALID, "metrics: NULL series");
    ts_metric *f = s->family;
    if (f->type != TS_METRIC_HISTOGRAM)
        return ts_fail(TS_ERR_INVALID, "metrics: '%s' is a %s: only histograms observe", f->name,
                       type_name(f->type));
    /* NaN compares false with every bound and lands in +Inf, as in the
     * Prometheus client libraries. */
    int b = 0;
    while (b < f->n_bounds && !(value <= f->bounds[b])) b++;
    atomic_fetch_add_explicit(&s->buckets[b], 1, memory_order_relaxed);
    atomic_add_double(&s->bits, value);
    atomic_store_explicit(&s->touched, 1, memory_order_relaxed);
    return TS_OK;
}

double ts_series_value(const ts_series *s) {
    return s ? u2d(atomic_load_explicit(&((ts_series *)s)->bits, memory_order_relaxed)) : NAN;
}

uint64_t ts_series_count(const ts_series *s) {
    if (!s || s->family->type != TS_METRIC_HISTOGRAM) return 0;
    uint64_t n = 0;
    for (int i = 0; i <= s->family->n_bounds; i++)
        n += atomic_load_explicit(&s->buckets[i], memory_order_relaxed);
    return n;
}

/* The single series of an unlabelled family; it is created at registration
 * and never moves, so reading it needs no lock. */
static ts_status single(ts_metric *f, ts_series **s) {
    if (!f) return ts_fail(TS_ERR_INVALID, "metrics: NULL family");
    if (f->n_labels)
        return ts_fail(TS_ERR_INVALID,
                       "metrics: '%s' has labels: update it through ts_metric_series", f->name);
    *s = f->series[0];
    return TS_OK;
}

ts_status ts_metric_inc(ts_metric *f, double delta) {
    ts_series *s = NULL;
    ts_status st = single(f, &s);
    return st == TS_OK ? ts_series_inc(s, delta) : st;
}

ts_status ts_metric_set(ts_metric *f, double value) {
    ts_series *s = NULL;
    ts_status st = single(f, &s);
    return st == TS_OK ? ts_series_set(s, value) : st;
}

ts_status ts_metric_observe(ts_metric *f, double value) {
    ts_series *s = NULL;
    ts_status st = single(f, &s);
    return st == TS_OK ? ts_series_observe(s, value) : st;
}

/* ---- rendering ----------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t k) {
    if (b->oom) return;
    if (b->n + k + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->n + k + 1 > cap) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, k);
    b->n += k;
    b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) {
    sb_put(b, s, strlen(s));
}

/* Label values escape backslash, double quote and newline; help text only
 * backslash and newline (a quote is literal there). */
static void sb_escaped(sbuf *b, const char *s, int quote) {
    for (; *s; s++) {
        if (*s == '\\')
            sb_put(b, "\\\\", 2);
        else if (*s == '\n')
            sb_put(b, "\\n", 2);
        else if (*s == '"' && quote)
            sb_put(b, "\\\"", 2);
        else
            sb_put(b, s, 1);
    }
}

/* Integers below 2^53 in full, anything else as the shortest decimal that
 * reads back as the same double, so a scraped 0.1 is "0.1" rather than
 * "0.10000000000000001"; Go's ParseFloat (used by Prometheus) reads "NaN",
 * "+Inf" and "-Inf". */
static void fmt_double(char *buf, size_t n, double v) {
    if (isnan(v)) {
        snprintf(buf, n, "NaN");
    } else if (isinf(v)) {
        snprintf(buf, n, v > 0 ? "+Inf" : "-Inf");
    } else if (v == floor(v) && fabs(v) < 9007199254740992.0) {
        /* integers (counts, bytes, steps) in full: "400000", not "4e+05" */
        snprintf(buf, n, "%.0f", v);
    } else {
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(buf, n, "%.*g", prec, v);
            if (strtod(buf, NULL) == v) break;
        }
    }
}

static void sb_double(sbuf *b, double v) {
    char buf[40];
    fmt_double(buf, sizeof buf, v);
    sb_str(b, buf);
}

static void sb_u64(sbuf *b, uint64_t v) {
    char buf[24];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    sb_str(b, buf);
}

/* `{const labels, family labels[, le="..."]}` or nothing when empty. */
static void sb_labels(sbuf *b, const ts_metrics *m, const ts_series *s, const char *le) {
    const ts_metric *f = s->family;
    if (!m->n_const && !f->n_labels && !le) return;
    sb_put(b, "{", 1);
    int first = 1;
    for (int i = 0; i < m->n_const + f->n_labels; i++) {
        const char *name = i < m->n_const ? m->const_names[i] : f->labels[i - m->n_const];
        const char *value = i < m->n_const ? m->const_values[i] : s->values[i - m->n_const];
        if (!first) sb_put(b, ",", 1);
        first = 0;
        sb_str(b, name);
        sb_put(b, "=\"", 2);
        sb_escaped(b, value, 1);
        sb_put(b, "\"", 1);
    }
    if (le) {
        if (!first) sb_put(b, ",", 1);
        sb_put(b, "le=\"", 4);
        sb_str(b, le);
        sb_put(b, "\"", 1);
    }
    sb_put(b, "}", 1);
}

static int shown(const ts_metric *f, const ts_series *s) {
    return !atomic_load_explicit(&((ts_metric *)f)->lazy, memory_order_relaxed) ||
           atomic_load_explicit(&((ts_series *)s)->touched, memory_order_relaxed);
}

static void render_family(sbuf *b, const ts_metrics *m, const ts_metric *f) {
    /* A family with nothing to show (labelled without series yet, or lazy
     * and never updated) is left out entirely, as client libraries do,
     * rather than emitting a bare TYPE line. */
    int any = 0;
    for (int i = 0; i < f->n_series && !any; i++) any = shown(f, f->series[i]);
    if (!any) return;
    sb_str(b, "# HELP ");
    sb_str(b, f->name);
    sb_put(b, " ", 1);
    sb_escaped(b, f->help, 0);
    sb_str(b, "\n# TYPE ");
    sb_str(b, f->name);
    sb_put(b, " ", 1);
    sb_str(b, type_name(f->type));
    sb_put(b, "\n", 1);
    for (int i = 0; i < f->n_series; i++) {
        const ts_series *s = f->series[i];
        if (!shown(f, s)) continue;
        double v = u2d(atomic_load_explicit(&((ts_series *)s)->bits, memory_order_relaxed));
        if (f->type != TS_METRIC_HISTOGRAM) {
            sb_str(b, f->name);
            sb_labels(b, m, s, NULL);
            sb_put(b, " ", 1);
            sb_double(b, v);
            sb_put(b, "\n", 1);
            continue;
        }
        uint64_t cum = 0;
        for (int k = 0; k <= f->n_bounds; k++) {
            char le[40];
            if (k < f->n_bounds)
                fmt_double(le, sizeof le, f->bounds[k]);
            else
                snprintf(le, sizeof le, "+Inf");
            cum += atomic_load_explicit(&s->buckets[k], memory_order_relaxed);
            sb_str(b, f->name);
            sb_str(b, "_bucket");
            sb_labels(b, m, s, le);
            sb_put(b, " ", 1);
            sb_u64(b, cum);
            sb_put(b, "\n", 1);
        }
        sb_str(b, f->name);
        sb_str(b, "_sum");
        sb_labels(b, m, s, NULL);
        sb_put(b, " ", 1);
        sb_double(b, v);
        sb_put(b, "\n", 1);
        sb_str(b, f->name);
        sb_str(b, "_count");
        sb_labels(b, m, s, NULL);
        sb_put(b, " ", 1);
        sb_u64(b, cum);
        sb_put(b, "\n", 1);
    }
}

ts_status ts_metrics_render(ts_metrics *m, char **text, size_t *len) {
    if (!m || !text) return ts_fail(TS_ERR_INVALID, "metrics: NULL registry or output pointer");
    *text = NULL;
    if (len) *len = 0;
    sbuf b = {0};
    sb_put(&b, "", 0); /* an empty registry still renders as "" */
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < m->n_fams && !b.oom; i++) render_family(&b, m, m->fams[i]);
    pthread_mutex_unlock(&m->mu);
    if (b.oom) {
        free(b.p);
        return ts_fail(TS_ERR_NOMEM, "metrics: out of memory rendering %zu bytes", b.n);
    }
    *text = b.p;
    if (len) *len = b.n;
    return TS_OK;
}

/* ---- tessel's standard training metrics ---------------------------------- */

ts_status ts_metrics_resident_bytes(uint64_t *bytes) {
    if (!bytes) return ts_fail(TS_ERR_INVALID, "metrics: NULL output pointer");
    *bytes = 0;
    /* open/read rather than stdio: this runs every step, and a step must
     * not allocate (tests/unit/noalloc.c). */
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ts_fail(TS_ERR_UNSUPPORTED, "metrics: cannot open /proc/self/statm");
    char buf[128];
    ssize_t k = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (k <= 0) return ts_fail(TS_ERR_IO, "metrics: cannot read /proc/self/statm");
    buf[k] = 0;
    unsigned long long size_pages, rss_pages;
    if (sscanf(buf, "%llu %llu", &size_pages, &rss_pages) != 2)
        return ts_fail(TS_ERR_FORMAT, "metrics: unexpected /proc/self/statm: %.40s", buf);
    long page = sysconf(_SC_PAGESIZE);
    *bytes = (uint64_t)rss_pages * (uint64_t)(page > 0 ? page : 4096);
    return TS_OK;
}

ts_status ts_train_metrics_create(int rank, ts_train_metrics *tm) {
    if (!tm) return ts_fail(TS_ERR_INVALID, "metrics: NULL train metrics");
    memset(tm, 0, sizeof *tm);
    ts_metrics *m;
    ts_status st = ts_metrics_create(&m);
    if (st != TS_OK) return st;
    if (rank >= 0) {
        char r[16];
        snprintf(r, sizeof r, "%d", rank);
        st = ts_metrics_const_label(m, "rank", r);
    }
    /* Step times from 1 ms to about 2 minutes; checkpoints from 10 ms to
     * about 20 minutes; both doubling, so any run lands in a few buckets. */
    double step_b[18], ckpt_b[18];
    if (st == TS_OK) st = ts_metrics_exp_buckets(0.001, 2, 18, step_b);
    if (st == TS_OK) st = ts_metrics_exp_buckets(0.01, 2, 18, ckpt_b);
    static const char *const version[] = {"version"}, *const group[] = {"group"},
                             *const reason[] = {"reason"}, *const op[] = {"op"},
                             *const kind[] = {"kind"}, *const alert[] = {"rule", "action"};
#define G(field, name, help)                                                                       \
    if (st == TS_OK) st = ts_metrics_gauge(m, name, help, 0, NULL, &tm->field)
#define GL(field, name, help, labels)                                                              \
    if (st == TS_OK) st = ts_metrics_gauge(m, name, help, 1, labels, &tm->field)
#define CL(field, name, help, n, labels)                                                           \
    if (st == TS_OK) st = ts_metrics_counter(m, name, help, n, labels, &tm->field)
    GL(build_info, "tessel_build_info", "Always 1; the version label names the tessel build.",
       version);
    G(step, "tessel_step", "Last completed training step.");
    if (st == TS_OK)
        st = ts_metrics_counter(m, "tessel_steps_total", "Training steps run by this process.", 0,
                                NULL, &tm->steps);
    G(loss, "tessel_loss", "Training loss of the last step.");
    G(learning_rate, "tessel_learning_rate", "Learning rate of the last step.");
    G(samples_per_second, "tessel_samples_per_second",
      "Training throughput in samples per second.");
    G(tokens_per_second, "tessel_tokens_per_second", "Training throughput in tokens per second.");
    if (st == TS_OK)
        st = ts_metrics_histogram(m, "tessel_step_duration_seconds",
                                  "Wall time of one training step.", 0, NULL, 18, step_b,
                                  &tm->step_seconds);
    G(grad_norm, "tessel_grad_norm", "Global L2 norm of the gradients of the last step.");
    GL(group_grad_norm, "tessel_group_grad_norm",
       "L2 norm of the gradients of one parameter group.", group);
    G(grad_variance, "tessel_grad_variance", "Variance of the gradient elements of the last step.");
    GL(update_ratio, "tessel_update_ratio",
       "Norm of the optimizer update over the norm of the parameters, per group.", group);
    G(loss_scale, "tessel_loss_scale", "Current dynamic loss scale (mixed precision).");
    CL(skipped_steps, "tessel_skipped_steps_total",
       "Steps whose update was discarded (overflow, alert action), by reason.", 1, reason);
    CL(collective_bytes, "tessel_collective_bytes_total",
       "Bytes sent by this rank in collectives, by operation.", 1, op);
    CL(collective_seconds, "tessel_collective_seconds_total",
       "Wall time spent in collectives, by operation.", 1, op);
    CL(collectives, "tessel_collectives_total", "Collectives run, by operation.", 1, op);
    if (st == TS_OK)
        st = ts_metrics_histogram(m, "tessel_checkpoint_duration_seconds",
                                  "Wall time to write and commit one checkpoint.", 0, NULL, 18,
                                  ckpt_b, &tm->checkpoint_seconds);
    G(arena_bytes, "tessel_arena_bytes", "Size of the plan's memory arena.");
    G(resident_bytes, "tessel_resident_memory_bytes", "Resident memory of the training process.");
    CL(anomalies, "tessel_anomalies_total",
       "Anomalies seen by the gradient monitors and loss checks, by kind.", 1, kind);
    CL(alerts, "tessel_alerts_total", "Alert rules that fired, by rule and action.", 2, alert);
    if (st == TS_OK)
        st = ts_metrics_counter(m, "tessel_data_wait_seconds_total",
                                "Time training steps waited for their batch (input pipeline).", 0,
                                NULL, &tm->data_wait_seconds);
#undef G
#undef GL
#undef CL
    /* Values not every run has (no tokens for an MLP, no loss scale
     * without mixed precision, no checkpoint yet) stay out of the scrape
     * until set, rather than reading as a misleading 0. */
    if (st == TS_OK) {
        ts_metric *lazy[] = {
            tm->loss,           tm->learning_rate, tm->samples_per_second, tm->tokens_per_second,
            tm->grad_norm,      tm->grad_variance, tm->loss_scale,         tm->arena_bytes,
            tm->resident_bytes, tm->step_seconds,  tm->checkpoint_seconds, tm->data_wait_seconds};
        for (size_t i = 0; i < sizeof lazy / sizeof *lazy; i++) ts_metric_lazy(lazy[i]);
    }
    ts_series *info = NULL;
    if (st == TS_OK)
        st = ts_metric_series(tm->build_info, (const char *const[]){TESSEL_VERSION}, &info);
    if (st == TS_OK) st = ts_series_set(info, 1);
    if (st != TS_OK) {
        ts_error_prefix("registering the training metrics");
        ts_metrics_free(m);
        memset(tm, 0, sizeof *tm);
        return st;
    }
    tm->reg = m;
    return TS_OK;
}

void ts_train_metrics_free(ts_train_metrics *tm) {
    if (!tm) return;
    ts_metrics_free(tm->reg);
    memset(tm, 0, sizeof *tm);
}

ts_step_metrics ts_step_metrics_empty(void) {
    return (ts_step_metrics){0, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN};
}

ts_status ts_train_metrics_step(ts_train_metrics *tm, const ts_step_metrics *s) {
    if (!tm || !tm->reg || !s)
        return ts_fail(TS_ERR_INVALID, "metrics: NULL train metrics or step");
    ts_metric_set(tm->step, (double)s->step);
    ts_metric_inc(tm->steps, 1);
    ts_metric_set(tm->loss, s->loss);
    if (!isnan(s->learning_rate)) ts_metric_set(tm->learning_rate, s->learning_rate);
    if (!isnan(s->samples_per_s)) ts_metric_set(tm->samples_per_second, s->samples_per_s);
    if (!isnan(s->tokens_per_s)) ts_metric_set(tm->tokens_per_second, s->tokens_per_s);
    if (!isnan(s->grad_norm)) ts_metric_set(tm->grad_norm, s->grad_norm);
    if (!isnan(s->grad_variance)) ts_metric_set(tm->grad_variance, s->grad_variance);
    if (!isnan(s->loss_scale)) ts_metric_set(tm->loss_scale, s->loss_scale);
    if (s->data_wait_total_s >= tm->data_wait_seen) { /* NaN: no loader */
        ts_metric_inc(tm->data_wait_seconds, s->data_wait_total_s - tm->data_wait_seen);
        tm->data_wait_seen = s->data_wait_total_s;
    }
    if (s->seconds >= 0) ts_metric_observe(tm->step_seconds, s->seconds);
    uint64_t rss;
    /* Without /proc (not Linux) the gauge simply stays at 0. */
    if (ts_metrics_resident_bytes(&rss) == TS_OK) ts_metric_set(tm->resident_bytes, (double)rss);
    return TS_OK;
}

static ts_status labelled_inc(ts_metric *f, const char *const *values, double delta) {
    ts_series *s = NULL;
    ts_status st = ts_metric_series(f, values, &s);
    return st == TS_OK ? ts_series_inc(s, delta) : st;
}

ts_status ts_train_metrics_collective(ts_train_metrics *tm, const char *op, double bytes,
                                      double seconds) {
    if (!tm || !tm->reg) return ts_fail(TS_ERR_INVALID, "metrics: NULL train metrics");
    const char *const v[] = {op};
    ts_status st = labelled_inc(tm->collective_bytes, v, bytes);
    if (st == TS_OK) st = labelled_inc(tm->collective_seconds, v, seconds);
    if (st == TS_OK) st = labelled_inc(tm->collectives, v, 1);
    return st;
}

ts_status ts_train_metrics_anomaly(ts_train_metrics *tm, const char *kind) {
    if (!tm || !tm->reg) return ts_fail(TS_ERR_INVALID, "metrics: NULL train metrics");
    return labelled_inc(tm->anomalies, (const char *const[]){kind}, 1);
}

ts_status ts_train_metrics_alert(ts_train_metrics *tm, const char *rule, const char *action) {
    if (!tm || !tm->reg) return ts_fail(TS_ERR_INVALID, "metrics: NULL train metrics");
    return labelled_inc(tm->alerts, (const char *const[]){rule, action}, 1);
}

ts_status ts_train_metrics_skipped(ts_train_metrics *tm, const char *reason) {
    if (!tm || !tm->reg) return ts_fail(TS_ERR_INVALID, "metrics: NULL train metrics");
    return labelled_inc(tm->skipped_steps, (const char *const[]){reason}, 1);
}

ts_status ts_train_metrics_group(ts_train_metrics *tm, const char *group, double grad_norm,
                                 double update_ratio) {
    if (!tm || !tm->reg) return ts_fail(TS_ERR_INVALID, "metrics: NULL train metrics");
    const char *const v[] = {group};
    ts_series *s = NULL;
    ts_status st = TS_OK;
    if (!isnan(grad_norm) && (st = ts_metric_series(tm->group_grad_norm, v, &s)) == TS_OK)
        st = ts_series_set(s, grad_norm);
    if (st == TS_OK && !isnan(update_ratio) &&
        (st = ts_metric_series(tm->update_ratio, v, &s)) == TS_OK)
        st = ts_series_set(s, update_ratio);
    return st;
}
