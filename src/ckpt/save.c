/* Saving checkpoints: snapshot, shards, manifest, signature and the commit
 * protocol (docs/checkpoints.md).
 *
 * ts_ckpt_saver_begin() copies the plan's persistent regions into a host
 * buffer (that copy is the whole stall the training loop sees) and hands
 * the buffer to a background thread, which
 *   1. writes the shards into RUN/step-N.tmp/ — several files written and
 *      hashed by parallel threads, each fsync'ed by the safetensors writer,
 *   2. writes and fsyncs manifest.json (signed), fsyncs the directory,
 *   3. renames step-N.tmp to step-N and fsyncs RUN,
 *   4. writes LATEST.tmp, fsyncs it, renames it over LATEST, fsyncs RUN,
 *   5. logs the save to the audit log and applies retention.
 * A crash at any moment leaves LATEST naming the previous checkpoint or
 * the new one, and both complete; leftovers are "*.tmp" names that resume
 * ignores and ts_ckpt_gc() removes. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include "ckpt/safetensors.h"
#include "ckpt_internal.h"
#include "core/crc32c.h"
#include "tessel/tessel.h"

#define SHARD_MIN_BYTES ((size_t)16 << 20)
#define HASH_BLOCK      ((size_t)1 << 20)

typedef struct sv_tensor {
    char *name;
    int is_state;
    ts_dtype dtype;
    int rank;
    int64_t dims[TS_MAX_RANK];
    size_t bytes, off; /* in the snapshot */
    uint32_t crc;
    int shard;
} sv_tensor;

typedef struct sv_shard {
    char file[64];
    int *members; /* tensor indices in file order */
    int n;
    uint64_t bytes, file_bytes;
    char sha[CK_SHA_HEX];
    ts_status st;
    char err[1024];
} sv_shard;

struct ts_ckpt_saver {
    char *run_dir;
    int threads, keep_last, keep_every;
    int background; /* lower the writer threads' priority (not for ts_ckpt_save) */
    ts_audit *audit;
    ck_key key;

    unsigned char *buf; /* the snapshot */
    size_t buf_bytes;

    /* the job being written (owned by the background thread while running) */
    sv_tensor *t;
    int nt;
    sv_shard *shards;
    int ns;
    int64_t step;
    int64_t updates_applied; /* optimizer updates applied (steps minus skipped ones) */
    uint64_t seed;
    char config_sha[CK_SHA_HEX];
    char **data_paths, **data_shas;
    int n_data;
    int64_t data_position, epoch;
    atomic_int next_shard;

    pthread_t thread;
    int running;
    ts_status last;
    char last_err[1024];
    ts_ckpt_save_stats stats; /* owned by the caller's thread */
    ts_ckpt_save_stats done;  /* written by the background thread, merged by wait() */
};

ts_ckpt_options ts_ckpt_options_default(void) {
    ts_ckpt_options o;
    memset(&o, 0, sizeof o);
    return o;
}

static void job_clear(ts_ckpt_saver *s) {
    for (int i = 0; i < s->nt; i++) free(s->t[i].name);
    free(s->t);
    s->t = NULL;
    s->nt = 0;
    for (int i = 0; i < s->ns; i++) free(s->shards[i].members);
    free(s->shards);
    s->shards = NULL;
    s->ns = 0;
    for (int i = 0; i < s->n_data; i++) {
        free(s->data_paths[i]);
        free(s->data_shas[i]);
    }
    free(s->data_paths);
    free(s->data_shas);
    s->data_paths = s->data_shas = NULL;
    s->n_data = 0;
}

/* (Re)allocate the snapshot buffer. With `prefault`, touch every page now:
 * first-touch page faults on ~300 MB cost about as much as the copy, and
 * belong at start-up rather than in a step's stall. */
