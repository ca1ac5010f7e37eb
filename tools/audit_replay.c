/* `tessel audit replay RUN_DIR [--from STEP] [--to STEP] [--procs N]
 * [--pubkey FILE] [--key FILE]`: an auditor's re-run of a recorded
 * training run (docs/reproducibility.md, "Replay").
 *
 * 1. The checkpoint of step TO (default: LATEST) is opened and verified
 *    (with --pubkey its signature too); its manifest's "replay" object
 *    holds the config text its config_sha256 is the hash of, the build and
 *    the batch layout.
 * 2. RUN_DIR/config.yaml must agree with that text on every key that
 *    changes what a step computes (a changed key is named), and every data
 *    file of the lineage must still have its recorded SHA-256 (a changed
 *    file is named).
 * 3. `tessel train RUN_DIR/config.yaml --steps TO --procs N --out TMP`,
 *    resumed from the checkpoint of step FROM when FROM > 0, runs in a
 *    child process; its checkpoint of step TO is compared tensor by tensor
 *    with the recorded one: the first tensor that differs is named with
 *    its largest difference.
 * 4. The report (JSON, sorted keys) is printed with an Ed25519 signature
 *    (--key, else the run's ckpt.sign_key) and appended to the run's
 *    audit.log as a "replay" entry.
 * Exit status: 0 identical, 3 different, 2 bad input (tampered data or
 * config, a missing checkpoint), 1 an internal failure. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "cli.h"
#include "replay_cli.h"
#include "tessel/ckpt.h"
#include "tessel/util.h"

typedef struct replay {
    const char *run, *pubkey, *key;
    long long from, to;
    int procs;
    char to_dir[1024], from_dir[1024], tmp[64];
    json_t *manifest, *rec; /* the step-TO manifest and its "replay" object */
} replay;

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&buf, &n);
    char chunk[8192];
    size_t k;
    while (m && (k = fread(chunk, 1, sizeof chunk, f)) > 0) fwrite(chunk, 1, k, m);
    fclose(f);
    if (!m || fclose(m) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* The value of `section.key` in a two-level YAML text as written by
 * tessel's config writer ("section:" lines, then "  key: value"); NULL
 * when absent. *len gets the value's length. */
static const char *yaml_value(const char *text, const char *path, size_t *len) {
    const char *dot = strchr(path, '.');
    if (!dot) return NULL;
    const size_t slen = (size_t)(dot - path);
    int in = 0;
    for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
        const size_t ll = strcspn(l, "\n");
        if (l[0] != ' ' && l[0] != '#') in = ll > slen && !strncmp(l, path, slen) && l[slen] == ':';
        const size_t kl = strlen(dot + 1);
        if (in && !strncmp(l, "  ", 2) && !strncmp(l + 2, dot + 1, kl) && l[2 + kl] == ':') {
            const char *v = l + 3 + kl;
            while (*v == ' ') v++;
            *len = ll - (size_t)(v - l);
            return v;
        }
    }
    return NULL;
}

/* Every "section.key" line of the recorded config must read the same in
 * config.yaml. */
