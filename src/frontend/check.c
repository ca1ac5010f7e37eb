/* Values of single keys: parsing and storing them with their range checks
 * (ts_config_init, ts_config_set, and the YAML reader through cfg_store),
 * where a key got its value, and "did you mean" suggestions for unknown
 * keys and enum values (check.h). */
#include "frontend/check.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "core/core.h"
#include "frontend/keys.h"

/* Optimal string alignment distance: Levenshtein plus adjacent swaps, so
 * "trian" is one edit from "train". Names are short; longer inputs are cut. */
static int osa(const char *a, const char *b) {
    enum { M = 64 };
    int n = (int)strlen(a), m = (int)strlen(b);
    if (n > M) n = M;
    if (m > M) m = M;
    static _Thread_local int d[M + 1][M + 1];
    for (int i = 0; i <= n; i++) d[i][0] = i;
    for (int j = 0; j <= m; j++) d[0][j] = j;
    for (int i = 1; i <= n; i++)
        for (int j = 1; j <= m; j++) {
            int cost = a[i - 1] != b[j - 1];
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[n][m];
}

/* How far `cand` is from what the user wrote: a misspelt name, or the
 * right name in the wrong section ("model.lr" -> "train.lr"). */
static int suggest_score(const char *got, const char *cand) {
    int s = osa(got, cand);
    const char *gl = cfg_leaf(got), *cl = cfg_leaf(cand);
    if (gl != got || cl != cand) {
        int t = osa(gl, cl) + 1;
        if (t < s) s = t;
        size_t ng = strlen(gl), nc = strlen(cl), mn = ng < nc ? ng : nc;
        /* "batch_size" for "batch", "warmup" for "warmup_steps" */
        if (mn >= 3 && !strncmp(gl, cl, mn) && 2 < s) s = 2;
    }
    return s;
}

/* Whether cand (at distance s) beats the best so far; on a tie the one
 * closer in length wins, so "adamx" suggests adamw rather than adam. */
static int closer(int s, int best_s, const char *got, const char *cand, const char *best) {
    if (s != best_s) return s < best_s;
    long g = (long)strlen(got), dc = labs((long)strlen(cand) - g),
         db = labs((long)strlen(best) - g);
    return dc < db;
}

/* Candidate names: every key path and every section (path prefix). */
static int candidate(int i, char *buf, size_t n) {
    if (i < CFG_N_KEYS) {
        snprintf(buf, n, "%s", cfg_keys[i].path);
        return 1;
    }
    i -= CFG_N_KEYS;
    if (i >= CFG_N_KEYS) return 0;
    size_t len = strcspn(cfg_keys[i].path, ".");
    if (len >= n) len = n - 1;
    memcpy(buf, cfg_keys[i].path, len);
    buf[len] = 0;
    return 1;
}

/* " (did you mean 'train.lr'?)", else the names valid where the user was.
 * A name outside every section also gets the list of sections, since a
 * near miss there ("dataset" for "data") may still be the wrong guess. */
void cfg_suggestion(const char *got, char *out, size_t n) {
    char best[128] = "", c[128];
    int best_s = INT_MAX;
    for (int i = 0; candidate(i, c, sizeof c); i++) {
        int s = suggest_score(got, c);
        if (closer(s, best_s, got, c, best)) best_s = s, snprintf(best, sizeof best, "%s", c);
    }
    size_t sec = strcspn(got, "."), k = 0;
    const int close = best_s <= 1 + (int)strlen(cfg_leaf(got)) / 3;
    if (close) {
        k = (size_t)snprintf(out, n, " (did you mean '%s'?", best);
        if (got[sec] == '.' || k >= n) {
            if (k < n) snprintf(out + k, n - k, ")");
            return;
        }
    }
    /* Inside a known section list its keys; otherwise list the sections. */
    int known = 0;
    for (int i = 0; i < CFG_N_KEYS; i++)
        known |= got[sec] == '.' && !strncmp(cfg_keys[i].path, got, sec + 1);
    if (!close) out[0] = 0;
    const size_t start = k;
    for (int i = 0; i < CFG_N_KEYS && k < n; i++) {
        const char *p = cfg_keys[i].path;
        size_t ps = strcspn(p, ".");
        const char *open = k == start ? (close ? " sections: " : " (sections: ") : ", ";
        if (known) {
            if (strncmp(p, got, sec + 1)) continue;
            k += (size_t)snprintf(out + k, n - k, "%s%s", k ? ", " : " (valid here: ", p + sec + 1);
        } else if (i == 0 || strncmp(cfg_keys[i - 1].path, p, ps + 1)) {
            /* the table is grouped by section, so a section starts where the prefix changes */
            k += (size_t)snprintf(out + k, n - k, "%s%.*s", open, (int)ps, p);
        }
    }
    if (k && k < n) snprintf(out + k, n - k, ")");
}

/* ---- values ------------------------------------------------------------- */

const char *cfg_shown(const char *text, char *buf, size_t n) {
    size_t len = strlen(text);
    if (len < 48) {
        snprintf(buf, n, "'%s'", text);
    } else {
        snprintf(buf, n, "'%.44s...'", text);
    }
    return buf;
}

static int parse_i64(const char *s, int64_t *v) {
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (end != s && !*end && !errno) {
        *v = x;
        return 1;
    }
    /* 1e6 is a fine way to write a step count; 1.5 is not an integer. */
    double d = strtod(s, &end);
    if (end == s || *end || !isfinite(d) || d != floor(d) || fabs(d) >= 9.2e18) return 0;
    *v = (int64_t)d;
    return 1;
}

static int parse_f64(const char *s, double *v) {
    char *end;
    double d = strtod(s, &end);
    if (end == s || *end || !isfinite(d)) return 0;
    *v = d;
    return 1;
}

static int parse_bool(const char *s, int *v) {
    static const char *yes[] = {"true", "yes", "on", "1"}, *no[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, yes[i])) return *v = 1, 1;
        if (!strcasecmp(s, no[i])) return *v = 0, 1;
    }
    return 0;
}

