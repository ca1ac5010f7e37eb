/* A training run: data, model, plans, the step loop, evaluation and the run
 * directory. The order matters for the promise in session.h: every check
 * that can fail on bad input (config, data, labels, shapes, compile, the
 * run directory's state) runs before the run directory is created. */
#include "session/session.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/core.h"
#include "data/data.h"
#include "data/synthetic.h"
#include "obs/alert_run.h"
#include "obs/http.h"
#include "obs/metrics.h"
#include "obs/tfevents.h"
#include "obs/trace.h"
#include "session/metrics_eval.h"
#include "session/launch.h"
#include "session/zoo_data.h"
#include "tessel/ckpt.h"
#include "tessel/tessel.h"

/* Synthetic data cycles over a few fixed batches, as the reference
 * benchmark does: a GPT can then lower its loss by memorising them, which
 * fresh uniform tokens (whose best loss is log(vocab) from the start) would
 * not allow. */
enum { N_SYNTH = 4 };
/* Step rates kept for the median: enough for any run a person watches. */
enum { MAX_RATES = 1 << 20 };

static const char *const source_names[] = {"synthetic", "idx", "npy", "csv", "tokens", "graph"};

typedef struct session {
    ts_config c; /* resolved copy */
    const ts_session_options *o;
    ts_session_result *r;
    ts_progress pr;
    /* data */
    ts_dataset *all, *train, *val, *test;
    ts_loader *loader;
    int n_synth;
    void *sx[N_SYNTH], *sy[N_SYNTH];
    /* model and plans */
    ts_graph *g;
    ts_model m;
    ts_plan *plan, *eval;
    int gpt, classifier, want_acc, want_mse;
    const char *in_name, *tgt_name, *out_name;
    size_t xb, yb, outb; /* bytes of one batch's x, y and model output */
    void *bx, *by;
    float *bout;
    void *pbuf; /* one parameter, for copying into the eval plan */
    size_t pbuf_bytes;
    double *rates;
    int64_t n_rates;
    /* run directory */
    FILE *metrics;
    int dir_made;
    /* checkpoints */
    int resume_in_place; /* --resume latest: continue in the run directory */
    ts_ckpt *ck;         /* the verified checkpoint to resume from */
    int64_t start_step;  /* steps done before this run's first step */
    char ck_dir[512], ck_id[80], ck_config[80];
    char *ident; /* the config text checkpoints are tied to (see identity) */
    size_t ident_bytes;
    char ident_sha[65];
    ts_ckpt_data_file *lineage; /* data lineage for the manifests */
    int n_lineage;
    ts_audit *audit;
    ts_ckpt_saver *sv;
    uint64_t ckpt_group; /* ZeRO checkpoints: this launch's (ts_session_ckpt_group) */
    /* observability (docs/observability.md) */
    ts_train_metrics tm;
    int tm_made;
    ts_http_server *http;
    ts_tfevents *tb;
    int rank, nranks;       /* data parallelism: this rank's rows of every batch */
    struct ts_trace *trace; /* --trace */
    float *gbuf;            /* one parameter or gradient, read back for norms and histograms */
    size_t gbuf_bytes;
    ts_alert_runner *ar; /* gradient monitors and alert rules (src/obs/alert_run.h) */
    ts_ckpt_saver *asv;  /* anomaly snapshots when ckpt.every is 0 (no s->sv) */
    /* evaluation metrics beyond accuracy/mse (metrics_eval.h) */
    unsigned metric_flags;
    ts_metric_acc macc;
    /* gru/lstm, unet3d, gcn (zoo_data.h) */
    int binary;         /* a gru/lstm with one logit: BCE against 0/1 targets */
    ts_zoo_graph graph; /* data.source graph: the gcn's edges */
    ts_zoo_dice dice;   /* unet3d: the soft Dice term of the evaluation loss */
} session;

ts_session_options ts_session_options_default(void) {
    ts_session_options o = {NULL, NULL, NULL, TS_PROGRESS_LINES, NULL, NULL, NULL, NULL};
    return o;
}

/* ---- small helpers ------------------------------------------------------ */

static json_t *jnum(double v) {
    return isfinite(v) ? json_real(v) : json_null();
}

/* A number for a JSON line: shortest text that reads back the same float,
 * null for NaN and infinities (which JSON lacks). */
static const char *num(double v, char *buf, size_t n) {
    if (!isfinite(v)) return "null";
    snprintf(buf, n, "%.9g", v);
    return buf;
}

static int64_t numel_dims(int rank, const int64_t *dims) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= dims[i];
    return n;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double param_count(const ts_plan *p) {
    double n = 0;
    for (int i = 0; i < ts_plan_param_count(p); i++) {
        int rank;
        int64_t dims[TS_MAX_RANK];
        if (ts_plan_value_info(p, ts_plan_param_name(p, i), NULL, &rank, dims) == TS_OK)
            n += (double)numel_dims(rank, dims);
    }
    return n;
}

/* ---- the run directory --------------------------------------------------- */

/* A run directory may be new or empty; anything else is someone's run. */
static ts_status check_run_dir(const char *dir) {
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno == ENOENT) return TS_OK;
        return ts_fail(TS_ERR_IO, "run directory '%s': %s", dir, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        return ts_fail(TS_ERR_INVALID, "run directory '%s' exists and is not a directory", dir);
    DIR *d = opendir(dir);
    if (!d) return ts_fail(TS_ERR_IO, "run directory '%s': %s", dir, strerror(errno));
    int empty = 1;
    for (struct dirent *e; empty && (e = readdir(d));)
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    if (!empty)
        return ts_fail(TS_ERR_INVALID,
                       "run directory '%s' already exists and is not empty; nothing was written "
                       "(choose a new one with --out or output.dir)",
                       dir);
    return TS_OK;
}

/* --resume latest: the run directory must exist; ts_ckpt_open then
 * finds its LATEST. */
static ts_status check_resume_dir(const char *dir) {
    struct stat st;
    if (stat(dir, &st) != 0)
        return ts_fail(errno == ENOENT ? TS_ERR_INVALID : TS_ERR_IO,
                       "--resume latest: run directory '%s': %s (name the run to continue with "
                       "--out or output.dir)",
                       dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return ts_fail(TS_ERR_INVALID, "--resume latest: '%s' is not a directory", dir);
    return TS_OK;
}

/* A key file named by the config must be readable before the run starts. */
static ts_status check_key(const char *key, const char *path) {
    if (!path[0]) return TS_OK;
    FILE *f = fopen(path, "rb");
    if (!f) return ts_fail(TS_ERR_INVALID, "%s: cannot read '%s': %s", key, path, strerror(errno));
    fclose(f);
    return TS_OK;
}

static void sha256_hex(const void *data, size_t n, char hex[65]) {
    unsigned char h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256(h, (const unsigned char *)data, n);
    sodium_bin2hex(hex, 65, h, sizeof h);
}

/* The resolved config as YAML (the bytes of config.yaml). */
static ts_status config_text(const session *s, char **text, size_t *n) {
    FILE *f = open_memstream(text, n);
    if (!f) return ts_fail(TS_ERR_NOMEM, "out of memory for the config text");
    fprintf(f, "# resolved configuration of this run (tessel %s)\n", TESSEL_VERSION);
    ts_status st = ts_config_write(&s->c, f);
    if (fclose(f) != 0 && st == TS_OK) st = ts_fail(TS_ERR_NOMEM, "out of memory for the config");
    return st;
}

/* What a checkpoint is tied to: the resolved config without the keys that
 * may change on resume because they do not change the numbers a step
 * computes: train.steps, train.epochs (how far to go), train.log_every,
 * train.eval_every, train.threads, dist.max_restarts (how often a failed
 * run is retried), dist.procs, dist.zero, dist.bucket_mb, dist.share_params
 * and dist.timeout_s (how the same step is spread over processes), and the
 * output, ckpt and observe sections. The
 * manifests' config_sha256 is the hash of this text, so resuming with a
 * higher train.steps matches while any other change is refused. */
static ts_status identity(session *s) {
    char *full = NULL;
    size_t n = 0;
    ts_status st = config_text(s, &full, &n);
    if (st != TS_OK) {
        free(full);
        return st;
    }
    FILE *f = open_memstream(&s->ident, &s->ident_bytes);
    if (!f) {
        free(full);
        return ts_fail(TS_ERR_NOMEM, "out of memory for the config text");
    }
    static const char *const skip[] = {
        "steps:", "epochs:", "log_every:", "eval_every:", "threads:"};
    /* How the same global batch is spread over processes and how the
     * optimizer state is sharded: a checkpoint loads on any of these. */
    static const char *const dskip[] = {
        "max_restarts:", "procs:", "zero:", "timeout_s:", "bucket_mb:", "share_params:"};
    int skip_section = 0, in_train = 0, in_dist = 0;
    for (char *line = full; *line;) {
        size_t len = strcspn(line, "\n");
        const int top = line[0] != ' ' && line[0] != '#';
        if (top) {
            skip_section = !strncmp(line, "output:", 7) || !strncmp(line, "ckpt:", 5) ||
                           !strncmp(line, "observe:", 8) || !strncmp(line, "alerts:", 7);
            in_train = !strncmp(line, "train:", 6);
            in_dist = !strncmp(line, "dist:", 5);
        }
        int keep = line[0] != '#' && !skip_section;
        for (size_t i = 0; keep && in_train && !top && i < sizeof skip / sizeof *skip; i++)
            if (!strncmp(line + 2, skip[i], strlen(skip[i]))) keep = 0;
        for (size_t i = 0; keep && in_dist && !top && i < sizeof dskip / sizeof *dskip; i++)
            if (!strncmp(line + 2, dskip[i], strlen(dskip[i]))) keep = 0;
        if (keep) fprintf(f, "%.*s\n", (int)len, line);
        line += len + (line[len] == '\n');
    }
    free(full);
    if (fclose(f) != 0) return ts_fail(TS_ERR_NOMEM, "out of memory for the config text");
    sha256_hex(s->ident, s->ident_bytes, s->ident_sha);
    return TS_OK;
}

/* mkdir -p */
static ts_status make_dirs(const char *dir) {
    char path[512];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return ts_fail(TS_ERR_INVALID, "run directory '%s': path too long", dir);
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p) continue;
        char c = *p;
        *p = 0;
        if (mkdir(path, 0777) != 0 && errno != EEXIST)
            return ts_fail(TS_ERR_IO, "cannot create run directory '%s': %s", path,
                           strerror(errno));
        *p = c;
        if (!c) break;
    }
    return TS_OK;
}