static ts_status ensure_buffer(ts_ckpt_saver *s, size_t need, int prefault) {
    if (s->buf && need == s->buf_bytes) return TS_OK;
    ts_aligned_free(s->buf);
    s->buf_bytes = 0;
    if (!(s->buf = ts_aligned_alloc(need ? need : TS_ALIGN, "checkpoint snapshot buffer")))
        return TS_ERR_NOMEM;
    if (prefault) memset(s->buf, 0, need);
    s->buf_bytes = need;
    return TS_OK;
}

ts_status ts_ckpt_saver_new(const char *run_dir, const ts_plan *p, const ts_ckpt_options *opt,
                            ts_ckpt_saver **out) {
    if (!run_dir || !*run_dir || !out) return ts_fail(TS_ERR_INVALID, "ckpt saver: NULL argument");
    *out = NULL;
    ts_ckpt_options o = opt ? *opt : ts_ckpt_options_default();
    if (o.keep_last < 0 || o.keep_every < 0 || o.threads < 0)
        return ts_fail(TS_ERR_INVALID,
                       "ckpt saver: keep_last, keep_every and threads must be >= 0");
    if (mkdir(run_dir, 0755) != 0 && errno != EEXIST)
        return ts_fail(TS_ERR_IO, "%s: cannot create run directory: %s", run_dir, strerror(errno));
    ts_ckpt_saver *s = ts_zalloc(sizeof *s, "ckpt saver");
    if (!s) return TS_ERR_NOMEM;
    if (!(s->run_dir = ts_strdup(run_dir))) {
        free(s);
        return ts_fail(TS_ERR_NOMEM, "ckpt saver: out of memory");
    }
    if (o.sign_key) {
        ts_status st = ck_key_load_secret(o.sign_key, &s->key);
        if (st != TS_OK) {
            free(s->run_dir);
            free(s);
            return st;
        }
    }
    /* Twice the cores: a thread blocked in fsync leaves its core to
     * another thread's hashing. */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    s->threads = o.threads > 0 ? o.threads : (int)(ncpu < 1 ? 2 : ncpu > 4 ? 8 : 2 * ncpu);
    s->keep_last = o.keep_last;
    s->keep_every = o.keep_every;
    s->audit = o.audit;
    s->background = 1;
    if (p && ensure_buffer(s, ts_plan_snapshot_bytes(p), 1) != TS_OK) {
        ts_ckpt_saver_free(s);
        return TS_ERR_NOMEM;
    }
    *out = s;
    return TS_OK;
}

