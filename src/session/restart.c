/* --max-restarts: the launcher's side of a restart. See restart.h. */
#include "session/restart.h"
#include <errno.h>
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/core.h"
#include "tessel/ckpt.h"

ts_status ts_restart_check(const ts_config *c, int procs) {
    const int k = c->dist.max_restarts;
    if (k <= 0) return TS_OK;
    if (procs <= 1)
        return ts_fail(TS_ERR_INVALID,
                       "--max-restarts %d (dist.max_restarts) restarts the workers of --procs N; "
                       "this run has one process",
                       k);
    if (c->ckpt.every <= 0)
        return ts_fail(TS_ERR_INVALID,
                       "--max-restarts %d (dist.max_restarts) resumes from the latest checkpoint, "
                       "and this run saves none: set ckpt.every (e.g. --set ckpt.every=100)",
                       k);
    return TS_OK;
}

int ts_restart_failed_rank(const int *codes, int n) {
    for (int r = 0; r < n; r++)
        if (codes[r] >= 128) return r;
    for (int r = 0; r < n; r++)
        if (codes[r] != 0) return r;
    return -1;
}

void ts_restart_describe(int code, char *buf, size_t n) {
    if (code >= 128)
        snprintf(buf, n, "killed by signal %d", code - 128);
    else
        snprintf(buf, n, "exit status %d", code);
}

/* A "restart" entry in run_dir/audit.log when the run has one. */
static ts_status audit_restart(const ts_config *c, const char *run_dir, int attempt, int max,
                               const char *from, int rank, const char *how) {
    char path[1024];
    if ((size_t)snprintf(path, sizeof path, "%s/audit.log", run_dir) >= sizeof path)
        return ts_fail(TS_ERR_INVALID, "run directory '%.60s...': path too long", run_dir);
    if (access(path, F_OK) != 0) return TS_OK;
    ts_audit *a = NULL;
    ts_status s = ts_audit_open(run_dir, ts_config_sign_key(c), &a);
    if (s != TS_OK) {
        ts_error_prefix("restart %d/%d: %s", attempt, max, path);
        return s;
    }
    json_t *o = json_pack("{s:i, s:i, s:s?, s:i, s:s}", "restart", attempt, "max_restarts", max,
                          "checkpoint", from, "rank", rank, "failure", how);
    /* The failed attempt's last entries may be unsigned: this entry's head
     * covers them, and says so (as a run's "config" entry does). */
    const int64_t unsigned_n = ts_config_sign_key(c) ? ts_audit_unsigned(a) : 0;
    if (o && unsigned_n > 0) json_object_set_new(o, "unsigned_before", json_integer(unsigned_n));
    char *txt = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(o);
    if (!txt) s = ts_fail(TS_ERR_NOMEM, "out of memory for the audit log");
    if (s == TS_OK) s = ts_audit_append(a, "restart", txt);
    if (a) {
        ts_status cs = ts_audit_close(a);
        if (s == TS_OK) s = cs;
    }
    free(txt);
    if (s != TS_OK) ts_error_prefix("restart %d/%d: %s", attempt, max, path);
    return s;
}

ts_status ts_restart_prepare(const ts_config *c, const char *run_dir, const char *orig_resume,
                             int attempt, int max, int rank, const char *how, FILE *log,
                             const char **resume) {
    if (!log) log = stdout;
    char ck[1024];
    const int have_ckpt = ts_ckpt_resolve(run_dir, ck, sizeof ck) == TS_OK;
    const char *name = NULL;
    if (have_ckpt) {
        name = strrchr(ck, '/');
        name = name ? name + 1 : ck;
    }
    ts_status s = audit_restart(c, run_dir, attempt, max, name, rank, how);
    if (s != TS_OK) return s;
    char who[32] = ""; /* tessel launch may not know the rank (ts_launch_job) */
    if (rank >= 0) snprintf(who, sizeof who, "rank %d ", rank);
    if (have_ckpt) {
        fprintf(log, "restart %d/%d from %s after %s%s\n", attempt, max, name, who, how);
        fflush(log);
        *resume = "latest";
        return TS_OK;
    }
    /* No checkpoint yet: start over as the first attempt did, in a new
     * run directory (a run refuses a used one); keep the failed one. */
    *resume = orig_resume;
    char moved[1024] = "";
    struct stat st;
    if (stat(run_dir, &st) == 0) {
        if ((size_t)snprintf(moved, sizeof moved, "%s.attempt-%d", run_dir, attempt) >=
            sizeof moved)
            return ts_fail(TS_ERR_INVALID, "run directory '%.60s...': path too long", run_dir);
        if (rename(run_dir, moved) != 0)
            return ts_fail(TS_ERR_IO,
                           "restart %d/%d: no checkpoint to resume from, and the failed "
                           "attempt's run directory '%s' cannot be moved to '%s': %s",
                           attempt, max, run_dir, moved, strerror(errno));
    }
    fprintf(log, "restart %d/%d from %s after %s%s (no checkpoint yet%s%s)\n", attempt, max,
            orig_resume && *orig_resume ? orig_resume : "the start", who, how,
            moved[0] ? "; the failed attempt's run directory is now " : "", moved);
    fflush(log);
    return TS_OK;
}
