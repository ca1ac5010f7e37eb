/* Rollback checks: is a checkpoint where it was saved? A signed manifest
 * binds its step, its directory name ("dir") and its run ("run": the hash
 * of the audit log's first line), and the audit log records every save
 * with the manifest's SHA-256. Together they show
 *   - a step-N directory renamed to a newer name (the name and "dir" or
 *     "step" disagree),
 *   - an old checkpoint copied in under the newest name (the log's save
 *     into that name recorded another manifest),
 *   - LATEST pointed at an older checkpoint (the log's newest save is
 *     another directory),
 *   - a checkpoint of another run copied in ("run" differs),
 *   - a committed checkpoint missing from the log (entries cut from the end):
 *     its "commit" entry is logged before the rename, so the log holds every
 *     committed checkpoint (docs/checkpoints.md, "What the audit log proves").
 * Used by ts_ckpt_open (resume, export, ckpt verify) and ts_audit_verify. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt_internal.h"
#include "core/fsat.h"

#define LOG_MAX ((size_t)1 << 30)

void ck_log_view_free(ck_log_view *v) {
    if (!v) return;
    free(v->saves);
    free(v->commits);
    free(v->ids);
    memset(v, 0, sizeof *v);
}

ts_status ck_log_view_read(const ts_dir *run, ck_log_view *v) {
    memset(v, 0, sizeof *v);
    v->last_head = -1;
    char *text = NULL;
    size_t len = 0;
    ts_status s = ts_dir_read(run, "audit.log", LOG_MAX, &text, &len);
    if (s != TS_OK) return s;
    int cap = 0, capi = 0, capc = 0;
    for (const char *p = text, *end = text + len; p < end && s == TS_OK; v->n++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        char h[CK_SHA_HEX];
        if ((s = ts_sha256_mem(p, n, h)) != TS_OK) break;
        if (v->n == 0) memcpy(v->genesis, h, CK_SHA_HEX);
        memcpy(v->last, h, CK_SHA_HEX);
        json_t *e = json_loadb(p, n, 0, NULL);
        const char *ev = json_string_value(json_object_get(e, "event"));
        const char *dir = json_string_value(json_object_get(e, "dir"));
        const char *sha = json_string_value(json_object_get(e, "manifest_sha256"));
        if (ev && !strcmp(ev, "head") && json_object_get(e, "sig")) v->last_head = v->n;
        const int is_save = ev && !strcmp(ev, "save"), is_commit = ev && !strcmp(ev, "commit");
        if ((is_save || is_commit) && dir && strlen(dir) < sizeof v->saves->dir && sha &&
            strlen(sha) == CK_SHA_HEX - 1) {
            s = is_save ? ts_grow((void **)&v->saves, &cap, v->nsaves + 1, sizeof *v->saves,
                                  "audit saves")
                        : ts_grow((void **)&v->commits, &capc, v->ncommits + 1, sizeof *v->commits,
                                  "audit commits");
            if (s == TS_OK) {
                ck_save_rec *r = is_save ? &v->saves[v->nsaves++] : &v->commits[v->ncommits++];
                snprintf(r->dir, sizeof r->dir, "%s", dir);
                snprintf(r->sha, sizeof r->sha, "%s", sha);
                r->line = v->n;
            }
        }
        const char *id = json_string_value(json_object_get(e, "id"));
        if (s == TS_OK && ev && id && strlen(id) == 32 &&
            (!strcmp(ev, "load") || !strcmp(ev, "verify") || !strcmp(ev, "resume"))) {
            s = ts_grow((void **)&v->ids, &capi, v->nids + 1, sizeof *v->ids, "audit ids");
            if (s == TS_OK) memcpy(v->ids[v->nids++], id, 33);
        }
        json_decref(e);
        p = nl ? nl + 1 : end;
    }
    free(text);
    if (s != TS_OK) ck_log_view_free(v);
    return s;
}

/* The step of a name "step-N" or "step-N-TAG"; -1 otherwise. */
static int64_t name_step(const char *name) {
    char buf[64];
    if (strncmp(name, "step-", 5) || strlen(name) >= sizeof buf) return -1;
    snprintf(buf, sizeof buf, "%s", name);
    char *dash = strchr(buf + 5, '-');
    if (dash) *dash = '\0';
    return ck_parse_step_name(buf);
}

