/* quant.c — `tessel quant report`: the FP8 quantisation error of each
 * calibration method on the tensors of a .npy file or of a checkpoint's
 * parameters (src/quant/calib.c does the work; docs/fp8.md). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "quant_cli.h"
#include "tessel/tessel.h"

typedef struct qopts {
    const char *path;
    ts_quant_report_opts r;
    int json;
} qopts;

static int parse_num(const char *opt, const char *v, double lo, double hi, double *out) {
    char *end;
    double x = strtod(v, &end);
    if (!*v || *end || !(x >= lo && x <= hi))
        return cli_error(CLI_USAGE, "quant report: %s must be a number in [%g, %g], got '%s'", opt,
                         lo, hi, v);
    *out = x;
    return CLI_OK;
}

static int parse(int argc, char **argv, qopts *o) {
    memset(o, 0, sizeof *o);
    o->r = ts_quant_report_defaults();
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        if (a[0] != '-' || !a[1]) {
            if (o->path)
                return cli_error(CLI_USAGE, "quant report takes one file, got '%s' and '%s'",
                                 o->path, a);
            o->path = a;
            continue;
        }
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        char name[32];
        size_t nl = eq ? (size_t)(eq - a) : strlen(a);
        snprintf(name, sizeof name, "%.*s", (int)(nl < 31 ? nl : 31), a);
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        static const char opts[] =
            " --format --per-channel --percentile --history --reduce --margin ";
        char key[40];
        snprintf(key, sizeof key, " %s ", name);
        if (!strstr(opts, key))
            return cli_error(CLI_USAGE, "quant report: unknown option '%s' (options:%s--json)", a,
                             opts);
        if (!v) return cli_error(CLI_USAGE, "quant report: %s needs a value", name);
        double x = 0;
        int rc = CLI_OK;
        if (!strcmp(name, "--format")) {
            if (!strcmp(v, "e4m3"))
                o->r.fmt = TS_F8E4M3;
            else if (!strcmp(v, "e5m2"))
                o->r.fmt = TS_F8E5M2;
            else
                return cli_error(CLI_USAGE, "quant report: --format must be e4m3 or e5m2, got '%s'",
                                 v);
        } else if (!strcmp(name, "--per-channel")) {
            if ((rc = parse_num(name, v, -TS_MAX_RANK, TS_MAX_RANK - 1, &x)) == CLI_OK) {
                if (x != floor(x))
                    return cli_error(CLI_USAGE, "quant report: --per-channel needs an integer");
                o->r.axis = (int)x;
            }
        } else if (!strcmp(name, "--percentile")) {
            rc = parse_num(name, v, 1e-9, 100, &o->r.pct);
        } else if (!strcmp(name, "--history")) {
            if ((rc = parse_num(name, v, 1, 1e6, &x)) == CLI_OK) o->r.history_len = (int)x;
        } else if (!strcmp(name, "--reduce")) {
            if (!strcmp(v, "max"))
                o->r.reduce = TS_AMAX_MAX;
            else if (!strcmp(v, "most_recent"))
                o->r.reduce = TS_AMAX_MOST_RECENT;
            else
                return cli_error(CLI_USAGE,
                                 "quant report: --reduce must be max or most_recent, got '%s'", v);
        } else if (!strcmp(name, "--margin")) {
            rc = parse_num(name, v, -64, 64, &o->r.margin);
        }
        if (rc != CLI_OK) return rc;
    }
    if (!o->path)
        return cli_error(CLI_USAGE, "quant report: missing FILE.npy or checkpoint directory");
    return CLI_OK;
}

/* A finite number, or JSON null (inf SQNR, NaN). */
static json_t *jnum(double v) {
    return isfinite(v) ? json_real(v) : json_null();
}

