/* CSV time series cut into sliding windows.
 *
 * The first line names the columns; every other non-blank line is a data
 * row with one cell per column, separated by commas. Spaces and tabs around
 * a cell are ignored; quoting is not supported. Only the columns used
 * (features and label) must hold numbers, so a date column can stay in the
 * file. Row numbers in messages are file line numbers (the header is line
 * 1), because that is what an editor shows.
 *
 * Example i (0-based over data rows) takes rows [i, i + window) as x and
 * the label of row i + window - 1 + horizon as y.
 *
 * skip_rows drops leading lines (scikit-learn's bundled tables open with a
 * line of counts, not names); with no_header the columns are named by their
 * 0-based index ("0", "1", ...). With classes > 0 the label is a class id:
 * a whole number in [0, classes), stored as i64. */
#include <locale.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "data/data_internal.h"

typedef struct span {
    const char *s, *e; /* [s, e), trimmed */
} span;

static int is_blank(char c) {
    return c == ' ' || c == '\t' || c == '\r';
}

static span trim(const char *s, const char *e) {
    while (s < e && is_blank(*s)) s++;
    while (e > s && is_blank(e[-1])) e--;
    return (span){s, e};
}

/* Splits [s, e) at commas into cells; returns the number of cells, storing
 * at most `cap` of them. */
static int64_t split_cells(const char *s, const char *e, span *cells, int64_t cap) {
    int64_t n = 0;
    for (const char *p = s;; p++) {
        if (p == e || *p == ',') {
            if (n < cap) cells[n] = trim(s, p);
            n++;
            if (p == e) break;
            s = p + 1;
        }
    }
    return n;
}

static int span_is(span c, const char *name) {
    size_t n = strlen(name);
    return (size_t)(c.e - c.s) == n && !memcmp(c.s, name, n);
}

/* "a, b, c" into buf, cut short with "..." if it does not fit. */
static const char *column_list(const span *cols, int64_t n, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        int w = snprintf(buf + k, cap - k, "%s'%.*s'", i ? ", " : "", (int)(cols[i].e - cols[i].s),
                         cols[i].s);
        if (w < 0 || (size_t)w >= cap - k) {
            if (cap > 4) memcpy(buf + (k < cap - 4 ? k : cap - 4), "...", 4);
            break;
        }
        k += (size_t)w;
    }
    return buf;
}

/* Index of the header column `name`, or an error listing the columns. */
static ts_status find_column(const char *path, const span *cols, int64_t ncols, const char *name,
                             const char *role, int64_t *idx) {
    *idx = -1;
    for (int64_t i = 0; i < ncols; i++) {
        if (!span_is(cols[i], name)) continue;
        if (*idx >= 0)
            return ts_fail(TS_ERR_FORMAT, "%s: column '%s' appears twice in the header", path,
                           name);
        *idx = i;
    }
    if (*idx >= 0) return TS_OK;
    char list[512];
    return ts_fail(TS_ERR_NOT_FOUND, "%s: no %s column '%s'; the columns are %s", path, role, name,
                   column_list(cols, ncols, list, sizeof list));
}

/* The number rule (docs/data.md, "Numbers"): a cell is a plain decimal
 * number, [+-] digits [. digits] [(e|E) [+-] digits], with digits on at
 * least one side of the point ("1.", ".5" are fine). strtod alone would
 * also take hex ("0x10"), "inf", "nan", "infinity" and, through its own
 * whitespace skipping, text that only looks numeric; none of them is a
 * measurement a table should hold, and a .npy file's NaN or infinity is
 * refused the same way. Returns 1 if [s, e) has that form. */
static int plain_decimal(const char *s, const char *e) {
    if (s < e && (*s == '+' || *s == '-')) s++;
    int digits = 0;
    while (s < e && *s >= '0' && *s <= '9') s++, digits++;
    if (s < e && *s == '.') {
        s++;
        while (s < e && *s >= '0' && *s <= '9') s++, digits++;
    }
    if (!digits) return 0;
    if (s < e && (*s == 'e' || *s == 'E')) {
        s++;
        if (s < e && (*s == '+' || *s == '-')) s++;
        int exp_digits = 0;
        while (s < e && *s >= '0' && *s <= '9') s++, exp_digits++;
        if (!exp_digits) return 0;
    }
    return s == e;
}

