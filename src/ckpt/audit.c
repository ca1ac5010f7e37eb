/* The audit log: RUN_DIR/audit.log, one compact JSON object per line with
 * sorted keys:
 *
 *     {"event":"save","prev":"<sha256 of the previous line>","seq":7,"time":"...",...}
 *
 * "prev" chains every entry to the one before (64 zeros for the first), so
 * editing, deleting or reordering a line breaks the chain at the next line
 * and "seq" names the gap. The chain alone cannot show lines cut off the
 * end, nor an edit of the very last line, so two anchors cover the tail: a
 * "head" entry signed with the run's Ed25519 key (after every save and
 * every HEAD_EVERY entries), and the log head each checkpoint's manifest
 * records when it is saved (its signature protects that record).
 *
 * Each entry is written with one write() on an O_APPEND descriptor and
 * fsync'ed: a killed process leaves whole lines only. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "ckpt_internal.h"
#include "core/dirlock.h"
#include "core/fsat.h"

#define HEAD_EVERY      16
#define AUDIT_MAX_BYTES ((size_t)1 << 30)

static const char ZERO_HASH[] = "0000000000000000000000000000000000000000000000000000000000000000";

struct ts_audit {
    pthread_mutex_t mu;
    char *path;
    int fd;
    int64_t seq; /* of the last entry; -1 when empty */
    char head[CK_SHA_HEX];
    char genesis[CK_SHA_HEX]; /* hash of line 0: the run's identity ("" while empty) */
    ck_key key;
    int since_head; /* entries since the last signed head */
};

/* What a scan of the log found. hashes[i] is the SHA-256 of line i. */
typedef struct scan {
    int64_t n;
    char (*hashes)[CK_SHA_HEX];
    int64_t signed_heads, last_signed;
} scan;

static const char *const RESERVED[] = {"event", "prev", "seq", "time", "sig", "signer"};

/* Check the chain of `text` (the whole log). With pk, head signatures are
 * checked too. The first break is reported by line number. */
static ts_status scan_log(const char *path, const char *text, size_t len, const ck_key *pk,
                          scan *out) {
    memset(out, 0, sizeof *out);
    out->last_signed = -1;
    if (len > 0 && text[len - 1] != '\n')
        return ts_fail(TS_ERR_FORMAT,
                       "%s: the last line is not terminated: it was cut short or appended to by "
                       "hand",
                       path);
    int64_t lines = 0;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    out->hashes = ts_alloc(sizeof *out->hashes * (size_t)(lines + 1), "audit hashes");
    if (!out->hashes) return TS_ERR_NOMEM;
    const char *p = text, *end = text + len;
    ts_status s = TS_OK;
    for (int64_t ln = 0; p < end && s == TS_OK; ln++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = (size_t)(nl - p);
        long lno = (long)ln + 1;
        if ((s = ts_sha256_mem(p, n, out->hashes[ln])) != TS_OK) break;
        json_error_t je;
        json_t *e = json_loadb(p, n, 0, &je);
        const char *prev = json_string_value(json_object_get(e, "prev"));
        json_t *seqv = json_object_get(e, "seq");
        const char *event = json_string_value(json_object_get(e, "event"));
        const char *expect_prev = ln == 0 ? ZERO_HASH : out->hashes[ln - 1];
        if (!json_is_object(e))
            s = ts_fail(TS_ERR_FORMAT, "%s: line %ld is not a JSON object (%s): it was edited",
                        path, lno, e ? "not an object" : je.text);
        else if (!prev || !json_is_integer(seqv) || !event)
            s = ts_fail(TS_ERR_FORMAT,
                        "%s: line %ld lacks its \"prev\", \"seq\" or \"event\" field: it was "
                        "edited",
                        path, lno);
        else if (json_integer_value(seqv) != ln)
            s = ts_fail(TS_ERR_FORMAT,
                        "%s: line %ld holds entry %lld where entry %ld belongs: entries were "
                        "deleted, inserted or reordered",
                        path, lno, (long long)json_integer_value(seqv), (long)ln);
        else if (strcmp(prev, expect_prev) != 0)
            s = ts_fail(TS_ERR_FORMAT,
                        "%s: line %ld: \"prev\" is not the SHA-256 of line %ld: line %ld was "
                        "edited",
                        path, lno, lno - 1, lno - 1);
        else if (!strcmp(event, "head")) {
            const char *sig = json_string_value(json_object_get(e, "sig"));
            const char *signer = json_string_value(json_object_get(e, "signer"));
            if (!sig || !signer) {
                s = ts_fail(TS_ERR_FORMAT, "%s: line %ld: a head entry without \"sig\"/\"signer\"",
                            path, lno);
            } else if (pk) {
                char want[2 * CK_PK_BYTES + 1];
                ts_hex(pk->pk, CK_PK_BYTES, want);
                char *canon = ck_canonical(e, "sig");
                if (!canon)
                    s = ts_fail(TS_ERR_NOMEM, "%s: out of memory", path);
                else if (strcmp(signer, want) != 0)
                    s = ts_fail(TS_ERR_FORMAT,
                                "%s: line %ld: head signed by key %.16s..., not by the given "
                                "public key %.16s...",
                                path, lno, signer, want);
                else if (!ck_verify(pk->pk, canon, strlen(canon), sig))
                    s = ts_fail(TS_ERR_FORMAT,
                                "%s: line %ld: the head signature does not verify: the line "
                                "was edited",
                                path, lno);
                free(canon);
            }
            if (s == TS_OK) {
                out->signed_heads++;
                out->last_signed = ln;
            }
        }
        json_decref(e);
        out->n = ln + 1;
        p = nl + 1;
    }
    if (s != TS_OK) {
        free(out->hashes);
        out->hashes = NULL;
    }
    return s;
}

