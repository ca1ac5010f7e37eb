/* The run directory and the run's identity: checks before anything is
 * written (a directory that exists and is not empty is refused), the
 * config text checkpoints are tied to, and the files of a run directory
 * (config.yaml, audit.log, lineage.json, normalisation.json, metrics.jsonl,
 * summary.json). See session_internal.h. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/core.h"
#include "session/session_internal.h"

const char *const ts_sess_source_names[] = {"synthetic", "idx", "npy", "csv", "tokens", "graph"};

static json_t *jnum(double v) {
    return isfinite(v) ? json_real(v) : json_null();
}

double ts_sess_param_count(const ts_plan *p) {
    double n = 0;
    for (int i = 0; i < ts_plan_param_count(p); i++) {
        int rank;
        int64_t dims[TS_MAX_RANK];
        if (ts_plan_value_info(p, ts_plan_param_name(p, i), NULL, &rank, dims) == TS_OK)
            n += (double)numel_dims(rank, dims);
    }
    return n;
}

/* A run directory may be new or empty; anything else is someone's run. */
ts_status ts_sess_check_run_dir(const char *dir) {
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
ts_status ts_sess_check_resume_dir(const char *dir) {
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
ts_status ts_sess_identity(session *s) {
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

ts_status ts_sess_write_run_files(session *s) {
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
    if ((st = ts_audit_open(s->r->run_dir, ts_config_sign_key(&s->c), &s->audit)) != TS_OK)
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
        "{s:s, s:o, s:{s:I, s:I, s:I}, s:f, s:b, s:I}", "source",
        ts_sess_source_names[s->c.data.source], "files", files, "examples", "train",
        (json_int_t)(s->train ? s->train->n : 0), "val", (json_int_t)(s->val ? s->val->n : 0),
        "test", (json_int_t)(s->test ? s->test->n : 0), "val_fraction", s->c.data.val_fraction,
        "shuffle", s->c.data.shuffle, "seed", (json_int_t)s->c.train.seed);
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
        co.sign_key = ts_config_sign_key(&s->c);
        co.keep_last = s->c.ckpt.keep_last;
        co.keep_every = s->c.ckpt.keep_every;
        co.audit = s->audit;
        co.rank = s->rank; /* ZeRO: see ts_sess_shard_saver() */
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
ts_status ts_sess_write_summary(session *s, const char *status, const char *error) {
    if (!s->dir_made) return TS_OK;
    ts_session_result *r = s->r;
    char rate_key[32];
    snprintf(rate_key, sizeof rate_key, "median_%.*s_per_s", (int)strcspn(r->unit, "/"), r->unit);
    json_t *o =
        json_pack("{s:s, s:s, s:s, s:I, s:I, s:o, s:o, s:f, s:o, s:I, s:I}", "status", status,
                  "tessel", TESSEL_VERSION, "model", ts_config_model_word(s->c.model.name), "steps",
                  (json_int_t)r->steps, "planned_steps", (json_int_t)r->planned_steps, "first_loss",
                  jnum(r->first_loss), "final_loss", jnum(r->final_loss), "seconds", r->seconds,
                  rate_key, jnum(r->median_rate), "parameters",
                  (json_int_t)(s->plan ? ts_sess_param_count(s->plan) : 0), "seed",
                  (json_int_t)s->c.train.seed);
    if (!o) return ts_fail(TS_ERR_NOMEM, "out of memory for summary.json");
    if (s->c.batches_per_epoch)
        json_object_set_new(o, "epochs",
                            json_real((double)r->steps / (double)s->c.batches_per_epoch));
    if (s->plan && (s->c.peft.targets[0] || s->c.peft.base[0])) {
        double tr, all;
        ts_sess_peft_counts(s->plan, &tr, &all);
        json_object_set_new(o, "peft",
                            json_pack("{s:I, s:I, s:f}", "trainable", (json_int_t)tr, "total",
                                      (json_int_t)all, "trainable_percent",
                                      all > 0 ? 100.0 * tr / all : 0.0));
    }
    if (r->resumed_step) json_object_set_new(o, "resumed_from_step", json_integer(r->resumed_step));
    if (s->c.ckpt.every > 0) json_object_set_new(o, "checkpoints", json_integer(r->checkpoints));
    if (r->has_val) json_object_set_new(o, "val", eval_json(&r->val));
    if (r->has_test) json_object_set_new(o, "test", eval_json(&r->test));
    if (error) json_object_set_new(o, "error", json_string(error));
    return write_json(s, "summary.json", o);
}