/* ---- shards -------------------------------------------------------------- */

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
static ts_status plan_shards(ts_ckpt_saver *s) {
    uint64_t total = 0;
    for (int i = 0; i < s->nt; i++) total += s->t[i].bytes;
    uint64_t target = total / (uint64_t)(2 * s->threads);
    if (target < SHARD_MIN_BYTES) target = SHARD_MIN_BYTES;
    s->shards = ts_zalloc(sizeof *s->shards * (size_t)(s->nt + 1), "ckpt shards");
    if (!s->shards) return TS_ERR_NOMEM;
    int counters[2] = {0, 0};
    for (int kind = 0; kind < 2; kind++) {
        sv_shard *cur = NULL;
        for (int i = 0; i < s->nt; i++) {
            if (s->t[i].is_state != kind) continue;
            if (!cur || (cur->bytes > 0 && cur->bytes + s->t[i].bytes > target)) {
                cur = &s->shards[s->ns++];
                snprintf(cur->file, sizeof cur->file, "%s-r0-%03d.safetensors",
                         kind ? "state" : "params", counters[kind]++);
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

/* Header bytes of a written shard: the 8-byte length and the JSON. */
static ts_status read_prefix(const char *path, unsigned char **out, size_t *n) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ts_fail(TS_ERR_IO, "%s: cannot reopen: %s", path, strerror(errno));
    unsigned char len8[8];
    ts_status s = TS_OK;
    if (pread(fd, len8, 8, 0) != 8) s = ts_fail(TS_ERR_IO, "%s: cannot read back the header", path);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)len8[i] << (8 * i);
    unsigned char *buf = NULL;
    if (s == TS_OK && hl > ((uint64_t)100 << 20))
        s = ts_fail(TS_ERR_FORMAT, "%s: header of %llu bytes read back", path,
                    (unsigned long long)hl);
    if (s == TS_OK && !(buf = ts_alloc((size_t)hl + 8, path))) s = TS_ERR_NOMEM;
    if (s == TS_OK) {
        memcpy(buf, len8, 8);
        if (pread(fd, buf + 8, (size_t)hl, 8) != (ssize_t)hl)
            s = ts_fail(TS_ERR_IO, "%s: cannot read back the header", path);
    }
    close(fd);
    if (s != TS_OK) {
        free(buf);
        return s;
    }
    *out = buf;
    *n = (size_t)hl + 8;
    return TS_OK;
}

/* Write one shard, then one pass over its data in memory computes both the
 * file's SHA-256 (after the header read back) and each tensor's CRC-32C.
 * The hash covers the bytes handed to write(), and a load re-hashes the
 * file, so a write that went wrong still cannot pass as good. */
static ts_status write_shard(ts_ckpt_saver *s, const char *dir, sv_shard *sh) {
    ts_st_writer *w;
    ts_status st = ts_st_writer_new(&w);
    if (st != TS_OK) return st;
    for (int j = 0; j < sh->n && st == TS_OK; j++) {
        const sv_tensor *t = &s->t[sh->members[j]];
        st = ts_st_writer_add(w, t->name, t->dtype, t->rank, t->dims, s->buf + t->off);
    }
    char *path = ck_join(dir, sh->file);
    if (!path) st = TS_ERR_NOMEM;
    if (st == TS_OK) st = ts_st_writer_save(w, path);
    ts_st_writer_free(w);
    unsigned char *prefix = NULL;
    size_t plen = 0;
    if (st == TS_OK) st = read_prefix(path, &prefix, &plen);
    ts_sha256 h;
    if (st == TS_OK) st = ts_sha256_begin(&h, path);
    if (st == TS_OK) {
        ts_sha256_update(&h, prefix, plen);
        uint64_t fb = plen;
        for (int j = 0; j < sh->n; j++) {
            sv_tensor *t = &s->t[sh->members[j]];
            const unsigned char *p = s->buf + t->off;
            uint32_t crc = 0;
            for (size_t o = 0; o < t->bytes; o += HASH_BLOCK) {
                size_t len = t->bytes - o < HASH_BLOCK ? t->bytes - o : HASH_BLOCK;
                crc = ts_crc32c(crc, p + o, len);
                ts_sha256_update(&h, p + o, len);
            }
            t->crc = crc;
            fb += t->bytes;
        }
        ts_sha256_end(&h, sh->sha);
        sh->file_bytes = fb;
    }
    free(prefix);
    free(path);
    return st;
}

typedef struct worker_arg {
    ts_ckpt_saver *s;
    const char *dir;
} worker_arg;

static void *shard_worker(void *arg) {
    worker_arg *wa = arg;
    ts_ckpt_saver *s = wa->s;
    for (;;) {
        int k = atomic_fetch_add(&s->next_shard, 1);
        if (k >= s->ns) break;
        sv_shard *sh = &s->shards[k];
        sh->st = write_shard(s, wa->dir, sh);
        if (sh->st != TS_OK) snprintf(sh->err, sizeof sh->err, "%s", ts_last_error());
    }
    return NULL;
}

static ts_status write_shards(ts_ckpt_saver *s, const char *dir) {
    atomic_store(&s->next_shard, 0);
    int extra = (s->threads < s->ns ? s->threads : s->ns) - 1;
    pthread_t th[8];
    worker_arg wa = {s, dir};
    int started = 0;
    for (; started < extra && started < 8; started++)
        if (pthread_create(&th[started], NULL, shard_worker, &wa) != 0) break;
    shard_worker(&wa); /* this thread works too; fewer helpers only slow it down */
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    for (int k = 0; k < s->ns; k++)
        if (s->shards[k].st != TS_OK) return ts_fail(s->shards[k].st, "%s", s->shards[k].err);
    return TS_OK;
}

/* ---- manifest ------------------------------------------------------------ */

static json_t *int_array(const int64_t *v, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(v[i])) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* Build the manifest and return its on-disk text (sorted keys, indented;
 * the signature covers the compact sorted form without "signature"). */
static ts_status build_manifest(ts_ckpt_saver *s, char **out, char id[33]) {
    *out = NULL;
    unsigned char rnd[16];
    randombytes_buf(rnd, sizeof rnd);
    ts_hex(rnd, sizeof rnd, id);
    char now[32], seed[24];
    ck_utc_now(now);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)s->seed);
    json_t *m = json_object(), *files = json_array(), *tensors = json_array(),
           *dfiles = json_array();
    int bad = !m || !files || !tensors || !dfiles;
    if (!bad) {
        bad |= json_object_set_new(m, "format", json_string("tessel-checkpoint"));
        bad |= json_object_set_new(m, "format_version", json_integer(1));
        bad |= json_object_set_new(m, "id", json_string(id));
        bad |= json_object_set_new(m, "step", json_integer(s->step));
        bad |= json_object_set_new(m, "updates_applied", json_integer(s->updates_applied));
        bad |= json_object_set_new(m, "time", json_string(now));
        bad |= json_object_set_new(m, "tessel_version", json_string(TESSEL_VERSION));
        bad |= json_object_set_new(m, "config_sha256", json_string(s->config_sha));
        bad |= json_object_set_new(m, "rng",
                                   json_pack("{s:s, s:s, s:I}", "algorithm", "philox4x32-10",
                                             "seed", seed, "step", (json_int_t)s->step));
        for (int i = 0; i < s->n_data && !bad; i++)
            bad |= json_array_append_new(dfiles, json_pack("{s:s, s:s}", "path", s->data_paths[i],
                                                           "sha256", s->data_shas[i]));
        bad |= json_object_set_new(m, "data",
                                   json_pack("{s:O, s:I, s:I}", "files", dfiles, "position",
                                             (json_int_t)s->data_position, "epoch",
                                             (json_int_t)s->epoch));
        bad |= json_object_set_new(m, "world",
                                   json_pack("{s:i, s:s}", "size", 1, "layout", "replicated"));
        for (int k = 0; k < s->ns && !bad; k++)
            bad |= json_array_append_new(files, json_pack("{s:s, s:i, s:I, s:s}", "name",
                                                          s->shards[k].file, "rank", 0, "bytes",
                                                          (json_int_t)s->shards[k].file_bytes,
                                                          "sha256", s->shards[k].sha));
        bad |= json_object_set(m, "files", files);
        for (int i = 0; i < s->nt && !bad; i++) {
            const sv_tensor *t = &s->t[i];
            char crc[9];
            snprintf(crc, sizeof crc, "%08x", t->crc);
            int64_t zero[TS_MAX_RANK] = {0};
            json_t *chunk = json_pack("{s:s, s:i, s:o, s:o, s:s}", "file", s->shards[t->shard].file,
                                      "rank", 0, "offset", int_array(zero, t->rank), "shape",
                                      int_array(t->dims, t->rank), "crc32c", crc);
            bad |= json_array_append_new(tensors,
                                         json_pack("{s:s, s:s, s:s, s:o, s:[o]}", "name", t->name,
                                                   "kind", t->is_state ? "state" : "param", "dtype",
                                                   ts_dtype_name(t->dtype), "shape",
                                                   int_array(t->dims, t->rank), "chunks", chunk));
        }
        bad |= json_object_set(m, "tensors", tensors);
        if (s->audit && !bad) {
            int64_t aseq;
            char ahash[CK_SHA_HEX];
            ck_audit_head(s->audit, &aseq, ahash);
            bad |= json_object_set_new(
                m, "audit_head", json_pack("{s:I, s:s}", "seq", (json_int_t)aseq, "sha256", ahash));
        }
    }
    if (!bad && s->key.has_secret) {
        char *canon = ck_canonical(m, NULL);
        char pk[2 * CK_PK_BYTES + 1], sig[2 * CK_SIG_BYTES + 1];
        bad |= !canon;
        if (canon) {
            ck_sign(&s->key, canon, strlen(canon), sig);
            ts_hex(s->key.pk, CK_PK_BYTES, pk);
            bad |= json_object_set_new(m, "signature",
                                       json_pack("{s:s, s:s, s:s}", "algorithm", "ed25519",
                                                 "public_key", pk, "value", sig));
        }
        free(canon);
    }
    char *text = bad ? NULL : json_dumps(m, JSON_SORT_KEYS | JSON_INDENT(1));
    json_decref(m);
    json_decref(files);
    json_decref(tensors);
    json_decref(dfiles);
    if (!text) return ts_fail(TS_ERR_NOMEM, "%s: cannot build the manifest", s->run_dir);
    *out = text;
    return TS_OK;
}

