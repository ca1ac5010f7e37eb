/* Memory-mapped token files: a corpus larger than memory trains without
 * being copied.
 *
 * ts_data_load_tokens expands every token to two int64 (x and y): 8x the
 * file for uint16 tokens, so a 4 GB corpus asks for 32 GB. Here the file is
 * mapped read-only and a batch's windows are widened to int64 as the loader
 * assembles it, giving exactly the values the in-memory path stores.
 *
 * Resident memory stays small: the hashing pass drops each chunk's pages
 * from the process once hashed (the kernel keeps them in its page cache),
 * and the loader and the split drop the mapping's pages again after every
 * 16 windows they read (DROP_WINDOWS, dataset.c), so touched pages never add
 * up to the file. Counting windows and not bytes matters: the kernel maps a
 * whole page-cache folio (up to 2 MiB) on a fault, so each shuffled window
 * may bring in far more than its bytes; a drop is one madvise and the next
 * faults find the pages still in the page cache.
 *
 * The lineage hash covers the mapped bytes as they were read at load time;
 * pages read back later come from the file, so the file must not change
 * while a run uses it (as for any memory-mapped input).
 *
 * ts_data_map_tokens_async returns before that pass: a thread hashes and
 * checks the shards while training starts (hashing 4 GB takes seconds),
 * and ts_dataset_lineage_wait collects the hashes (or the first error)
 * into the lineage. Meanwhile no unchecked token reaches a batch: every
 * window is checked against the vocabulary as it is widened, with the
 * load pass's message. Each shard's size and modification and change
 * times are compared after it is hashed with those at mapping: a file
 * changed while hashing is an error, since its hash would not name the
 * bytes trained on.
 *
 * A sharded corpus (data.path a directory, or a glob pattern) maps every
 * shard: shards are taken in byte order of their names, each is hashed
 * once into the lineage, and windows never cross a shard (shard k holds
 * (tokens_k - 1) / ctx windows, numbered after those of shards 0..k-1).
 * One shard named directly gives exactly the windows of the single file. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <pthread.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/sha256.h"
#include "data/data_internal.h"

/* Bytes hashed and checked between two drops in the load pass. */
#define HASH_CHUNK ((size_t)8 << 20)

typedef struct shard {
    uint8_t *base;
    size_t len;
    int64_t first; /* its first window's number */
    char *path;
    int fd;          /* open until hashed: its status then is compared with st */
    struct stat st;  /* at mapping */
    char sha256[65]; /* "" until hashed */
} shard;

struct ts_token_map {
    int refs; /* datasets sharing the mapping (an unsplit one and its views) */
    shard *sh;
    int n;
    int bits;
    int64_t ctx, vocab;
    /* The hashing pass on a thread (ts_data_map_tokens_async). */
    pthread_t thread;
    int running;  /* started and not yet joined */
    int stop;     /* set by the last unref: the thread returns early */
    int finished; /* under mu: the thread is done (joining will not block) */
    pthread_mutex_t mu;
    ts_status err; /* the pass's result, kept for every later wait */
    char msg[1024];
};

static int64_t token(const uint8_t *buf, int bits, size_t i) {
    return bits == 16 ? ts_le16(buf + 2 * i) : ts_le32(buf + 4 * i);
}

/* Hands the mapping's pages back to the page cache; the next read maps
 * them again. MADV_DONTNEED on a read-only private mapping only drops page
 * table entries, so it cannot lose data. */
static void drop(uint8_t *p, size_t len) {
    if (len) (void)madvise(p, len, MADV_DONTNEED);
}

void ts_token_map_ref(ts_token_map *m) {
    if (m) m->refs++;
}

static void join(ts_token_map *m) {
    if (!m->running) return;
    pthread_join(m->thread, NULL);
    pthread_mutex_destroy(&m->mu);
    m->running = 0;
}

void ts_token_map_unref(ts_token_map *m) {
    if (!m || --m->refs > 0) return;
    __atomic_store_n(&m->stop, 1, __ATOMIC_RELAXED);
    join(m);
    for (int k = 0; k < m->n; k++) {
        if (m->sh[k].base) munmap(m->sh[k].base, m->sh[k].len);
        if (m->sh[k].fd >= 0) close(m->sh[k].fd);
        free(m->sh[k].path);
    }
    free(m->sh);
    free(m);
}