/* Parses one cell as a plain decimal that fits f32. strtod converts
 * (correctly rounded) and tells the messages apart: text it cannot read is
 * "not a number", nan/inf "not a finite number", hex and the like "not a
 * plain decimal number". The buffer is NUL-terminated, and strtod stops at
 * the comma or line end anyway. The C locale keeps '.' the decimal point
 * whatever the program's locale is. */
static ts_status parse_cell(const char *path, int64_t line, span c, span name, locale_t loc,
                            float *out) {
    char *end = NULL;
    double v = c.s < c.e ? strtod_l(c.s, &end, loc) : 0.0;
    const int whole = c.s < c.e && end == c.e, plain = plain_decimal(c.s, c.e);
    const char *why = NULL;
    if (!whole)
        why = "not a number";
    else if (!plain && !isfinite(v))
        why = "not a finite number";
    else if (!plain)
        why = "not a plain decimal number (such as -1.5 or 2e-3)";
    else if (!isfinite(v) || !isfinite((float)v))
        why = "too large for f32";
    if (why) {
        int len = (int)(c.e - c.s);
        return ts_fail(TS_ERR_FORMAT, "%s:%lld: column '%.*s' holds '%.*s%s', %s", path,
                       (long long)line, (int)(name.e - name.s), name.s, len > 40 ? 40 : len, c.s,
                       len > 40 ? "..." : "", why);
    }
    *out = (float)v;
    return TS_OK;
}

/* Everything the load allocates, freed in one place. */
typedef struct csv_state {
    uint8_t *buf;
    ts_lineage lin;
    span *cols, *cells;
    char *names;  /* generated column names without a header */
    int64_t *use; /* column index per slot: features, then the label */
    float *vals;  /* [rows, n_features + 1] */
    ts_dataset *d;
    locale_t loc;
} csv_state;

static void state_free(csv_state *st) {
    free(st->buf);
    ts_lineage_clear(&st->lin);
    free(st->cols);
    free(st->cells);
    free(st->names);
    free(st->use);
    free(st->vals);
    ts_dataset_free(st->d);
    if (st->loc) freelocale(st->loc);
}

static ts_status check_options(const ts_csv_options *o) {
    if (!o || !o->path) return ts_fail(TS_ERR_INVALID, "CSV windows: no options or no path");
    const char *p = o->path;
    if (!o->label) return ts_fail(TS_ERR_INVALID, "%s: no label column named", p);
    if (o->n_features < 0 || (o->n_features > 0 && !o->features) ||
        (o->features && o->n_features == 0))
        return ts_fail(TS_ERR_INVALID, "%s: feature list and count (%d) disagree", p,
                       o->n_features);
    for (int i = 0; i < o->n_features; i++) {
        if (!o->features[i]) return ts_fail(TS_ERR_INVALID, "%s: feature %d has no name", p, i);
        for (int j = 0; j < i; j++)
            if (!strcmp(o->features[i], o->features[j]))
                return ts_fail(TS_ERR_INVALID, "%s: feature '%s' is listed twice", p,
                               o->features[i]);
    }
    if (o->window < 1)
        return ts_fail(TS_ERR_INVALID, "%s: window %lld (must be at least 1)", p,
                       (long long)o->window);
    if (o->horizon < 0)
        return ts_fail(TS_ERR_INVALID, "%s: horizon %lld (must be at least 0)", p,
                       (long long)o->horizon);
    if (o->train_rows < 0)
        return ts_fail(TS_ERR_INVALID, "%s: train_rows %lld is negative", p,
                       (long long)o->train_rows);
    if (o->skip_rows < 0)
        return ts_fail(TS_ERR_INVALID, "%s: skip_rows %lld is negative", p,
                       (long long)o->skip_rows);
    if (o->classes < 0)
        return ts_fail(TS_ERR_INVALID, "%s: classes %lld is negative", p, (long long)o->classes);
    return TS_OK;
}