/* ---- commit ---------------------------------------------------------------- */

/* Move the finished directory to its final name. A directory already there
 * (the same step saved again after a resume) is swapped out atomically, so
 * LATEST never names a missing directory, and then removed. */
static ts_status move_into_place(const char *tmp, const char *final) {
    if (rename(tmp, final) == 0) return TS_OK;
    if (errno != EEXIST && errno != ENOTEMPTY)
        return ts_fail(TS_ERR_IO, "%s: cannot rename to %s: %s", tmp, final, strerror(errno));
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) != 0)
        return ts_fail(TS_ERR_IO, "%s: exists, and cannot be replaced by %s: %s", final, tmp,
                       strerror(errno));
    return ck_remove_flat_dir(tmp); /* now the old one */
}

static ts_status write_latest(const char *run_dir, const char *step_name) {
    char *tmp = ck_join(run_dir, "LATEST.tmp"), *latest = ck_join(run_dir, "LATEST");
    ts_status s = tmp && latest ? TS_OK : TS_ERR_NOMEM;
    char line[64];
    snprintf(line, sizeof line, "%s\n", step_name);
    if (s == TS_OK) s = ck_write_sync(tmp, line, strlen(line), 0644, 0);
    if (s == TS_OK && rename(tmp, latest) != 0)
        s = ts_fail(TS_ERR_IO, "%s: cannot rename over %s: %s", tmp, latest, strerror(errno));
    if (s == TS_OK) s = ck_fsync_dir(run_dir);
    free(tmp);
    free(latest);
    return s;
}

