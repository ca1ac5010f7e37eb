/* The audit log: a chained, signed log verifies; an edit, a deletion, a
 * reordering, a cut-off tail, a torn last line, a forged head and the
 * wrong key are each detected and named by line. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "tessel/ckpt.h"

static char root[256];

static void rm_rf(const char *path) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", path);
}

/* The log as lines (each without its newline). */
typedef struct lines {
    char *v[256];
    int n;
} lines;

static void read_lines(const char *path, lines *l) {
    l->n = 0;
    FILE *f = fopen(path, "rb");
    char buf[8192];
    while (f && l->n < 256 && fgets(buf, sizeof buf, f)) {
        buf[strcspn(buf, "\n")] = '\0';
        l->v[l->n++] = strdup(buf);
    }
    if (f) fclose(f);
}

static void write_lines(const char *path, const lines *l, int skip, int swap_a, int swap_b) {
    FILE *f = fopen(path, "wb");
    for (int i = 0; i < l->n; i++) {
        if (i == skip) continue;
        int j = i == swap_a ? swap_b : i == swap_b ? swap_a : i;
        fprintf(f, "%s\n", l->v[j]);
    }
    fclose(f);
}

static void free_lines(lines *l) {
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    l->n = 0;
}

/* Run `verify` on a copy of the run whose log has been changed by `edit`. */
static ts_status verify_tampered(const char *run, const char *pk, void (*edit)(const char *),
                                 char *msg, size_t n) {
    char copy[400], cmd[900], log[500];
    snprintf(copy, sizeof copy, "%s/tampered", root);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", copy, run, copy);
    CHECK(system(cmd) == 0, "%s", cmd);
    snprintf(log, sizeof log, "%s/audit.log", copy);
    edit(log);
    ts_status s = ts_audit_verify(copy, pk, NULL);
    snprintf(msg, n, "%s", ts_last_error());
    return s;
}

static void edit_line3(const char *log) {
    lines l;
    read_lines(log, &l);
    char *p = strstr(l.v[2], "\"n\":2");
    if (p) p[4] = '9';
    write_lines(log, &l, -1, -1, -1);
    free_lines(&l);
}

static void delete_line5(const char *log) {
    lines l;
    read_lines(log, &l);
    write_lines(log, &l, 4, -1, -1);
    free_lines(&l);
}

static void swap_lines_3_4(const char *log) {
    lines l;
    read_lines(log, &l);
    write_lines(log, &l, -1, 2, 3);
    free_lines(&l);
}

static void cut_tail(const char *log) {
    lines l;
    read_lines(log, &l);
    l.n -= 4;
    write_lines(log, &l, -1, -1, -1);
    l.n += 4;
    free_lines(&l);
}

static void torn_tail(const char *log) {
    FILE *f = fopen(log, "ab");
    fputs("{\"event\":\"alert\"", f);
    fclose(f);
}

/* Rewrite the last signed head with another time: its signature fails
 * before the next line's chain check is reached. */