static FILE *open_in_dir(const session *s, const char *name, const char *mode) {
    char path[640];
    snprintf(path, sizeof path, "%s/%s", s->r->run_dir, name);
    FILE *f = fopen(path, mode);
    if (!f) ts_fail(TS_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    return f;
}

static ts_status write_json(const session *s, const char *name, json_t *obj) {
    if (!obj) return ts_fail(TS_ERR_NOMEM, "out of memory for %s", name);
    FILE *f = open_in_dir(s, name, "w");
    ts_status st = TS_ERR_IO;
    if (f) {
        int bad =
            json_dumpf(obj, f, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) != 0;
        bad |= fputc('\n', f) == EOF;
        bad |= fclose(f) != 0;
        st = bad ? ts_fail(TS_ERR_IO, "writing %s/%s failed", s->r->run_dir, name) : TS_OK;
    }
    json_decref(obj);
    return st;
}

static json_t *lineage_json(const ts_dataset *d, json_t *files) {
    for (int i = 0; d && i < d->n_lineage; i++)
        json_array_append_new(files, json_pack("{s:s, s:I, s:s}", "path", d->lineage[i].path,
                                               "bytes", (json_int_t)d->lineage[i].bytes, "sha256",
                                               d->lineage[i].sha256));
    return files;
}

static ts_status write_run_files(session *s) {
    ts_status st = make_dirs(s->r->run_dir);
    if (st != TS_OK) return st;
    s->dir_made = 1;
    char *text = NULL;
    size_t text_bytes = 0;
    if ((st = config_text(s, &text, &text_bytes)) != TS_OK) {
        free(text);
        return st;
    }
    char config_sha[65];
    sha256_hex(text, text_bytes, config_sha);
    FILE *f = open_in_dir(s, "config.yaml", "w");
    if (!f) {
        free(text);
        return TS_ERR_IO;
    }
    int bad = fwrite(text, 1, text_bytes, f) != text_bytes;
    free(text);
    if ((fclose(f) != 0) | bad) return ts_fail(TS_ERR_IO, "writing config.yaml failed");

    /* The audit log: the config this run used, and where it resumed from. */
    if ((st = ts_audit_open(s->r->run_dir, s->c.ckpt.sign_key[0] ? s->c.ckpt.sign_key : NULL,
                            &s->audit)) != TS_OK)
        return st;
    char fields[1024];
    snprintf(fields, sizeof fields,
             "{\"file\":\"config.yaml\",\"sha256\":\"%s\",\"checkpoint_config_sha256\":\"%s\"}",
             config_sha, s->ident_sha);
    if ((st = ts_audit_append(s->audit, "config", fields)) != TS_OK) return st;
    if (s->ck) {
        json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:b}", "checkpoint", s->ck_dir, "id", s->ck_id,
                              "step", (json_int_t)s->start_step, "config_sha256", s->ck_config,
                              "in_place", s->resume_in_place);
        char *txt = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        json_decref(o);
        if (!txt) return ts_fail(TS_ERR_NOMEM, "out of memory for the audit log");
        st = ts_audit_append(s->audit, "resume", txt);
        free(txt);
        if (st != TS_OK) return st;
    }

    json_t *files = lineage_json(s->test, lineage_json(s->all, json_array()));
    json_t *lin = json_pack(
        "{s:s, s:o, s:{s:I, s:I, s:I}, s:f, s:b, s:I}", "source", source_names[s->c.data.source],
        "files", files, "examples", "train", (json_int_t)(s->train ? s->train->n : 0), "val",
        (json_int_t)(s->val ? s->val->n : 0), "test", (json_int_t)(s->test ? s->test->n : 0),
        "val_fraction", s->c.data.val_fraction, "shuffle", s->c.data.shuffle, "seed",
        (json_int_t)s->c.train.seed);
    if ((st = write_json(s, "lineage.json", lin)) != TS_OK) return st;

    /* The training split carries the statistics used (its own when it was
     * standardised after the split, else copies of the loader's). */
    const ts_dataset *nd = s->train ? s->train : s->all;
    if (nd && nd->norm_mean) {
        json_t *names = json_array(), *mean = json_array(), *sd = json_array();
        const char *p = s->c.data.features;
        for (int64_t i = 0; i < nd->n_norm; i++) {
            json_array_append_new(mean, json_real(nd->norm_mean[i]));
            json_array_append_new(sd, json_real(nd->norm_std[i]));
        }
        /* The feature names as configured; empty when every column but
         * the label was used (the loader knows their order). */
        while (*p) {
            while (*p == ' ' || *p == ',') p++;
            size_t len = strcspn(p, ",");
            while (len && p[len - 1] == ' ') len--;
            if (len) json_array_append_new(names, json_stringn(p, len));
            p += strcspn(p, ",");
        }
        json_t *norm = json_pack("{s:s, s:o, s:o}", "method", "standardise: (x - mean) / std",
                                 "mean", mean, "std", sd);
        if (norm && json_array_size(names)) json_object_set(norm, "features", names);
        json_decref(names);
        if ((st = write_json(s, "normalisation.json", norm)) != TS_OK) return st;
    }
    /* A resumed run appends: the lines before the checkpoint stay (steps
     * after it that an interrupted run logged appear again). */
    s->metrics = open_in_dir(s, "metrics.jsonl", s->ck ? "a" : "w");
    if (!s->metrics) return TS_ERR_IO;
    if (s->c.ckpt.every > 0) {
        ts_ckpt_options co = ts_ckpt_options_default();
        co.sign_key = s->c.ckpt.sign_key[0] ? s->c.ckpt.sign_key : NULL;
        co.keep_last = s->c.ckpt.keep_last;
        co.keep_every = s->c.ckpt.keep_every;
        co.audit = s->audit;
        co.rank = s->rank; /* ZeRO: see shard_saver() */
        co.world = s->nranks;
        co.group = s->ckpt_group;
        co.rank_timeout_s = s->c.dist.timeout_s;
        if ((st = ts_ckpt_saver_new(s->r->run_dir, s->plan, &co, &s->sv)) != TS_OK) return st;
    }
    return TS_OK;
}

static json_t *eval_json(const ts_eval_result *e) {
    json_t *o = json_pack("{s:I, s:o}", "examples", (json_int_t)e->examples, "loss", jnum(e->loss));
    if (!isnan(e->accuracy)) json_object_set_new(o, "accuracy", jnum(e->accuracy));
    if (!isnan(e->mse)) json_object_set_new(o, "mse", jnum(e->mse));
    if (!isnan(e->auc)) json_object_set_new(o, "auc", jnum(e->auc));
    if (!isnan(e->dice)) json_object_set_new(o, "dice", jnum(e->dice));
    if (!isnan(e->miou)) json_object_set_new(o, "miou", jnum(e->miou));
    return o;
}

/* summary.json, however the run ended; `error` is NULL on success. The
 * status is that of writing the file. */
static ts_status write_summary(session *s, const char *status, const char *error) {
    if (!s->dir_made) return TS_OK;
    ts_session_result *r = s->r;
    char rate_key[32];
    snprintf(rate_key, sizeof rate_key, "median_%.*s_per_s", (int)strcspn(r->unit, "/"), r->unit);
    json_t *o = json_pack(
        "{s:s, s:s, s:s, s:I, s:I, s:o, s:o, s:f, s:o, s:I, s:I}", "status", status, "tessel",
        TESSEL_VERSION, "model", ts_config_model_word(s->c.model.name), "steps",
        (json_int_t)r->steps, "planned_steps", (json_int_t)r->planned_steps, "first_loss",
        jnum(r->first_loss), "final_loss", jnum(r->final_loss), "seconds", r->seconds, rate_key,
        jnum(r->median_rate), "parameters", (json_int_t)(s->plan ? param_count(s->plan) : 0),
        "seed", (json_int_t)s->c.train.seed);
    if (!o) return ts_fail(TS_ERR_NOMEM, "out of memory for summary.json");
    if (s->c.batches_per_epoch)
        json_object_set_new(o, "epochs",
                            json_real((double)r->steps / (double)s->c.batches_per_epoch));
    if (r->resumed_step) json_object_set_new(o, "resumed_from_step", json_integer(r->resumed_step));
    if (s->c.ckpt.every > 0) json_object_set_new(o, "checkpoints", json_integer(r->checkpoints));
    if (r->has_val) json_object_set_new(o, "val", eval_json(&r->val));
    if (r->has_test) json_object_set_new(o, "test", eval_json(&r->test));
    if (error) json_object_set_new(o, "error", json_string(error));
    return write_json(s, "summary.json", o);
}

/* ---- data ----------------------------------------------------------------- */

