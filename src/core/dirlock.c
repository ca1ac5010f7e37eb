/* The lock of a run directory (core/dirlock.h): flock(2) on tessel.lock,
 * shared by this process's takers and by the workers a launcher forks. */
#include "core/dirlock.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* The locks this process holds. A fork copies the table with the
 * descriptors, so a worker finds its launcher's lock here. */
enum { MAX_HELD = 8 };
static struct held {
    int fd, refs; /* refs 0: a free slot */
    int marked;   /* the holder's PID is in the file */
    pid_t pid;    /* the process that took it (a launcher, for its workers) */
    dev_t dev;
    ino_t ino;
} held[MAX_HELD];
static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER;

/* The PID written into the lock file by its holder, 0 if none is readable
 * or that process is gone (a holder still in its setup has not written
 * its PID yet: the file may name the previous holder). */
static long holder_pid(int fd) {
    char buf[32];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = '\0';
    long pid = strtol(buf, NULL, 10);
    if (pid <= 0 || (kill((pid_t)pid, 0) != 0 && errno != EPERM)) return 0;
    return pid;
}

static ts_status write_pid(const ts_dir *d, int fd, pid_t pid) {
    char text[32];
    int n = snprintf(text, sizeof text, "%ld\n", (long)pid);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n)
        return ts_fail(TS_ERR_IO, "%s/%s: cannot write the holder's PID: %s", d->path,
                       TS_DIR_LOCK_NAME, strerror(errno));
    return TS_OK;
}

static ts_status busy(const ts_dir *d, const char *who, int fd) {
    long pid = holder_pid(fd);
    char by[64] = "another process", stop[48] = "";
    if (pid) {
        snprintf(by, sizeof by, "process %ld", pid);
        snprintf(stop, sizeof stop, " (kill %ld)", pid);
    }
    return ts_fail(TS_ERR_IO,
                   "%s: run directory %s is in use: %s holds its lock (%s/%s); wait for it to end "
                   "or stop it%s, then try again",
                   who, d->path, by, d->path, TS_DIR_LOCK_NAME, stop);
}

ts_status ts_dir_lock_take(const ts_dir *d, const char *who, int how, ts_dir_lock *l) {
    l->slot = -1;
    const int create = how & TS_LOCK_CREATE;
    int writable = create;
    int fd = openat(d->fd, TS_DIR_LOCK_NAME,
                    (create ? O_RDWR | O_CREAT : O_RDONLY) | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && create && (errno == EACCES || errno == EROFS)) {
        /* Someone else's run, read by an auditor: lock it if it has a lock file. */
        writable = 0;
        fd = openat(d->fd, TS_DIR_LOCK_NAME, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (fd < 0 && errno == ENOENT) return TS_OK; /* no run has locked it: nothing to share */
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP)
            return ts_fail(TS_ERR_IO,
                           "%s/%s is a symbolic link; tessel does not follow links in a run "
                           "directory (remove it); nothing was changed",
                           d->path, TS_DIR_LOCK_NAME);
        return ts_fail(TS_ERR_IO, "%s/%s: cannot open the lock file: %s", d->path, TS_DIR_LOCK_NAME,
                       strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink > 1) {
        close(fd);
        return ts_fail(TS_ERR_IO, "%s/%s is not a plain regular file; not using it as the lock",
                       d->path, TS_DIR_LOCK_NAME);
    }
    pthread_mutex_lock(&held_mu);
    int free_slot = -1;
    ts_status s = TS_OK;
    for (int i = 0; i < MAX_HELD; i++) {
        struct held *h = &held[i];
        if (h->refs && h->dev == st.st_dev && h->ino == st.st_ino) {
            /* Ours already (or our launcher's): shared; the holder's PID is
             * recorded once something is to be written. */
            if (writable && !h->marked && (s = write_pid(d, fd, h->pid)) == TS_OK) h->marked = 1;
            if (s == TS_OK) {
                h->refs++;
                l->slot = i;
            }
            pthread_mutex_unlock(&held_mu);
            close(fd);
            return s;
        }
        if (!h->refs && free_slot < 0) free_slot = i;
    }
    if (free_slot < 0)
        s = ts_fail(TS_ERR_INTERNAL, "%s: more than %d run directories locked at once", d->path,
                    MAX_HELD);
    else if (flock(fd, LOCK_EX | LOCK_NB) != 0)
        s = errno == EWOULDBLOCK ? busy(d, who, fd)
                                 : ts_fail(TS_ERR_IO, "%s/%s: flock failed: %s", d->path,
                                           TS_DIR_LOCK_NAME, strerror(errno));
    if (s == TS_OK && writable) s = write_pid(d, fd, getpid());
    if (s != TS_OK) {
        pthread_mutex_unlock(&held_mu);
        close(fd); /* drops the lock if it was taken */
        return s;
    }
    held[free_slot] = (struct held){fd, 1, writable, getpid(), st.st_dev, st.st_ino};
    pthread_mutex_unlock(&held_mu);
    l->slot = free_slot;
    return TS_OK;
}

void ts_dir_lock_release(ts_dir_lock *l) {
    if (!l || l->slot < 0) return;
    pthread_mutex_lock(&held_mu);
    struct held *h = &held[l->slot];
    if (h->refs > 0 && --h->refs == 0) {
        close(h->fd); /* the lock goes with the last descriptor of it, in any process */
        h->fd = -1;
    }
    pthread_mutex_unlock(&held_mu);
    l->slot = -1;
}
