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
 * while a run uses it (as for any memory-mapped input). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/sha256.h"
#include "data/data_internal.h"

/* Bytes hashed and checked between two drops in the load pass. */
#define HASH_CHUNK ((size_t)8 << 20)

struct ts_token_map {
    int refs; /* datasets sharing the mapping (an unsplit one and its views) */
    uint8_t *base;
    size_t len;
    int bits;
    int64_t ctx;
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

void ts_token_map_unref(ts_token_map *m) {
    if (!m || --m->refs > 0) return;
    if (m->base) munmap(m->base, m->len);
    free(m);
}

void ts_token_map_drop(ts_token_map *m) {
    if (m) drop(m->base, m->len);
}

void ts_token_map_window(ts_token_map *m, int64_t w, int64_t *x, int64_t *y) {
    const int64_t ctx = m->ctx;
    const size_t first = (size_t)w * (size_t)ctx;
    for (int64_t i = 0; i < ctx; i++) {
        x[i] = token(m->base, m->bits, first + (size_t)i);
        y[i] = token(m->base, m->bits, first + (size_t)i + 1);
    }
}

/* Hashes the whole mapping and checks every token against vocab in one
 * pass, chunk by chunk, dropping each chunk once done. */
static ts_status hash_and_check(const char *path, const ts_token_map *m, int64_t vocab,
                                char hex[65]) {
    ts_sha256 h = {NULL};
    ts_status s = ts_sha256_begin(&h, path);
    if (s != TS_OK) return s;
    const size_t tb = (size_t)m->bits / 8;
    (void)madvise(m->base, m->len, MADV_SEQUENTIAL);
    for (size_t off = 0; off < m->len; off += HASH_CHUNK) {
        const size_t n = m->len - off < HASH_CHUNK ? m->len - off : HASH_CHUNK;
        ts_sha256_update(&h, m->base + off, n);
        /* Every token is checked, including an unused tail: a value out of
         * range means the file and the vocabulary do not belong together. */
        for (size_t i = off / tb; i < (off + n) / tb; i++) {
            const int64_t t = token(m->base, m->bits, i);
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

ts_status ts_data_map_tokens(const char *path, int bits, int64_t ctx, int64_t vocab,
                             ts_dataset **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "tokens: no output pointer");
    *out = NULL;
    const char *p = path ? path : "(null)";
    if (!path) return ts_fail(TS_ERR_INVALID, "reading a file: no path given");
    if (bits != 16 && bits != 32)
        return ts_fail(TS_ERR_INVALID, "%s: token width %d bits (16 or 32 are read)", p, bits);
    if (ctx < 1) return ts_fail(TS_ERR_INVALID, "%s: context length %lld", p, (long long)ctx);
    if (vocab < 1) return ts_fail(TS_ERR_INVALID, "%s: vocabulary size %lld", p, (long long)vocab);

    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ts_fail(errno == ENOENT ? TS_ERR_NOT_FOUND : TS_ERR_IO, "%s: cannot open: %s", path,
                       strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        ts_status s = ts_fail(TS_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return s;
    }
    const size_t len = st.st_size > 0 ? (size_t)st.st_size : 0;
    size_t ntok = 0;
    ts_status s = TS_OK;
    ts_token_map *m = NULL;
    ts_dataset *d = NULL;
    ts_lineage lin = {0};
    if ((s = ts_tokens_count(path, len, bits, &ntok)) != TS_OK ||
        (s = ts_tokens_check_window(path, ntok, ctx)) != TS_OK)
        goto done;
    if (!(m = ts_zalloc(sizeof *m, "token map"))) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    m->refs = 1, m->len = len, m->bits = bits, m->ctx = ctx;
    void *base = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (base == MAP_FAILED) {
        s = ts_fail(TS_ERR_IO, "%s: cannot map %zu bytes: %s", path, len, strerror(errno));
        goto done;
    }
    m->base = base;
    if ((s = hash_and_check(path, m, vocab, lin.sha256)) != TS_OK) goto done;
    lin.bytes = (int64_t)len;
    if (!(lin.path = ts_strdup(path)) || !(d = ts_zalloc(sizeof *d, "dataset"))) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    d->n = (int64_t)(ntok - 1) / ctx;
    d->x_dtype = d->y_dtype = TS_I64;
    d->x_rank = d->y_rank = 1;
    d->x_dims[0] = d->y_dims[0] = ctx;
    d->tokens = m;
    m = NULL;
    s = ts_dataset_add_lineage(d, &lin);
done:
    close(fd);
    ts_lineage_clear(&lin);
    ts_token_map_unref(m);
    if (s != TS_OK) {
        ts_dataset_free(d);
        return s;
    }
    *out = d;
    return TS_OK;
}