static int check_config(replay *r) {
    const char *recorded = json_string_value(json_object_get(r->rec, "config"));
    const char *want_sha = json_string_value(json_object_get(r->manifest, "config_sha256"));
    if (!recorded || !want_sha)
        return cli_error(CLI_USAGE,
                         "%s: the manifest records no config (saved before replay "
                         "records existed?)",
                         r->to_dir);
    char sha[65];
    char path[1100];
    snprintf(path, sizeof path, "%s/config.yaml", r->run);
    char *now = slurp(path);
    if (!now) return cli_error(CLI_USAGE, "%s: %s", path, strerror(errno));
    char section[64] = "";
    int rc = CLI_OK;
    for (const char *l = recorded; *l && rc == CLI_OK;) {
        const size_t ll = strcspn(l, "\n");
        if (l[0] != ' ' && l[0] != '#' && ll < sizeof section) {
            snprintf(section, sizeof section, "%.*s", (int)strcspn(l, ":"), l);
        } else if (!strncmp(l, "  ", 2) && l[2] != ' ') {
            char key[160];
            const size_t kl = strcspn(l + 2, ":");
            snprintf(key, sizeof key, "%s.%.*s", section, (int)kl, l + 2);
            const char *v = l + 3 + kl;
            while (*v == ' ') v++;
            const size_t vl = ll - (size_t)(v - l);
            size_t nl = 0;
            const char *nv = yaml_value(now, key, &nl);
            if (!nv || nl != vl || strncmp(nv, v, vl))
                rc = cli_error(CLI_USAGE,
                               "%s: %s is %.*s, the run recorded %.*s (manifest of %s): replay "
                               "refused",
                               path, key, nv ? (int)nl : 9, nv ? nv : "(missing)", (int)vl, v,
                               r->to_dir);
        }
        l += ll + (l[ll] == '\n');
    }
    free(now);
    if (rc != CLI_OK) return rc;
    /* The recorded text is what the (verified) manifest's hash covers. */
    if (ts_sha256_bytes(recorded, strlen(recorded), sha) != TS_OK || strcmp(sha, want_sha))
        return cli_error(CLI_USAGE, "%s: the recorded config does not hash to config_sha256 %s",
                         r->to_dir, want_sha);
    return CLI_OK;
}

static int check_data(replay *r, json_t *files_out) {
    json_t *files = json_object_get(json_object_get(r->manifest, "data"), "files");
    size_t i;
    json_t *f;
    json_array_foreach(files, i, f) {
        const char *p = json_string_value(json_object_get(f, "path"));
        const char *want = json_string_value(json_object_get(f, "sha256"));
        char got[65];
        if (!p || !want)
            return cli_error(CLI_USAGE, "%s: a data file without path or sha256", r->to_dir);
        if (ts_sha256_file(p, got) != TS_OK)
            return cli_error(CLI_USAGE, "data file %s: %s: replay refused", p, ts_last_error());
        if (strcmp(got, want))
            return cli_error(CLI_USAGE,
                             "data file %s: SHA-256 %s, the run recorded %s: the data changed; "
                             "replay refused",
                             p, got, want);
        json_array_append_new(files_out, json_pack("{s:s, s:s}", "path", p, "sha256", got));
    }
    return CLI_OK;
}