static ts_status load_csv(session *s) {
    const ts_config *c = &s->c;
    char names[sizeof c->data.features];
    const char *list[256];
    int n = 0;
    snprintf(names, sizeof names, "%s", c->data.features);
    for (char *p = names; *p;) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        if (n == (int)(sizeof list / sizeof list[0]))
            return ts_fail(TS_ERR_INVALID, "data.features: more than %d columns",
                           (int)(sizeof list / sizeof list[0]));
        char *end = p + strcspn(p, ",");
        char *next = *end ? end + 1 : end;
        while (end > p && end[-1] == ' ') end--;
        *end = 0;
        list[n++] = p;
        p = next;
    }
    /* A table (window 1) is standardised after the split, with statistics of
     * the training split only (load_data); windows keep the loader's. */
    ts_csv_options co = {.path = c->data.path,
                         .features = n ? list : NULL,
                         .n_features = n,
                         .label = c->data.label,
                         .window = c->data.window,
                         .horizon = c->data.horizon,
                         .normalise = c->data.normalise && c->data.window > 1,
                         .skip_rows = c->data.skip_rows,
                         .no_header = !c->data.header,
                         /* binary gru/lstm: 0/1 numbers, checked by ts_zoo_fit */
                         .classes = ts_zoo_binary(c) ? 0 : c->model.classes};
    return ts_data_load_csv_windows(&co, &s->all);
}

/* Class ids must be in [0, classes): the first bad one, named by file and
 * example, is the error. Returns the largest label in *max. */
static ts_status check_labels(const ts_dataset *d, const char *file, int64_t classes,
                              int64_t *max) {
    const int64_t *y = d->y;
    for (int64_t i = 0; i < d->n; i++) {
        if (y[i] < 0 || (classes > 0 && y[i] >= classes))
            return ts_fail(TS_ERR_INVALID,
                           "%s: example %lld has label %lld, out of range: labels must be in "
                           "[0, %lld)%s",
                           file, (long long)i, (long long)y[i],
                           (long long)(classes > 0 ? classes : 0),
                           classes > 0 ? " (model.classes)" : "");
        if (y[i] > *max) *max = y[i];
    }
    return TS_OK;
}

static ts_status load_data(session *s) {
    ts_config *c = &s->c;
    ts_status st = TS_OK;
    const char *label_file = NULL, *test_label_file = NULL;
    /* A synthetic gcn's graph is data like a graph file's (zoo_data.h). */
    const int graph = c->data.source == TS_CFG_GRAPH || c->model.name == TS_CFG_GCN;
    switch ((ts_cfg_source)(graph ? TS_CFG_GRAPH : c->data.source)) {
    case TS_CFG_SYNTHETIC: return TS_OK;
    case TS_CFG_IDX:
        st = ts_data_load_idx_pair(c->data.train_images, c->data.train_labels, &s->all);
        if (st == TS_OK && c->data.test_images[0])
            st = ts_data_load_idx_pair(c->data.test_images, c->data.test_labels, &s->test);
        label_file = c->data.train_labels, test_label_file = c->data.test_labels;
        break;
    case TS_CFG_NPY:
        st = ts_data_load_npy_pair(c->data.x, c->data.y, &s->all);
        label_file = c->data.y;
        break;
    case TS_CFG_CSV: st = load_csv(s); break;
    case TS_CFG_TOKENS:
        st = ts_data_load_tokens(c->data.path, c->data.bits, c->model.ctx, c->model.vocab, &s->all);
        break;
    case TS_CFG_GRAPH: {
        /* The whole graph is the one example of each split (zoo_data.h). */
        ts_config_data_shape gs = {0, 0, 0, 0, 0, 0};
        st = ts_zoo_load_graph(c, &s->graph, &s->all, &s->train, &s->val, &s->test, &gs);
        if (st == TS_OK) st = ts_config_fit_data(c, &gs);
        if (st != TS_OK) return st;
        return ts_loader_new(s->train, 1, 0, c->train.seed, &s->loader);
    }
    }
    if (st != TS_OK) return st;

    ts_config_data_shape shape = {0, 0, 0, 0, 0, 0};
    shape.in_dim = numel_dims(s->all->x_rank, s->all->x_dims);
    if (ts_zoo_model(c)) {
        st = ts_zoo_fit(c, s->all, c->data.source == TS_CFG_CSV ? c->data.path : c->data.x,
                        label_file ? label_file : c->data.path, &shape);
        if (st != TS_OK) return st;
    } else if (!s->gpt) {
        const int64_t per = numel_dims(s->all->y_rank, s->all->y_dims);
        if (s->all->y_dtype == TS_I64) {
            if (per != 1)
                return ts_fail(TS_ERR_SHAPE,
                               "%s: integer targets are class ids, one per example, but each "
                               "example has %lld",
                               label_file, (long long)per);
            const int64_t want = c->model.classes;
            int64_t max = -1;
            st = check_labels(s->all, label_file, want, &max);
            if (st == TS_OK && s->test) st = check_labels(s->test, test_label_file, want, &max);
            if (st != TS_OK) return st;
            shape.classes = max + 1;
        } else {
            shape.out_dim = per;
        }
    }
    if (s->test &&
        (s->test->x_rank != s->all->x_rank ||
         memcmp(s->test->x_dims, s->all->x_dims, sizeof(int64_t) * (size_t)s->all->x_rank)))
        return ts_fail(TS_ERR_SHAPE, "%s: test images are not the shape of the training images",
                       c->data.test_images);

    st = ts_dataset_split(s->all, c->data.val_fraction, c->train.seed, &s->train, &s->val);
    if (st != TS_OK) return st;
    if (c->data.source == TS_CFG_CSV && c->data.normalise && c->data.window == 1) {
        ts_dataset *others[1] = {s->val};
        if ((st = ts_dataset_standardise(s->train, others, 1)) != TS_OK) return st;
    }
    if (s->train->n < c->model.batch)
        return ts_fail(TS_ERR_INVALID,
                       "the training split has %lld examples, fewer than model.batch %lld "
                       "(%lld examples, data.val_fraction %g)",
                       (long long)s->train->n, (long long)c->model.batch, (long long)s->all->n,
                       c->data.val_fraction);
    shape.batches_per_epoch = s->train->n / c->model.batch;
    st = ts_config_fit_data(c, &shape);
    if (st != TS_OK) {
        /* Name the data file whose examples do not fit (images of the wrong size). */
        const char *xf = c->data.source == TS_CFG_IDX   ? c->data.train_images
                         : c->data.source == TS_CFG_NPY ? c->data.x
                                                        : c->data.path;
        if (xf[0]) ts_error_prefix("%s", xf);
        return st;
    }
    return ts_loader_new(s->train, c->model.batch, c->data.shuffle, c->train.seed, &s->loader);
}

/* The benchmark models (mlp, gpt) cycle over N_SYNTH fixed batches, as the
 * reference benchmark does; the sequence and volume models draw a fresh
 * batch every step instead (next_batch), so their evaluation measures
 * generalisation, not memory of a few batches. */
static ts_status make_synthetic(session *s) {
    const ts_config *c = &s->c;
    if (ts_zoo_model(c)) return TS_OK;
    int n = c->train.steps < N_SYNTH ? (int)c->train.steps : N_SYNTH;
    for (; s->n_synth < n; s->n_synth++) {
        int k = s->n_synth;
        if (!(s->sx[k] = ts_alloc(s->xb * (size_t)s->nranks, "synthetic batch")) ||
            !(s->sy[k] = ts_alloc(s->yb * (size_t)s->nranks, "synthetic batch"))) {
            s->n_synth++;
            return TS_ERR_NOMEM;
        }
        ts_status st;
        if (ts_zoo_model(c)) {
            st = ts_zoo_synth(c, k, s->sx[k], s->sy[k]);
        } else if (!s->gpt) {
            ts_mlp_config mc = ts_config_mlp(c);
            int64_t window = mc.window > 0 ? mc.window : mc.in_dim;
            int64_t features = mc.window > 0 ? mc.features : 1;
            st = ts_synth_regression(c->train.seed, k, mc.batch, window, features, mc.out_dim,
                                     s->sx[k], s->sy[k]);
        } else {
            ts_gpt_config gc = ts_config_gpt(c);
            st = ts_synth_tokens(c->train.seed, k, gc.batch, gc.ctx, gc.vocab, s->sx[k], s->sy[k]);
        }
        if (st != TS_OK) return st;
    }
    return TS_OK;
}

/* ---- model and plans ---------------------------------------------------- */

static size_t value_bytes(const ts_graph *g, ts_val v) {
    return (size_t)ts_numel(g, v) * ts_dtype_size(ts_dtype_of(g, v));
}

static ts_status resolve_metrics(session *s) {
    ts_config *c = &s->c;
    if (!c->train.metrics[0])
        snprintf(c->train.metrics, sizeof c->train.metrics, "%s",
                 c->model.name == TS_CFG_UNET3D ? "accuracy, dice"
                 : s->binary                    ? "accuracy, auc"
                 : s->classifier                ? "accuracy"
                                                : "mse");
    ts_status st = ts_config_metrics(c, &s->want_acc, &s->want_mse);
    if (st != TS_OK) return st;
    const int classifies = s->classifier || s->binary;
    if (s->want_acc && !classifies)
        return ts_fail(TS_ERR_INVALID,
                       "train.metrics: accuracy needs a classifier (model.classes > 0 or a gpt "
                       "model); this model is a regression");
    if (s->want_mse && classifies)
        return ts_fail(TS_ERR_INVALID,
                       "train.metrics: mse needs a regression model; this one is a classifier "
                       "(use accuracy)");
    if ((st = ts_config_metric_flags(c, &s->metric_flags)) != TS_OK) return st;
    if ((s->metric_flags & (TS_METRIC_AUC | TS_METRIC_DICE | TS_METRIC_MIOU)) && !classifies)
        return ts_fail(TS_ERR_INVALID,
                       "train.metrics: auc, dice and miou need a classifier (model.classes > 0); "
                       "this model is a regression");
    return TS_OK;
}