ts_status ck_check_placement(const ck_log_view *v, const char *run_path, const char *name,
                             const char *text, json_t *m, int latest) {
    const int64_t nstep = name_step(name);
    if (nstep < 0) return TS_OK; /* not a checkpoint name of a run directory: a copy elsewhere */
    const char *saved_as = json_string_value(json_object_get(m, "dir"));
    json_t *stepv = json_object_get(m, "step");
    if (saved_as && strcmp(saved_as, name))
        return ts_fail(TS_ERR_FORMAT,
                       "%s/%s: its signed manifest was saved as '%s': the checkpoint was renamed "
                       "or copied in under another name (rollback?)",
                       run_path, name, saved_as);
    if (json_is_integer(stepv) && json_integer_value(stepv) != nstep)
        return ts_fail(TS_ERR_FORMAT,
                       "%s/%s: holds the checkpoint of step %lld: renamed or copied in under "
                       "another name (rollback?)",
                       run_path, name, (long long)json_integer_value(stepv));
    if (!v) return TS_OK;
    const char *run_id = json_string_value(json_object_get(m, "run"));
    if (run_id && *run_id && strcmp(run_id, v->genesis))
        return ts_fail(TS_ERR_FORMAT,
                       "%s/%s: saved by another run (its manifest's \"run\" %.16s... is not this "
                       "run directory's audit log, %.16s...): copied in from elsewhere",
                       run_path, name, run_id, v->genesis);
    json_t *ah = json_object_get(m, "audit_head");
    if (!ah) return TS_OK; /* saved without a log: nothing recorded it */
    char sha[CK_SHA_HEX];
    ts_status s = ts_sha256_mem(text, strlen(text), sha);
    if (s != TS_OK) return s;
    const ck_save_rec *mine = NULL, *newest = NULL, *later = NULL;
    const json_t *seqv = json_object_get(ah, "seq");
    const int64_t head = json_is_integer(seqv) ? json_integer_value(seqv) : -1;
    for (int i = 0; i < v->nsaves; i++) {
        const ck_save_rec *r = &v->saves[i];
        if (!strcmp(r->dir, name)) mine = r;
        if (ck_parse_step_name(r->dir) >= 0) newest = r;
        if (r->line > head && ck_parse_step_name(r->dir) >= 0) later = r;
    }
    /* Saved into this name again after its last "save" entry (a resume
     * from an older checkpoint) and not logged yet. */
    if (mine && mine->line <= head) mine = NULL;
    if (!mine && json_is_true(json_object_get(m, "audit_commit"))) {
        /* Its "commit" entry was logged before the rename: a kill between
         * the commit and the "save" entry leaves that entry, and nothing
         * else explains a committed checkpoint the log lacks. */
        for (int i = 0; i < v->ncommits; i++)
            if (!strcmp(v->commits[i].dir, name) && v->commits[i].line > head &&
                !strcmp(v->commits[i].sha, sha))
                return TS_OK;
        return ts_fail(TS_ERR_FORMAT,
                       "%s/%s: committed, but audit.log records neither its commit nor its save "
                       "after entry %lld, where its manifest says the log stood: entries were "
                       "removed from the end of the log, or the checkpoint was copied in",
                       run_path, name, (long long)head + 1);
    }
    if (!mine) {
        /* A manifest from before "commit" entries. The process died
         * between the commit and the "save" entry: then
         * no save was logged after the log head its manifest records
         * (ts_audit_verify checks that line is intact). Any later save
         * means this one's entry was removed, or it was copied in. */
        if (!later) return TS_OK;
        /* ... and a later run that resumed from it recorded its id. */
        const char *id = json_string_value(json_object_get(m, "id"));
        for (int i = 0; id && i < v->nids; i++)
            if (!strcmp(v->ids[i], id)) return TS_OK;
        return ts_fail(TS_ERR_FORMAT,
                       "%s/%s: committed, but audit.log records no save of it although it "
                       "records a later one (%s, line %lld): entries were removed from the log, "
                       "or the checkpoint was copied in",
                       run_path, name, later->dir, (long long)later->line + 1);
    }
    if (strcmp(mine->sha, sha))
        return ts_fail(TS_ERR_FORMAT,
                       "%s/%s: its manifest is not the one audit.log recorded at its save (line "
                       "%lld, manifest %.16s..., here %.16s...): another checkpoint was copied in "
                       "under this name (rollback?)",
                       run_path, name, (long long)mine->line + 1, mine->sha, sha);
    if (latest && newest && newest != mine)
        return ts_fail(TS_ERR_FORMAT,
                       "%s/LATEST names %s, but the newest save audit.log records is %s (line "
                       "%lld): LATEST was pointed at an older checkpoint (rollback?)",
                       run_path, name, newest->dir, (long long)newest->line + 1);
    return TS_OK;
}