void ts_token_map_drop(ts_token_map *m) {
    for (int k = 0; m && k < m->n; k++) drop(m->sh[k].base, m->sh[k].len);
}

ts_status ts_token_map_window(ts_token_map *m, int64_t w, int64_t *x, int64_t *y) {
    int lo = 0, hi = m->n - 1; /* the last shard whose first window is <= w */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (m->sh[mid].first <= w)
            lo = mid;
        else
            hi = mid - 1;
    }
    const shard *sh = &m->sh[lo];
    const int64_t ctx = m->ctx;
    const size_t first = (size_t)(w - sh->first) * (size_t)ctx;
    int64_t worst = 0;
    for (int64_t i = 0; i < ctx; i++) {
        x[i] = token(sh->base, m->bits, first + (size_t)i);
        y[i] = token(sh->base, m->bits, first + (size_t)i + 1);
        worst = y[i] > worst ? y[i] : worst;
    }
    if (x[0] < m->vocab && worst < m->vocab) return TS_OK;
    /* The hashing pass may not have reached this window yet: the first
     * bad token, named as that pass names it. */
    const size_t tb = (size_t)m->bits / 8;
    for (int64_t i = 0; i <= ctx; i++) {
        const int64_t t = token(sh->base, m->bits, first + (size_t)i);
        if (t >= m->vocab)
            return ts_fail(TS_ERR_FORMAT,
                           "%s: token at byte offset %zu is %lld, not below the vocabulary size "
                           "%lld",
                           sh->path, (first + (size_t)i) * tb, (long long)t, (long long)m->vocab);
    }
    return TS_OK;
}

/* The largest of ntok little-endian tokens at p. On a little-endian host
 * native loads (memcpy) read the same values as ts_le16 / ts_le32 and the
 * compiler turns the loop into vector maxima; baseline x86-64 has no
 * unsigned 16-bit maximum (SSE4.1), so an AVX2 copy is chosen at run time
 * where the CPU has it. */
static inline int64_t max_native(const uint8_t *p, int bits, size_t ntok) {
    if (bits == 16) {
        uint16_t hi = 0;
        for (size_t i = 0; i < ntok; i++) {
            uint16_t t;
            memcpy(&t, p + 2 * i, sizeof t);
            hi = t > hi ? t : hi;
        }
        return hi;
    }
    uint32_t hi = 0;
    for (size_t i = 0; i < ntok; i++) {
        uint32_t t;
        memcpy(&t, p + 4 * i, sizeof t);
        hi = t > hi ? t : hi;
    }
    return hi;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) static int64_t max_avx2(const uint8_t *p, int bits, size_t ntok) {
    return max_native(p, bits, ntok);
}
#endif

static int64_t chunk_max(const uint8_t *p, int bits, size_t ntok) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#if defined(__x86_64__) && defined(__GNUC__)
    static int avx2 = -1;
    if (avx2 < 0) avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    if (avx2) return max_avx2(p, bits, ntok);
#endif
    return max_native(p, bits, ntok);
#else
    uint32_t hi = 0;
    for (size_t i = 0; i < ntok; i++) {
        const uint32_t t = bits == 16 ? ts_le16(p + 2 * i) : ts_le32(p + 4 * i);
        hi = t > hi ? t : hi;
    }
    return hi;
#endif
}

/* Hashes the whole mapping and checks every token against vocab in one
 * pass, chunk by chunk, dropping each chunk once done; *stop (when set by
 * another thread) ends it early with TS_ERR_INTERNAL. */