/* Checks v against a range written "[lo, hi)", "(0, inf)" and the like. */
static int in_range(const char *range, double v) {
    if (!range) return 1;
    char *p;
    double lo = strtod(range + 1, &p);
    while (*p == ',' || *p == ' ') p++;
    double hi = strtod(p, &p);
    int lo_ok = range[0] == '[' ? v >= lo : v > lo;
    int hi_ok = *p == ']' ? v <= hi : v < hi;
    return lo_ok && hi_ok;
}

/* "a number", "one of sgd | adam | adamw", ... for messages. */
const char *cfg_expected(const ts_config_key *k, char *buf, size_t n) {
    char tb[96];
    switch (k->type) {
    case TS_CFG_INT:
    case TS_CFG_I64:
    case TS_CFG_U64: return "an integer";
    case TS_CFG_F64: return "a number";
    case TS_CFG_BOOL: return "true or false";
    case TS_CFG_STR: return (k->flags & TS_CFG_LIST) ? "a name or a list of names" : "a string";
    case TS_CFG_ENUM: snprintf(buf, n, "one of %s", ts_config_type_name(k, tb, sizeof tb)); break;
    }
    return buf;
}

/* Parse `text` for key k and store it in c. The message names the key but
 * not the place; the caller adds that. */
ts_status cfg_store(ts_config *c, const ts_config_key *k, const char *text) {
    char eb[128], vb[64];
    char *dst = (char *)c + k->offset;
    if (!*text)
        return ts_fail(TS_ERR_INVALID, "%s: expected %s, got nothing", k->path,
                       cfg_expected(k, eb, sizeof eb));
    switch (k->type) {
    case TS_CFG_INT:
    case TS_CFG_I64: {
        int64_t v;
        if (!parse_i64(text, &v)) {
            double d;
            /* a whole number too large for int64 is out of range, not malformed */
            if (parse_f64(text, &d) && d == floor(d)) break;
            return ts_fail(TS_ERR_INVALID, "%s: expected an integer, got %s", k->path,
                           cfg_shown(text, vb, sizeof vb));
        }
        if (!in_range(k->range, (double)v) ||
            (k->type == TS_CFG_INT && (v < INT_MIN || v > INT_MAX)))
            break;
        if (k->type == TS_CFG_INT) {
            int iv = (int)v;
            memcpy(dst, &iv, sizeof iv);
        } else {
            memcpy(dst, &v, sizeof v);
        }
        return TS_OK;
    }
    case TS_CFG_U64: {
        char *end;
        errno = 0;
        const char *p = text;
        while (isspace((unsigned char)*p)) p++;
        unsigned long long v = strtoull(p, &end, 10);
        if (*p == '-' || end == p || *end || errno)
            return ts_fail(TS_ERR_INVALID, "%s: expected an integer in [0, 2^64), got %s", k->path,
                           cfg_shown(text, vb, sizeof vb));
        uint64_t u = v;
        if (!in_range(k->range, (double)u)) break;
        memcpy(dst, &u, sizeof u);
        return TS_OK;
    }
    case TS_CFG_F64: {
        double v;
        if (!parse_f64(text, &v))
            return ts_fail(TS_ERR_INVALID, "%s: expected a number, got %s", k->path,
                           cfg_shown(text, vb, sizeof vb));
        if (!in_range(k->range, v)) break;
        memcpy(dst, &v, sizeof v);
        return TS_OK;
    }
    case TS_CFG_BOOL: {
        int v;
        if (!parse_bool(text, &v))
            return ts_fail(TS_ERR_INVALID, "%s: expected true or false, got %s", k->path,
                           cfg_shown(text, vb, sizeof vb));
        memcpy(dst, &v, sizeof v);
        return TS_OK;
    }
    case TS_CFG_ENUM: {
        char ch[64], best[64] = "";
        int best_s = INT_MAX;
        for (int i = 0; cfg_choice_at(k->choices, i, ch, sizeof ch); i++) {
            /* Case does not matter: "AdamW" means adamw. */
            if (!strcasecmp(ch, text)) {
                memcpy(dst, &i, sizeof i);
                return TS_OK;
            }
            int s = osa(text, ch);
            if (closer(s, best_s, text, ch, best))
                best_s = s, snprintf(best, sizeof best, "%s", ch);
        }
        char hint[96] = "";
        if (best_s <= 1 + (int)strlen(text) / 3)
            snprintf(hint, sizeof hint, " (did you mean '%s'?)", best);
        return ts_fail(TS_ERR_INVALID, "%s: expected %s, got %s%s", k->path,
                       cfg_expected(k, eb, sizeof eb), cfg_shown(text, vb, sizeof vb), hint);
    }
    case TS_CFG_STR:
        if (strlen(text) >= k->size)
            return ts_fail(TS_ERR_INVALID, "%s: longer than %zu characters", k->path, k->size - 1);
        memcpy(dst, text, strlen(text) + 1);
        return TS_OK;
    }
    /* Every break above lands here: a well-formed value outside the range. */
    if (!k->range)
        return ts_fail(TS_ERR_INVALID, "%s: %s is out of range", k->path,
                       cfg_shown(text, vb, sizeof vb));
    return ts_fail(TS_ERR_INVALID, "%s: must be in %s, got %s", k->path, k->range,
                   cfg_shown(text, vb, sizeof vb));
}