/* Runs tessel train in a child; its output goes to TMP/train.log. */
static int run_training(replay *r) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return cli_error(CLI_FAIL, "audit replay: /proc/self/exe: %s", strerror(errno));
    self[n] = 0;
    char cfg[1100], steps[32], procs[16], out[128], log[128];
    snprintf(cfg, sizeof cfg, "%s/config.yaml", r->run);
    snprintf(steps, sizeof steps, "%lld", r->to);
    snprintf(procs, sizeof procs, "%d", r->procs);
    snprintf(out, sizeof out, "%s/run", r->tmp);
    snprintf(log, sizeof log, "%s/train.log", r->tmp);
    const char *argv[16] = {self, "train", cfg, "--steps", steps, "--procs", procs, "--out", out};
    int k = 9;
    if (r->from > 0) argv[k++] = "--resume", argv[k++] = r->from_dir;
    argv[k] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return cli_error(CLI_FAIL, "audit replay: fork: %s", strerror(errno));
    if (pid == 0) {
        if (!freopen(log, "w", stdout) || dup2(fileno(stdout), 2) < 0) _exit(126);
        execv(self, (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char *t = slurp(log);
        const char *tail = t ? t + (strlen(t) > 2000 ? strlen(t) - 2000 : 0) : "";
        int rc =
            cli_error(CLI_FAIL, "audit replay: the re-run failed (status %d):\n%s", status, tail);
        free(t);
        return rc;
    }
    return CLI_OK;
}

static double max_abs_diff(ts_dtype dt, const void *a, const void *b, size_t bytes) {
    double m = 0;
    for (size_t i = 0; i < bytes / ts_dtype_size(dt); i++) {
        double x = dt == TS_F64 ? ((const double *)a)[i] : ((const float *)a)[i];
        double y = dt == TS_F64 ? ((const double *)b)[i] : ((const float *)b)[i];
        double d = fabs(x - y);
        if (isnan(d) && !(isnan(x) && isnan(y))) return NAN;
        if (d > m) m = d;
    }
    return m;
}

/* Recorded (a) against replayed (b): report gets "tensors", "identical"
 * and, when one differs, "first_difference". */
static int compare(replay *r, json_t *report) {
    char got[160];
    snprintf(got, sizeof got, "%s/run/step-%08lld", r->tmp, r->to);
    ts_ckpt *a = NULL, *b = NULL;
    ts_status s = ts_ckpt_open(r->to_dir, r->pubkey, NULL, &a);
    if (s == TS_OK) s = ts_ckpt_open(got, NULL, NULL, &b);
    if (s != TS_OK) {
        ts_ckpt_close(a);
        return cli_error(CLI_FAIL, "audit replay: %s", ts_last_error());
    }
    int same = 0, differ = 0;
    json_t *first = NULL;
    for (int i = 0; i < ts_ckpt_tensor_count(a) && s == TS_OK; i++) {
        ts_ckpt_tensor ta;
        ts_ckpt_tensor_info(a, i, &ta);
        void *da = malloc(ta.bytes ? ta.bytes : 1), *db = malloc(ta.bytes ? ta.bytes : 1);
        if (!da || !db) s = ts_fail(TS_ERR_NOMEM, "out of memory for tensor %s", ta.name);
        if (s == TS_OK) s = ts_ckpt_read(a, ta.name, da, ta.bytes);
        if (s == TS_OK && ts_ckpt_read(b, ta.name, db, ta.bytes) != TS_OK) {
            differ++;
            if (!first) first = json_pack("{s:s, s:s}", "tensor", ta.name, "why", "missing");
        } else if (s == TS_OK && memcmp(da, db, ta.bytes)) {
            differ++;
            if (!first) {
                double d = ta.dtype == TS_F32 || ta.dtype == TS_F64
                               ? max_abs_diff(ta.dtype, da, db, ta.bytes)
                               : NAN;
                first =
                    json_pack("{s:s, s:f}", "tensor", ta.name, "max_abs_diff", isnan(d) ? -1.0 : d);
            }
        } else if (s == TS_OK) {
            same++;
        }
        free(da);
        free(db);
    }
    ts_ckpt_close(a);
    ts_ckpt_close(b);
    if (s != TS_OK) {
        json_decref(first);
        return cli_error(CLI_FAIL, "audit replay: %s", ts_last_error());
    }
    json_object_set_new(report, "tensors", json_integer(same + differ));
    json_object_set_new(report, "tensors_identical", json_integer(same));
    json_object_set_new(report, "verdict", json_string(differ ? "different" : "identical"));
    if (first) json_object_set_new(report, "first_difference", first);
    return CLI_OK;
}

/* The run's signing key: ckpt.sign_key of config.yaml (NULL: none). */
static char *run_sign_key(replay *r) {
    char path[1100];
    snprintf(path, sizeof path, "%s/config.yaml", r->run);
    char *t = slurp(path);
    size_t n = 0;
    const char *v = t ? yaml_value(t, "ckpt.sign_key", &n) : NULL;
    char *key = NULL;
    if (v && n > 0 && strncmp(v, "\"\"", 2) && strncmp(v, "''", 2)) {
        if (*v == '"' && n >= 2) v++, n -= 2;
        key = strndup(v, n);
    }
    free(t);
    return key;
}

static void remove_tree(const char *dir) {
    char cmd[256];
    if (strncmp(dir, "/tmp/tessel-replay-", 19)) return;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "tessel: warning: could not remove %s\n", dir);
}