static ts_status build(session *s) {
    ts_train_spec spec;
    ts_compile_options opt;
    /* With N ranks the graph is built for model.batch / N rows (the
     * session's buffers hold the whole batch; each rank feeds its rows). */
    ts_config lc = s->c;
    lc.model.batch /= s->nranks;
    ts_config_graph cg = ts_zoo_graph_of(&s->graph);
    ts_status st =
        ts_config_build_graph(&lc, s->graph.nodes ? &cg : NULL, &s->g, &s->m, &spec, &opt);
    opt.comm = s->o->comm;
    opt.bucket_mb = s->c.dist.bucket_mb;
    opt.dist_algo = s->c.dist.algo;
    opt.zero = s->nranks > 1 ? s->c.dist.zero : 0;
    opt.zero_private_params = !s->c.dist.share_params;
    opt.monitors = 1; /* gradient monitors for observe and alerts */
    if (st == TS_OK) st = ts_compile(s->g, &spec, &opt, &s->plan);
    opt.monitors = 0;
    opt.comm = NULL; /* the evaluation plan is this rank's alone */
    if (st != TS_OK) return st;
    s->in_name = ts_name(s->g, s->m.input);
    s->tgt_name = ts_name(s->g, s->m.target);
    s->out_name = ts_name(s->g, s->m.output);
    s->xb = value_bytes(s->g, s->m.input);
    s->yb = value_bytes(s->g, s->m.target);
    s->outb = value_bytes(s->g, s->m.output);
    if (s->all) {
        /* The model's inputs hold a batch of the dataset's examples. */
        const size_t B = (size_t)lc.model.batch;
        if (s->xb != B * ts_dataset_x_bytes(s->all) || s->yb != B * ts_dataset_y_bytes(s->all) ||
            ts_dtype_of(s->g, s->m.input) != s->all->x_dtype ||
            ts_dtype_of(s->g, s->m.target) != s->all->y_dtype)
            return ts_fail(TS_ERR_INTERNAL,
                           "the model's inputs (%zu, %zu bytes) do not hold a batch of the "
                           "data (%zu, %zu bytes per example)",
                           s->xb, s->yb, ts_dataset_x_bytes(s->all), ts_dataset_y_bytes(s->all));
    }
    if (!(s->bx = ts_alloc(s->xb * (size_t)s->nranks, "batch")) ||
        !(s->by = ts_alloc(s->yb * (size_t)s->nranks, "batch")))
        return TS_ERR_NOMEM;
    if ((s->val && s->val->n) || s->test) {
        /* Evaluation runs an inference plan of the same graph: forward only,
         * no dropout, its own arena; parameters are copied in by name. */
        if ((st = ts_compile(s->g, NULL, &opt, &s->eval)) != TS_OK) return st;
        if (!(s->bout = ts_alloc(s->outb, "model output"))) return TS_ERR_NOMEM;
        for (int i = 0; i < ts_plan_persistent_count(s->plan); i++) {
            ts_persistent pv;
            if (ts_plan_persistent(s->plan, i, &pv) == TS_OK && pv.bytes > s->pbuf_bytes)
                s->pbuf_bytes = pv.bytes;
        }
        if (!(s->pbuf = ts_alloc(s->pbuf_bytes ? s->pbuf_bytes : 1, "parameter copy")))
            return TS_ERR_NOMEM;
    }
    if (s->classifier || s->binary) {
        /* Logits per target: the output's values over the targets' count
         * (a binary model's scores are taken as two logits {0, z}). */
        const int64_t width =
            s->binary ? 2 : (int64_t)((s->outb / sizeof(float)) / (s->yb / sizeof(int64_t)));
        if ((st = ts_metric_acc_init(&s->macc, s->metric_flags & ~(unsigned)TS_METRIC_ACCURACY,
                                     width)) != TS_OK)
            return st;
    }
    return TS_OK;
}

/* ---- evaluation ----------------------------------------------------------- */

/* Parameters and persistent state (BatchNorm running statistics: eval mode
 * normalises with them) go into the eval plan by name; optimizer moments
 * have no counterpart there and are skipped. */
static ts_status copy_params(session *s) {
    for (int i = 0; i < ts_plan_persistent_count(s->plan); i++) {
        ts_persistent pv;
        ts_status st = ts_plan_persistent(s->plan, i, &pv);
        if (st != TS_OK) return st;
        /* A value the forward pass does not read is not in the eval plan. */
        if (ts_plan_value_info(s->eval, pv.name, NULL, NULL, NULL) != TS_OK) continue;
        st = ts_plan_read(s->plan, pv.name, s->pbuf, pv.bytes);
        if (st == TS_OK) st = ts_plan_write_param(s->eval, pv.name, s->pbuf, pv.bytes);
        if (st != TS_OK) return st;
    }
    return TS_OK;
}

/* Every example of d, in order, in batches of the plan's size; the last
 * batch is padded with copies of its first example, which are not counted. */
static ts_status evaluate(session *s, const ts_dataset *d, ts_eval_result *e) {
    const int64_t B = s->c.model.batch / s->nranks; /* the plan's batch */
    const size_t xe = ts_dataset_x_bytes(d), ye = ts_dataset_y_bytes(d);
    /* Targets per example: class ids (classifier) or numbers (regression);
     * the output has `width` values per target for a classifier. */
    const int64_t per = (int64_t)(ye / (s->classifier ? sizeof(int64_t) : sizeof(float)));
    const int64_t width = s->classifier ? (int64_t)(s->outb / sizeof(float)) / (B * per) : 1;
    double loss = 0, sq = 0;
    int64_t correct = 0, targets = 0, ignored = 0;
    ts_metric_acc_reset(&s->macc);
    const int unet = s->c.model.name == TS_CFG_UNET3D;
    ts_status st = unet ? ts_zoo_dice_reset(&s->dice, width) : TS_OK;
    if (st == TS_OK) st = copy_params(s);
    for (int64_t start = 0; st == TS_OK && start < d->n; start += B) {
        const int64_t cnt = d->n - start < B ? d->n - start : B;
        memcpy(s->bx, (const char *)d->x + (size_t)start * xe, (size_t)cnt * xe);
        for (int64_t i = cnt; i < B; i++)
            memcpy((char *)s->bx + (size_t)i * xe, (const char *)d->x + (size_t)start * xe, xe);
        st = ts_plan_set_input(s->eval, s->in_name, s->bx, s->xb);
        if (st == TS_OK) st = ts_plan_step(s->eval);
        if (st == TS_OK) st = ts_plan_read(s->eval, s->out_name, s->bout, s->outb);
        if (st == TS_OK && unet) /* [B, C, voxels]: a row per voxel */
            st = ts_zoo_channels_last(s->bout, B, width, per);
        if (st != TS_OK) break;
        const int64_t nt = cnt * per;
        if (unet)
            ts_zoo_dice_add(&s->dice, s->bout,
                            (const int64_t *)((const char *)d->y + (size_t)start * ye), nt);
        if (s->binary) {
            const float *y = (const float *)((const char *)d->y + (size_t)start * ye);
            st = ts_zoo_binary_add(s->bout, y, nt, &loss, &correct, &s->macc);
            if (st != TS_OK) break;
        } else if (s->classifier) {
            const int64_t *y = (const int64_t *)((const char *)d->y + (size_t)start * ye);
            for (int64_t t = 0; t < nt; t++) {
                if (y[t] == TS_ZOO_IGNORE) { /* a graph node outside this split */
                    ignored++;
                    continue;
                }
                const float *row = s->bout + t * width;
                int64_t arg = 0;
                double mx = row[0], sum = 0;
                for (int64_t k = 1; k < width; k++)
                    if (row[k] > mx) mx = row[k], arg = k;
                for (int64_t k = 0; k < width; k++) sum += exp((double)row[k] - mx);
                loss += mx + log(sum) - (double)row[y[t]];
                correct += arg == y[t];
                if (s->macc.flags && (st = ts_metric_acc_add(&s->macc, row, y[t])) != TS_OK) break;
            }
            if (st != TS_OK) break;
        } else {
            const float *y = (const float *)((const char *)d->y + (size_t)start * ye);
            for (int64_t t = 0; t < nt; t++) {
                double diff = (double)s->bout[t] - (double)y[t];
                sq += diff * diff;
            }
        }
        targets += nt;
    }
    if (st != TS_OK) {
        ts_error_prefix("evaluation");
        return st;
    }
    e->examples = d->n;
    targets -= ignored;
    if (s->graph.nodes) e->examples = targets; /* the split's nodes */
    e->accuracy = e->mse = e->auc = e->dice = e->miou = NAN;
    if (s->macc.flags &&
        (st = ts_metric_acc_result(&s->macc, &e->auc, &e->dice, &e->miou)) != TS_OK)
        return st;
    if (s->classifier || s->binary) {
        e->loss = targets ? loss / (double)targets : NAN;
        /* unet3d: cross-entropy + soft Dice over the split, as it trains */
        if (unet) e->loss += ts_zoo_dice_loss(&s->dice);
        if (s->want_acc) e->accuracy = targets ? (double)correct / (double)targets : NAN;
    } else {
        e->loss = targets ? sq / (double)targets : NAN;
        if (s->want_mse) e->mse = e->loss;
    }
    return TS_OK;
}