static ts_status run_job(ts_ckpt_saver *s) {
    char step_name[40], tmp_name[48];
    ck_step_name(step_name, s->step);
    snprintf(tmp_name, sizeof tmp_name, "%s.tmp", step_name);
    char *tmp = ck_join(s->run_dir, tmp_name), *final = ck_join(s->run_dir, step_name),
         *mpath = tmp ? ck_join(tmp, "manifest.json") : NULL;
    char *manifest = NULL, id[33] = "";
    ts_status st = tmp && final && mpath ? TS_OK : TS_ERR_NOMEM;
    /* A leftover from a crash at this step: nothing in it is trusted. */
    if (st == TS_OK) st = ck_remove_flat_dir(tmp);
    if (st == TS_OK && mkdir(tmp, 0755) != 0)
        st = ts_fail(TS_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    if (st == TS_OK) st = plan_shards(s);
    if (st == TS_OK) st = write_shards(s, tmp);
    if (st == TS_OK) st = build_manifest(s, &manifest, id);
    if (st == TS_OK) st = ck_write_sync(mpath, manifest, strlen(manifest), 0644, 1);
    if (st == TS_OK) st = ck_fsync_dir(tmp);
    if (st == TS_OK) st = move_into_place(tmp, final);
    if (st == TS_OK) st = ck_fsync_dir(s->run_dir);
    if (st == TS_OK) st = write_latest(s->run_dir, step_name);
    if (st == TS_OK && s->audit) {
        char msha[CK_SHA_HEX];
        uint64_t bytes = 0;
        for (int k = 0; k < s->ns; k++) bytes += s->shards[k].file_bytes;
        st = ts_sha256_mem(manifest, strlen(manifest), msha);
        if (st == TS_OK)
            st = ck_audit_event(s->audit, "save",
                                json_pack("{s:I, s:s, s:s, s:s, s:I, s:b}", "step",
                                          (json_int_t)s->step, "dir", step_name, "id", id,
                                          "manifest_sha256", msha, "bytes", (json_int_t)bytes,
                                          "signed", s->key.has_secret));
    }
    if (st == TS_OK && s->keep_last > 0) {
        st = ts_ckpt_gc(s->run_dir, s->keep_last, s->keep_every, NULL);
        if (st != TS_OK) ts_error_prefix("%s committed, but retention failed", step_name);
    }
    if (st == TS_OK)
        snprintf(s->done.dir, sizeof s->done.dir, "%s", step_name);
    else
        ts_error_prefix("checkpoint %s", final ? final : step_name);
    free(manifest);
    free(mpath);
    free(tmp);
    free(final);
    return st;
}

static void *job_thread(void *arg) {
    ts_ckpt_saver *s = arg;
    /* Hashing competes with the training step for cores, and OpenMP
     * threads that lose their core stall every barrier of the step. At
     * nice 10 the writers take only what the step leaves idle. Linux nice
     * is per thread and the shard workers inherit it; failure only costs
     * speed, so it is ignored. */
    if (s->background) {
        errno = 0;
        int cur = getpriority(PRIO_PROCESS, (id_t)gettid());
        if (errno == 0)
            (void)!setpriority(PRIO_PROCESS, (id_t)gettid(), cur + 10 > 19 ? 19 : cur + 10);
    }
    double t0 = ts_now();
    s->last = run_job(s);
    if (s->last != TS_OK) snprintf(s->last_err, sizeof s->last_err, "%s", ts_last_error());
    double dt = ts_now() - t0;
    uint64_t bytes = 0;
    for (int i = 0; i < s->nt; i++) bytes += s->t[i].bytes;
    if (s->last == TS_OK) {
        s->done.step = s->step;
        s->done.bytes = bytes;
        s->done.write_s = dt;
        s->done.throughput = dt > 0 ? (double)bytes / dt : 0;
    }
    return NULL;
}

ts_status ts_ckpt_saver_wait(ts_ckpt_saver *s) {
    if (!s) return ts_fail(TS_ERR_INVALID, "ckpt saver: NULL");
    if (s->running) {
        pthread_join(s->thread, NULL);
        s->running = 0;
        job_clear(s);
        if (s->last == TS_OK) {
            s->stats.step = s->done.step;
            s->stats.bytes = s->done.bytes;
            s->stats.write_s = s->done.write_s;
            s->stats.throughput = s->done.throughput;
            memcpy(s->stats.dir, s->done.dir, sizeof s->stats.dir);
        }
    }
    ts_status st = s->last;
    s->last = TS_OK;
    if (st != TS_OK) return ts_fail(st, "%s", s->last_err);
    return TS_OK;
}

/* Copy the job's description; the plan and meta may change or go away
 * once begin() returns. */
static ts_status take_job(ts_ckpt_saver *s, const ts_plan *p, const ts_ckpt_meta *meta) {
    int n = ts_plan_persistent_count(p);
    s->t = ts_zalloc(sizeof *s->t * (size_t)(n + 1), "ckpt tensors");
    if (!s->t) return TS_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        ts_persistent pv;
        ts_status st = ts_plan_persistent(p, i, &pv);
        if (st != TS_OK) return st;
        sv_tensor *t = &s->t[s->nt++];
        if (!(t->name = ts_strdup(pv.name))) return ts_fail(TS_ERR_NOMEM, "ckpt: out of memory");
        t->is_state = pv.is_state;
        t->dtype = pv.dtype;
        t->rank = pv.rank;
        memcpy(t->dims, pv.dims, sizeof t->dims);
        t->bytes = pv.bytes;
        t->off = pv.snapshot_off;
    }
    s->step = ts_plan_step_count(p);
    s->updates_applied = ts_plan_updates_applied(p);
    s->seed = ts_plan_seed(p);
    s->config_sha[0] = '\0';
    s->data_position = meta ? meta->data_position : 0;
    s->epoch = meta ? meta->epoch : 0;
    if (meta && meta->config) {
        ts_status st = ts_sha256_mem(meta->config, meta->config_bytes, s->config_sha);
        if (st != TS_OK) return st;
    }
    int nd = meta ? meta->n_data_files : 0;
    if (nd < 0 || (nd > 0 && !meta->data_files))
        return ts_fail(TS_ERR_INVALID, "ckpt: n_data_files %d without data_files", nd);
    if (nd > 0) {
        s->data_paths = ts_zalloc(sizeof(char *) * (size_t)nd, "ckpt lineage");
        s->data_shas = ts_zalloc(sizeof(char *) * (size_t)nd, "ckpt lineage");
        if (!s->data_paths || !s->data_shas) return TS_ERR_NOMEM;
        for (int i = 0; i < nd; i++) {
            const ts_ckpt_data_file *f = &meta->data_files[i];
            if (!f->path || !f->sha256)
                return ts_fail(TS_ERR_INVALID, "ckpt: data file %d has no path or sha256", i);
            s->n_data++;
            s->data_paths[i] = ts_strdup(f->path);
            s->data_shas[i] = ts_strdup(f->sha256);
            if (!s->data_paths[i] || !s->data_shas[i])
                return ts_fail(TS_ERR_NOMEM, "ckpt: out of memory");
        }
    }
    return TS_OK;
}

