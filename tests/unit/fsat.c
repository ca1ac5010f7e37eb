/* core/fsat.h: every way of reaching a name in a directory refuses a
 * symbolic link planted there, names it, and leaves the link's target (a
 * file or directory outside) untouched; a hard-linked file is not written
 * to; removing a flat directory checks everything before removing anything.
 * Also the obs writers built on it: the PAUSED file of an alert pause. */
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "core/fsat.h"
#include "obs/alert_run.h"

static char root[64];

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static int holds(const char *path, const char *text) {
    char buf[256] = "";
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return !strcmp(buf, text);
}

static char *at(const char *rel) {
    static char bufs[4][256];
    static int k;
    char *b = bufs[k++ & 3];
    snprintf(b, 256, "%s/%s", root, rel);
    return b;
}

/* Failed, naming `name` as a symbolic link. */
static void refused(ts_status s, const char *what, const char *name) {
    CHECK(s != TS_OK, "%s: accepted a link", what);
    CHECK(strstr(ts_last_error(), name) && strstr(ts_last_error(), "symbolic link"),
          "%s: message does not name the link '%s': %s", what, name, ts_last_error());
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/tessel-fsat-XXXXXX");
    if (!mkdtemp(root)) return 1;
    mkdir(at("run"), 0755);
    mkdir(at("outside"), 0755);
    put(at("outside/keep"), "precious\n");
    if (symlink(at("outside/keep"), at("run/file-link")) != 0) return 1;
    if (symlink(at("outside"), at("run/dir-link")) != 0) return 1;
    if (symlink(at("run"), at("run-link")) != 0) return 1;

    ts_dir d;
    refused(ts_dir_open(&d, at("run-link"), 0), "open a linked directory", "run-link");
    CHECK_OK(ts_dir_open(&d, at("run-link"), TS_DIR_FOLLOW));
    ts_dir_close(&d);
    CHECK_OK(ts_dir_open(&d, at("run"), 0));

    int fd, kind;
    refused(ts_dir_kind(&d, "file-link", &kind), "kind", "file-link");
    refused(ts_dir_openf(&d, "file-link", TS_AT_READ, 0, &fd), "read", "file-link");
    refused(ts_dir_openf(&d, "file-link", TS_AT_APPEND, 0644, &fd), "append", "file-link");
    refused(ts_dir_openf(&d, "file-link", TS_AT_EXCL, 0644, &fd), "create", "file-link");
    refused(ts_dir_openf(&d, "file-link", TS_AT_REPLACE, 0644, &fd), "replace", "file-link");
    CHECK(ts_dir_fopen(&d, "file-link", "a") == NULL, "fopen append through a link");
    refused(ts_dir_write(&d, "file-link", TS_AT_REPLACE, "x", 1, 0644, 1), "write", "file-link");
    /* replace writes NAME.tmp first: a link there is refused too */
    if (symlink(at("outside/keep"), at("run/LATEST.tmp")) != 0) return 1;
    refused(ts_dir_replace(&d, "LATEST", "x\n", 2, 0644, 1), "replace via .tmp", "LATEST.tmp");
    refused(ts_dir_replace(&d, "file-link", "x\n", 2, 0644, 1), "replace over a link", "file-link");
    refused(ts_dir_unlink(&d, "file-link"), "unlink", "file-link");
    refused(ts_dir_rename(&d, "file-link", "other"), "rename from", "file-link");
    char *text = NULL;
    refused(ts_dir_read(&d, "file-link", 100, &text, NULL), "read whole", "file-link");
    CHECK(holds(at("outside/keep"), "precious\n"), "the file outside is unchanged");
    struct stat st;
    CHECK(lstat(at("run/file-link"), &st) == 0 && S_ISLNK(st.st_mode), "the link is still there");

    ts_dir sub;
    refused(ts_dir_sub(&sub, &d, "dir-link", 0), "open a linked folder", "dir-link");
    refused(ts_dir_sub(&sub, &d, "dir-link", TS_DIR_CREATE), "create a linked folder", "dir-link");
    refused(ts_dir_mkdir(&d, "dir-link", 1), "mkdir over a link", "dir-link");
    refused(ts_dir_remove_flat(&d, "dir-link"), "remove a linked folder", "dir-link");
    refused(ts_dir_exchange(&d, "dir-link", "other"), "exchange", "dir-link");
    CHECK(holds(at("outside/keep"), "precious\n"), "the folder outside is unchanged");

    /* A flat folder with a link inside: nothing of it is removed. */
    CHECK_OK(ts_dir_mkdir(&d, "step-00000006.tmp", 0));
    put(at("run/step-00000006.tmp/a.safetensors"), "a");
    put(at("run/step-00000006.tmp/z.safetensors"), "z");
    if (symlink(at("outside/keep"), at("run/step-00000006.tmp/manifest.json")) != 0) return 1;
    refused(ts_dir_remove_flat(&d, "step-00000006.tmp"), "remove flat", "manifest.json");
    CHECK(access(at("run/step-00000006.tmp/a.safetensors"), F_OK) == 0 &&
              access(at("run/step-00000006.tmp/z.safetensors"), F_OK) == 0,
          "remove flat removed files before it met the link");
    unlink(at("run/step-00000006.tmp/manifest.json"));
    CHECK_OK(ts_dir_remove_flat(&d, "step-00000006.tmp"));
    CHECK(access(at("run/step-00000006.tmp"), F_OK) != 0, "flat folder removed");

    /* A hard link to a file elsewhere is not appended to or truncated. */
    if (link(at("outside/keep"), at("run/hard")) == 0) {
        ts_status s = ts_dir_openf(&d, "hard", TS_AT_APPEND, 0644, &fd);
        CHECK(s != TS_OK && strstr(ts_last_error(), "hard links"), "append to a hard link: %s",
              ts_last_error());
        CHECK_OK(ts_dir_write(&d, "hard", TS_AT_REPLACE, "new\n", 4, 0644, 0));
        CHECK(holds(at("outside/keep"), "precious\n") && holds(at("run/hard"), "new\n"),
              "replace makes a new file instead of writing through the hard link");
    }

    /* The ordinary cases still work. */
    CHECK_OK(ts_dir_replace(&d, "summary.json", "{}\n", 3, 0644, 1));
    CHECK(holds(at("run/summary.json"), "{}\n"), "replaced");
    FILE *f = ts_dir_fopen(&d, "metrics.jsonl", "a");
    CHECK(f != NULL, "append: %s", ts_last_error());
    if (f) {
        fputs("{\"step\":1}\n", f);
        fclose(f);
    }
    CHECK_OK(ts_dir_read(&d, "metrics.jsonl", 100, &text, NULL));
    CHECK(text && !strcmp(text, "{\"step\":1}\n"), "read back");
    free(text);
    CHECK_OK(ts_dir_rename(&d, "summary.json", "s2.json"));
    CHECK_OK(ts_dir_unlink(&d, "s2.json"));
    CHECK_OK(ts_dir_unlink(&d, "absent"));
    CHECK_OK(ts_dir_sync(&d));
    ts_dir_close(&d);

    /* An alert pause writes PAUSED: a link there is refused. */
    if (symlink(at("outside/keep"), at("run/PAUSED")) != 0) return 1;
    volatile sig_atomic_t stop = 1;
    int resumed = 0;
    refused(ts_alert_pause(at("run"), 5, "rule", &stop, NULL, &resumed), "pause", "PAUSED");
    CHECK(holds(at("outside/keep"), "precious\n"), "pause left the file outside alone");

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (check_failed == 0 && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    return check_summary("unit/fsat");
}