static ts_status load(const ts_csv_options *o, csv_state *st, ts_dataset **out) {
    const char *path = o->path;
    size_t len;
    ts_status s = ts_data_slurp(path, &st->buf, &len, &st->lin);
    if (s != TS_OK) return s;
    /* A terminator after the last cell keeps strtod inside the buffer. */
    uint8_t *nb = ts_realloc(st->buf, len + 1, path);
    if (!nb) return TS_ERR_NOMEM;
    st->buf = nb;
    st->buf[len] = 0;
    const char *p = (const char *)st->buf, *end = p + len;
    if (len >= 3 && !memcmp(p, "\xEF\xBB\xBF", 3)) p += 3; /* a UTF-8 byte-order mark */

    int64_t line = 1; /* file line of p */
    for (int64_t k = 0; k < o->skip_rows; k++, line++) {
        const char *q = memchr(p, '\n', (size_t)(end - p));
        if (!q)
            return ts_fail(TS_ERR_FORMAT, "%s: skip_rows is %lld but the file has %lld lines", path,
                           (long long)o->skip_rows, (long long)line);
        p = q + 1;
    }

    /* Header (or, without one, the first data line gives the column count). */
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *hend = nl ? nl : end;
    if (trim(p, hend).s == hend)
        return ts_fail(TS_ERR_FORMAT, "%s:%lld: the line is empty; expected %s", path,
                       (long long)line, o->no_header ? "a data row" : "the column names");
    const int64_t ncols = split_cells(p, hend, NULL, 0);
    st->cols = ts_alloc((size_t)ncols * sizeof *st->cols, "CSV columns");
    st->cells = ts_alloc((size_t)ncols * sizeof *st->cells, "CSV cells");
    if (!st->cols || !st->cells) return TS_ERR_NOMEM;
    if (o->no_header) {
        /* Names "0", "1", ... in one buffer the spans point into. */
        if (!(st->names = ts_alloc((size_t)ncols * 21, "CSV column names"))) return TS_ERR_NOMEM;
        for (int64_t c = 0; c < ncols; c++) {
            char *nm = st->names + c * 21;
            int w = snprintf(nm, 21, "%lld", (long long)c);
            st->cols[c] = (span){nm, nm + (w > 0 ? w : 0)};
        }
    } else {
        split_cells(p, hend, st->cols, ncols);
    }

    /* Columns used: the features in the order given (all but the label, in
     * file order, when none are named), then the label. */
    int64_t label;
    if ((s = find_column(path, st->cols, ncols, o->label, "label", &label)) != TS_OK) return s;
    const int64_t nf = o->features ? o->n_features : ncols - 1;
    if (nf < 1)
        return ts_fail(TS_ERR_INVALID, "%s: no feature columns besides the label '%s'", path,
                       o->label);
    if (!(st->use = ts_alloc((size_t)(nf + 1) * sizeof *st->use, "CSV column map")))
        return TS_ERR_NOMEM;
    if (o->features) {
        for (int64_t f = 0; f < nf; f++)
            if ((s = find_column(path, st->cols, ncols, o->features[f], "feature", &st->use[f])) !=
                TS_OK)
                return s;
    } else {
        for (int64_t c = 0, f = 0; c < ncols; c++)
            if (c != label) st->use[f++] = c;
    }
    st->use[nf] = label;

    /* Data rows. */
    if (!(st->loc = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0)))
        return ts_fail(TS_ERR_NOMEM, "%s: cannot create the C locale for parsing numbers", path);
    const int64_t stride = nf + 1;
    int64_t rows = 0, cap = 0;
    if (o->no_header) line--; /* the first line read below is `p` itself */
    for (p = o->no_header ? p : nl ? nl + 1 : end; p < end; p = nl ? nl + 1 : end) {
        line++;
        nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        if (trim(p, le).s == le) continue;
        const int64_t n = split_cells(p, le, st->cells, ncols);
        if (n != ncols)
            return ts_fail(TS_ERR_FORMAT, "%s:%lld: %lld cells, but the header names %lld columns",
                           path, (long long)line, (long long)n, (long long)ncols);
        if (rows == cap) {
            cap = cap ? 2 * cap : 1024;
            float *v = ts_realloc(st->vals, (size_t)(cap * stride) * sizeof *v, "CSV values");
            if (!v) return TS_ERR_NOMEM;
            st->vals = v;
        }
        for (int64_t k = 0; k < stride; k++)
            if ((s = parse_cell(path, line, st->cells[st->use[k]], st->cols[st->use[k]], st->loc,
                                &st->vals[rows * stride + k])) != TS_OK)
                return s;
        if (o->classes > 0) {
            float lv = st->vals[rows * stride + nf];
            if (lv != floorf(lv) || lv < 0 || lv >= (float)o->classes)
                return ts_fail(TS_ERR_INVALID,
                               "%s:%lld: label column '%.*s' holds %g, not a class id in [0, "
                               "%lld) (model.classes)",
                               path, (long long)line, (int)(st->cols[label].e - st->cols[label].s),
                               st->cols[label].s, (double)lv, (long long)o->classes);
        }
        rows++;
    }

    const int64_t W = o->window, H = o->horizon, n = rows - W - H + 1;
    if (n < 1)
        return ts_fail(TS_ERR_INVALID,
                       "%s: %lld data rows are too few for window %lld and horizon %lld (at "
                       "least %lld are needed)",
                       path, (long long)rows, (long long)W, (long long)H, (long long)(W + H));
    if (o->train_rows > rows)
        return ts_fail(TS_ERR_INVALID, "%s: train_rows is %lld but the file has %lld data rows",
                       path, (long long)o->train_rows, (long long)rows);

    ts_dataset *d = st->d = ts_zalloc(sizeof *d, "dataset");
    if (!d) return TS_ERR_NOMEM;
    if (o->normalise) {
        /* Statistics of the training rows only, so nothing of the rows
         * held out leaks into the inputs; applied with the float values
         * recorded, so the stored statistics reproduce x exactly. */
        const int64_t T = o->train_rows ? o->train_rows : rows;
        d->norm_mean = ts_alloc((size_t)nf * sizeof(float), "normalisation means");
        d->norm_std = ts_alloc((size_t)nf * sizeof(float), "normalisation deviations");
        if (!d->norm_mean || !d->norm_std) return TS_ERR_NOMEM;
        d->n_norm = nf;
        for (int64_t f = 0; f < nf; f++) {
            double sum = 0, sq = 0;
            for (int64_t r = 0; r < T; r++) sum += st->vals[r * stride + f];
            const double mean = sum / (double)T;
            for (int64_t r = 0; r < T; r++) {
                double dv = st->vals[r * stride + f] - mean;
                sq += dv * dv;
            }
            const float m = (float)mean, sd = (float)sqrt(sq / (double)T);
            d->norm_mean[f] = m;
            d->norm_std[f] = sd > 0 ? sd : 1.0f;
            for (int64_t r = 0; r < rows; r++) {
                float *v = &st->vals[r * stride + f];
                *v = (float)(((double)*v - m) / d->norm_std[f]);
            }
        }
    }
    d->n = n;
    d->x_dtype = d->y_dtype = TS_F32;
    d->x_rank = 2, d->x_dims[0] = W, d->x_dims[1] = nf;
    d->y_rank = 1, d->y_dims[0] = 1;
    if (o->classes > 0) d->y_dtype = TS_I64, d->y_rank = 0;
    /* Windows overlap, so x holds up to window times the file's values. */
    int64_t x_vals;
    if (__builtin_mul_overflow(n, W, &x_vals) || __builtin_mul_overflow(x_vals, nf, &x_vals) ||
        x_vals > (int64_t)(SIZE_MAX / 2 / sizeof(float)))
        return ts_fail(TS_ERR_INVALID,
                       "%s: %lld windows of %lld rows x %lld features are too many values to "
                       "hold (data.window)",
                       path, (long long)n, (long long)W, (long long)nf);
    float *x = d->x = ts_alloc((size_t)x_vals * sizeof(float), "CSV windows");
    d->y = ts_alloc((size_t)n * (o->classes > 0 ? sizeof(int64_t) : sizeof(float)), "CSV labels");
    if (!x || !d->y) return TS_ERR_NOMEM;
    for (int64_t i = 0; i < n; i++) {
        for (int64_t t = 0; t < W; t++)
            memcpy(x + (i * W + t) * nf, st->vals + (i + t) * stride, (size_t)nf * sizeof *x);
        float lv = st->vals[(i + W - 1 + H) * stride + nf];
        if (o->classes > 0)
            ((int64_t *)d->y)[i] = (int64_t)lv;
        else
            ((float *)d->y)[i] = lv;
    }
    if ((s = ts_dataset_add_lineage(d, &st->lin)) != TS_OK) return s;
    *out = d;
    st->d = NULL;
    return TS_OK;
}

ts_status ts_data_load_csv_windows(const ts_csv_options *o, ts_dataset **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "CSV windows: no output pointer");
    *out = NULL;
    ts_status s = check_options(o);
    if (s != TS_OK) return s;
    csv_state st = {0};
    s = load(o, &st, out);
    state_free(&st);
    return s;
}