ts_status ts_ckpt_saver_begin(ts_ckpt_saver *s, const ts_plan *p, const ts_ckpt_meta *meta) {
    if (!s || !p) return ts_fail(TS_ERR_INVALID, "ckpt saver begin: NULL argument");
    double t0 = ts_now();
    ts_status st = ts_ckpt_saver_wait(s);
    if (st != TS_OK) {
        ts_error_prefix("previous checkpoint failed");
        return st;
    }
    size_t need = ts_plan_snapshot_bytes(p);
    if ((st = ensure_buffer(s, need, 0)) != TS_OK) return st;
    double t1 = ts_now();
    st = ts_plan_snapshot(p, s->buf, need);
    double t2 = ts_now();
    if (st == TS_OK) st = take_job(s, p, meta);
    if (st == TS_OK && pthread_create(&s->thread, NULL, job_thread, s) != 0)
        st = ts_fail(TS_ERR_INTERNAL, "ckpt saver: cannot start the writer thread");
    if (st != TS_OK) {
        job_clear(s);
        return st;
    }
    s->running = 1;
    s->stats.snapshot_s = t2 - t1;
    s->stats.stall_s = ts_now() - t0;
    return TS_OK;
}

ts_status ts_ckpt_saver_stats(const ts_ckpt_saver *s, ts_ckpt_save_stats *st) {
    if (!s || !st) return ts_fail(TS_ERR_INVALID, "ckpt saver stats: NULL argument");
    *st = s->stats;
    return TS_OK;
}

