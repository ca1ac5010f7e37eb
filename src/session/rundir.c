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
#include "core/dirlock.h"
#include "session/pipe_train.h"
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

/* Entries of the open run directory other than the lock file (which a
 * run directory holds from its first lock on); *has_ckpt when one is a
 * checkpoint (LATEST or a committed step-N). */
static ts_status list_run_dir(const ts_dir *d, int *entries, int *has_ckpt) {
    *entries = *has_ckpt = 0;
    DIR *dd;
    ts_status st = ts_dir_list(d, &dd); /* listed twice: before and when writing */
    if (st != TS_OK) return st;
    for (struct dirent *e; (e = readdir(dd));) {
        const char *n = e->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, TS_DIR_LOCK_NAME)) continue;
        (*entries)++;
        /* step-N.tmp (unfinished) and step-N-TAG (anomaly snapshots) are not
         * checkpoints to continue from. */
        if (!strcmp(n, "LATEST") ||
            (!strncmp(n, "step-", 5) && n[5] && strspn(n + 5, "0123456789") == strlen(n + 5)))
            *has_ckpt = 1;
    }
    closedir(dd);
    return TS_OK;
}

/* The run directory is locked, and new or empty (or, resuming, a run).
 * `how` 0 (the checks before anything is written) locks it only when it has
 * a lock file and writes nothing; TS_LOCK_CREATE (about to write) makes the
 * lock file and records the holder's PID (core/dirlock.h). */
static ts_status lock_and_check(session *s, int how) {
    ts_dir_lock l;
    ts_status st = ts_dir_lock_take(&s->dir, "tessel train", how, &l);
    if (st != TS_OK) return st;
    ts_dir_lock_release(&s->lock); /* a share of the same lock, when it was held */
    s->lock = l;
    int entries, has_ckpt;
    st = list_run_dir(&s->dir, &entries, &has_ckpt);
    if (st != TS_OK) return st;
    if (s->resume_in_place) {
        /* A run stopped before its first checkpoint starts again from step 0
         * (ts_sess_check_from_start ties it to its config). */
        s->from_start = !has_ckpt;
        return TS_OK;
    }
    if (entries)
        return ts_fail(TS_ERR_INVALID,
                       "run directory '%s' already exists and is not empty; nothing was written "
                       "(choose a new one with --out or output.dir, or continue its run with "
                       "--resume latest)",
                       s->dir.path);
    return TS_OK;
}

ts_status ts_sess_open_run_dir(session *s, const char *dir) {
    struct stat st;
    if (lstat(dir, &st) != 0) {
        if (errno == ENOENT && !s->resume_in_place) return TS_OK; /* made and locked later */
        if (errno == ENOENT)
            return ts_fail(TS_ERR_INVALID,
                           "--resume latest: run directory '%s': %s (name the run to continue "
                           "with --out or output.dir)",
                           dir, strerror(errno));
        return ts_fail(TS_ERR_IO, "run directory '%s': %s", dir, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode) && !S_ISLNK(st.st_mode))
        return ts_fail(TS_ERR_INVALID, "%srun directory '%s' exists and is not a directory",
                       s->resume_in_place ? "--resume latest: " : "", dir);
    ts_status r = ts_dir_open(&s->dir, dir, 0); /* a link is refused, naming it */
    return r != TS_OK ? r : lock_and_check(s, 0);
}