static void audit_free(ts_audit *a) {
    if (!a) return;
    if (a->fd >= 0) close(a->fd);
    ck_key_wipe(&a->key);
    pthread_mutex_destroy(&a->mu);
    free(a->path);
    free(a);
}

ts_status ts_audit_open(const char *run_dir, const char *private_key, ts_audit **out) {
    if (!run_dir || !out) return ts_fail(TS_ERR_INVALID, "audit_open: NULL argument");
    *out = NULL;
    /* audit.log is reached without following links (core/fsat.h). */
    ts_dir run;
    ts_status s = ts_dir_open(&run, run_dir, 1);
    if (s != TS_OK) return s;
    ts_audit *a = ts_zalloc(sizeof *a, "audit log");
    if (!a) {
        ts_dir_close(&run);
        return TS_ERR_NOMEM;
    }
    a->fd = -1;
    pthread_mutex_init(&a->mu, NULL);
    if (!(a->path = ck_join(run_dir, "audit.log"))) s = TS_ERR_NOMEM;
    if (s == TS_OK && private_key) s = ck_key_load_secret(private_key, &a->key);
    char *text = NULL;
    size_t len = 0;
    if (s == TS_OK) {
        s = ts_dir_read(&run, "audit.log", AUDIT_MAX_BYTES, &text, &len);
        if (s == TS_ERR_NOT_FOUND) s = TS_OK, len = 0;
    }
    scan sc = {0};
    if (s == TS_OK) s = scan_log(a->path, text ? text : "", len, NULL, &sc);
    if (s == TS_OK) {
        a->seq = sc.n - 1;
        memcpy(a->head, sc.n ? sc.hashes[sc.n - 1] : ZERO_HASH, CK_SHA_HEX);
        if (sc.n) memcpy(a->genesis, sc.hashes[0], CK_SHA_HEX);
        a->since_head = (int)(sc.n - 1 - sc.last_signed);
        s = ts_dir_openf(&run, "audit.log", TS_AT_APPEND, 0644, &a->fd);
    }
    if (s == TS_OK && len == 0) s = ts_dir_sync(&run); /* the new file's name */
    ts_dir_close(&run);
    free(sc.hashes);
    free(text);
    if (s != TS_OK) {
        ts_error_prefix("audit log");
        audit_free(a);
        return s;
    }
    *out = a;
    return TS_OK;
}

