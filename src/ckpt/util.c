/* Helpers of the checkpoint module: SHA-256 through OpenSSL's EVP
 * interface, hex, canonical JSON and the file-system calls of the commit
 * protocol, each of which reports the path it failed on. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "ckpt_internal.h"
#include "core/fsat.h"

ts_status ts_sha256_file(const char *path, char hex[65]) {
    if (!path || !hex) return ts_fail(TS_ERR_INVALID, "sha256_file: NULL argument");
    return ts_sha256_path(path, hex, NULL);
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int ck_unhex(const char *s, unsigned char *out, size_t n) {
    if (!s || strlen(s) != 2 * n) return 0;
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0) return 0;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    return 1;
}

char *ck_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = ts_alloc(a + b + 2, "path");
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

void ck_utc_now(char buf[32]) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

char *ck_canonical(json_t *obj, const char *skip) {
    json_t *copy = json_copy(obj); /* shallow: only the top level is edited */
    if (!copy) return NULL;
    if (skip) json_object_del(copy, skip);
    char *s = json_dumps(copy, JSON_SORT_KEYS | JSON_COMPACT);
    json_decref(copy);
    return s;
}

ts_status ck_write_sync(const char *path, const void *data, size_t n, mode_t mode, int excl) {
    int fd =
        open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (excl ? O_EXCL : O_TRUNC), mode);
    if (fd < 0) return ts_fail(TS_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    const unsigned char *p = data;
    ts_status s = TS_OK;
    while (n > 0) {
        ssize_t r = write(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            s = ts_fail(TS_ERR_IO, "%s: write failed: %s", path,
                        r < 0 ? strerror(errno) : "no progress");
            break;
        }
        p += r;
        n -= (size_t)r;
    }
    if (s == TS_OK && fsync(fd) != 0)
        s = ts_fail(TS_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
    if (close(fd) != 0 && s == TS_OK)
        s = ts_fail(TS_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    return s;
}

ts_status ck_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ts_fail(TS_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    ts_status s = TS_OK;
    /* Some file systems cannot sync a directory (EINVAL): nothing to make
     * durable there. */
    if (fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP)
        s = ts_fail(TS_ERR_IO, "%s: fsync of directory failed: %s", dir, strerror(errno));
    close(fd);
    return s;
}

ts_status ck_read_file(const char *path, size_t max, char **out, size_t *n) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ts_fail(errno == ENOENT ? TS_ERR_NOT_FOUND : TS_ERR_IO, "%s: cannot open: %s", path,
                       strerror(errno));
    return ts_fd_read_all(fd, path, max, out, n);
}

void ck_step_name(char buf[40], int64_t step) {
    snprintf(buf, 40, "step-%08lld", (long long)step);
}

int64_t ck_parse_step_name(const char *name) {
    if (strncmp(name, "step-", 5) != 0) return -1;
    const char *p = name + 5;
    if (!*p || strlen(p) > 18) return -1;
    int64_t v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

json_t *ck_int_array(const int64_t *v, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(v[i])) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}