static ts_status eval_split(session *s, const char *split, const ts_dataset *d, ts_eval_result *e,
                            int64_t step, int64_t epoch) {
    double t0 = ts_now();
    ts_status st = evaluate(s, d, e);
    if (st != TS_OK) return st;
    char metrics[160] = "", b1[32], b2[32];
    if (!isnan(e->accuracy))
        snprintf(metrics, sizeof metrics, "  accuracy %.2f %%", 100.0 * e->accuracy);
    else if (!isnan(e->mse))
        snprintf(metrics, sizeof metrics, "  mse %.6g", e->mse);
    const struct {
        const char *name;
        double v;
    } extra[] = {{"auc", e->auc}, {"dice", e->dice}, {"miou", e->miou}};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
        if (!isnan(extra[i].v)) {
            size_t len = strlen(metrics);
            snprintf(metrics + len, sizeof metrics - len, "  %s %.4f", extra[i].name, extra[i].v);
        }
    ts_progress_log(&s->pr,
                    "eval  step %lld  epoch %lld  %-4s loss %.6f%s  (%lld examples, %.1f s)",
                    (long long)step, (long long)epoch, split, e->loss, metrics,
                    (long long)e->examples, ts_now() - t0);
    if (s->metrics) {
        fprintf(s->metrics,
                "{\"type\":\"eval\",\"split\":\"%s\",\"step\":%lld,\"epoch\":%lld,"
                "\"examples\":%lld,\"loss\":%s",
                split, (long long)step, (long long)epoch, (long long)e->examples,
                num(e->loss, b1, sizeof b1));
        if (!isnan(e->accuracy))
            fprintf(s->metrics, ",\"accuracy\":%s", num(e->accuracy, b2, sizeof b2));
        if (!isnan(e->mse)) fprintf(s->metrics, ",\"mse\":%s", num(e->mse, b2, sizeof b2));
        for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
            if (!isnan(extra[i].v))
                fprintf(s->metrics, ",\"%s\":%s", extra[i].name, num(extra[i].v, b2, sizeof b2));
        fputs("}\n", s->metrics);
        fflush(s->metrics);
    }
    if (s->tb) {
        char tag[32];
        const char *const tags[] = {tag};
        snprintf(tag, sizeof tag, "%s/loss", split);
        if ((st = ts_tfevents_scalars(s->tb, step, 1, tags, &e->loss)) != TS_OK) return st;
    }
    return TS_OK;
}

/* ---- the step loop -------------------------------------------------------- */

static ts_status next_batch(session *s, int64_t step) {
    ts_status st = TS_OK;
    if (s->loader) {
        st = ts_loader_next(s->loader, s->bx, s->by);
    } else if (s->n_synth == 0) {
        /* Batch `step - 1` of the seed's stream: a resumed run draws the
         * same batches; the validation batches come from indices 2^20 on. */
        st = ts_zoo_synth(&s->c, step - 1, s->bx, s->by);
    } else {
        int k = (int)((step - 1) % s->n_synth);
        memcpy(s->bx, s->sx[k], s->xb * (size_t)s->nranks);
        memcpy(s->by, s->sy[k], s->yb * (size_t)s->nranks);
    }
    const ts_config *c = &s->c;
    if (st == TS_OK && c->debug.inject)
        ts_alert_inject(c->debug.inject, c->debug.inject_step, c->debug.inject_count,
                        c->debug.inject_scale, step, s->bx, s->xb * (size_t)s->nranks);
    return st;
}

/* Begin a checkpoint of the state after `step` (written in the background
 * unless ckpt.async is off). */
static ts_status save_checkpoint(session *s, int64_t step) {
    ts_ckpt_meta meta = {s->ident,
                         s->ident_bytes,
                         s->lineage,
                         s->n_lineage,
                         s->loader ? ts_loader_position(s->loader) : step,
                         s->loader ? ts_loader_epoch(s->loader) : 0};
    ts_status st = ts_ckpt_saver_begin(s->sv, s->plan, &meta);
    if (st == TS_OK && !s->c.ckpt.async) st = ts_ckpt_saver_wait(s->sv);
    if (st != TS_OK) {
        ts_error_prefix("checkpoint at step %lld", (long long)step);
        return st;
    }
    s->r->checkpoints++;
    return TS_OK;
}

/* ---- observability (docs/observability.md) ------------------------------- */

/* The metrics registry and the /metrics endpoint, started before the run
 * directory is made (a taken port leaves no trace) and before the first
 * step; also the buffer the gradient norm and the histograms read into. */
static ts_status observe_start(session *s) {
    const ts_config *c = &s->c;
    size_t most = sizeof(float);
    for (int i = 0; i < ts_plan_param_count(s->plan); i++) {
        ts_dtype dt;
        int rank;
        int64_t dims[TS_MAX_RANK];
        if (ts_plan_value_info(s->plan, ts_plan_param_name(s->plan, i), &dt, &rank, dims) ==
                TS_OK &&
            dt == TS_F32) {
            const size_t b = (size_t)numel_dims(rank, dims) * sizeof(float);
            if (b > most) most = b;
        }
    }
    if (!(s->gbuf = ts_alloc(most, "gradient read-back buffer"))) return TS_ERR_NOMEM;
    s->gbuf_bytes = most;
    if (c->observe.metrics_port <= 0) return TS_OK;
    ts_status st = ts_train_metrics_create(s->rank, &s->tm);
    if (st != TS_OK) return st;
    s->tm_made = 1;
    ts_plan_stats ps;
    if (ts_plan_get_stats(s->plan, &ps) == TS_OK)
        ts_metric_set(s->tm.arena_bytes, (double)ps.arena_bytes);
    const char *addr = c->observe.metrics_addr[0] ? c->observe.metrics_addr : "127.0.0.1";
    st = ts_http_serve_metrics(s->tm.reg, addr, c->observe.metrics_port, &s->http);
    if (st != TS_OK) {
        ts_error_prefix("observe.metrics_port");
        return st;
    }
    ts_progress_log(&s->pr, "metrics: http://%s%s%s:%d/metrics", strchr(addr, ':') ? "[" : "", addr,
                    strchr(addr, ':') ? "]" : "", ts_http_port(s->http));
    return TS_OK;
}

/* Every collective of a data-parallel run: its bytes and time in the
 * metrics, its span in the --trace timeline. Runs on the thread that ran
 * the collective (the communication thread for the gradient buckets). */
static void comm_span(const ts_comm_span *sp, void *user) {
    session *s = user;
    if (s->trace) ts_trace_comm_span(sp, s->trace);
    if (s->tm_made)
        ts_train_metrics_collective(&s->tm, ts_coll_kind_name(sp->kind), (double)sp->bytes,
                                    sp->end - sp->start);
}

/* TensorBoard events under RUN_DIR/tb/, once the run directory exists. */
static ts_status tensorboard_start(session *s) {
    if (!s->r->run_dir[0] || !s->c.observe.tensorboard) return TS_OK;
    char dir[640], suffix[64];
    snprintf(dir, sizeof dir, "%s/tb", s->r->run_dir);
    ts_tfevents_options o = ts_tfevents_options_default();
    if (s->ck) {
        /* A resumed run adds a file next to the earlier ones, which may
         * have been opened in this same second. */
        snprintf(suffix, sizeof suffix, ".resumed-step%lld.%ld", (long long)s->start_step,
                 (long)getpid());
        o.suffix = suffix;
    }
    ts_status st = ts_tfevents_open(dir, &o, &s->tb);
    if (st != TS_OK) ts_error_prefix("observe.tensorboard");
    return st;
}

/* Stop the endpoint and close the event file (idempotent). */
static ts_status observe_end(session *s) {
    ts_http_stop(s->http);
    s->http = NULL;
    ts_status st = TS_OK;
    if (s->tb) {
        st = ts_tfevents_close(s->tb);
        s->tb = NULL;
        if (st != TS_OK) ts_error_prefix("closing the TensorBoard events");
    }
    return st;
}

/* Read float32 value `name` into s->gbuf; *n = 0 for a value that is not
 * float32 or not there (a parameter without a gradient). */
static ts_status read_f32(session *s, const char *name, int64_t *n) {
    ts_dtype dt;
    int rank;
    int64_t dims[TS_MAX_RANK];
    *n = 0;
    if (ts_plan_value_info(s->plan, name, &dt, &rank, dims) != TS_OK || dt != TS_F32) return TS_OK;
    const int64_t k = numel_dims(rank, dims);
    if ((size_t)k * sizeof(float) > s->gbuf_bytes) return TS_OK;
    ts_status st = ts_plan_read(s->plan, name, s->gbuf, (size_t)k * sizeof(float));
    if (st == TS_OK) *n = k;
    return st;
}

/* The global L2 norm of the gradients, computed in place in the plan's
 * gradient region (not yet a monitor node of the step graph), and with
 * `hist` the histograms of every parameter and its gradient. */
static ts_status gradient_pass(session *s, int64_t step, int hist, double *norm) {
    char name[600];
    int64_t n;
    ts_status st = ts_plan_grad_norm(s->plan, norm);
    for (int i = 0; hist && i < ts_plan_param_count(s->plan) && st == TS_OK; i++) {
        const char *p = ts_plan_param_name(s->plan, i);
        if ((st = read_f32(s, p, &n)) != TS_OK) break;
        snprintf(name, sizeof name, "weights/%s", p);
        if (n && (st = ts_tfevents_histogram(s->tb, step, name, s->gbuf, n, NULL)) != TS_OK) break;
        snprintf(name, sizeof name, "grad:%s", p);
        if (s->nranks > 1 && s->c.dist.zero == 2) continue; /* ZeRO-2: gone after the step */
        if ((st = read_f32(s, name, &n)) != TS_OK) break;
        snprintf(name, sizeof name, "grads/%s", p);
        if (n) st = ts_tfevents_histogram(s->tb, step, name, s->gbuf, n, NULL);
    }
    return st;
}