/* Write one entry; the caller holds the lock. `e` is borrowed. */
static ts_status append_locked(ts_audit *a, const char *event, json_t *e, int sign) {
    char t[32];
    ck_utc_now(t);
    int bad = json_object_set_new(e, "event", json_string(event));
    bad |= json_object_set_new(e, "prev", json_string(a->head));
    bad |= json_object_set_new(e, "seq", json_integer(a->seq + 1));
    bad |= json_object_set_new(e, "time", json_string(t));
    if (sign && !bad) {
        char pk[2 * CK_PK_BYTES + 1], sig[2 * CK_SIG_BYTES + 1];
        ts_hex(a->key.pk, CK_PK_BYTES, pk);
        bad |= json_object_set_new(e, "signer", json_string(pk));
        char *canon = bad ? NULL : ck_canonical(e, NULL);
        if (!canon) return ts_fail(TS_ERR_NOMEM, "%s: out of memory", a->path);
        ck_sign(&a->key, canon, strlen(canon), sig);
        free(canon);
        bad |= json_object_set_new(e, "sig", json_string(sig));
    }
    char *line = bad ? NULL : ck_canonical(e, NULL);
    if (!line)
        return ts_fail(TS_ERR_INVALID, "%s: entry \"%s\" cannot be encoded (invalid UTF-8?)",
                       a->path, event);
    size_t n = strlen(line);
    char hash[CK_SHA_HEX];
    ts_status s = ts_sha256_mem(line, n, hash);
    line[n] = '\n'; /* json_dumps' buffer has room: the NUL is replaced and not needed */
    if (s == TS_OK) {
        ssize_t w = write(a->fd, line, n + 1);
        if (w != (ssize_t)(n + 1))
            s = ts_fail(TS_ERR_IO, "%s: appending entry %lld failed: %s", a->path,
                        (long long)a->seq + 1, w < 0 ? strerror(errno) : "short write");
        else if (fsync(a->fd) != 0)
            s = ts_fail(TS_ERR_IO, "%s: fsync failed: %s", a->path, strerror(errno));
    }
    free(line);
    if (s != TS_OK) return s;
    a->seq++;
    memcpy(a->head, hash, CK_SHA_HEX);
    if (a->seq == 0) memcpy(a->genesis, hash, CK_SHA_HEX);
    a->since_head = sign ? 0 : a->since_head + 1;
    return TS_OK;
}

static ts_status sign_head_locked(ts_audit *a) {
    json_t *e = json_object();
    if (!e) return ts_fail(TS_ERR_NOMEM, "%s: out of memory", a->path);
    ts_status s = append_locked(a, "head", e, 1);
    json_decref(e);
    return s;
}

ts_status ck_audit_event(ts_audit *a, const char *event, json_t *fields) {
    if (!a) {
        json_decref(fields);
        return TS_OK;
    }
    json_t *e = fields ? fields : json_object();
    if (!e) return ts_fail(TS_ERR_NOMEM, "audit: out of memory");
    ts_status s = TS_OK;
    for (size_t i = 0; i < sizeof RESERVED / sizeof *RESERVED && s == TS_OK; i++)
        if (json_object_get(e, RESERVED[i]))
            s = ts_fail(TS_ERR_INVALID, "audit entry \"%s\": field \"%s\" is reserved", event,
                        RESERVED[i]);
    if (s == TS_OK && (!strcmp(event, "head") || !*event))
        s = ts_fail(TS_ERR_INVALID, "audit: \"%s\" is not an event name to append", event);
    if (s == TS_OK) {
        pthread_mutex_lock(&a->mu);
        s = append_locked(a, event, e, 0);
        int want_head = !strcmp(event, "save") || a->since_head >= HEAD_EVERY;
        if (s == TS_OK && a->key.has_secret && want_head) s = sign_head_locked(a);
        pthread_mutex_unlock(&a->mu);
    }
    json_decref(e);
    return s;
}

void ck_audit_head(ts_audit *a, int64_t *seq, char hex[CK_SHA_HEX]) {
    pthread_mutex_lock(&a->mu);
    *seq = a->seq;
    memcpy(hex, a->head, CK_SHA_HEX);
    pthread_mutex_unlock(&a->mu);
}

void ck_audit_genesis(ts_audit *a, char hex[CK_SHA_HEX]) {
    pthread_mutex_lock(&a->mu);
    memcpy(hex, a->genesis, CK_SHA_HEX);
    pthread_mutex_unlock(&a->mu);
}