ts_status ts_sess_check_from_start(session *s) {
    char *text = NULL;
    ts_status st = ts_dir_read(&s->dir, "audit.log", (size_t)1 << 30, &text, NULL);
    if (st == TS_ERR_NOT_FOUND)
        return ts_fail(TS_ERR_INVALID,
                       "--resume latest: %s holds no checkpoint and no audit.log: it is not a "
                       "run tessel can continue (start a new one in an empty directory)",
                       s->dir.path);
    if (st != TS_OK) return st;
    /* A finished run without checkpoints is not one to continue. */
    char *sum = NULL;
    if (ts_dir_read(&s->dir, "summary.json", (size_t)1 << 20, &sum, NULL) == TS_OK) {
        json_t *o = json_loads(sum, 0, NULL);
        const char *status = json_string_value(json_object_get(o, "status"));
        int done = status && !strcmp(status, "completed");
        json_decref(o);
        free(sum);
        if (done) {
            free(text);
            return ts_fail(TS_ERR_INVALID,
                           "--resume latest: %s completed without saving a checkpoint "
                           "(ckpt.every): there is nothing to continue from",
                           s->dir.path);
        }
    }
    json_t *e = json_loadb(text, strcspn(text, "\n"), 0, NULL);
    free(text);
    const char *ev = json_string_value(json_object_get(e, "event"));
    const char *sha = json_string_value(json_object_get(e, "checkpoint_config_sha256"));
    if (!ev || strcmp(ev, "config") || !sha) {
        json_decref(e);
        return ts_fail(TS_ERR_FORMAT,
                       "--resume latest: %s/audit.log does not begin with the run's \"config\" "
                       "entry",
                       s->dir.path);
    }
    if (strcmp(sha, s->ident_sha))
        st = ts_fail(TS_ERR_INVALID,
                     "--resume latest: %s holds no checkpoint yet; its run started with config "
                     "sha256 %.16s..., this config's is %.16s...: only the keys a resume may "
                     "change may differ (docs/checkpoints.md)",
                     s->dir.path, sha, s->ident_sha);
    json_decref(e);
    return st;
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
 * run is retried), dist.procs, dist.zero, dist.bucket_mb, dist.share_params,
 * dist.prefetch, dist.max_mem_mb and dist.timeout_s (how the same step is
 * spread over processes), and the
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
        "max_restarts:", "procs:",        "zero:",     "timeout_s:",
        "bucket_mb:",    "share_params:", "prefetch:", "max_mem_mb:"};
    /* pipeline stages: how the same micro-batches are spread (pipe_train.h) */
    static const char *const pskip[] = {
        "pipeline_stages:", "pipeline_schedule:", "devices:", "microbatches:"};
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
        for (size_t i = 0; keep && in_dist && !top && i < sizeof pskip / sizeof *pskip; i++)
            if (!strncmp(line + 2, pskip[i], strlen(pskip[i]))) keep = 0;
        if (keep) fprintf(f, "%.*s\n", (int)len, line);
        line += len + (line[len] == '\n');
    }
    free(full);
    if (fclose(f) != 0) return ts_fail(TS_ERR_NOMEM, "out of memory for the config text");
    sha256_hex(s->ident, s->ident_bytes, s->ident_sha);
    return TS_OK;
}

/* mkdir -p of the directories above the run directory (the user chose
 * them); the run directory itself is made and opened by ts_dir_open. */