static void forge_head(const char *log) {
    lines l;
    read_lines(log, &l);
    int h = l.n - 1;
    while (h > 0 && !strstr(l.v[h], "\"event\":\"head\"")) h--;
    char *p = strstr(l.v[h], "\"time\":\"");
    if (p) p[8] = p[8] == '1' ? '2' : '1';
    write_lines(log, &l, -1, -1, -1);
    free_lines(&l);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/tessel-audit-test-%d", (int)getpid());
    rm_rf(root);
    mkdir(root, 0755);
    char sk[300], pk[300], sk2[300], pk2[300], run[300], log[400];
    snprintf(sk, sizeof sk, "%s/a.key", root);
    snprintf(pk, sizeof pk, "%s/a.pub", root);
    snprintf(sk2, sizeof sk2, "%s/b.key", root);
    snprintf(pk2, sizeof pk2, "%s/b.pub", root);
    snprintf(run, sizeof run, "%s/run", root);
    snprintf(log, sizeof log, "%s/audit.log", run);
    CHECK_OK(ts_ckpt_keygen(sk, pk));
    CHECK_OK(ts_ckpt_keygen(sk2, pk2));

    ts_audit *a = NULL;
    CHECK_OK(ts_audit_open(run, sk, &a));
    CHECK_OK(ts_audit_append(a, "config", "{\"config_sha256\":\"ab\",\"n\":0}"));
    char fields[64];
    for (int i = 1; i < 20; i++) {
        snprintf(fields, sizeof fields, "{\"n\":%d}", i);
        CHECK_OK(ts_audit_append(a, "alert", fields));
    }
    CHECK(ts_audit_append(a, "alert", "{\"seq\":3}") == TS_ERR_INVALID, "reserved field refused");
    CHECK(ts_audit_append(a, "alert", "[1]") == TS_ERR_INVALID, "non-object fields refused");

    /* A checkpoint saved with the log records its head in the manifest. */
    ts_mlp_config mc = {4, 0, 0, 8, 16, 1, 1, 1, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_mlp(g, &mc, &m));
    ts_train_spec spec = ts_train_spec_default(m.loss);
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, NULL, &p));
    ts_ckpt_options o = ts_ckpt_options_default();
    o.sign_key = sk;
    o.audit = a;
    CHECK_OK(ts_ckpt_save(p, run, NULL, &o));
    ts_ckpt *ck = NULL;
    CHECK_OK(ts_ckpt_open(run, pk, a, &ck));
    ts_ckpt_close(ck);
    for (int i = 0; i < 5; i++) CHECK_OK(ts_audit_append(a, "alert", "{\"late\":true}"));
    CHECK_OK(ts_audit_close(a));

    ts_audit_report r;
    CHECK_OK(ts_audit_verify(run, pk, &r));
    /* 20 + head at 16 + commit + save + head + verify + 5 + closing head */
    CHECK(r.entries == 31, "entries %lld", (long long)r.entries);
    CHECK(r.signed_heads == 3 && r.last_signed_seq == 30, "heads %lld, last %lld",
          (long long)r.signed_heads, (long long)r.last_signed_seq);
    CHECK(r.checkpoints_anchored == 1, "anchored %d", r.checkpoints_anchored);
    CHECK(!strcmp(r.newest_checkpoint, "step-00000000") && r.newest_logged_seq == 22,
          "newest checkpoint %s logged at %lld", r.newest_checkpoint,
          (long long)r.newest_logged_seq);
    CHECK(r.unsigned_events[0] == '\0', "no unsigned tail: %s", r.unsigned_events);

    /* Reopening continues the chain. */
    CHECK_OK(ts_audit_open(run, NULL, &a));
    CHECK_OK(ts_audit_append(a, "resume", "{\"step\":0}"));
    CHECK_OK(ts_audit_close(a));
    CHECK_OK(ts_audit_verify(run, pk, &r));
    CHECK(r.entries == 32, "entries after reopen %lld", (long long)r.entries);
    CHECK(!strcmp(r.unsigned_events, "resume"), "the unsigned tail: %s", r.unsigned_events);
    CHECK(ts_audit_sign_head(NULL) == TS_ERR_INVALID, "sign_head(NULL)");

    char msg[1024];
    CHECK(ts_audit_verify(run, pk2, NULL) == TS_ERR_FORMAT, "wrong key detected");

    CHECK(verify_tampered(run, pk, edit_line3, msg, sizeof msg) == TS_ERR_FORMAT, "edit detected");
    CHECK(strstr(msg, "line 3 was edited") != NULL, "edit named: %s", msg);
    CHECK(verify_tampered(run, NULL, delete_line5, msg, sizeof msg) == TS_ERR_FORMAT,
          "deletion detected");
    CHECK(strstr(msg, "line 5") && strstr(msg, "deleted"), "deletion named: %s", msg);
    CHECK(verify_tampered(run, NULL, swap_lines_3_4, msg, sizeof msg) == TS_ERR_FORMAT,
          "reordering detected");
    CHECK(strstr(msg, "line 3") && strstr(msg, "reordered"), "reordering named: %s", msg);
    CHECK(verify_tampered(run, NULL, torn_tail, msg, sizeof msg) == TS_ERR_FORMAT,
          "torn tail detected");
    CHECK(strstr(msg, "not terminated") != NULL, "torn tail named: %s", msg);
    CHECK(verify_tampered(run, pk, forge_head, msg, sizeof msg) == TS_ERR_FORMAT,
          "forged head detected");
    CHECK(strstr(msg, "line 31") && strstr(msg, "signature"), "forged head named: %s", msg);

    /* Cutting entries off the end leaves a consistent chain; the manifest's
     * record of the log head catches it once the cut reaches the save. */
    CHECK(verify_tampered(run, NULL, cut_tail, msg, sizeof msg) == TS_OK, "short cut: %s", msg);
    /* 32 lines: 0-20 before the save, 21 its commit, 22 its save, 23 the head. */
    for (int k = 0; k < 12; k++) {
        lines l;
        read_lines(log, &l);
        l.n--;
        write_lines(log, &l, -1, -1, -1);
        l.n++;
        free_lines(&l);
        const int64_t left = 31 - k;
        ts_status vs = ts_audit_verify(run, pk, &r);
        if (left >= 22) {
            /* Down to the commit entry: what a kill between the commit and
             * the "save" entry leaves: it verifies, the tail unsigned. */
            CHECK(vs == TS_OK, "%lld lines: %s", (long long)left, ts_last_error());
            if (left <= 23)
                CHECK(vs == TS_OK && r.last_signed_seq == 16 && r.newest_logged_seq == left - 1,
                      "%lld lines: last signed %lld, newest logged at %lld", (long long)left,
                      (long long)r.last_signed_seq, (long long)r.newest_logged_seq);
        } else {
            /* The commit entry cut (21 lines), then the anchor too (20). */
            CHECK(vs == TS_ERR_FORMAT, "%lld lines: cut tail detected", (long long)left);
            CHECK(strstr(ts_last_error(), "removed from the end") != NULL, "cut named: %s",
                  ts_last_error());
            if (left == 21)
                CHECK(strstr(ts_last_error(), "neither its commit nor its save") != NULL,
                      "the missing commit named: %s", ts_last_error());
        }
    }
    CHECK(ts_audit_open(run, NULL, &a) == TS_OK, "a cut log still opens (its chain holds)");
    ts_audit_close(a);

    ts_plan_free(p);
    ts_graph_free(g);
    if (check_failed == 0) rm_rf(root);
    return check_summary("audit");
}