/* Everything published after a step: the Prometheus metrics, the
 * TensorBoard scalars and (every observe.histogram_every steps, and at the
 * first step) the histograms. *grad_norm gets the global gradient norm. */
static ts_status observe_step(session *s, int64_t step, double loss, double lr, double dt,
                              double rate, double *grad_norm) {
    const ts_config *c = &s->c;
    const int64_t every = c->observe.histogram_every;
    const int hist = s->tb && every > 0 && (step % every == 0 || step == s->start_step + 1);
    ts_status st = gradient_pass(s, step, hist, grad_norm);
    if (st != TS_OK) return st;
    if (s->tm_made) {
        ts_step_metrics m = ts_step_metrics_empty();
        m.step = step;
        m.loss = loss;
        m.seconds = dt;
        m.learning_rate = lr;
        m.samples_per_s = s->gpt ? rate / (double)c->model.ctx : rate;
        if (s->gpt) m.tokens_per_s = rate;
        m.grad_norm = *grad_norm;
        if (s->ar) m.grad_variance = s->ar->mon->value[TS_MON_GRAD_VARIANCE];
        double scale;
        if (ts_plan_loss_scale(s->plan, &scale, NULL, NULL)) m.loss_scale = scale;
        if ((st = ts_train_metrics_step(&s->tm, &m)) != TS_OK) return st;
        if (ts_plan_found_inf(s->plan) && /* the loss scaler skipped the update */
            (st = ts_train_metrics_skipped(&s->tm, "non_finite_gradients")) != TS_OK)
            return st;
    }
    if (s->tb) {
        static const char *const tags[] = {"train/loss", "train/lr", "train/throughput",
                                           "train/grad_norm"};
        const double v[] = {loss, lr, rate, *grad_norm};
        st = ts_tfevents_scalars(s->tb, step, 4, tags, v);
    }
    if (st == TS_OK && s->tb && s->ar) st = ts_alert_runner_scalars(s->ar, s->tb, step);
    return st;
}

/* ---- alerts (docs/observability.md) ------------------------------------- */

/* The monitors and rules, checked before the run directory exists. */
static ts_status alerts_setup(session *s) {
    const ts_config *c = &s->c;
    if (c->debug.inject && ts_dtype_of(s->g, s->m.input) != TS_F32)
        return ts_fail(TS_ERR_INVALID, "debug.inject corrupts a float input x; this model's "
                                       "input is not float32");
    ts_alert_run_config ac = {c->alerts.rules,
                              c->alerts.defaults,
                              c->alerts.webhook_url,
                              c->alerts.baseline_window,
                              c->alerts.baseline_warmup,
                              c->alerts.update_ratio_every,
                              s->rank,
                              s->nranks > 1 ? s->o->comm : NULL};
    return ts_alert_runner_new(s->plan, &ac, &s->ar);
}

/* What the fired rules do to the run: an anomaly checkpoint (snapshot,
 * and before a pause), the pause itself, or a clean stop. */
static ts_status alert_actions(session *s, int64_t step, unsigned act) {
    ts_session_result *r = s->r;
    const ts_alert_runner *ar = s->ar;
    const int pause = (act >> TS_AA_PAUSE) & 1, stop = (act >> TS_AA_STOP) & 1;
    ts_status st = TS_OK;
    if (((act >> TS_AA_SNAPSHOT) & 1) || pause) {
        if (!r->run_dir[0]) {
            ts_progress_log(&s->pr, "alert: no run directory: no snapshot at step %lld",
                            (long long)step);
        } else {
            if (!s->sv && !s->asv) {
                ts_ckpt_options co = ts_ckpt_options_default();
                co.sign_key = s->c.ckpt.sign_key[0] ? s->c.ckpt.sign_key : NULL;
                co.audit = s->audit;
                if ((st = ts_ckpt_saver_new(r->run_dir, s->plan, &co, &s->asv)) != TS_OK) return st;
            }
            ts_ckpt_saver *sv = s->sv ? s->sv : s->asv;
            if ((st = ts_ckpt_saver_set_tag(sv, "anomaly")) != TS_OK) return st;
            ts_ckpt_meta meta = {s->ident,
                                 s->ident_bytes,
                                 s->lineage,
                                 s->n_lineage,
                                 s->loader ? ts_loader_position(s->loader) : step,
                                 s->loader ? ts_loader_epoch(s->loader) : 0};
            st = ts_ckpt_saver_begin(sv, s->plan, &meta);
            if (st == TS_OK) st = ts_ckpt_saver_wait(sv);
            if (st != TS_OK) {
                ts_error_prefix("alert snapshot at step %lld", (long long)step);
                return st;
            }
            ts_progress_log(&s->pr, "alert: snapshot %s/step-%08lld-anomaly (rule '%s')",
                            r->run_dir, (long long)step,
                            ar->snapshot_rule ? ar->snapshot_rule->name
                            : ar->pause_rule  ? ar->pause_rule->name
                                              : "?");
            r->anomaly_snapshots++;
        }
    }
    if (stop) {
        r->stopped_by_alert = 1;
        snprintf(r->alert_rule, sizeof r->alert_rule, "%s",
                 ar->stop_rule ? ar->stop_rule->name : "");
        ts_progress_log(&s->pr, "stopped by alert rule '%s' after step %lld", r->alert_rule,
                        (long long)step);
        if (s->sv && s->c.ckpt.every > 0) st = save_checkpoint(s, step);
        return st;
    }
    if (pause) {
        if (!r->run_dir[0]) {
            ts_progress_log(&s->pr, "alert: no run directory to resume through: not pausing");
            return TS_OK;
        }
        int resumed = 0;
        st = ts_alert_pause(r->run_dir, step, ar->pause_rule ? ar->pause_rule->name : "?",
                            s->o->stop, &s->pr, &resumed);
        if (st == TS_OK) r->pauses++;
    }
    return st;
}

static ts_status train_loop(session *s) {
    ts_session_result *r = s->r;
    const ts_config *c = &s->c;
    const int64_t steps = c->train.steps, bpe = c->batches_per_epoch;
    const double per_step = (double)c->model.batch * (s->gpt ? (double)c->model.ctx : 1.0);
    /* Ranks hold the same weights: rank 0 alone evaluates. */
    const int has_val = s->val && s->val->n > 0 && s->rank == 0;
    const double t_start = ts_now();
    ts_status st = TS_OK;
    /* A stop requested while the data loaded or the plan compiled. */
    if (s->o->stop && *s->o->stop) {
        r->interrupted = 1;
        ts_progress_log(&s->pr, "stopped before the first step (interrupted)");
    }
    for (int64_t step = s->start_step + 1; step <= steps && !r->interrupted; step++) {
        const int64_t epoch = bpe ? (step - 1) / bpe + 1 : 0;
        const double lr = ts_plan_lr(s->plan), t0 = ts_now();
        st = next_batch(s, step);
        /* This rank's rows: rank r takes rows r*B/N .. (r+1)*B/N - 1. */
        if (st == TS_OK)
            st = ts_plan_set_input(s->plan, s->in_name,
                                   (const char *)s->bx + (size_t)s->rank * s->xb, s->xb);
        if (st == TS_OK)
            st = ts_plan_set_input(s->plan, s->tgt_name,
                                   (const char *)s->by + (size_t)s->rank * s->yb, s->yb);
        if (st == TS_OK) st = ts_plan_step(s->plan);
        double loss = ts_plan_loss(s->plan);
        int stop = s->o->stop && *s->o->stop;
        if (st == TS_OK && s->nranks > 1) st = ts_session_agree(s->o->comm, &loss, &stop);
        const double dt = ts_now() - t0;
        if (st != TS_OK) {
            ts_error_prefix("step %lld", (long long)step);
            break;
        }
        const double rate = dt > 0 ? per_step / dt : 0;
        r->steps = step;
        r->final_loss = loss;
        if (step == s->start_step + 1) r->first_loss = loss;
        if (step > s->start_step + 1 && s->n_rates < MAX_RATES) s->rates[s->n_rates++] = rate;
        double gnorm = NAN;
        unsigned alert = 0;
        if (s->ar && (st = ts_alert_runner_step(s->ar, step, &alert)) != TS_OK) {
            ts_error_prefix("step %lld: alerts", (long long)step);
            break;
        }
        if ((st = observe_step(s, step, loss, lr, dt, rate, &gnorm)) != TS_OK) {
            ts_error_prefix("step %lld", (long long)step);
            break;
        }
        ts_progress_info in = {step, epoch, c->train.epochs, loss, lr, rate};
        ts_progress_step(&s->pr, &in);
        if (s->metrics) {
            char b1[32], b2[32], b3[32], b4[32], amp[96] = "";
            double scale;
            if (ts_plan_loss_scale(s->plan, &scale, NULL, NULL)) /* mixed precision */
                snprintf(amp, sizeof amp, ",\"loss_scale\":%.9g,\"step_skipped\":%d", scale,
                         ts_plan_last_step_skipped(s->plan));
            fprintf(s->metrics,
                    "{\"type\":\"train\",\"step\":%lld,\"epoch\":%lld,\"loss\":%s,\"lr\":%s,"
                    "\"samples_per_s\":%s,\"grad_norm\":%s%s}\n",
                    (long long)step, (long long)epoch, num(loss, b1, sizeof b1),
                    num(lr, b2, sizeof b2),
                    num(rate / (s->gpt ? (double)c->model.ctx : 1.0), b3, sizeof b3),
                    num(gnorm, b4, sizeof b4), amp);
        }
        /* A skipped update kept the weights: the run can go on. */
        if (!isfinite(loss) && !(alert & (1u << TS_AA_SKIP | 1u << TS_AA_STOP))) {
            st = ts_fail(TS_ERR_NUMERIC,
                         "step %lld: the loss is %g; lower train.lr, set train.clip_grad_norm, "
                         "or find the first bad value with --set compile.debug_nan=true",
                         (long long)step, loss);
            break;
        }
        if (alert && (st = alert_actions(s, step, alert)) != TS_OK) break;
        if (r->stopped_by_alert) break;
        const int due =
            c->train.eval_every > 0 ? step % c->train.eval_every == 0 : bpe > 0 && step % bpe == 0;
        if (has_val && (due || (step == steps && !stop))) {
            st = eval_split(s, "val", s->val, &r->val, step, epoch);
            if (st != TS_OK) break;
            r->has_val = 1;
        }
        if (s->sv && (step == steps || step % c->ckpt.every == 0 || stop) &&
            (st = save_checkpoint(s, step)) != TS_OK)
            break;
        if (stop) {
            r->interrupted = 1;
            ts_progress_log(&s->pr, "stopped after step %lld of %lld (interrupted)",
                            (long long)step, (long long)steps);
            break;
        }
    }
    if (s->sv) {
        /* The last save, also after Ctrl-C or a failed step (whose other
         * ranks may be gone: a ZeRO save stops waiting for them). */
        if (st != TS_OK && s->nranks > 1) ts_ckpt_saver_cancel(s->sv);
        ts_status ws = ts_ckpt_saver_wait(s->sv);
        ts_ckpt_save_stats ss;
        if (ws != TS_OK) {
            if (st == TS_OK) {
                ts_error_prefix("saving a checkpoint");
                st = ws;
            } else {
                ts_progress_log(&s->pr, "tessel: error: saving a checkpoint: %s", ts_last_error());
            }
        } else if (r->checkpoints && ts_ckpt_saver_stats(s->sv, &ss) == TS_OK) {
            ts_progress_log(&s->pr,
                            "checkpoint %s/%s: %.1f MB, step stall %.1f ms, written in %.3f s "
                            "(%.0f MB/s)",
                            r->run_dir, ss.dir, (double)ss.bytes * 1e-6, ss.stall_s * 1e3,
                            ss.write_s, ss.throughput * 1e-6);
        }
    }
    r->seconds = ts_now() - t_start;
    if (st == TS_OK && s->metrics && (fflush(s->metrics) != 0 || ferror(s->metrics)))
        st = ts_fail(TS_ERR_IO, "writing %s/metrics.jsonl failed", r->run_dir);
    if (st != TS_OK) {
        r->failed_in_step = 1;
        return st;
    }
    if (s->n_rates) {
        qsort(s->rates, (size_t)s->n_rates, sizeof *s->rates, cmp_double);
        r->median_rate = s->rates[s->n_rates / 2];
    } else if (r->steps == s->start_step + 1 && r->seconds > 0) {
        r->median_rate = per_step / r->seconds;
    }
    if (s->test && !r->interrupted && !r->stopped_by_alert && s->rank == 0) {
        st = eval_split(s, "test", s->test, &r->test, r->steps, bpe ? (r->steps - 1) / bpe + 1 : 0);
        if (st != TS_OK) return st;
        r->has_test = 1;
    }
    return TS_OK;
}