static void shape_text(char *buf, size_t n, int rank, const int64_t *dims) {
    size_t len = 0;
    buf[0] = 0;
    ts_catf(buf, n, &len, "f32[");
    for (int i = 0; i < rank; i++)
        ts_catf(buf, n, &len, "%s%lld", i ? "," : "", (long long)dims[i]);
    ts_catf(buf, n, &len, "]");
}

/* Report one tensor: a table block, or an entry appended to `arr`. */
static int report_one(const qopts *o, const char *name, const float *x, int rank,
                      const int64_t *dims, json_t *arr) {
    ts_quant_report_opts r = o->r;
    int ax = r.axis == TS_PER_TENSOR ? -1 : (r.axis < 0 ? r.axis + rank : r.axis);
    if (r.axis != TS_PER_TENSOR && (ax < 0 || ax >= rank)) r.axis = TS_PER_TENSOR, ax = -1;
    ts_quant_report_row rows[3];
    ts_status s = ts_quant_report(x, rank, dims, &r, rows);
    if (s != TS_OK)
        return cli_error(cli_status_code(s), "quant report: %s: %s", name, ts_last_error());
    if (arr) {
        json_t *t = json_object(), *sh = json_array(), *m = json_object();
        for (int i = 0; i < rank; i++) json_array_append_new(sh, json_integer(dims[i]));
        json_object_set_new(t, "name", json_string(name));
        json_object_set_new(t, "shape", sh);
        json_object_set_new(t, "channel_axis", ax < 0 ? json_null() : json_integer(ax));
        for (int k = 0; k < 3; k++) {
            const ts_quant_error *e = &rows[k].err;
            json_t *row = json_null();
            if (rows[k].available) {
                row = json_object();
                json_object_set_new(row, "amax", jnum(rows[k].amax));
                json_object_set_new(row, "mse", jnum(e->mse));
                json_object_set_new(row, "max_abs_error", jnum(e->max_abs));
                json_object_set_new(row, "sqnr_db", jnum(e->sqnr_db));
                json_object_set_new(row, "frac_saturated", jnum(e->frac_saturated));
                json_object_set_new(row, "frac_flushed", jnum(e->frac_flushed));
                json_object_set_new(row, "n", json_integer(e->n));
            }
            json_object_set_new(m, ts_calib_method_name(rows[k].method), row);
        }
        json_object_set_new(t, "methods", m);
        json_array_append_new(arr, t);
        return CLI_OK;
    }
    char sh[200];
    shape_text(sh, sizeof sh, rank, dims);
    if (ax < 0)
        printf("%s %s, per tensor\n", name, sh);
    else
        printf("%s %s, per channel along axis %d\n", name, sh, ax);
    printf("  %-10s %12s %12s %12s %9s %10s %10s\n", "method", "amax", "mse", "max_abs_err",
           "sqnr_db", "saturated", "flushed");
    for (int k = 0; k < 3; k++) {
        const ts_quant_error *e = &rows[k].err;
        if (!rows[k].available) {
            printf("  %-10s %s\n", ts_calib_method_name(rows[k].method),
                   "n/a (needs axis 0 as steps: rank >= 2, channels not on axis 0)");
            continue;
        }
        char sq[32];
        if (isinf(e->sqnr_db))
            snprintf(sq, sizeof sq, "inf");
        else
            snprintf(sq, sizeof sq, "%.2f", e->sqnr_db);
        printf("  %-10s %12.5g %12.5g %12.5g %9s %9.4f%% %9.4f%%\n",
               ts_calib_method_name(rows[k].method), rows[k].amax, e->mse, e->max_abs, sq,
               100 * e->frac_saturated, 100 * e->frac_flushed);
    }
    return CLI_OK;
}

static int report_npy(const qopts *o, json_t *arr) {
    ts_array a;
    ts_status s = ts_data_read_npy(o->path, TS_F32, &a);
    if (s != TS_OK) return cli_error(cli_status_code(s), "%s", ts_last_error());
    int rc = report_one(o, o->path, a.data, a.rank, a.dims, arr);
    ts_array_free(&a);
    return rc;
}