void ts_ckpt_saver_free(ts_ckpt_saver *s) {
    if (!s) return;
    if (s->running) {
        pthread_join(s->thread, NULL);
        s->running = 0;
    }
    job_clear(s);
    ts_aligned_free(s->buf);
    ck_key_wipe(&s->key);
    free(s->run_dir);
    free(s);
}

ts_status ts_ckpt_save(const ts_plan *p, const char *run_dir, const ts_ckpt_meta *meta,
                       const ts_ckpt_options *opt) {
    ts_ckpt_saver *s;
    ts_status st = ts_ckpt_saver_new(run_dir, NULL, opt, &s);
    if (st != TS_OK) return st;
    s->background = 0; /* the caller waits: full speed */
    st = ts_ckpt_saver_begin(s, p, meta);
    if (st == TS_OK) st = ts_ckpt_saver_wait(s);
    ts_ckpt_saver_free(s);
    return st;
}

/* ---- garbage collection and retention -------------------------------------- */

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x > y ? -1 : x < y;
}

ts_status ts_ckpt_gc(const char *run_dir, int keep_last, int keep_every, int *removed) {
    if (removed) *removed = 0;
    if (!run_dir) return ts_fail(TS_ERR_INVALID, "ckpt gc: NULL run directory");
    char latest_dir[256] = "";
    char *lp = ck_join(run_dir, "LATEST"), *ltext = NULL;
    if (!lp) return TS_ERR_NOMEM;
    if (ck_read_file(lp, 4096, &ltext, NULL) == TS_OK) {
        ltext[strcspn(ltext, "\r\n")] = '\0';
        snprintf(latest_dir, sizeof latest_dir, "%s", ltext);
    }
    free(ltext);
    free(lp);
    int64_t latest_step = ck_parse_step_name(latest_dir);

    DIR *d = opendir(run_dir);
    if (!d) return ts_fail(TS_ERR_IO, "%s: cannot list: %s", run_dir, strerror(errno));
    int64_t *steps = NULL;
    int n = 0, cap = 0;
    ts_status st = TS_OK;
    struct dirent *e;
    while (st == TS_OK && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len > 4 && !strcmp(e->d_name + len - 4, ".tmp") && !strncmp(e->d_name, "step-", 5)) {
            char *path = ck_join(run_dir, e->d_name);
            st = path ? ck_remove_flat_dir(path) : TS_ERR_NOMEM;
            if (st == TS_OK && removed) (*removed)++;
            free(path);
        } else if (ck_parse_step_name(e->d_name) >= 0) {
            st = ts_grow((void **)&steps, &cap, n + 1, sizeof *steps, "ckpt gc");
            if (st == TS_OK) steps[n++] = ck_parse_step_name(e->d_name);
        }
    }
    closedir(d);
    if (st == TS_OK && keep_last > 0) {
        qsort(steps, (size_t)n, sizeof *steps, cmp_desc);
        for (int i = keep_last; i < n && st == TS_OK; i++) {
            if (steps[i] == latest_step || (keep_every > 0 && steps[i] % keep_every == 0)) continue;
            /* Renamed to a ".tmp" name first: a crash halfway through the
             * removal then leaves a leftover for the next gc, never a
             * checkpoint with files missing. */
            char name[40], doomed[56];
            ck_step_name(name, steps[i]);
            snprintf(doomed, sizeof doomed, "%s.old.tmp", name);
            char *path = ck_join(run_dir, name), *dpath = ck_join(run_dir, doomed);
            st = path && dpath ? TS_OK : TS_ERR_NOMEM;
            if (st == TS_OK && rename(path, dpath) != 0)
                st = ts_fail(TS_ERR_IO, "%s: cannot rename to %s for removal: %s", path, doomed,
                             strerror(errno));
            if (st == TS_OK) st = ck_remove_flat_dir(dpath);
            if (st == TS_OK && removed) (*removed)++;
            free(path);
            free(dpath);
        }
    }
    if (st == TS_OK) {
        char *lt = ck_join(run_dir, "LATEST.tmp");
        if (lt) unlink(lt);
        free(lt);
        st = ck_fsync_dir(run_dir);
    }
    free(steps);
    return st;
}
