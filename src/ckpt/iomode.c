/* iomode.c — O_DIRECT or the page cache for checkpoint files, measured
 * once per file system (see ck_io_choose in pipe.h).
 *
 * Neither wins everywhere: O_DIRECT skips a copy and the writeback, but
 * some devices and file systems (tmpfs refuses it; network and overlay
 * file systems may emulate it slowly) write faster through the cache. The
 * choice only changes speed: the files hold the same bytes either way.
 * The cache is keyed by device number and file-system type, so a new
 * mount or another disk is measured again. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include "ckpt/pipe.h"
#include "tessel/ckpt.h"

#define PROBE_BYTES ((size_t)64 << 20)
#define PROBE_NAME  ".tessel-io-probe"
#define MAX_SEEN    16

static pthread_mutex_t seen_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char key[64];
    ck_io_mode mode;
} seen[MAX_SEEN];
static int nseen;

const char *ck_io_mode_name(ck_io_mode m) {
    return m == CK_IO_DIRECT ? "direct" : "buffered";
}

static int cache_path(char *out, size_t n) {
    return ts_cache_dir("TESSEL_CKPT_IO_CACHE", out, n);
}

static int cache_lookup(const char *key, ck_io_mode *mode) {
    char dir[900], path[1000], line[256];
    if (!cache_path(dir, sizeof dir)) return 0;
    snprintf(path, sizeof path, "%s/ckpt-io.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        char k[64], m[16];
        if (line[0] == '#' || sscanf(line, "%63s %15s", k, m) != 2 || strcmp(k, key)) continue;
        if (!strcmp(m, "direct")) *mode = CK_IO_DIRECT, found = 1;
        if (!strcmp(m, "buffered")) *mode = CK_IO_BUFFERED, found = 1;
    }
    fclose(f);
    return found;
}

/* Appends the measurement; a failure only means measuring again next time. */
static void cache_store(const char *key, ck_io_mode mode, double direct_gbs, double buffered_gbs) {
    char dir[900], path[1000];
    if (!cache_path(dir, sizeof dir)) return;
    char parent[900];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash) *slash = 0, (void)mkdir(parent, 0755);
    (void)mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/ckpt-io.txt", dir);
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "%s %s direct=%.2fGB/s buffered=%.2fGB/s\n", key, ck_io_mode_name(mode), direct_gbs,
            buffered_gbs);
    fclose(f);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Seconds to write `buf` durably as one file through a pipe of `mode`. */
static ts_status probe_once(int dirfd, const char *dir_path, ck_io_mode mode,
                            const unsigned char *buf, double *secs) {
    char shown[1100];
    snprintf(shown, sizeof shown, "%s/%s", dir_path, PROBE_NAME);
    ck_pipe *p;
    ts_status st = ck_pipe_new(mode, 2, 6, &p);
    if (st != TS_OK) return st;
    ck_part part = {buf, PROBE_BYTES, -1};
    uint64_t n;
    double t0 = now_s();
    st = ck_pipe_file(p, dirfd, PROBE_NAME, shown, &part, 1, NULL, NULL, &n);
    ts_status fin = ck_pipe_finish(p);
    *secs = now_s() - t0;
    ck_pipe_free(p);
    unlinkat(dirfd, PROBE_NAME, 0);
    return st != TS_OK ? st : fin;
}

static int direct_supported(int dirfd) {
    int fd = openat(dirfd, PROBE_NAME ".tmp",
                    O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | O_DIRECT, 0644);
    if (fd < 0) return 0;
    close(fd);
    unlinkat(dirfd, PROBE_NAME ".tmp", 0);
    return 1;
}