static ts_status make_parents(const char *dir) {
    char path[512];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return ts_fail(TS_ERR_INVALID, "run directory '%s': path too long", dir);
    char *last = strrchr(path, '/');
    while (last && last > path && last[1] == '\0') { /* trailing slashes */
        *last = '\0';
        last = strrchr(path, '/');
    }
    if (!last || last == path) return TS_OK;
    *last = '\0';
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

/* The run directory about to be written: made and opened without following
 * a link when it is new, locked with this run's PID recorded, and checked
 * again (another run may have made or used it since the first checks). */
static ts_status make_run_dir(session *s) {
    ts_status st = TS_OK;
    if (s->dir.fd < 0) {
        st = make_parents(s->r->run_dir);
        if (st == TS_OK) st = ts_dir_open(&s->dir, s->r->run_dir, TS_DIR_CREATE);
    }
    return st == TS_OK ? lock_and_check(s, TS_LOCK_CREATE) : st;
}

/* A JSON file of the run directory, replaced atomically (NAME.tmp, then
 * renamed) without following a link planted as either name. */
static ts_status write_json(const session *s, const char *name, json_t *obj) {
    if (!obj) return ts_fail(TS_ERR_NOMEM, "out of memory for %s", name);
    char *text = json_dumps(obj, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(obj);
    if (!text) return ts_fail(TS_ERR_NOMEM, "out of memory for %s/%s", s->dir.path, name);
    size_t n = strlen(text);
    char *line = realloc(text, n + 2);
    if (!line) {
        free(text);
        return ts_fail(TS_ERR_NOMEM, "out of memory for %s/%s", s->dir.path, name);
    }
    line[n] = '\n';
    line[n + 1] = '\0';
    ts_status st = ts_dir_replace(&s->dir, name, line, n + 1, 0644, 0);
    free(line);
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
    ts_status st = make_run_dir(s);
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
    st = ts_dir_replace(&s->dir, "config.yaml", text, text_bytes, 0644, 0);
    free(text);
    if (st != TS_OK) return st;

    /* The audit log: the config this run used, and where it resumed from. */
    if ((st = ts_audit_open(s->r->run_dir, ts_config_sign_key(&s->c), &s->audit)) != TS_OK)
        return st;
    /* A signing run that opens a log over entries nobody signed (a run
     * killed before it signed, or lines appended by hand) says so, in the
     * entry its own heads will sign: they never vouch for those silently. */
    const int64_t unsigned_n = ts_config_sign_key(&s->c) ? ts_audit_unsigned(s->audit) : 0;
    char fields[1024], extra[64] = "";
    if (unsigned_n > 0) {
        snprintf(extra, sizeof extra, ",\"unsigned_before\":%lld", (long long)unsigned_n);
        ts_progress_log(&s->pr,
                        "note: %s/audit.log ends in %lld entries no signed head covers (a run "
                        "killed before it signed, or entries appended by hand); this run's "
                        "\"config\" entry records that before its heads cover them",
                        s->dir.path, (long long)unsigned_n);
    }
    snprintf(fields, sizeof fields,
             "{\"file\":\"config.yaml\",\"sha256\":\"%s\",\"checkpoint_config_sha256\":\"%s\"%s}",
             config_sha, s->ident_sha, extra);
    if ((st = ts_audit_append(s->audit, "config", fields)) != TS_OK) return st;
    if (s->from_start) {
        st = ts_audit_append(s->audit, "resume", "{\"checkpoint\":null,\"step\":0}");
        if (st != TS_OK) return st;
    }
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

    /* lineage.json: now, or when the data's hashes are in (lineage.c). */
    s->lineage_deferred = 1;
    if ((st = ts_sess_lineage_settle(s, 0)) != TS_OK) return st;

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
    s->metrics = ts_dir_fopen(&s->dir, "metrics.jsonl", s->ck || s->from_start ? "a" : "w");
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
        /* PEFT on a base: the frozen weights are the base's (docs/peft.md) */
        co.base_path = s->peft_base_path[0] ? s->peft_base_path : NULL;
        co.base_sha256 = s->peft_base_sha;
        if ((st = ts_ckpt_saver_new(s->r->run_dir, s->plan, &co, &s->sv)) != TS_OK) return st;
        if ((st = ts_ckpt_saver_set_replay(s->sv, s->replay_json)) != TS_OK) return st;
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
                  (json_int_t)(s->model_params > 0 ? s->model_params
                               : s->plan           ? ts_sess_param_count(s->plan)
                                                   : 0),
                  "seed", (json_int_t)s->c.train.seed);
    if (!o) return ts_fail(TS_ERR_NOMEM, "out of memory for summary.json");
    /* the threads each process used (train.threads 0: chosen per host, docs/config.md) */
    if (s->threads_used > 0)
        json_object_set_new(o, "threads_per_process", json_integer(s->threads_used));
    if (isfinite(r->start_to_first_step)) { /* process start to the first step (docs/data.md) */
        json_object_set_new(o, "start_to_first_step_ms", json_real(1e3 * r->start_to_first_step));
        json_object_set_new(o, "first_step_ms", json_real(1e3 * r->first_step));
    }
    if (s->loader) /* time steps waited for their batch, summed (docs/data.md) */
        json_object_set_new(o, "data_wait_ms", json_real(1e3 * ts_loader_wait_seconds(s->loader)));
    if (s->c.batches_per_epoch)
        json_object_set_new(o, "epochs",
                            json_real((double)r->steps / (double)s->c.batches_per_epoch));
    if (s->plan && (s->c.peft.targets[0] || s->c.peft.adapter_after[0] || s->c.peft.base[0])) {
        double tr, all;
        ts_sess_peft_counts(s->plan, &tr, &all);
        json_object_set_new(o, "peft",
                            json_pack("{s:I, s:I, s:f}", "trainable", (json_int_t)tr, "total",
                                      (json_int_t)all, "trainable_percent",
                                      all > 0 ? 100.0 * tr / all : 0.0));
    }
    if (r->resumed_step) json_object_set_new(o, "resumed_from_step", json_integer(r->resumed_step));
    if (s->c.ckpt.every > 0) json_object_set_new(o, "checkpoints", json_integer(r->checkpoints));
    if (s->cache) json_object_set_new(o, "plan_cache", ts_sess_shape_summary(s));
    if (s->pipe) json_object_set_new(o, "pipeline", ts_sess_pipe_summary(s));
    if (r->has_val) json_object_set_new(o, "val", eval_json(&r->val));
    if (r->has_test) json_object_set_new(o, "test", eval_json(&r->test));
    if (error) json_object_set_new(o, "error", json_string(error));
    return write_json(s, "summary.json", o);
}

ts_status ts_sess_write_lineage(session *s) {
    json_t *files = lineage_json(s->test, lineage_json(s->all, json_array()));
    if (files && s->c.model.onnx[0] && s->c.model.onnx_sha256[0]) /* an imported model's file */
        json_array_append_new(files, json_pack("{s:s, s:s, s:s}", "path", s->c.model.onnx, "sha256",
                                               s->c.model.onnx_sha256, "role", "model"));
    json_t *lin = json_pack(
        "{s:s, s:o, s:{s:I, s:I, s:I}, s:f, s:b, s:I}", "source",
        ts_sess_source_names[s->c.data.source], "files", files, "examples", "train",
        (json_int_t)(s->train ? s->train->n : 0), "val", (json_int_t)(s->val ? s->val->n : 0),
        "test", (json_int_t)(s->test ? s->test->n : 0), "val_fraction", s->c.data.val_fraction,
        "shuffle", s->c.data.shuffle, "seed", (json_int_t)s->c.train.seed);
    return write_json(s, "lineage.json", lin);
}
