/* save_shards.c — a checkpoint's shard files: cut from the snapshot,
 * hashed (SHA-256 per file, CRC-32C per tensor) and written through the
 * pipe (pipe.h) by parallel threads. A background save hashes on idle CPU
 * time until someone waits for it (docs/checkpoints.md, "Performance"). */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "ckpt/safetensors.h"
#include "ckpt/save_internal.h"
#include "core/crc32c.h"

#define SHARD_MIN_BYTES ((size_t)16 << 20)
#define IO_PROBE_MIN    ((uint64_t)64 << 20) /* smaller saves do not measure the disk */

static int by_dtype_size(const void *a, const void *b, void *ctx) {
    const sv_tensor *t = ctx;
    int x = *(const int *)a, y = *(const int *)b;
    size_t sx = ts_dtype_size(t[x].dtype), sy = ts_dtype_size(t[y].dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return x < y ? -1 : x > y; /* stable: arena order */
}

/* Cut parameters and state into files of about total / (2 * threads)
 * bytes (at least SHARD_MIN_BYTES), so the writer threads stay busy to the
 * end; a tensor is never split across files. */
ts_status ck_plan_shards(ts_ckpt_saver *s) {
    uint64_t total = 0;
    for (int i = 0; i < s->nt; i++) total += s->t[i].skip ? 0 : s->t[i].bytes;
    uint64_t target = total / (uint64_t)(2 * s->threads);
    if (target < SHARD_MIN_BYTES) target = SHARD_MIN_BYTES;
    s->shards = ts_zalloc(sizeof *s->shards * (size_t)(s->nt + 1), "ckpt shards");
    if (!s->shards) return TS_ERR_NOMEM;
    /* kinds: parameters, replicated state, this rank's sharded state */
    static const char *const prefix[3] = {"params", "state", "optim"};
    int counters[3] = {0, 0, 0};
    for (int kind = 0; kind < 3; kind++) {
        sv_shard *cur = NULL;
        for (int i = 0; i < s->nt; i++) {
            const sv_tensor *t = &s->t[i];
            if (t->skip || (t->sharded ? 2 : t->is_state) != kind) continue;
            if (!cur || (cur->bytes > 0 && cur->bytes + s->t[i].bytes > target)) {
                cur = &s->shards[s->ns++];
                snprintf(cur->file, sizeof cur->file, "%s-r%d-%03d.safetensors", prefix[kind],
                         kind == 2 ? s->rank : 0, counters[kind]++);
                cur->sharded = kind == 2;
                cur->members = ts_alloc(sizeof(int) * (size_t)s->nt, "ckpt shard");
                if (!cur->members) return TS_ERR_NOMEM;
            }
            cur->members[cur->n++] = i;
            cur->bytes += s->t[i].bytes;
            s->t[i].shard = (int)(cur - s->shards);
        }
    }
    /* The safetensors writer lays tensors out back to back: larger elements
     * first keeps every tensor aligned for its dtype. */
    for (int k = 0; k < s->ns; k++)
        qsort_r(s->shards[k].members, (size_t)s->shards[k].n, sizeof(int), by_dtype_size, s->t);
    return TS_OK;
}

/* What the writer hands over, piece by piece, before writing it: the
 * file's SHA-256 and each tensor's CRC-32C are computed on those bytes
 * while they are in cache, so hashing costs no second pass over memory and
 * the file hash is exactly the hash of the bytes written (a load re-hashes
 * the file, so a write that went wrong still cannot pass as good). The
 * state is the shard's, so whichever thread holds the shard adds to it. */
static void hash_piece(void *user, int tensor, const void *data, size_t n) {
    sv_shard *sh = user;
    ts_sha256_update(&sh->sha_ctx, data, n);
    if (tensor >= 0) sh->crc[tensor] = ts_crc32c(sh->crc[tensor], data, n);
}

static void shard_release(sv_shard *sh) {
    free(sh->parts);
    free(sh->prefix);
    free(sh->path);
    free(sh->crc);
    sh->parts = NULL, sh->prefix = NULL, sh->path = NULL, sh->crc = NULL;
}

/* The safetensors prefix, the parts to stream and the open temporary
 * file: the shard's cursor. */
static ts_status shard_open(ts_ckpt_saver *s, const ts_dir *dir, sv_shard *sh) {
    ts_st_writer *w;
    ts_status st = ts_st_writer_new(&w);
    if (st != TS_OK) return st;
    sh->parts = ts_alloc(sizeof *sh->parts * (size_t)(sh->n + 1), "ckpt shard parts");
    sh->crc = ts_zalloc(sizeof *sh->crc * (size_t)(sh->n + 1), "ckpt shard parts");
    if (!sh->parts || !sh->crc) st = TS_ERR_NOMEM;
    for (int j = 0; j < sh->n && st == TS_OK; j++) {
        sv_tensor *t = &s->t[sh->members[j]];
        sh->parts[j + 1] = (ck_part){src_at(s, t->off), t->bytes, j};
        st = ts_st_writer_add(w, t->name, t->dtype, t->rank, t->dims, src_at(s, t->off));
    }
    sh->path = ck_join(dir->path, sh->file);
    if (!sh->path && st == TS_OK) st = TS_ERR_NOMEM;
    size_t plen = 0;
    if (st == TS_OK) st = ts_st_writer_prefix(w, sh->path, &sh->prefix, &plen);
    ts_st_writer_free(w);
    if (st == TS_OK) st = ts_sha256_begin(&sh->sha_ctx, sh->path);
    if (st != TS_OK) return st;
    sh->parts[0] = (ck_part){sh->prefix, plen, -1};
    st = ck_pipe_open(s->pipe, dir->fd, sh->file, sh->path, sh->parts, sh->n + 1, hash_piece, sh,
                      &sh->cur);
    if (st != TS_OK) ts_sha256_abort(&sh->sha_ctx);
    return st;
}

/* The shard's last byte is hashed and handed to the I/O threads (which
 * may still be writing it: ck_pipe_finish). */
static void shard_close(ts_ckpt_saver *s, sv_shard *sh) {
    ts_sha256_end(&sh->sha_ctx, sh->sha);
    for (int j = 0; j < sh->n; j++) s->t[sh->members[j]].crc = sh->crc[j];
}

/* This thread's time on a CPU and waiting for one, in ns (0 if unknown).
 * The CPU time comes from the thread's CPU clock, exact when read;
 * schedstat's run time is brought up to date only at scheduler events, so
 * a worker that hashed a small shard within one slice would read 0. */
static void thread_sched(long long *run, long long *wait) {
    *run = *wait = 0;
    long long sched_run = 0;
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    if (f) {
        if (fscanf(f, "%lld %lld", &sched_run, wait) != 2) *wait = 0;
        fclose(f);
    }
    struct timespec ts;
    *run = clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0
               ? (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec
               : sched_run;
}

/* The next shard to advance, held by the caller: one begun and not held
 * (finishing files frees their buffers), else a new one while fewer than
 * max_open are open (each open file may keep a buffer: more would leave
 * none to take). -1: none now. With wmu held. */
static int pick_shard(ts_ckpt_saver *s) {
    for (int k = 0; k < s->ns; k++)
        if (s->shards[k].state == SH_OPEN) return k;
    if (s->n_open >= s->max_open) return -1;
    for (int k = 0; k < s->ns; k++)
        if (s->shards[k].state == SH_TODO) return k;
    return -1;
}

/* Hash and hand over pieces of any shard not held by another thread until
 * every shard is done. A piece at a time: a thread that loses its CPU
 * holds a shard for one piece at most, so a thread that takes over waits
 * for little. */
static void hash_shards(ts_ckpt_saver *s) {
    long long run0, wait0, run1, wait1;
    thread_sched(&run0, &wait0);
    pthread_mutex_lock(&s->wmu);
    while (s->wdir && s->n_done < s->ns) {
        int k = pick_shard(s);
        if (k < 0) {
            s->n_idle++;
            pthread_cond_wait(&s->wcv, &s->wmu);
            s->n_idle--;
            continue;
        }
        sv_shard *sh = &s->shards[k];
        int fresh = sh->state == SH_TODO;
        sh->state = SH_HELD;
        s->n_open += fresh;
        pthread_mutex_unlock(&s->wmu);
        ts_status st = fresh ? shard_open(s, s->wdir, sh) : TS_OK;
        int done = st != TS_OK;
        if (st == TS_OK) st = ck_pipe_advance(s->pipe, sh->cur, CK_PIECE, &done, &sh->file_bytes);
        if (st != TS_OK) {
            sh->st = st;
            snprintf(sh->err, sizeof sh->err, "%s", ts_last_error());
        } else if (done) {
            shard_close(s, sh);
        }
        if (done) shard_release(sh);
        pthread_mutex_lock(&s->wmu);
        sh->state = done ? SH_DONE : SH_OPEN;
        s->n_open -= done;
        s->n_done += done;
        if (s->n_idle) pthread_cond_broadcast(&s->wcv);
        if (s->n_done == s->ns) pthread_cond_broadcast(&s->bcv);
    }
    pthread_mutex_unlock(&s->wmu);
    thread_sched(&run1, &wait1);
    atomic_fetch_add(&s->run_ns, run1 - run0);
    atomic_fetch_add(&s->wait_ns, wait1 - wait0);
}

/* A hasher of a background save: it runs only on CPU time nothing else
 * of normal priority wants (SCHED_IDLE), so the training step beside it
 * keeps its cores; a waking step thread preempts it at once. An
 * unprivileged thread cannot leave SCHED_IDLE again, so these threads
 * never speed up: when someone waits for the save, the saver's own thread
 * and the waiter take the remaining pieces over at their priority. */
static void *idle_hasher(void *arg) {
    ts_ckpt_saver *s = arg;
    struct sched_param sp = {0};
    (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp); /* failure costs speed only */
    hash_shards(s);
    return NULL;
}

static void *full_hasher(void *arg) {
    hash_shards(arg);
    return NULL;
}

/* Hashers, one per core (at most the shard count and `threads`); the
 * pipe's two I/O threads keep two writes in flight while they hash. A
 * background save hashes on idle CPU time until someone waits for it
 * (ts_ckpt_saver_wait), a synchronous one at full priority from the start. */
ts_status ck_write_shards(ts_ckpt_saver *s, const ts_dir *dir) {
    atomic_store(&s->run_ns, 0);
    atomic_store(&s->wait_ns, 0);
    ts_status st = TS_OK;
    /* Measuring costs 256 MiB of writes: not for small checkpoints. */
    uint64_t total = 0;
    for (int k = 0; k < s->ns; k++) total += s->shards[k].bytes;
    if (!s->io_mode)
        st = total >= IO_PROBE_MIN ? ck_io_choose(s->run.fd, s->run_dir, &s->io_mode, NULL)
                                   : ck_io_peek(s->run.fd, s->run_dir, &s->io_mode, NULL);
    if (st != TS_OK) return st;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int most = (int)(ncpu < 1 ? 1 : ncpu > 8 ? 8 : ncpu);
    if (most > s->threads) most = s->threads;
    int hashers = most > s->ns ? (s->ns > 0 ? s->ns : 1) : most;
    /* One pipe for the saver's life (its buffers are allocated and touched
     * once): two buffers per hasher it can have and one per I/O thread, or
     * fewer for a small checkpoint (any count is enough to make progress). */
    uint64_t fit = total / CK_CHUNK + 2;
    int nbufs = fit < (uint64_t)(2 * most + 2) ? (int)fit : 2 * most + 2;
    if (!s->pipe && (st = ck_pipe_new(s->io_mode, 2, nbufs, &s->pipe)) != TS_OK) return st;
    pthread_mutex_lock(&s->wmu);
    s->wdir = dir;
    s->n_open = s->n_done = 0;
    /* each open file may keep a buffer; one is left to take */
    s->max_open = nbufs - 1 < hashers + 2 ? nbufs - 1 : hashers + 2;
    if (s->max_open < 1) s->max_open = 1;
    for (int k = 0; k < s->ns; k++) s->shards[k].state = SH_TODO;
    pthread_mutex_unlock(&s->wmu);
    pthread_t th[8];
    int started = 0;
    /* A synchronous save: this thread is one of the hashers. A background
     * one: as many as the step leaves cores free hash at normal priority
     * (train.threads below the core count), the others on idle time. */
    for (; started < hashers - !s->background && started < 8; started++)
        if (pthread_create(&th[started], NULL,
                           s->background && started >= s->free_cores ? idle_hasher : full_hasher,
                           s) != 0)
            break;
    /* Until someone waits for the save (at once for a synchronous one),
     * this thread only waits; then it hashes too (at its own priority),
     * and hashes alone if no helper started. */
    pthread_mutex_lock(&s->wmu);
    while (s->background && started > 0 && !s->boost && s->n_done < s->ns)
        pthread_cond_wait(&s->bcv, &s->wmu);
    pthread_mutex_unlock(&s->wmu);
    hash_shards(s);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    pthread_mutex_lock(&s->wmu);
    s->wdir = NULL;
    pthread_mutex_unlock(&s->wmu);
    st = ck_pipe_finish(s->pipe);
    for (int k = 0; k < s->ns; k++)
        if (s->shards[k].st != TS_OK) return ts_fail(s->shards[k].st, "%s", s->shards[k].err);
    return st;
}

/* Someone waits for the save: the saver's thread stops waiting and hashes
 * too, and so does the caller, at their priority, until every shard is
 * handed over. */
void ck_save_boost(ts_ckpt_saver *s) {
    pthread_mutex_lock(&s->wmu);
    s->boost = 1;
    pthread_cond_broadcast(&s->bcv);
    pthread_mutex_unlock(&s->wmu);
    hash_shards(s);
}