static ts_status hash_and_check(const char *path, const shard *m, int bits, int64_t vocab,
                                char hex[65], int *stop) {
    ts_sha256 h = {NULL};
    ts_status s = ts_sha256_begin(&h, path);
    if (s != TS_OK) return s;
    const size_t tb = (size_t)bits / 8;
    (void)madvise(m->base, m->len, MADV_SEQUENTIAL);
    for (size_t off = 0; off < m->len; off += HASH_CHUNK) {
        if (__atomic_load_n(stop, __ATOMIC_RELAXED)) {
            ts_sha256_abort(&h);
            return ts_fail(TS_ERR_INTERNAL, "%s: hashing stopped", path);
        }
        const size_t n = m->len - off < HASH_CHUNK ? m->len - off : HASH_CHUNK;
        ts_sha256_update(&h, m->base + off, n);
        /* Every token is checked, including an unused tail: a value out of
         * range means the file and the vocabulary do not belong together.
         * The chunk's largest token first (a loop without exits, which the
         * compiler vectorises); only a chunk holding a bad one is searched. */
        if (chunk_max(m->base + off, bits, n / tb) < vocab) {
            drop(m->base + off, n);
            continue;
        }
        for (size_t i = off / tb; i < (off + n) / tb; i++) {
            const int64_t t = token(m->base, bits, i);
            if (t >= vocab) {
                ts_sha256_abort(&h);
                drop(m->base, m->len);
                return ts_fail(TS_ERR_FORMAT,
                               "%s: token at byte offset %zu is %lld, not below the vocabulary "
                               "size %lld",
                               path, i * tb, (long long)t, (long long)vocab);
            }
        }
        drop(m->base + off, n);
    }
    (void)madvise(m->base, m->len, MADV_RANDOM);
    ts_sha256_end(&h, hex);
    return TS_OK;
}

/* Maps one shard and adds it to the lineage, its hash left for the pass
 * (hash_all). The descriptor stays open until then. */