/* Every f32 / f64 parameter of the checkpoint (no optimizer state). */
static int report_ckpt(const qopts *o, json_t *arr) {
    ts_ckpt *c;
    ts_status s = ts_ckpt_open(o->path, NULL, NULL, &c);
    if (s != TS_OK) return cli_error(cli_status_code(s), "%s", ts_last_error());
    int rc = CLI_OK, done = 0;
    for (int i = 0; i < ts_ckpt_tensor_count(c) && rc == CLI_OK; i++) {
        ts_ckpt_tensor t;
        ts_ckpt_tensor_info(c, i, &t);
        if (t.is_state || (t.dtype != TS_F32 && t.dtype != TS_F64)) continue;
        int64_t n = 1;
        for (int d = 0; d < t.rank; d++) n *= t.dims[d];
        void *buf = malloc(t.bytes ? t.bytes : 1);
        if (!buf) {
            rc = cli_error(CLI_FAIL, "quant report: out of memory for %s", t.name);
            break;
        }
        s = ts_ckpt_read(c, t.name, buf, t.bytes);
        if (s == TS_OK && t.dtype == TS_F64)
            for (int64_t k = 0; k < n; k++) ((float *)buf)[k] = (float)((double *)buf)[k];
        if (s != TS_OK)
            rc = cli_error(cli_status_code(s), "%s", ts_last_error());
        else
            rc = report_one(o, t.name, buf, t.rank, t.dims, arr);
        free(buf);
        done++;
        if (!arr && rc == CLI_OK && i + 1 < ts_ckpt_tensor_count(c)) putchar('\n');
    }
    ts_ckpt_close(c);
    if (rc == CLI_OK && !done)
        rc = cli_error(CLI_USAGE, "quant report: %s has no f32/f64 parameters", o->path);
    return rc;
}

static int is_npy(const char *p) {
    size_t n = strlen(p);
    return n >= 4 && !strcmp(p + n - 4, ".npy");
}

int tessel_cmd_quant(int argc, char **argv) {
    if (argc < 1 || strcmp(argv[0], "report") != 0)
        return cli_error(CLI_USAGE, "quant: usage: tessel quant report FILE.npy|CKPT [options] "
                                    "(see tessel help)");
    qopts o;
    int rc = parse(argc - 1, argv + 1, &o);
    if (rc != CLI_OK) return rc;
    json_t *root = NULL, *arr = NULL;
    if (o.json) {
        root = json_object();
        arr = json_array();
        json_object_set_new(root, "format", json_string(o.r.fmt == TS_F8E4M3 ? "e4m3" : "e5m2"));
        json_object_set_new(root, "per_channel_axis",
                            o.r.axis == TS_PER_TENSOR ? json_null() : json_integer(o.r.axis));
        json_object_set_new(root, "percentile", json_real(o.r.pct));
        json_object_set_new(root, "history", json_integer(o.r.history_len));
        json_object_set_new(root, "reduce",
                            json_string(o.r.reduce == TS_AMAX_MAX ? "max" : "most_recent"));
        json_object_set_new(root, "margin", json_real(o.r.margin));
        json_object_set_new(root, "tensors", arr);
    } else {
        printf("FP8 %s; percentile %g; delayed: history %d, reduce %s, margin %g\n\n",
               o.r.fmt == TS_F8E4M3 ? "e4m3" : "e5m2", o.r.pct, o.r.history_len,
               o.r.reduce == TS_AMAX_MAX ? "max" : "most_recent", o.r.margin);
    }
    rc = is_npy(o.path) ? report_npy(&o, arr) : report_ckpt(&o, arr);
    if (rc == CLI_OK && root) {
        char *text = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
        if (text) puts(text);
        free(text);
        if (!text) rc = cli_error(CLI_FAIL, "quant report: out of memory");
    }
    json_decref(root);
    return rc;
}