ts_status ts_audit_append(ts_audit *a, const char *event, const char *fields_json) {
    if (!a || !event) return ts_fail(TS_ERR_INVALID, "audit_append: NULL argument");
    json_t *f = NULL;
    if (fields_json) {
        json_error_t je;
        f = json_loads(fields_json, 0, &je);
        if (!json_is_object(f)) {
            json_decref(f);
            return ts_fail(TS_ERR_INVALID, "audit entry \"%s\": fields are not a JSON object: %s",
                           event, f ? "not an object" : je.text);
        }
    }
    return ck_audit_event(a, event, f);
}

ts_status ts_audit_sign_head(ts_audit *a) {
    if (!a) return ts_fail(TS_ERR_INVALID, "audit_sign_head: NULL log");
    if (!a->key.has_secret)
        return ts_fail(TS_ERR_INVALID, "%s: no private key was given to sign the head with",
                       a->path);
    pthread_mutex_lock(&a->mu);
    ts_status s = sign_head_locked(a);
    pthread_mutex_unlock(&a->mu);
    return s;
}

int64_t ts_audit_unsigned(ts_audit *a) {
    if (!a) return 0;
    pthread_mutex_lock(&a->mu);
    int64_t n = a->since_head;
    pthread_mutex_unlock(&a->mu);
    return n;
}

ts_status ts_audit_close(ts_audit *a) {
    if (!a) return TS_OK;
    ts_status s = TS_OK;
    if (a->key.has_secret && a->since_head > 0) s = ts_audit_sign_head(a);
    audit_free(a);
    return s;
}

/* Each committed checkpoint's manifest records the log head at its save:
 * the log must still hold that line, unchanged. A checkpoint directory
 * that is a link is an error naming it (core/fsat.h). */
static ts_status check_anchors(const ts_dir *run, const char *log_path, const scan *sc,
                               const ck_log_view *v, const char *latest, int *anchored,
                               char newest[64]) {
    *anchored = 0;
    int64_t newest_step = -1;
    newest[0] = '\0';
    DIR *d;
    ts_status s = ts_dir_list(run, &d);
    if (s != TS_OK) return s;
    struct dirent *de;
    while (s == TS_OK && (de = readdir(d))) {
        const int64_t step = ck_parse_step_name(de->d_name);
        if (step < 0) continue;
        if (step > newest_step) {
            newest_step = step;
            snprintf(newest, 64, "%.63s", de->d_name);
        }
        ts_dir ck;
        char *text = NULL;
        if ((s = ts_dir_sub(&ck, run, de->d_name, 0)) != TS_OK) break;
        if (ts_dir_read(&ck, "manifest.json", (size_t)64 << 20, &text, NULL) != TS_OK)
            text = NULL; /* ckpt verify reports unreadable checkpoints */
        ts_dir_close(&ck);
        json_t *m = text ? json_loads(text, 0, NULL) : NULL;
        json_t *ah = json_object_get(m, "audit_head");
        json_t *seqv = json_object_get(ah, "seq");
        const char *h = json_string_value(json_object_get(ah, "sha256"));
        if (s == TS_OK && json_is_integer(seqv) && h) {
            int64_t seq = json_integer_value(seqv);
            if (seq >= sc->n)
                s = ts_fail(TS_ERR_FORMAT,
                            "%s: has %lld entries, but %s was saved when it had %lld: entries "
                            "were removed from the end",
                            log_path, (long long)sc->n, de->d_name, (long long)seq + 1);
            else if (seq >= 0 && strcmp(sc->hashes[seq], h) != 0)
                s = ts_fail(TS_ERR_FORMAT,
                            "%s: line %lld differs from the one %s recorded when it was saved: "
                            "the log was edited or rewritten",
                            log_path, (long long)seq + 1, de->d_name);
            else
                (*anchored)++;
        }
        /* Where it was saved, and recorded in the log (rollback.c). */
        if (s == TS_OK && m)
            s = ck_check_placement(v, run->path, de->d_name, text, m, !strcmp(de->d_name, latest));
        json_decref(m);
        free(text);
    }
    closedir(d);
    return s;
}

/* The "config" entries that record an unsigned tail signed over
 * ("unsigned_before"): "line L (N entries)", comma-separated into buf. */