static ts_status map_shard(const char *path, ts_token_map *m, ts_dataset *d) {
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ts_fail(errno == ENOENT ? TS_ERR_NOT_FOUND : TS_ERR_IO, "%s: cannot open: %s", path,
                       strerror(errno));
    struct stat st;
    ts_status s = TS_OK;
    if (fstat(fd, &st) != 0) s = ts_fail(TS_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    const size_t len = s == TS_OK && st.st_size > 0 ? (size_t)st.st_size : 0;
    size_t ntok = 0;
    if (s == TS_OK) s = ts_tokens_count(path, len, m->bits, &ntok);
    if (s == TS_OK) s = ts_tokens_check_window(path, ntok, m->ctx);
    shard *sh = &m->sh[m->n];
    void *base = MAP_FAILED;
    if (s == TS_OK && (base = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED)
        s = ts_fail(TS_ERR_IO, "%s: cannot map %zu bytes: %s", path, len, strerror(errno));
    if (s != TS_OK) {
        close(fd);
        return s;
    }
    *sh = (shard){.base = base, .len = len, .first = d->n, .fd = fd, .st = st};
    m->n++; /* unmapped and closed with the map from here on */
    ts_lineage lin = {0};
    lin.bytes = (int64_t)len;
    if (!(sh->path = ts_strdup(path)) || !(lin.path = ts_strdup(path))) return TS_ERR_NOMEM;
    s = ts_dataset_add_lineage(d, &lin);
    ts_lineage_clear(&lin);
    d->n += (int64_t)(ntok - 1) / m->ctx;
    return s;
}

/* The shard's status now against that at mapping: same size, same
 * modification and change times (a write or a truncation changes them). */
static ts_status unchanged(const shard *sh) {
    struct stat now;
    if (fstat(sh->fd, &now) != 0)
        return ts_fail(TS_ERR_IO, "%s: cannot stat: %s", sh->path, strerror(errno));
    if (now.st_size != sh->st.st_size || now.st_mtim.tv_sec != sh->st.st_mtim.tv_sec ||
        now.st_mtim.tv_nsec != sh->st.st_mtim.tv_nsec ||
        now.st_ctim.tv_sec != sh->st.st_ctim.tv_sec ||
        now.st_ctim.tv_nsec != sh->st.st_ctim.tv_nsec)
        return ts_fail(TS_ERR_IO,
                       "%s: the file changed while it was hashed (size %lld -> %lld bytes or its "
                       "modification time moved): its hash would not name the tokens trained on; "
                       "do not write a data file while a run uses it",
                       sh->path, (long long)sh->st.st_size, (long long)now.st_size);
    return TS_OK;
}

/* The load pass over every shard in order, stopping at the first error. */
static void *hash_all(void *arg) {
    ts_token_map *m = arg;
    ts_status s = TS_OK;
    /* Nice 19: the first steps keep the cores (a 4 GB corpus is about 2
     * CPU s of hashing, which doubled W3's first step beside it). Unlike
     * SCHED_IDLE (the checkpoint's hashers) it still gets a small share
     * under load, and a core whenever the step or a waiter leaves one:
     * nobody can take a SHA-256 stream over, so the pass must not starve. */
    (void)setpriority(PRIO_PROCESS, (id_t)gettid(), 19); /* failure costs only the steps' speed */
    for (int k = 0; s == TS_OK && k < m->n; k++) {
        shard *sh = &m->sh[k];
        char hex[65];
        s = hash_and_check(sh->path, sh, m->bits, m->vocab, hex, &m->stop);
        if (s == TS_OK) s = unchanged(sh);
        if (s == TS_OK) memcpy(sh->sha256, hex, sizeof hex);
        close(sh->fd);
        sh->fd = -1;
    }
    pthread_mutex_lock(&m->mu);
    m->err = s;
    if (s != TS_OK) snprintf(m->msg, sizeof m->msg, "%s", ts_last_error());
    m->finished = 1;
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

int ts_dataset_lineage_pending(const ts_dataset *d) {
    ts_token_map *m = d ? d->tokens : NULL;
    if (!m || !m->running) return 0;
    pthread_mutex_lock(&m->mu);
    const int pending = !m->finished;
    pthread_mutex_unlock(&m->mu);
    return pending;
}

ts_status ts_dataset_lineage_wait(ts_dataset *d) {
    ts_token_map *m = d ? d->tokens : NULL;
    if (!m || !d->lineage) return TS_OK;
    join(m);
    if (m->err != TS_OK) return ts_fail(m->err, "%s", m->msg);
    /* The shards are the lineage entries of the data set that mapped them
     * (a split's parts carry copies taken when they were made). */
    for (int k = 0; k < m->n && k < d->n_lineage; k++)
        memcpy(d->lineage[k].sha256, m->sh[k].sha256, sizeof m->sh[k].sha256);
    return TS_OK;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The shards `path` names: a directory's files (not those whose name
 * starts with '.'), the matches of a glob pattern, or the file itself;
 * sorted by name (byte order), so every run sees the same order. */
static ts_status list_shards(const char *path, char ***out, int *n) {
    *out = NULL;
    *n = 0;
    struct stat st;
    char **v = NULL;
    int cnt = 0, cap = 0;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        DIR *dir = opendir(path);
        if (!dir) return ts_fail(TS_ERR_IO, "%s: cannot list: %s", path, strerror(errno));
        ts_status s = TS_OK;
        for (struct dirent *e; s == TS_OK && (e = readdir(dir));) {
            if (e->d_name[0] == '.') continue;
            size_t len = strlen(path) + strlen(e->d_name) + 2;
            char *f = ts_alloc(len, "shard path");
            if (!f || ts_grow((void **)&v, &cap, cnt + 1, sizeof *v, "shard list") != TS_OK) {
                free(f);
                s = TS_ERR_NOMEM;
                break;
            }
            snprintf(f, len, "%s/%s", path, e->d_name);
            struct stat fs;
            if (stat(f, &fs) != 0 || !S_ISREG(fs.st_mode)) {
                free(f);
                continue;
            }
            v[cnt++] = f;
        }
        closedir(dir);
        if (s == TS_OK && cnt == 0)
            s = ts_fail(TS_ERR_NOT_FOUND, "%s: a directory with no token files in it", path);
        if (s != TS_OK) {
            for (int i = 0; i < cnt; i++) free(v[i]);
            free(v);
            return s;
        }
        qsort(v, (size_t)cnt, sizeof *v, by_name);
    } else if (strpbrk(path, "*?[") && access(path, F_OK) != 0) {
        glob_t g;
        int rc = glob(path, GLOB_ERR, NULL, &g); /* sorted by name */
        if (rc == GLOB_NOMATCH) return ts_fail(TS_ERR_NOT_FOUND, "%s: no file matches", path);
        if (rc != 0) return ts_fail(TS_ERR_IO, "%s: cannot expand the pattern", path);
        ts_status s = TS_OK;
        if (!(v = ts_zalloc(sizeof *v * (g.gl_pathc + 1), "shard list"))) s = TS_ERR_NOMEM;
        for (size_t i = 0; s == TS_OK && i < g.gl_pathc; i++)
            if (!(v[cnt++] = ts_strdup(g.gl_pathv[i]))) s = TS_ERR_NOMEM;
        globfree(&g);
        if (s != TS_OK) {
            for (int i = 0; i < cnt; i++) free(v[i]);
            free(v);
            return s;
        }
    } else {
        if (!(v = ts_zalloc(sizeof *v, "shard list")) || !(v[0] = ts_strdup(path))) {
            free(v);
            return TS_ERR_NOMEM;
        }
        cnt = 1;
    }
    *out = v;
    *n = cnt;
    return TS_OK;
}

ts_status ts_data_map_tokens_async(const char *path, int bits, int64_t ctx, int64_t vocab,
                                   ts_dataset **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "tokens: no output pointer");
    *out = NULL;
    const char *p = path ? path : "(null)";
    if (!path) return ts_fail(TS_ERR_INVALID, "reading a file: no path given");
    if (bits != 16 && bits != 32)
        return ts_fail(TS_ERR_INVALID, "%s: token width %d bits (16 or 32 are read)", p, bits);
    if (ctx < 1) return ts_fail(TS_ERR_INVALID, "%s: context length %lld", p, (long long)ctx);
    if (vocab < 1) return ts_fail(TS_ERR_INVALID, "%s: vocabulary size %lld", p, (long long)vocab);
    char **files = NULL;
    int nf = 0;
    ts_status s = list_shards(path, &files, &nf);
    if (s != TS_OK) return s;
    ts_token_map *m = ts_zalloc(sizeof *m, "token map");
    ts_dataset *d = ts_zalloc(sizeof *d, "dataset");
    if (m) m->sh = ts_zalloc(sizeof *m->sh * (size_t)nf, "token shards");
    if (!m || !m->sh || !d) s = TS_ERR_NOMEM;
    if (s == TS_OK) {
        m->refs = 1, m->bits = bits, m->ctx = ctx, m->vocab = vocab;
        d->x_dtype = d->y_dtype = TS_I64;
        d->x_rank = d->y_rank = 1;
        d->x_dims[0] = d->y_dims[0] = ctx;
        d->tokens = m;
        d->shuffle_bijection = 1;
        m = NULL;
    }
    for (int k = 0; s == TS_OK && k < nf; k++) s = map_shard(files[k], d->tokens, d);
    if (s == TS_OK) {
        ts_token_map *tm = d->tokens;
        int rc = pthread_mutex_init(&tm->mu, NULL);
        if (rc == 0 && (rc = pthread_create(&tm->thread, NULL, hash_all, tm)) != 0)
            pthread_mutex_destroy(&tm->mu);
        if (rc != 0)
            s = ts_fail(TS_ERR_INTERNAL, "%s: cannot start the hashing thread: %s", p,
                        strerror(rc));
        else
            tm->running = 1;
    }
    if (s != TS_OK && nf > 1) ts_error_prefix("data.path %s (%d shards)", path, nf);
    for (int k = 0; k < nf; k++) free(files[k]);
    free(files);
    if (m) free(m->sh);
    free(m);
    if (s != TS_OK) {
        ts_dataset_free(d);
        return s;
    }
    *out = d;
    return TS_OK;
}

ts_status ts_data_map_tokens(const char *path, int bits, int64_t ctx, int64_t vocab,
                             ts_dataset **out) {
    ts_status s = ts_data_map_tokens_async(path, bits, ctx, vocab, out);
    if (s != TS_OK || (s = ts_dataset_lineage_wait(*out)) == TS_OK) return s;
    if ((*out)->tokens->n > 1) ts_error_prefix("data.path %s (%d shards)", path, (*out)->tokens->n);
    ts_dataset_free(*out);
    *out = NULL;
    return s;
}
