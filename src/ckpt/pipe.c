/* pipe.c — checkpoint files written as a pipeline (see pipe.h).
 *
 * Before this, each shard thread hashed a piece, copied it into a staging
 * buffer and wrote the buffer itself: while its write() waited for the
 * device, that thread hashed nothing. Here the hashers never call write():
 * a full buffer is queued for the I/O threads and the hasher takes a free
 * one. The disk then sees up to `io_threads` writes in flight at all times
 * and the hashers' cores stay busy hashing.
 *
 * With O_DIRECT the buffers go straight to the device (no page-cache copy,
 * no writeback afterwards, and the training data keeps its place in the
 * cache); through the page cache, each buffer's writeback is started as it
 * is written. Which is faster depends on the device and file system, so it
 * is measured (ck_io_choose). */
#include "ckpt/pipe.h"
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

typedef struct pf { /* a file being written */
    struct pf *next;
    int fd, at;
    int padded; /* a last buffer was rounded up to CK_ALIGN: cut the file after */
    char *tmp, *name, *shown;
    uint64_t size;
    int pending; /* buffers queued or being written */
    int sealed;  /* the hasher has queued its last buffer */
    ts_status st;
    char err[512];
} pf;

typedef struct job {
    pf *f;
    unsigned char *buf;
    size_t len;
    uint64_t off;
} job;

struct ck_pipe {
    ck_io_mode mode;
    pthread_mutex_t mu;
    pthread_cond_t cv_free, cv_job, cv_done;
    unsigned char *mem; /* every buffer, one aligned block */
    unsigned char **free_bufs;
    int nfree, nbufs;
    job *q; /* ring of nbufs jobs */
    int qhead, qn;
    int stop, busy; /* busy: files not ended */
    pthread_t *th;
    int nth;
    pf *files;
};

static void set_err(pf *f, ts_status st, const char *fmt, const char *a, const char *b) {
    if (f->st != TS_OK) return;
    f->st = st;
    snprintf(f->err, sizeof f->err, fmt, a, b);
}

/* Writes one buffer at its offset; falls back to the page cache when the
 * file system opened the file O_DIRECT but refuses the write (same bytes). */