/* ---- the session ---------------------------------------------------------- */

static void header(session *s) {
    const ts_config *c = &s->c;
    ts_plan_stats st;
    ts_plan_get_stats(s->plan, &st);
    char data[256];
    if (s->graph.nodes) /* one example: the graph */
        snprintf(data, sizeof data, "graph of %lld nodes, %lld edges: %lld train, %lld val%s",
                 (long long)s->graph.nodes, (long long)s->graph.edges.n,
                 (long long)s->graph.n_train, (long long)s->graph.n_val, s->test ? ", " : "");
    else if (s->all)
        snprintf(data, sizeof data, "%s data: %lld train, %lld val%s", source_names[c->data.source],
                 (long long)s->train->n, (long long)s->val->n, s->test ? ", " : "");
    else
        snprintf(data, sizeof data, "synthetic data");
    char test[64] = "";
    if (s->test)
        snprintf(test, sizeof test, "%lld test",
                 (long long)(s->graph.nodes ? s->graph.n_test : s->test->n));
    char epochs[96] = "";
    if (c->batches_per_epoch)
        snprintf(epochs, sizeof epochs, " (%.3g epochs of %lld)",
                 (double)c->train.steps / (double)c->batches_per_epoch,
                 (long long)c->batches_per_epoch);
    const double np = param_count(s->plan);
    char params[32];
    if (np >= 1e6)
        snprintf(params, sizeof params, "%.2f M", np * 1e-6);
    else
        snprintf(params, sizeof params, "%.0f", np);
    ts_progress_log(&s->pr,
                    "training %s: %s parameters, batch %lld, %lld steps%s; %s%s; plan: %d "
                    "instructions, arena %.1f MiB",
                    s->gpt                          ? "gpt"
                    : s->c.model.name == TS_CFG_CNN ? "cnn classifier"
                    : s->c.model.name != TS_CFG_MLP ? ts_config_model_word(s->c.model.name)
                    : s->classifier                 ? "mlp classifier"
                                                    : "mlp",
                    params, (long long)c->model.batch, (long long)c->train.steps, epochs, data,
                    test, st.n_instructions, (double)st.arena_bytes / (1024.0 * 1024.0));
    if (s->nranks > 1) {
        ts_progress_log(&s->pr,
                        "data parallel: %d processes (%s), batch %lld per process, gradients "
                        "averaged in buckets of %g MiB",
                        s->nranks, ts_comm_transport(s->o->comm),
                        (long long)(c->model.batch / s->nranks), c->dist.bucket_mb);
        const double mib = 1024.0 * 1024.0;
        char zs[48] = "", zg[192] = "";
        if (c->dist.zero) snprintf(zs, sizeof zs, ": ZeRO-%d, this rank's shard", c->dist.zero);
        if (st.zero_grad_bytes)
            snprintf(zg, sizeof zg,
                     ": ZeRO-2, buckets of %.1f in the temporaries, at most %.1f at once; this "
                     "rank's shards %.1f",
                     (double)st.zero_grad_bytes / mib, (double)st.zero_grad_peak / mib,
                     (double)st.zero_shard_bytes / mib);
        char ps[48];
        if (st.shared_param_bytes)
            snprintf(ps, sizeof ps, "0.0: shared, below");
        else
            snprintf(ps, sizeof ps, "%.1f", (double)st.param_bytes / mib);
        ts_progress_log(&s->pr,
                        "per process: arena %.1f MiB (parameters %s, gradients %.1f%s, optimizer "
                        "state %.1f%s, temporaries %.1f)",
                        (double)st.arena_bytes / mib, ps, (double)st.grad_bytes / mib, zg,
                        (double)st.state_bytes / mib, zs, (double)st.temp_bytes / mib);
        if (st.shared_param_bytes)
            ts_progress_log(&s->pr,
                            "shared by the %d processes: parameters %.1f MiB (one copy, each "
                            "process updates its block)",
                            s->nranks, (double)st.shared_param_bytes / mib);
    }
}

static void session_free(session *s) {
    /* no collective may report into the metrics or trace freed below */
    if (s->o && s->o->comm) ts_comm_set_trace(s->o->comm, NULL, NULL);
    if (observe_end(s) != TS_OK) ts_progress_log(&s->pr, "tessel: warning: %s", ts_last_error());
    ts_alert_runner_free(s->ar);
    if (s->tm_made) ts_train_metrics_free(&s->tm);
    free(s->gbuf);
    ts_ckpt_saver_free(s->sv);
    ts_ckpt_saver_free(s->asv);
    if (s->audit && ts_audit_close(s->audit) != TS_OK)
        ts_progress_log(&s->pr, "tessel: warning: audit.log: %s", ts_last_error());
    ts_ckpt_close(s->ck);
    free(s->ident);
    free(s->lineage);
    if (s->metrics) fclose(s->metrics);
    ts_loader_free(s->loader);
    ts_dataset_free(s->all);
    ts_dataset_free(s->train);
    ts_dataset_free(s->val);
    ts_dataset_free(s->test);
    for (int i = 0; i < s->n_synth; i++) free(s->sx[i]), free(s->sy[i]);
    ts_session_trace_close(s->plan, s->o, s->trace);
    ts_plan_free(s->plan);
    ts_plan_free(s->eval);
    ts_metric_acc_free(&s->macc);
    ts_zoo_graph_free(&s->graph);
    ts_zoo_dice_free(&s->dice);
    ts_graph_free(s->g);
    free(s->bx);
    free(s->by);
    free(s->bout);
    free(s->pbuf);
    free(s->rates);
}