/* "file:line:col: " or "--set: " for where key i got its value; "" for a default. */
const char *cfg_origin(const ts_config *c, int i, char *buf, size_t n) {
    if (i < 0 || c->set[i] == ORIGIN_DEFAULT)
        snprintf(buf, n, "%s", c->file[0] ? c->file : "config");
    else if (c->set[i] == ORIGIN_FILE)
        snprintf(buf, n, "%s:%d:%d", c->file, c->line[i], c->col[i]);
    else
        snprintf(buf, n, "--set");
    return buf;
}

const char *ts_config_key_origin(const ts_config *c, const char *path, char *buf, size_t n) {
    return cfg_origin(c, ts_config_key_find(path), buf, n);
}

int ts_config_key_is_set(const ts_config *c, const char *path) {
    const int i = ts_config_key_find(path);
    return i >= 0 && c->set[i] != ORIGIN_DEFAULT;
}

void ts_config_init(ts_config *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < CFG_N_KEYS; i++)
        if (!(cfg_keys[i].flags & TS_CFG_DERIVED)) cfg_store(c, &cfg_keys[i], cfg_keys[i].dflt);
}

ts_status ts_config_set(ts_config *c, const char *assignment) {
    if (!c || !assignment) return ts_fail(TS_ERR_INVALID, "config: NULL argument");
    if (c->finished)
        return ts_fail(TS_ERR_INVALID, "--set: config already finished; apply overrides "
                                       "before ts_config_finish");
    while (isspace((unsigned char)*assignment)) assignment++;
    const char *eq = strchr(assignment, '=');
    char vb[64];
    if (!eq || eq == assignment)
        return ts_fail(TS_ERR_INVALID, "--set: expected key=value (e.g. train.lr=3e-4), got %s",
                       cfg_shown(assignment, vb, sizeof vb));
    char path[256], value[1024];
    size_t kl = (size_t)(eq - assignment);
    while (kl && isspace((unsigned char)assignment[kl - 1])) kl--;
    const char *vs = eq + 1;
    while (isspace((unsigned char)*vs)) vs++;
    size_t vl = strlen(vs);
    while (vl && isspace((unsigned char)vs[vl - 1])) vl--;
    if (kl >= sizeof path || vl >= sizeof value)
        return ts_fail(TS_ERR_INVALID, "--set: key or value too long");
    memcpy(path, assignment, kl);
    path[kl] = 0;
    memcpy(value, vs, vl);
    value[vl] = 0;
    /* Quotes protect a value from the shell's view, not ours. */
    if (vl >= 2 && (value[0] == '"' || value[0] == '\'') && value[vl - 1] == value[0]) {
        memmove(value, value + 1, vl - 2);
        value[vl - 2] = 0;
    }
    int idx = ts_config_key_find(path);
    if (idx < 0) {
        char hint[512];
        if (cfg_is_section(path))
            return ts_fail(TS_ERR_INVALID, "--set: '%s' is a section; set one of its keys", path);
        cfg_suggestion(path, hint, sizeof hint);
        return ts_fail(TS_ERR_INVALID, "--set: unknown key '%s'%s", path, hint);
    }
    ts_status s = cfg_store(c, &cfg_keys[idx], value);
    if (s != TS_OK) {
        ts_error_prefix("--set");
        return s;
    }
    c->set[idx] = ORIGIN_SET;
    return TS_OK;
}