static int replay_run(replay *r) {
    /* 1. the checkpoints */
    char path[1100];
    if (r->to < 0) {
        snprintf(path, sizeof path, "%s/LATEST", r->run);
        char *l = slurp(path);
        if (!l) return cli_error(CLI_USAGE, "%s: %s (give --to STEP)", path, strerror(errno));
        l[strcspn(l, "\n")] = 0;
        r->to = strncmp(l, "step-", 5) ? -1 : atoll(l + 5);
        free(l);
        if (r->to <= 0) return cli_error(CLI_USAGE, "%s: not a step directory", path);
    }
    if (r->from < 0 || r->from >= r->to)
        return cli_error(CLI_USAGE, "audit replay: --from %lld must be in [0, %lld)", r->from,
                         r->to);
    snprintf(r->to_dir, sizeof r->to_dir, "%s/step-%08lld", r->run, r->to);
    snprintf(r->from_dir, sizeof r->from_dir, "%s/step-%08lld", r->run, r->from);
    ts_ckpt *ck = NULL;
    if (ts_ckpt_open(r->to_dir, r->pubkey, NULL, &ck) != TS_OK)
        return cli_error(CLI_USAGE, "%s", ts_last_error());
    ts_ckpt_close(ck);
    if (r->from > 0) {
        if (ts_ckpt_open(r->from_dir, r->pubkey, NULL, &ck) != TS_OK)
            return cli_error(CLI_USAGE, "%s", ts_last_error());
        ts_ckpt_close(ck);
    }
    snprintf(path, sizeof path, "%s/manifest.json", r->to_dir);
    r->manifest = json_load_file(path, 0, NULL);
    r->rec = json_object_get(r->manifest, "replay");
    if (!r->rec) return cli_error(CLI_USAGE, "%s: no \"replay\" record", path);
    /* 2. config and data */
    json_t *report = json_object(), *files = json_array();
    int rc = check_config(r);
    if (rc == CLI_OK) rc = check_data(r, files);
    char build[65] = "unknown";
    if (ts_sha256_file("/proc/self/exe", build) != TS_OK) snprintf(build, sizeof build, "unknown");
    const char *rb = json_string_value(json_object_get(r->rec, "build_sha256"));
    json_object_set_new(report, "run", json_string(r->run));
    json_object_set_new(report, "from", json_integer(r->from));
    json_object_set_new(report, "to", json_integer(r->to));
    json_object_set_new(report, "processes", json_integer(r->procs));
    json_object_set_new(report, "recorded", json_deep_copy(r->rec));
    json_object_del(json_object_get(report, "recorded"), "config");
    json_object_set_new(report, "tessel_version", json_string(TESSEL_VERSION));
    json_object_set_new(report, "build_sha256", json_string(build));
    json_object_set_new(report, "same_build", json_boolean(rb && !strcmp(rb, build)));
    char cpu[160];
    ts_cpu_kernel_path(cpu, sizeof cpu);
    const char *rcpu = json_string_value(json_object_get(r->rec, "cpu_path"));
    json_object_set_new(report, "cpu_path", json_string(cpu));
    json_object_set_new(report, "same_cpu_path", json_boolean(rcpu && !strcmp(rcpu, cpu)));
    if (!rcpu || strcmp(rcpu, cpu))
        fprintf(stderr,
                "note: the run's kernels were %s, here %s: other kernels may change the bits\n",
                rcpu ? rcpu : "(not recorded)", cpu);
    if (!rb || strcmp(rb, build))
        fprintf(stderr, "note: another build of tessel than the run's (%.12s, here %.12s)\n",
                rb ? rb : "(not recorded)", build);
    json_object_set_new(report, "config_sha256",
                        json_copy(json_object_get(r->manifest, "config_sha256")));
    json_object_set_new(
        report, "checkpoint",
        json_pack("{s:s, s:O}", "dir", r->to_dir, "id", json_object_get(r->manifest, "id")));
    json_object_set_new(report, "data", files);
    /* 3. the re-run */
    snprintf(r->tmp, sizeof r->tmp, "/tmp/tessel-replay-XXXXXX");
    if (rc == CLI_OK && !mkdtemp(r->tmp))
        rc = cli_error(CLI_FAIL, "audit replay: mkdtemp: %s", strerror(errno));
    if (rc == CLI_OK) {
        fprintf(stderr, "replaying steps %lld..%lld of %s on %d process%s\n", r->from + 1, r->to,
                r->run, r->procs, r->procs > 1 ? "es" : "");
        rc = run_training(r);
        if (rc == CLI_OK) rc = compare(r, report);
        remove_tree(r->tmp);
    }
    if (rc != CLI_OK) {
        json_decref(report);
        return rc;
    }
    /* 4. sign, print, log */
    char *key = r->key ? strdup(r->key) : run_sign_key(r);
    char *body = json_dumps(report, JSON_COMPACT | JSON_SORT_KEYS);
    char sig[129] = "", pub[73] = "";
    if (body && key && ts_ckpt_sign_text(key, body, strlen(body), sig, pub) != TS_OK)
        rc = cli_error(CLI_USAGE, "audit replay: signing: %s", ts_last_error());
    json_t *signed_report =
        json_pack("{s:o, s:o}", "report", report, "signature",
                  key && rc == CLI_OK ? json_pack("{s:s, s:s, s:s}", "algorithm", "ed25519",
                                                  "public_key", pub, "value", sig)
                                      : json_null());
    char *out = signed_report ? json_dumps(signed_report, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    char *line = signed_report ? json_dumps(signed_report, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    if (rc == CLI_OK && (!out || !line)) rc = cli_error(CLI_FAIL, "audit replay: out of memory");
    if (rc == CLI_OK) {
        printf("%s\n", out);
        ts_audit *a = NULL;
        ts_status s = ts_audit_open(r->run, key, &a);
        if (s == TS_OK) s = ts_audit_append(a, "replay", line);
        if (a && ts_audit_close(a) != TS_OK && s == TS_OK) s = TS_ERR_IO;
        if (s != TS_OK) rc = cli_error(CLI_FAIL, "audit replay: audit.log: %s", ts_last_error());
    }
    const int differ = rc == CLI_OK && json_object_get(report, "first_difference");
    if (differ) {
        json_t *fd = json_object_get(report, "first_difference");
        fprintf(stderr,
                "replay: DIFFERENT: the first tensor that differs is %s (max |recorded - replayed| "
                "%g)\n",
                json_string_value(json_object_get(fd, "tensor")),
                json_real_value(json_object_get(fd, "max_abs_diff")));
    } else if (rc == CLI_OK) {
        fprintf(stderr, "replay: IDENTICAL: %lld tensors of step %lld bit for bit\n",
                (long long)json_integer_value(json_object_get(report, "tensors")), r->to);
    }
    free(body);
    free(out);
    free(line);
    free(key);
    json_decref(signed_report);
    return rc != CLI_OK ? rc : differ ? 3 : CLI_OK;
}

int tessel_cmd_audit_replay(int argc, char **argv) {
    replay r = {.from = 0, .to = -1, .procs = 1};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const int has = i + 1 < argc;
        if (!strcmp(a, "--from") && has)
            r.from = atoll(argv[++i]);
        else if (!strcmp(a, "--to") && has)
            r.to = atoll(argv[++i]);
        else if (!strcmp(a, "--procs") && has)
            r.procs = atoi(argv[++i]);
        else if (!strcmp(a, "--pubkey") && has)
            r.pubkey = argv[++i];
        else if (!strcmp(a, "--key") && has)
            r.key = argv[++i];
        else if (a[0] == '-')
            return cli_error(CLI_USAGE, "audit replay: unknown option '%s'", a);
        else if (r.run)
            return cli_error(CLI_USAGE, "audit replay: one run directory, got '%s' and '%s'", r.run,
                             a);
        else
            r.run = a;
    }
    if (!r.run)
        return cli_error(CLI_USAGE, "usage: tessel audit replay RUN_DIR [--from STEP] "
                                    "[--to STEP] [--procs N] [--pubkey FILE] [--key FILE]");
    if (r.procs < 1 || r.procs > 1024)
        return cli_error(CLI_USAGE, "audit replay: --procs %d: must be in [1, 1024]", r.procs);
    int rc = replay_run(&r);
    json_decref(r.manifest);
    return rc;
}