static ts_status setup(session *s) {
    ts_status st = load_data(s);
    if (st != TS_OK) return st;
    s->binary = ts_zoo_binary(&s->c);
    s->classifier = s->gpt || (s->c.model.classes > 0 && !s->binary);
    if ((st = resolve_metrics(s)) != TS_OK) return st;
    if (!s->all && ts_zoo_model(&s->c) && (st = ts_zoo_synth_val(&s->c, &s->val)) != TS_OK)
        return st;
    if ((st = build(s)) != TS_OK) return st;
    if ((st = alerts_setup(s)) != TS_OK) return st;
    if (!s->all && (st = make_synthetic(s)) != TS_OK) return st;
    int64_t cap = s->c.train.steps < MAX_RATES ? s->c.train.steps : MAX_RATES;
    if (!(s->rates = ts_alloc(sizeof(double) * (size_t)(cap + 1), "step rates")))
        return TS_ERR_NOMEM;
    const int n = (s->all ? s->all->n_lineage : 0) + (s->test ? s->test->n_lineage : 0);
    if (n && !(s->lineage = ts_alloc(sizeof *s->lineage * (size_t)n, "data lineage")))
        return TS_ERR_NOMEM;
    for (int k = 0; k < 2; k++) {
        const ts_dataset *d = k ? s->test : s->all;
        for (int i = 0; d && i < d->n_lineage; i++)
            s->lineage[s->n_lineage++] =
                (ts_ckpt_data_file){d->lineage[i].path, d->lineage[i].sha256};
    }
    return identity(s);
}

/* ZeRO checkpoints: every rank saves its block of the optimizer state, and
 * rank 0 tells this launch's shards from leftovers by a number all agree
 * on (docs/checkpoints.md, "Sharded optimizer state"). */
static ts_status shard_saver(session *s) {
    if (s->nranks < 2 || !s->c.dist.zero || s->c.ckpt.every <= 0) return TS_OK;
    ts_status st = ts_session_ckpt_group(s->o->comm, &s->ckpt_group);
    if (st != TS_OK || s->rank == 0 || !s->o->shard_dir) return st;
    ts_ckpt_options co = ts_ckpt_options_default();
    co.rank = s->rank;
    co.world = s->nranks;
    co.group = s->ckpt_group;
    co.rank_timeout_s = s->c.dist.timeout_s;
    return ts_ckpt_saver_new(s->o->shard_dir, s->plan, &co, &s->sv);
}

/* Load the verified checkpoint into the freshly compiled plan: the config
 * must be the one it was saved with (up to the keys identity() leaves
 * out), then values, step count and the loader's position. Nothing is
 * written anywhere yet. */
static ts_status resume(session *s) {
    ts_ckpt_info in;
    ts_status st = ts_ckpt_get_info(s->ck, &in);
    if (st != TS_OK) return st;
    snprintf(s->ck_dir, sizeof s->ck_dir, "%s", in.dir);
    snprintf(s->ck_id, sizeof s->ck_id, "%s", in.id);
    snprintf(s->ck_config, sizeof s->ck_config, "%s", in.config_sha256);
    if (in.config_sha256[0] && strcmp(in.config_sha256, s->ident_sha))
        return ts_fail(TS_ERR_INVALID,
                       "--resume: checkpoint %s was saved with config sha256 %s, this config's is "
                       "%s; only train.steps, train.epochs, train.log_every, train.eval_every, "
                       "train.threads, dist.max_restarts, dist.procs, dist.zero, dist.bucket_mb, "
                       "dist.share_params, dist.timeout_s, output, ckpt and observe may change on "
                       "resume",
                       in.dir, in.config_sha256, s->ident_sha);
    if (in.step >= s->c.train.steps)
        return ts_fail(TS_ERR_INVALID,
                       "--resume: checkpoint %s is at step %lld and train.steps is %lld: nothing "
                       "to do (raise train.steps)",
                       in.dir, (long long)in.step, (long long)s->c.train.steps);
    if ((st = ts_ckpt_restore(s->ck, s->plan, NULL)) != TS_OK) return st;
    if (s->loader && (st = ts_loader_seek(s->loader, in.data_position)) != TS_OK) return st;
    s->start_step = in.step;
    s->r->resumed_step = in.step;
    return TS_OK;
}

ts_status ts_session_run(const ts_config *c, const ts_session_options *o, ts_session_result *r) {
    if (!c || !r) return ts_fail(TS_ERR_INVALID, "session: NULL argument");
    ts_session_options dflt = ts_session_options_default();
    if (!o) o = &dflt;
    memset(r, 0, sizeof *r);
    r->first_loss = r->final_loss = r->median_rate = NAN;
    if (!c->finished) return ts_fail(TS_ERR_INVALID, "session: call ts_config_finish first");
    session *s = ts_zalloc(sizeof *s, "session");
    if (!s) return TS_ERR_NOMEM;
    s->c = *c;
    s->o = o;
    s->r = r;
    s->nranks = o->comm ? ts_comm_size(o->comm) : 1;
    s->rank = o->comm ? ts_comm_rank(o->comm) : 0;
    s->gpt = c->model.name == TS_CFG_GPT;
    r->unit = s->gpt                        ? "tokens/s"
              : c->model.name == TS_CFG_GCN ? "epochs/s" /* a step is the whole graph */
                                            : "samples/s";
    const char *dir = o->out_dir && *o->out_dir ? o->out_dir : c->output.dir;
    const char *from = o->resume && *o->resume ? o->resume : NULL;
    s->resume_in_place = from && !strcmp(from, "latest");
    ts_status st = TS_OK;
    if (dir[0]) {
        if (snprintf(r->run_dir, sizeof r->run_dir, "%s", dir) >= (int)sizeof r->run_dir ||
            snprintf(s->c.output.dir, sizeof s->c.output.dir, "%s", dir) >=
                (int)sizeof s->c.output.dir)
            st = ts_fail(TS_ERR_INVALID, "run directory '%.60s...': path too long", dir);
        if (st == TS_OK) st = s->resume_in_place ? check_resume_dir(dir) : check_run_dir(dir);
    } else if (s->resume_in_place) {
        st = ts_fail(TS_ERR_INVALID, "--resume latest continues a run in its directory: name it "
                                     "with --out RUN_DIR or output.dir");
    } else if (c->ckpt.every > 0 && !o->shard_dir) {
        st = ts_fail(TS_ERR_INVALID, "ckpt.every needs a run directory for the checkpoints "
                                     "(--out RUN_DIR or output.dir)");
    }
    if (st == TS_OK) st = ts_zoo_check_procs(c, s->nranks);
    if (st == TS_OK && c->model.batch % s->nranks)
        st = ts_fail(TS_ERR_INVALID,
                     "model.batch %lld does not divide by %d processes: every rank trains on "
                     "model.batch / processes rows of each batch",
                     (long long)c->model.batch, s->nranks);
    if (st == TS_OK) st = check_key("ckpt.sign_key", c->ckpt.sign_key);
    if (st == TS_OK) st = check_key("ckpt.verify_key", c->ckpt.verify_key);
    /* Verify the checkpoint (signature, file hashes, tensor CRCs) before
     * anything else is loaded or written. */
    if (st == TS_OK && from) {
        st = ts_ckpt_open(s->resume_in_place ? dir : from,
                          c->ckpt.verify_key[0] ? c->ckpt.verify_key : NULL, NULL, &s->ck);
        if (st != TS_OK) ts_error_prefix("--resume %s", from);
    }
    ts_progress_start(&s->pr, o->log, o->progress, 1, 0, r->unit, 1);
    if (st == TS_OK) st = setup(s);
    if (st == TS_OK && s->ck) st = resume(s);
    if (st == TS_OK) st = shard_saver(s);
    if (st == TS_OK) {
        r->planned_steps = s->c.train.steps;
        ts_progress_start(&s->pr, o->log, o->progress, s->c.train.steps, s->c.train.log_every,
                          r->unit,
                          (double)s->c.model.batch * (s->gpt ? (double)s->c.model.ctx : 1.0));
        header(s);
        if (s->ck)
            ts_progress_log(&s->pr, "resuming from %s at step %lld", s->ck_dir,
                            (long long)s->start_step);
        st = observe_start(s);
        if (st == TS_OK && r->run_dir[0]) st = write_run_files(s);
        if (st == TS_OK) st = tensorboard_start(s);
        if (st == TS_OK)
            ts_alert_runner_attach(s->ar, &s->pr, s->tm_made ? &s->tm : NULL, s->tb, s->audit,
                                   r->run_dir);
    }
    if (st == TS_OK && o->trace)
        st = ts_session_trace_start(s->plan, o, s->c.train.steps, &s->trace);
    if (st == TS_OK && o->comm && (s->trace || s->tm_made))
        ts_comm_set_trace(o->comm, comm_span, s);
    if (st == TS_OK) {
        st = train_loop(s);
        if (st == TS_OK && s->trace) {
            st = ts_session_trace_finish(s->plan, o, s->trace, &s->pr);
            if (st != TS_OK) r->failed_in_step = 1;
        }
        /* The endpoint stops and the events are flushed when training ends. */
        ts_status oe = observe_end(s);
        if (st == TS_OK && oe != TS_OK) {
            st = oe;
            r->failed_in_step = 1;
        }
        ts_progress_end(&s->pr);
        if (st == TS_OK || r->steps)
            ts_progress_log(&s->pr, "done: %lld steps in %.2f s, loss %.6f -> %.6f, median %.0f %s",
                            (long long)r->steps, r->seconds, r->first_loss, r->final_loss,
                            r->median_rate, r->unit);
        if (st != TS_OK) {
            /* The run's own error is what the caller needs to see, even if
             * the summary cannot be written either. */
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", ts_last_error());
            if (write_summary(s, "failed", msg) != TS_OK)
                ts_progress_log(&s->pr, "tessel: warning: %s", ts_last_error());
            ts_fail(st, "%s", msg);
        } else if ((st = write_summary(s,
                                       r->stopped_by_alert ? "stopped_by_alert"
                                       : r->interrupted    ? "interrupted"
                                                           : "completed",
                                       NULL)) != TS_OK) {
            r->failed_in_step = 1;
        }
    }
    if (st != TS_OK && !s->dir_made) r->run_dir[0] = 0;
    session_free(s);
    free(s);
    return st;
}