static void signed_over(const char *text, size_t len, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = '\0';
    int64_t ln = 0;
    for (const char *p = text, *end = text + len; p < end && k < n; ln++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t m = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (memmem(p, m, "\"unsigned_before\":", 18)) {
            json_t *e = json_loadb(p, m, 0, NULL);
            json_t *u = json_object_get(e, "unsigned_before");
            if (json_is_integer(u)) {
                int w = snprintf(buf + k, n - k, "%sline %lld (%lld entries)", k ? ", " : "",
                                 (long long)ln + 1, (long long)json_integer_value(u));
                k = w < 0 ? n : k + (size_t)w;
            }
            json_decref(e);
        }
        p = nl ? nl + 1 : end;
    }
}

/* The events of the lines after `last_signed`, comma-separated into buf. */
static void tail_events(const char *text, size_t len, int64_t last_signed, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = '\0';
    int64_t ln = 0;
    for (const char *p = text, *end = text + len; p < end; ln++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t m = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (ln > last_signed) {
            json_t *e = json_loadb(p, m, 0, NULL);
            const char *ev = json_string_value(json_object_get(e, "event"));
            int w = snprintf(buf + k, n - k, "%s%s", k ? "," : "", ev ? ev : "?");
            json_decref(e);
            if (w < 0 || (size_t)w >= n - k) {
                snprintf(buf + (n > 4 ? n - 4 : 0), n > 4 ? 4 : n, "...");
                return;
            }
            k += (size_t)w;
        }
        p = nl ? nl + 1 : end;
    }
}

ts_status ts_audit_verify(const char *run_dir, const char *public_key, ts_audit_report *r) {
    if (!run_dir) return ts_fail(TS_ERR_INVALID, "audit_verify: NULL run directory");
    ck_key k;
    ts_status s = TS_OK;
    if (public_key && (s = ck_key_load_public(public_key, &k)) != TS_OK) return s;
    char *path = ck_join(run_dir, "audit.log"), *text = NULL;
    if (!path) return TS_ERR_NOMEM;
    size_t len = 0;
    scan sc = {0};
    ts_dir run;
    ts_dir_lock lock = {-1};
    s = ts_dir_open(&run, run_dir, TS_DIR_FOLLOW);
    /* A run appending to the log and saving checkpoints while they are
     * cross-checked could be reported as tampered: not while one runs. */
    if (s == TS_OK) s = ts_dir_lock_take(&run, "audit verify", 0, &lock);
    if (s == TS_OK) s = ts_dir_read(&run, "audit.log", AUDIT_MAX_BYTES, &text, &len);
    if (s == TS_OK) s = scan_log(path, text, len, public_key ? &k : NULL, &sc);
    int anchored = 0;
    ck_log_view v = {0};
    char *latest = NULL;
    if (s == TS_OK) s = ck_log_view_read(&run, &v);
    if (s == TS_OK) {
        ts_status ls = ts_dir_read(&run, "LATEST", 4096, &latest, NULL);
        if (ls != TS_OK && ls != TS_ERR_NOT_FOUND) s = ls;
        if (latest) latest[strcspn(latest, "\r\n")] = '\0';
    }
    char newest[64] = "";
    if (s == TS_OK) s = check_anchors(&run, path, &sc, &v, latest ? latest : "", &anchored, newest);
    free(latest);
    if (s == TS_OK && r) {
        r->entries = sc.n;
        r->signed_heads = sc.signed_heads;
        r->last_signed_seq = sc.last_signed;
        r->checkpoints_anchored = anchored;
        snprintf(r->newest_checkpoint, sizeof r->newest_checkpoint, "%s", newest);
        r->newest_logged_seq = -1;
        for (int i = 0; newest[0] && i < v.nsaves; i++)
            if (!strcmp(v.saves[i].dir, newest) && v.saves[i].line > r->newest_logged_seq)
                r->newest_logged_seq = v.saves[i].line;
        for (int i = 0; newest[0] && i < v.ncommits; i++)
            if (!strcmp(v.commits[i].dir, newest) && v.commits[i].line > r->newest_logged_seq)
                r->newest_logged_seq = v.commits[i].line;
        tail_events(text, len, sc.last_signed, r->unsigned_events, sizeof r->unsigned_events);
        signed_over(text, len, r->signed_over, sizeof r->signed_over);
    }
    ck_log_view_free(&v);
    ts_dir_lock_release(&lock);
    ts_dir_close(&run);
    free(sc.hashes);
    free(text);
    free(path);
    return s;
}
