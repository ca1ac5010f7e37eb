/* Files of a directory reached without following links (core/fsat.h).
 * Every call is relative to a directory descriptor opened once, with
 * O_NOFOLLOW: a name that is a symbolic link fails with ELOOP (or is seen
 * by fstatat(AT_SYMLINK_NOFOLLOW)) and is reported, never followed. */
#include "core/fsat.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static ts_status link_error(const char *dir, const char *name) {
    return ts_fail(TS_ERR_IO,
                   "%s/%s is a symbolic link; tessel does not follow links in a run directory "
                   "(remove it); nothing was changed",
                   dir, name);
}

static ts_status plain_name(const char *dir, const char *name) {
    if (!name || !*name || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, ".."))
        return ts_fail(TS_ERR_INVALID, "%s: '%s' is not a plain file name", dir,
                       name ? name : "(null)");
    return TS_OK;
}

static ts_status open_dir_at(int at, const char *shown, const char *name, int how, int *out) {
    if ((how & TS_DIR_CREATE) && mkdirat(at, name, 0755) != 0 && errno != EEXIST)
        return ts_fail(TS_ERR_IO, "%s: cannot create directory: %s", shown, strerror(errno));
    int fd = openat(at, name,
                    O_RDONLY | O_DIRECTORY | O_CLOEXEC | (how & TS_DIR_FOLLOW ? 0 : O_NOFOLLOW));
    if (fd < 0) {
        int e = errno;
        struct stat st;
        if ((e == ELOOP || e == ENOTDIR) && fstatat(at, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISLNK(st.st_mode))
            return ts_fail(TS_ERR_IO,
                           "%s is a symbolic link; tessel does not follow links to run "
                           "directories and their folders; nothing was changed",
                           shown);
        return ts_fail(e == ENOENT || e == ENOTDIR ? TS_ERR_NOT_FOUND : TS_ERR_IO,
                       "%s: cannot open directory: %s", shown, strerror(e));
    }
    *out = fd;
    return TS_OK;
}

ts_status ts_dir_open(ts_dir *d, const char *path, int how) {
    d->fd = -1;
    d->path = NULL;
    if (!path || !*path) return ts_fail(TS_ERR_INVALID, "directory: empty path");
    if (!(d->path = ts_strdup(path))) return ts_fail(TS_ERR_NOMEM, "%s: out of memory", path);
    /* Trailing slashes would make the kernel follow a link ("a/" is "a/."). */
    size_t n = strlen(d->path);
    while (n > 1 && d->path[n - 1] == '/') d->path[--n] = '\0';
    ts_status s = open_dir_at(AT_FDCWD, d->path, d->path, how, &d->fd);
    if (s != TS_OK) ts_dir_close(d);
    return s;
}

ts_status ts_dir_sub(ts_dir *d, const ts_dir *parent, const char *name, int how) {
    d->fd = -1;
    d->path = NULL;
    ts_status s = plain_name(parent->path, name);
    if (s != TS_OK) return s;
    size_t a = strlen(parent->path), b = strlen(name);
    if (!(d->path = ts_alloc(a + b + 2, "directory path"))) return TS_ERR_NOMEM;
    snprintf(d->path, a + b + 2, "%s/%s", parent->path, name);
    s = open_dir_at(parent->fd, d->path, name, how & TS_DIR_CREATE, &d->fd);
    if (s != TS_OK) ts_dir_close(d);
    return s;
}

void ts_dir_close(ts_dir *d) {
    if (!d) return;
    if (d->fd >= 0) close(d->fd);
    d->fd = -1;
    free(d->path);
    d->path = NULL;
}

ts_status ts_dir_kind(const ts_dir *d, const char *name, int *kind) {
    *kind = 0;
    ts_status s = plain_name(d->path, name);
    if (s != TS_OK) return s;
    struct stat st;
    if (fstatat(d->fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) return TS_OK;
        return ts_fail(TS_ERR_IO, "%s/%s: %s", d->path, name, strerror(errno));
    }
    if (S_ISLNK(st.st_mode)) return link_error(d->path, name);
    if (S_ISREG(st.st_mode))
        *kind = 1;
    else if (S_ISDIR(st.st_mode))
        *kind = 2;
    else
        return ts_fail(TS_ERR_IO,
                       "%s/%s is neither a regular file nor a directory; not touching it", d->path,
                       name);
    return TS_OK;
}

ts_status ts_dir_openf(const ts_dir *d, const char *name, int how, mode_t mode, int *out) {
    *out = -1;
    ts_status s = plain_name(d->path, name);
    if (s != TS_OK) return s;
    if (how == TS_AT_REPLACE) {
        int kind;
        if ((s = ts_dir_kind(d, name, &kind)) != TS_OK) return s;
        if (kind == 2)
            return ts_fail(TS_ERR_IO, "%s/%s is a directory, not a file; not touching it", d->path,
                           name);
        if (kind == 1 && unlinkat(d->fd, name, 0) != 0 && errno != ENOENT)
            return ts_fail(TS_ERR_IO, "%s/%s: cannot replace: %s", d->path, name, strerror(errno));
    }
    int flags = O_CLOEXEC | O_NOFOLLOW;
    switch (how) {
    case TS_AT_READ: flags |= O_RDONLY | O_NONBLOCK; break;
    case TS_AT_APPEND: flags |= O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK; break;
    default: flags |= O_WRONLY | O_CREAT | O_EXCL; break;
    }
    int fd = openat(d->fd, name, flags, mode);
    if (fd < 0) {
        int e = errno;
        struct stat st;
        if (e == ELOOP || (e == EEXIST && fstatat(d->fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                           S_ISLNK(st.st_mode)))
            return link_error(d->path, name);
        return ts_fail(e == ENOENT ? TS_ERR_NOT_FOUND : TS_ERR_IO, "%s/%s: cannot %s: %s", d->path,
                       name, how == TS_AT_READ ? "open" : "create", strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return ts_fail(TS_ERR_IO, "%s/%s is not a regular file; not touching it", d->path, name);
    }
    if (how != TS_AT_READ && st.st_nlink > 1) {
        close(fd);
        return ts_fail(TS_ERR_IO,
                       "%s/%s has %lu hard links (another file is linked in); not writing to it",
                       d->path, name, (unsigned long)st.st_nlink);
    }
    /* O_NONBLOCK only kept a FIFO from blocking the open: regular files
     * ignore it, and it is cleared so stdio behaves as usual. */
    int fl = fcntl(fd, F_GETFL);
    if (fl != -1) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *out = fd;
    return TS_OK;
}

FILE *ts_dir_fopen(const ts_dir *d, const char *name, const char *mode) {
    int how = mode[0] == 'r'   ? TS_AT_READ
              : mode[0] == 'a' ? TS_AT_APPEND
              : mode[0] == 'x' ? TS_AT_EXCL
                               : TS_AT_REPLACE;
    int fd;
    if (ts_dir_openf(d, name, how, 0644, &fd) != TS_OK) return NULL;
    FILE *f = fdopen(fd, how == TS_AT_READ ? "r" : how == TS_AT_APPEND ? "a" : "w");
    if (!f) {
        ts_fail(TS_ERR_IO, "%s/%s: %s", d->path, name, strerror(errno));
        close(fd);
    }
    return f;
}

static ts_status write_fd(int fd, const char *dir, const char *name, const void *data, size_t n,
                          int sync) {
    const unsigned char *p = data;
    while (n > 0) {
        ssize_t r = write(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return ts_fail(TS_ERR_IO, "%s/%s: write failed: %s", dir, name,
                           r < 0 ? strerror(errno) : "no progress");
        p += r;
        n -= (size_t)r;
    }
    if (sync && fsync(fd) != 0)
        return ts_fail(TS_ERR_IO, "%s/%s: fsync failed: %s", dir, name, strerror(errno));
    return TS_OK;
}

ts_status ts_dir_write(const ts_dir *d, const char *name, int how, const void *data, size_t n,
                       mode_t mode, int sync) {
    int fd;
    ts_status s = ts_dir_openf(d, name, how == TS_AT_EXCL ? TS_AT_EXCL : TS_AT_REPLACE, mode, &fd);
    if (s != TS_OK) return s;
    s = write_fd(fd, d->path, name, data, n, sync);
    if (close(fd) != 0 && s == TS_OK)
        s = ts_fail(TS_ERR_IO, "%s/%s: close failed: %s", d->path, name, strerror(errno));
    return s;
}

ts_status ts_dir_replace(const ts_dir *d, const char *name, const void *data, size_t n, mode_t mode,
                         int sync) {
    ts_status s = plain_name(d->path, name);
    if (s != TS_OK) return s;
    size_t len = strlen(name);
    char *tmp = ts_alloc(len + 5, "temporary name");
    if (!tmp) return TS_ERR_NOMEM;
    memcpy(tmp, name, len);
    memcpy(tmp + len, ".tmp", 5);
    s = ts_dir_write(d, tmp, TS_AT_REPLACE, data, n, mode, sync);
    if (s == TS_OK && (s = ts_dir_rename(d, tmp, name)) != TS_OK)
        (void)unlinkat(d->fd, tmp, 0); /* the file just written, not a link */
    free(tmp);
    return s;
}

ts_status ts_fd_read_all(int fd, const char *what, size_t max, char **out, size_t *n) {
    *out = NULL;
    if (n) *n = 0;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return ts_fail(TS_ERR_IO, "%s: not a readable regular file", what);
    }
    if ((uint64_t)st.st_size > max) {
        close(fd);
        return ts_fail(TS_ERR_FORMAT, "%s: %lld bytes, more than the %zu allowed", what,
                       (long long)st.st_size, max);
    }
    size_t len = (size_t)st.st_size, got = 0;
    char *buf = ts_alloc(len + 1, what);
    if (!buf) {
        close(fd);
        return TS_ERR_NOMEM;
    }
    while (got < len) {
        ssize_t r = read(fd, buf + got, len - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break; /* the file shrank: keep what was there */
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    *out = buf;
    if (n) *n = got;
    return TS_OK;
}

ts_status ts_dir_read(const ts_dir *d, const char *name, size_t max, char **out, size_t *n) {
    *out = NULL;
    if (n) *n = 0;
    int fd;
    ts_status s = ts_dir_openf(d, name, TS_AT_READ, 0, &fd);
    if (s != TS_OK) return s;
    char what[512];
    snprintf(what, sizeof what, "%s/%s", d->path, name);
    return ts_fd_read_all(fd, what, max, out, n);
}

ts_status ts_dir_mkdir(const ts_dir *d, const char *name, int exist_ok) {
    ts_status s = plain_name(d->path, name);
    if (s != TS_OK) return s;
    if (mkdirat(d->fd, name, 0755) == 0) return TS_OK;
    int e = errno;
    if (e != EEXIST)
        return ts_fail(TS_ERR_IO, "%s/%s: cannot create: %s", d->path, name, strerror(e));
    int kind;
    if ((s = ts_dir_kind(d, name, &kind)) != TS_OK) return s;
    if (kind != 2) return ts_fail(TS_ERR_IO, "%s/%s exists and is not a directory", d->path, name);
    if (!exist_ok) return ts_fail(TS_ERR_IO, "%s/%s: already exists", d->path, name);
    return TS_OK;
}

ts_status ts_dir_rename(const ts_dir *d, const char *from, const char *to) {
    int kf, kt;
    ts_status s = ts_dir_kind(d, from, &kf);
    if (s == TS_OK) s = ts_dir_kind(d, to, &kt);
    if (s != TS_OK) return s;
    if (renameat(d->fd, from, d->fd, to) != 0)
        return ts_fail(TS_ERR_IO, "%s/%s: cannot rename to %s: %s", d->path, from, to,
                       strerror(errno));
    return TS_OK;
}

ts_status ts_dir_exchange(const ts_dir *d, const char *a, const char *b) {
    int ka, kb;
    ts_status s = ts_dir_kind(d, a, &ka);
    if (s == TS_OK) s = ts_dir_kind(d, b, &kb);
    if (s != TS_OK) return s;
    if (renameat2(d->fd, a, d->fd, b, RENAME_EXCHANGE) != 0)
        return ts_fail(TS_ERR_IO, "%s/%s: cannot exchange with %s: %s", d->path, a, b,
                       strerror(errno));
    return TS_OK;
}

ts_status ts_dir_unlink(const ts_dir *d, const char *name) {
    int kind;
    ts_status s = ts_dir_kind(d, name, &kind);
    if (s != TS_OK || kind == 0) return s;
    if (kind == 2)
        return ts_fail(TS_ERR_IO, "%s/%s is a directory, not a file; not removing it", d->path,
                       name);
    if (unlinkat(d->fd, name, 0) != 0 && errno != ENOENT)
        return ts_fail(TS_ERR_IO, "%s/%s: cannot remove: %s", d->path, name, strerror(errno));
    return TS_OK;
}

ts_status ts_dir_remove_flat(const ts_dir *d, const char *name) {
    int kind;
    ts_status s = ts_dir_kind(d, name, &kind);
    if (s != TS_OK || kind == 0) return s;
    if (kind != 2)
        return ts_fail(TS_ERR_IO, "%s/%s is not a directory; not removing it", d->path, name);
    ts_dir sub;
    if ((s = ts_dir_sub(&sub, d, name, 0)) != TS_OK) return s;
    DIR *dd;
    if ((s = ts_dir_list(&sub, &dd)) != TS_OK) {
        ts_dir_close(&sub);
        return s;
    }
    /* Two passes: everything is checked before anything is removed. */
    for (int pass = 0; pass < 2 && s == TS_OK; pass++) {
        rewinddir(dd);
        struct dirent *e;
        while (s == TS_OK && (e = readdir(dd))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            struct stat st;
            if (fstatat(sub.fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
            if (S_ISLNK(st.st_mode))
                s = ts_fail(TS_ERR_IO,
                            "%s/%s is a symbolic link; tessel does not follow links in a run "
                            "directory (remove it); nothing was removed",
                            sub.path, e->d_name);
            else if (!S_ISREG(st.st_mode))
                s = ts_fail(TS_ERR_IO,
                            "%s: holds '%s', which is not a regular file; nothing was removed",
                            sub.path, e->d_name);
            else if (pass == 1 && unlinkat(sub.fd, e->d_name, 0) != 0 && errno != ENOENT)
                s = ts_fail(TS_ERR_IO, "%s/%s: cannot remove: %s", sub.path, e->d_name,
                            strerror(errno));
        }
    }
    closedir(dd);
    ts_dir_close(&sub);
    if (s == TS_OK && unlinkat(d->fd, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
        s = ts_fail(TS_ERR_IO, "%s/%s: cannot remove directory: %s", d->path, name,
                    strerror(errno));
    return s;
}

ts_status ts_dir_list(const ts_dir *d, DIR **out) {
    int fd2 = dup(d->fd);
    DIR *dd = fd2 >= 0 ? fdopendir(fd2) : NULL;
    if (!dd) {
        int e = errno;
        if (fd2 >= 0) close(fd2);
        *out = NULL;
        return ts_fail(TS_ERR_IO, "%s: cannot list: %s", d->path, strerror(e));
    }
    rewinddir(dd);
    *out = dd;
    return TS_OK;
}

ts_status ts_dir_sync(const ts_dir *d) {
    /* Some file systems cannot sync a directory (EINVAL): nothing to make
     * durable there. */
    if (fsync(d->fd) != 0 && errno != EINVAL && errno != ENOTSUP)
        return ts_fail(TS_ERR_IO, "%s: fsync of directory failed: %s", d->path, strerror(errno));
    return TS_OK;
}