static ts_status probe(int dirfd, const char *dir_path, ck_io_mode *mode, double *gd, double *gb) {
    *gd = *gb = 0;
    if (!direct_supported(dirfd)) {
        *mode = CK_IO_BUFFERED;
        return TS_OK;
    }
    unsigned char *buf = ts_alloc(PROBE_BYTES, "checkpoint I/O probe");
    if (!buf) return TS_ERR_NOMEM;
    /* Not zeros: a compressing file system would not write them. */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i + 8 <= PROBE_BYTES; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(buf + i, &x, 8);
    }
    /* Alternating twice, the better of each: on a shared machine one
     * round may be disturbed. */
    double best[2] = {0, 0};
    ts_status st = TS_OK;
    for (int r = 0; r < 4 && st == TS_OK; r++) {
        double t;
        st = probe_once(dirfd, dir_path, r % 2 ? CK_IO_BUFFERED : CK_IO_DIRECT, buf, &t);
        if (st == TS_OK && (best[r % 2] == 0 || t < best[r % 2])) best[r % 2] = t;
    }
    free(buf);
    if (st != TS_OK) return st;
    *gd = (double)PROBE_BYTES / best[0] / 1e9;
    *gb = (double)PROBE_BYTES / best[1] / 1e9;
    /* The page cache must win clearly: it also costs a copy of every byte
     * on a CPU the training step may want, and a 64 MiB probe reuses the
     * pages its previous round freed, which a checkpoint many times larger
     * cannot (on this project's VM, filling fresh page-cache pages ran at
     * a fifth of the probe's speed). */
    *mode = best[1] * 1.25 < best[0] ? CK_IO_BUFFERED : CK_IO_DIRECT;
    return TS_OK;
}

static ts_status choose(int dirfd, const char *dir_path, int measure, ck_io_mode *mode,
                        const char **source) {
    const char *src = "env";
    const char *e = getenv("TESSEL_CKPT_IO");
    if (e && *e && strcmp(e, "auto")) {
        if (!strcmp(e, "direct"))
            *mode = CK_IO_DIRECT;
        else if (!strcmp(e, "buffered"))
            *mode = CK_IO_BUFFERED;
        else
            return ts_fail(TS_ERR_INVALID, "TESSEL_CKPT_IO='%.40s': use direct, buffered or auto",
                           e);
        if (source) *source = src;
        return TS_OK;
    }
    struct stat st;
    struct statfs sf;
    if (fstat(dirfd, &st) != 0 || fstatfs(dirfd, &sf) != 0)
        return ts_fail(TS_ERR_IO, "%s: cannot stat its file system: %s", dir_path, strerror(errno));
    char key[64];
    snprintf(key, sizeof key, "dev-%u:%u-fs-%lx", major(st.st_dev), minor(st.st_dev),
             (unsigned long)sf.f_type);
    pthread_mutex_lock(&seen_mu);
    int hit = 0;
    for (int i = 0; i < nseen && !hit; i++)
        if (!strcmp(seen[i].key, key)) *mode = seen[i].mode, hit = 1;
    pthread_mutex_unlock(&seen_mu);
    if (hit) {
        src = "process";
    } else if (cache_lookup(key, mode)) {
        src = "cache";
    } else if (!measure) {
        *mode = direct_supported(dirfd) ? CK_IO_DIRECT : CK_IO_BUFFERED;
        if (source) *source = "default";
        return TS_OK; /* not remembered: a later large save measures */
    } else {
        double gd, gb;
        ts_status s = probe(dirfd, dir_path, mode, &gd, &gb);
        if (s != TS_OK) return s;
        cache_store(key, *mode, gd, gb);
        src = "probe";
    }
    if (!hit) {
        pthread_mutex_lock(&seen_mu);
        if (nseen < MAX_SEEN) {
            snprintf(seen[nseen].key, sizeof seen[nseen].key, "%s", key);
            seen[nseen++].mode = *mode;
        }
        pthread_mutex_unlock(&seen_mu);
    }
    if (source) *source = src;
    return TS_OK;
}

ts_status ck_io_choose(int dirfd, const char *dir_path, ck_io_mode *mode, const char **source) {
    return choose(dirfd, dir_path, 1, mode, source);
}

ts_status ck_io_peek(int dirfd, const char *dir_path, ck_io_mode *mode, const char **source) {
    return choose(dirfd, dir_path, 0, mode, source);
}

ts_status ts_ckpt_io_mode(const char *run_dir, const char **mode, const char **source) {
    if (!run_dir || !mode) return ts_fail(TS_ERR_INVALID, "ts_ckpt_io_mode: NULL argument");
    int fd = open(run_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ts_fail(TS_ERR_IO, "%s: cannot open: %s", run_dir, strerror(errno));
    ck_io_mode m;
    ts_status st = ck_io_choose(fd, run_dir, &m, source);
    close(fd);
    if (st == TS_OK) *mode = ck_io_mode_name(m);
    return st;
}