static void write_job(job *j, pthread_mutex_t *mu) {
    pf *f = j->f;
    size_t done = 0;
    while (done < j->len) {
        ssize_t r = pwrite(f->fd, j->buf + done, j->len - done, (off_t)(j->off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EINVAL) {
            int fl = fcntl(f->fd, F_GETFL);
            if (fl != -1 && (fl & O_DIRECT) && fcntl(f->fd, F_SETFL, fl & ~O_DIRECT) == 0) continue;
        }
        if (r <= 0) {
            const char *why = r < 0 ? strerror(errno) : "no progress";
            pthread_mutex_lock(mu);
            set_err(f, TS_ERR_IO, "%s: writing failed: %s", f->shown, why);
            pthread_mutex_unlock(mu);
            return;
        }
        done += (size_t)r;
    }
    /* Through the page cache: start this range's writeback now, so the
     * fsync at the end finds little left to do. Not supported everywhere;
     * fsync covers it all. */
    int fl = fcntl(f->fd, F_GETFL);
    if (fl != -1 && !(fl & O_DIRECT))
        (void)sync_file_range(f->fd, (off64_t)j->off, (off64_t)j->len, SYNC_FILE_RANGE_WRITE);
}

/* The file's last byte is written: its length, fsync, close, rename. */
static void end_file(pf *f, pthread_mutex_t *mu) {
    ts_status st = TS_OK;
    char err[512] = "";
    pthread_mutex_lock(mu);
    st = f->st;
    pthread_mutex_unlock(mu);
    if (st == TS_OK && f->padded && ftruncate(f->fd, (off_t)f->size) != 0)
        st = TS_ERR_IO,
        snprintf(err, sizeof err, "%s: cannot set the length: %s", f->shown, strerror(errno));
    if (st == TS_OK && fsync(f->fd) != 0)
        st = TS_ERR_IO,
        snprintf(err, sizeof err, "%s: fsync failed: %s", f->shown, strerror(errno));
    if (close(f->fd) != 0 && st == TS_OK)
        st = TS_ERR_IO,
        snprintf(err, sizeof err, "%s: close failed: %s", f->shown, strerror(errno));
    f->fd = -1;
    struct stat lst;
    if (st == TS_OK && fstatat(f->at, f->name, &lst, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISLNK(lst.st_mode))
        st = TS_ERR_IO,
        snprintf(err, sizeof err, "%s is a symbolic link; not replacing it", f->shown);
    if (st == TS_OK && renameat(f->at, f->tmp, f->at, f->name) != 0)
        st = TS_ERR_IO, snprintf(err, sizeof err, "%s: cannot rename %s into place: %s", f->shown,
                                 f->tmp, strerror(errno));
    if (st != TS_OK) unlinkat(f->at, f->tmp, 0);
    pthread_mutex_lock(mu);
    if (f->st == TS_OK && st != TS_OK) set_err(f, st, "%s%s", err, "");
    pthread_mutex_unlock(mu);
}

static void *io_thread(void *arg) {
    ck_pipe *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->qn && !p->stop) pthread_cond_wait(&p->cv_job, &p->mu);
        if (!p->qn) break;
        job j = p->q[p->qhead];
        p->qhead = (p->qhead + 1) % p->nbufs;
        p->qn--;
        int ok = j.f->st == TS_OK;
        pthread_mutex_unlock(&p->mu);
        if (ok) write_job(&j, &p->mu);
        pthread_mutex_lock(&p->mu);
        p->free_bufs[p->nfree++] = j.buf;
        pthread_cond_signal(&p->cv_free);
        if (--j.f->pending == 0 && j.f->sealed) {
            pthread_mutex_unlock(&p->mu);
            end_file(j.f, &p->mu);
            pthread_mutex_lock(&p->mu);
            p->busy--;
            pthread_cond_broadcast(&p->cv_done);
        }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

ts_status ck_pipe_new(ck_io_mode mode, int io_threads, int nbufs, ck_pipe **out) {
    *out = NULL;
    if (io_threads < 1) io_threads = 1;
    if (nbufs < 2) nbufs = 2;
    ck_pipe *p = ts_zalloc(sizeof *p, "checkpoint pipe");
    if (!p) return TS_ERR_NOMEM;
    p->mode = mode;
    p->nbufs = nbufs;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_free, NULL);
    pthread_cond_init(&p->cv_job, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    void *mem = NULL;
    if (posix_memalign(&mem, CK_ALIGN, CK_CHUNK * (size_t)nbufs) != 0) mem = NULL;
    p->mem = mem;
    p->free_bufs = ts_alloc(sizeof *p->free_bufs * (size_t)nbufs, "checkpoint pipe");
    p->q = ts_alloc(sizeof *p->q * (size_t)nbufs, "checkpoint pipe");
    p->th = ts_alloc(sizeof *p->th * (size_t)io_threads, "checkpoint pipe");
    if (!p->mem || !p->free_bufs || !p->q || !p->th) {
        if (!p->mem) ts_fail(TS_ERR_NOMEM, "checkpoint pipe: cannot allocate %d buffers", nbufs);
        ck_pipe_free(p);
        return TS_ERR_NOMEM;
    }
    /* Touched now, once: a saver keeps its pipe, so no save pays the
     * page faults of fresh buffers. */
    memset(p->mem, 0, CK_CHUNK * (size_t)nbufs);
    for (int i = 0; i < nbufs; i++) p->free_bufs[p->nfree++] = p->mem + CK_CHUNK * (size_t)i;
    for (; p->nth < io_threads; p->nth++)
        if (pthread_create(&p->th[p->nth], NULL, io_thread, p) != 0) break;
    if (p->nth == 0) {
        ck_pipe_free(p);
        return ts_fail(TS_ERR_INTERNAL, "checkpoint pipe: cannot start an I/O thread");
    }
    *out = p;
    return TS_OK;
}

static unsigned char *take_buf(ck_pipe *p) {
    pthread_mutex_lock(&p->mu);
    while (!p->nfree) pthread_cond_wait(&p->cv_free, &p->mu);
    unsigned char *b = p->free_bufs[--p->nfree];
    pthread_mutex_unlock(&p->mu);
    return b;
}

static void give_back(ck_pipe *p, unsigned char *buf) {
    pthread_mutex_lock(&p->mu);
    p->free_bufs[p->nfree++] = buf;
    pthread_cond_signal(&p->cv_free);
    pthread_mutex_unlock(&p->mu);
}

/* Queues buf; 0 if the file already failed (buf is given back). */
static int submit(ck_pipe *p, pf *f, unsigned char *buf, size_t len, uint64_t off) {
    pthread_mutex_lock(&p->mu);
    int ok = f->st == TS_OK;
    if (ok) {
        p->q[(p->qhead + p->qn) % p->nbufs] = (job){f, buf, len, off};
        p->qn++;
        f->pending++;
        pthread_cond_signal(&p->cv_job);
    } else {
        p->free_bufs[p->nfree++] = buf;
        pthread_cond_signal(&p->cv_free);
    }
    pthread_mutex_unlock(&p->mu);
    return ok;
}

static int open_tmp(int at, const char *tmp, int direct) {
    /* O_NOFOLLOW: a link planted as the temporary name is never written
     * through. */
    int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW;
    if (direct) {
        int fd = openat(at, tmp, flags | O_DIRECT, 0644);
        if (fd >= 0 || errno != EINVAL) return fd;
    }
    return openat(at, tmp, flags, 0644);
}

static pf *file_new(ck_pipe *p, int at, const char *name, const char *shown) {
    pf *f = ts_zalloc(sizeof *f, "checkpoint pipe file");
    size_t n = strlen(name);
    if (f) f->tmp = ts_alloc(n + 5, "checkpoint pipe file");
    if (f && f->tmp) {
        memcpy(f->tmp, name, n);
        memcpy(f->tmp + n, ".tmp", 5);
        f->name = ts_strdup(name);
        f->shown = ts_strdup(shown);
    }
    if (!f || !f->tmp || !f->name || !f->shown) {
        if (f) free(f->tmp), free(f->name), free(f->shown);
        free(f);
        return NULL;
    }
    f->at = at;
    f->fd = -1;
    (void)p;
    return f;
}

/* Where a file's stream stands: the next byte to copy and the buffer being
 * filled. Advanced by one thread at a time (any thread). */
struct ck_pfile {
    pf *f;
    const ck_part *parts;
    int nparts, part;
    size_t in_part; /* bytes of parts[part] already streamed */
    ck_piece_fn fn;
    void *user;
    unsigned char *cur; /* the buffer being filled, NULL: none taken */
    size_t fill;
    uint64_t off; /* file offset of cur */
    int ok;       /* 0 once the file failed: the rest is skipped */
};

ts_status ck_pipe_open(ck_pipe *p, int dirfd, const char *name, const char *shown,
                       const ck_part *parts, int nparts, ck_piece_fn fn, void *user,
                       ck_pfile **out) {
    *out = NULL;
    ck_pfile *c = ts_zalloc(sizeof *c, "checkpoint pipe file");
    pf *f = c ? file_new(p, dirfd, name, shown) : NULL;
    if (!f) {
        free(c);
        return ts_fail(TS_ERR_NOMEM, "%s: out of memory", shown);
    }
    if ((f->fd = open_tmp(dirfd, f->tmp, p->mode == CK_IO_DIRECT)) < 0) {
        ts_status s =
            ts_fail(TS_ERR_IO, "%s: cannot create %s: %s", shown, f->tmp,
                    errno == ELOOP ? "it is a symbolic link (not followed)" : strerror(errno));
        free(f->tmp), free(f->name), free(f->shown), free(f), free(c);
        return s;
    }
    pthread_mutex_lock(&p->mu);
    f->next = p->files;
    p->files = f;
    p->busy++;
    pthread_mutex_unlock(&p->mu);
    *c = (ck_pfile){.f = f, .parts = parts, .nparts = nparts, .fn = fn, .user = user, .ok = 1};
    *out = c;
    return TS_OK;
}

/* The last byte is streamed: hand over the last buffer and end the file
 * here if no write of it is still in flight. */
static void seal(ck_pipe *p, ck_pfile *c) {
    pf *f = c->f;
    uint64_t size = c->off + c->fill;
    if (c->cur && c->fill > 0 && c->ok) {
        size_t len = c->fill;
        if (p->mode == CK_IO_DIRECT) {
            len = TS_ALIGN_UP(c->fill, CK_ALIGN);
            memset(c->cur + c->fill, 0, len - c->fill);
            f->padded = len != c->fill;
        }
        c->ok = submit(p, f, c->cur, len, c->off);
    } else if (c->cur) {
        give_back(p, c->cur);
    }
    c->cur = NULL;
    pthread_mutex_lock(&p->mu);
    f->size = size;
    f->sealed = 1;
    int last = f->pending == 0;
    pthread_mutex_unlock(&p->mu);
    if (last) {
        end_file(f, &p->mu);
        pthread_mutex_lock(&p->mu);
        p->busy--;
        pthread_cond_broadcast(&p->cv_done);
        pthread_mutex_unlock(&p->mu);
    }
}

ts_status ck_pipe_advance(ck_pipe *p, ck_pfile *c, size_t budget, int *done, uint64_t *bytes) {
    *done = 0;
    size_t moved = 0;
    while (c->part < c->nparts && c->ok && moved < budget) {
        const ck_part *pt = &c->parts[c->part];
        size_t left = pt->bytes - c->in_part;
        if (left == 0) {
            c->part++, c->in_part = 0;
            continue;
        }
        if (!c->cur) c->cur = take_buf(p);
        size_t take = CK_CHUNK - c->fill;
        if (take > left) take = left;
        if (take > CK_PIECE) take = CK_PIECE;
        memcpy(c->cur + c->fill, (const unsigned char *)pt->data + c->in_part, take);
        /* hashed from the copy, while it is in L1/L2 */
        if (c->fn) c->fn(c->user, pt->tensor, c->cur + c->fill, take);
        c->fill += take;
        c->in_part += take;
        moved += take;
        if (c->fill == CK_CHUNK) {
            c->ok = submit(p, c->f, c->cur, c->fill, c->off);
            c->off += c->fill;
            c->cur = NULL;
            c->fill = 0;
        }
    }
    if (c->part < c->nparts && c->ok) return TS_OK;
    /* every byte streamed (or the file failed: ck_pipe_finish reports it) */
    uint64_t size = c->off + c->fill;
    seal(p, c);
    if (bytes) *bytes = size;
    free(c);
    *done = 1;
    return TS_OK;
}

ts_status ck_pipe_file(ck_pipe *p, int dirfd, const char *name, const char *shown,
                       const ck_part *parts, int nparts, ck_piece_fn fn, void *user,
                       uint64_t *bytes) {
    ck_pfile *c;
    ts_status st = ck_pipe_open(p, dirfd, name, shown, parts, nparts, fn, user, &c);
    int done = 0;
    while (st == TS_OK && !done) st = ck_pipe_advance(p, c, SIZE_MAX, &done, bytes);
    return st;
}

ts_status ck_pipe_finish(ck_pipe *p) {
    pthread_mutex_lock(&p->mu);
    while (p->busy > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    /* The first failure by name (shard names sort in shard order), so the
     * message does not depend on which thread got there first. */
    const pf *bad = NULL;
    for (const pf *f = p->files; f; f = f->next)
        if (f->st != TS_OK && (!bad || strcmp(f->name, bad->name) < 0)) bad = f;
    ts_status st = bad ? ts_fail(bad->st, "%s", bad->err) : TS_OK;
    /* Every file has ended: the pipe takes the next save's files. */
    for (pf *f = p->files, *nx; f; f = nx) {
        nx = f->next;
        free(f->tmp), free(f->name), free(f->shown), free(f);
    }
    p->files = NULL;
    pthread_mutex_unlock(&p->mu);
    return st;
}

void ck_pipe_free(ck_pipe *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    while (p->busy > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv_job);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nth; i++) pthread_join(p->th[i], NULL);
    for (pf *f = p->files, *nx; f; f = nx) {
        nx = f->next;
        if (f->fd >= 0) close(f->fd);
        free(f->tmp), free(f->name), free(f->shown), free(f);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_free);
    pthread_cond_destroy(&p->cv_job);
    pthread_cond_destroy(&p->cv_done);
    free(p->mem);
    free(p->free_bufs);
    free(p->q);
    free(p->th);
    free(p);
}
