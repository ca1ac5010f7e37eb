/* core/dirlock.h: the lock of a run directory. Another process is refused
 * with a message naming the holder's PID; a second taker in the holding
 * process, and a child forked while it holds the lock (a launcher's
 * worker), share it; the lock goes with the last share; a link planted as
 * tessel.lock is refused. */
#include "core/dirlock.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

/* Runs `fn` in a child process started before the caller took anything:
 * it waits for a byte on the pipe, then its exit status is fn's. */
typedef struct child {
    pid_t pid;
    int go;
} child;

static child spawn(const char *path, int (*fn)(const char *)) {
    int p[2];
    child c = {-1, -1};
    if (pipe(p) != 0) return c;
    c.pid = fork();
    if (c.pid == 0) {
        close(p[1]);
        char b;
        if (read(p[0], &b, 1) != 1) _exit(99);
        _exit(fn(path));
    }
    close(p[0]);
    c.go = p[1];
    return c;
}

static int finish(child c) {
    if (write(c.go, "x", 1) != 1) return -1;
    close(c.go);
    int st = 0;
    if (waitpid(c.pid, &st, 0) != c.pid || !WIFEXITED(st)) return -1;
    return WEXITSTATUS(st);
}

/* In another process: 0 when refused naming the parent's PID, 1 when the
 * lock was granted, 2 on anything else. */
static int try_other(const char *path) {
    ts_dir d;
    if (ts_dir_open(&d, path, 0) != TS_OK) return 2;
    ts_dir_lock l;
    ts_status s = ts_dir_lock_take(&d, "test", TS_LOCK_CREATE, &l);
    char want[64];
    snprintf(want, sizeof want, "process %ld holds its lock", (long)getppid());
    int rc = s == TS_OK                                                           ? 1
             : strstr(ts_last_error(), want) && strstr(ts_last_error(), "in use") ? 0
                                                                                  : 2;
    if (rc == 2) fprintf(stderr, "child: %s\n", ts_last_error());
    ts_dir_lock_release(&l);
    ts_dir_close(&d);
    return rc;
}

int main(void) {
    char root[] = "/tmp/tessel-dirlock-XXXXXX";
    CHECK(mkdtemp(root) != NULL, "mkdtemp");
    ts_dir d;
    CHECK_OK(ts_dir_open(&d, root, 0));

    /* Other processes: forked before anything is held, so they share nothing. */
    child other = spawn(root, try_other), other2 = spawn(root, try_other),
          other3 = spawn(root, try_other);
    ts_dir_lock a, b;
    /* Without TS_LOCK_CREATE a directory without a lock file is left as it
     * was: nothing locked, nothing written. */
    char path[128], *text = NULL;
    snprintf(path, sizeof path, "%s/%s", root, TS_DIR_LOCK_NAME);
    struct stat sb;
    CHECK_OK(ts_dir_lock_take(&d, "test", 0, &a));
    CHECK(a.slot < 0 && lstat(path, &sb) != 0, "no lock file made without TS_LOCK_CREATE");
    CHECK_OK(ts_dir_lock_take(&d, "test", TS_LOCK_CREATE, &a));
    CHECK_OK(ts_dir_lock_take(&d, "test", 0, &b)); /* the same process shares it */
    CHECK(finish(other) == 0, "another process is refused, naming this PID");

    /* A child forked while the lock is held shares it (a launcher's worker). */
    pid_t w = fork();
    if (w == 0) {
        ts_dir_lock c;
        _exit(ts_dir_lock_take(&d, "worker", TS_LOCK_CREATE, &c) == TS_OK ? 0 : 1);
    }
    int st = 0;
    CHECK(waitpid(w, &st, 0) == w && WIFEXITED(st) && WEXITSTATUS(st) == 0,
          "a forked worker shares the lock");

    /* One share released: still held. Both: free for another process. */
    ts_dir_lock_release(&b);
    CHECK(finish(other2) == 0, "still held after one of two shares went");
    ts_dir_lock_release(&a);
    ts_dir_lock_release(&a); /* idempotent */
    CHECK(finish(other3) == 1, "free after the last share");

    /* The lock file stays, holding the last holder's PID (the third child's). */
    CHECK(lstat(path, &sb) == 0 && S_ISREG(sb.st_mode), "the lock file stays");
    CHECK_OK(ts_dir_read(&d, TS_DIR_LOCK_NAME, 64, &text, NULL));
    CHECK(text && strtol(text, NULL, 10) == (long)other3.pid,
          "the last holder's PID in the lock file: %s", text ? text : "");
    free(text);

    /* A link planted as tessel.lock: refused, naming it. */
    char outside[128];
    snprintf(outside, sizeof outside, "%s.outside", root);
    FILE *f = fopen(outside, "w");
    if (f) fclose(f);
    unlink(path);
    CHECK(symlink(outside, path) == 0, "symlink");
    CHECK(ts_dir_lock_take(&d, "test", TS_LOCK_CREATE, &a) != TS_OK &&
              strstr(ts_last_error(), "tessel.lock") && strstr(ts_last_error(), "symbolic link"),
          "a link as the lock file: %s", ts_last_error());
    CHECK(lstat(outside, &sb) == 0 && sb.st_size == 0, "the link's target is untouched");

    ts_dir_close(&d);
    unlink(path);
    unlink(outside);
    rmdir(root);
    return check_summary("dirlock");
}
