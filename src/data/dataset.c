/* Datasets in memory: lineage (SHA-256 of every file read), deterministic
 * splits, and loaders whose batch order is a pure function of (seed, epoch).
 *
 * The split and the loader draw their orders from order.c: pure functions
 * of (seed, epoch), never of a stateful generator, so any position of any
 * epoch can be recomputed from scratch (ts_loader_seek is exact). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "core/sha256.h"
#include "data/data_internal.h"

/* ---- lineage and files --------------------------------------------------- */

/* Reads `path` into *buf in chunks, hashing each chunk as it arrives, so a
 * reader parses exactly the bytes it hashed. */
static ts_status hash_file(const char *path, char hex[65], int64_t *bytes, uint8_t **buf,
                           size_t *len) {
    if (!path) return ts_fail(TS_ERR_INVALID, "reading a file: no path given");
    FILE *f = fopen(path, "rb");
    if (!f)
        return ts_fail(errno == ENOENT ? TS_ERR_NOT_FOUND : TS_ERR_IO, "%s: cannot open: %s", path,
                       strerror(errno));
    enum { CHUNK = 1 << 20 };
    ts_status s = TS_OK;
    uint8_t *data = NULL;
    size_t cap = 0, n = 0;
    ts_sha256 h = {NULL};
    if ((s = ts_sha256_begin(&h, path)) != TS_OK) goto done;
    {
        /* The size on disk is only a first guess (the loop grows the buffer
         * if the file turns out longer); one byte more lets the read that
         * meets the end of a file of exactly that size stop without growing. */
        struct stat st;
        cap = fstat(fileno(f), &st) == 0 && st.st_size > 0 ? (size_t)st.st_size + 1 : CHUNK;
        if (!(data = ts_alloc(cap, path))) {
            s = TS_ERR_NOMEM;
            goto done;
        }
    }
    for (;;) {
        if (n == cap) {
            size_t nc = cap < ((size_t)1 << 62) ? 2 * cap : cap + CHUNK;
            uint8_t *p = ts_realloc(data, nc, path);
            if (!p) {
                s = TS_ERR_NOMEM;
                goto done;
            }
            data = p, cap = nc;
        }
        uint8_t *dst = data + n;
        size_t want = cap - n < CHUNK ? cap - n : CHUNK;
        size_t got = fread(dst, 1, want, f);
        ts_sha256_update(&h, dst, got);
        n += got;
        if (got < want) {
            if (ferror(f)) {
                s = ts_fail(TS_ERR_IO, "%s: read failed after %zu bytes: %s", path, n,
                            strerror(errno));
                goto done;
            }
            break;
        }
    }
    ts_sha256_end(&h, hex);
    if (bytes) *bytes = (int64_t)n;
    *buf = data, *len = n;
    data = NULL;
done:
    ts_sha256_abort(&h); /* no-op after ts_sha256_end */
    free(data);
    fclose(f);
    return s;
}

ts_status ts_data_slurp(const char *path, uint8_t **buf, size_t *len, ts_lineage *lin) {
    memset(lin, 0, sizeof *lin);
    *buf = NULL, *len = 0;
    char *p = ts_strdup(path);
    if (path && !p) return TS_ERR_NOMEM;
    ts_status s = hash_file(path, lin->sha256, &lin->bytes, buf, len);
    if (s != TS_OK) {
        free(p);
        memset(lin, 0, sizeof *lin);
        return s;
    }
    lin->path = p;
    return TS_OK;
}

void ts_lineage_clear(ts_lineage *l) {
    if (!l) return;
    free(l->path);
    memset(l, 0, sizeof *l);
}

ts_status ts_dataset_add_lineage(ts_dataset *d, ts_lineage *l) {
    ts_lineage *p = ts_realloc(d->lineage, (size_t)(d->n_lineage + 1) * sizeof *p, "lineage");
    if (!p) return TS_ERR_NOMEM;
    d->lineage = p;
    d->lineage[d->n_lineage++] = *l;
    memset(l, 0, sizeof *l);
    return TS_OK;
}

/* ---- datasets ------------------------------------------------------------ */

void ts_dataset_free(ts_dataset *d) {
    if (!d) return;
    for (int i = 0; i < d->n_lineage; i++) free(d->lineage[i].path);
    free(d->lineage);
    free(d->x);
    free(d->y);
    ts_token_map_unref(d->tokens);
    ts_xmap_unref(d->xmap);
    free(d->index);
    free(d->norm_mean);
    free(d->norm_std);
    free(d->valid);
    free(d);
}

size_t ts_dataset_x_bytes(const ts_dataset *d) {
    return ts_dtype_size(d->x_dtype) * (size_t)ts_shape_numel(d->x_rank, d->x_dims);
}

size_t ts_dataset_y_bytes(const ts_dataset *d) {
    return ts_dtype_size(d->y_dtype) * (size_t)ts_shape_numel(d->y_rank, d->y_dims);
}

/* Stream purposes: a split and a loader with the same seed shuffle
 * independently (order.c). */
#define PURPOSE_SPLIT  0x74696c7073ULL   /* "split" */
#define PURPOSE_LOADER 0x726564616f6cULL /* "loader" */

/* ---- splits -------------------------------------------------------------- */

ts_status ts_data_split_permutation(int64_t n, uint64_t seed, int64_t *perm) {
    if (n < 0 || (n > 0 && !perm))
        return ts_fail(TS_ERR_INVALID, "split permutation: bad arguments (n %lld)", (long long)n);
    ts_order_permute(perm, n, ts_order_key(seed, PURPOSE_SPLIT), 0);
    return TS_OK;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Mapped windows read between two drops of the mapping's pages: a fault
 * may map a whole page-cache folio (up to 2 MiB), so this bounds what
 * reading windows adds to resident memory (tokmap.c). */
#define DROP_WINDOWS 16

/* Copies example e of d into x and y (one example's bytes each); a mapped
 * token window may hold a token the vocabulary does not (an error). */
static ts_status example(const ts_dataset *d, int64_t e, size_t xb, size_t yb, void *x, void *y) {
    if (d->tokens) return ts_token_map_window(d->tokens, d->index ? d->index[e] : e, x, y);
    if (d->xmap) /* y stays in memory, indexed like the examples */
        ts_xmap_example(d->xmap, d->index ? d->index[e] : e, x);
    else
        memcpy(x, (const char *)d->x + (size_t)e * xb, xb);
    memcpy(y, (const char *)d->y + (size_t)e * yb, yb);
    return TS_OK;
}

/* Drops what reading mapped examples has mapped (token windows or .npy /
 * IDX examples), every DROP_WINDOWS examples and after the last. */
static void drop_mapped(const ts_dataset *d, int64_t i, int64_t count) {
    if (i % DROP_WINDOWS != DROP_WINDOWS - 1 && i != count - 1) return;
    if (d->tokens) ts_token_map_drop(d->tokens);
    if (d->xmap) ts_xmap_drop(d->xmap);
}

ts_status ts_dataset_read(const ts_dataset *d, int64_t first, int64_t count, void *x, void *y) {
    if (!d || !x || !y || first < 0 || count < 0 || count > d->n - first)
        return ts_fail(TS_ERR_INVALID, "dataset read: examples [%lld, +%lld) of %lld",
                       (long long)first, (long long)count, (long long)(d ? d->n : 0));
    const size_t xb = ts_dataset_x_bytes(d), yb = ts_dataset_y_bytes(d);
    if (d->valid) /* the flags follow the targets (ts_dataset_attach_valid) */
        memcpy((char *)y + (size_t)count * yb, d->valid + (size_t)first * (size_t)d->valid_cols,
               (size_t)(count * d->valid_cols));
    if (!d->tokens && !d->xmap) { /* in memory: one copy each */
        memcpy(x, (const char *)d->x + (size_t)first * xb, (size_t)count * xb);
        memcpy(y, (const char *)d->y + (size_t)first * yb, (size_t)count * yb);
        return TS_OK;
    }
    ts_status s = TS_OK;
    for (int64_t i = 0; i < count && s == TS_OK; i++) {
        s = example(d, first + i, xb, yb, (char *)x + (size_t)i * xb, (char *)y + (size_t)i * yb);
        drop_mapped(d, s == TS_OK ? i : count - 1, count);
    }
    return s;
}

/* A copy of `all` holding examples idx[0..count) in that order. Of mapped
 * data, a view: it shares the mapping and keeps an index of examples
 * instead of copying them (a mapped x's y is copied: it is in memory). */
static ts_status subset(const ts_dataset *all, const int64_t *idx, int64_t count,
                        ts_dataset **out) {
    *out = NULL;
    ts_dataset *d = ts_zalloc(sizeof *d, "dataset");
    if (!d) return TS_ERR_NOMEM;
    d->n = count;
    d->shuffle_bijection = all->shuffle_bijection;
    d->x_dtype = all->x_dtype, d->y_dtype = all->y_dtype;
    d->x_rank = all->x_rank, d->y_rank = all->y_rank;
    memcpy(d->x_dims, all->x_dims, sizeof d->x_dims);
    memcpy(d->y_dims, all->y_dims, sizeof d->y_dims);
    const size_t xb = ts_dataset_x_bytes(all), yb = ts_dataset_y_bytes(all);
    if (all->tokens) {
        d->index = ts_alloc((size_t)(count ? count : 1) * sizeof *d->index, "dataset split index");
        if (!d->index) goto nomem;
        for (int64_t i = 0; i < count; i++) d->index[i] = all->index ? all->index[idx[i]] : idx[i];
        d->tokens = all->tokens;
        ts_token_map_ref(d->tokens);
    } else if (all->xmap) {
        d->index = ts_alloc((size_t)(count ? count : 1) * sizeof *d->index, "dataset split index");
        d->y = ts_alloc((size_t)(count ? count : 1) * yb, "dataset split y");
        if (!d->index || !d->y) goto nomem;
        for (int64_t i = 0; i < count; i++) {
            d->index[i] = all->index ? all->index[idx[i]] : idx[i];
            memcpy((char *)d->y + (size_t)i * yb, (const char *)all->y + (size_t)idx[i] * yb, yb);
        }
        d->xmap = all->xmap;
        ts_xmap_ref(d->xmap);
    } else {
        d->x = ts_alloc((size_t)count * xb, "dataset split x");
        d->y = ts_alloc((size_t)count * yb, "dataset split y");
        if (!d->x || !d->y) goto nomem;
        for (int64_t i = 0; i < count; i++) {
            memcpy((char *)d->x + (size_t)i * xb, (const char *)all->x + (size_t)idx[i] * xb, xb);
            memcpy((char *)d->y + (size_t)i * yb, (const char *)all->y + (size_t)idx[i] * yb, yb);
        }
    }
    if (all->valid) { /* the flags go with their examples */
        const size_t vb = (size_t)all->valid_cols;
        if (!(d->valid = ts_alloc((size_t)(count ? count : 1) * vb, "dataset split flags")))
            goto nomem;
        for (int64_t i = 0; i < count; i++)
            memcpy(d->valid + (size_t)i * vb, all->valid + (size_t)idx[i] * vb, vb);
        d->valid_cols = all->valid_cols;
    }
    if (all->n_lineage) {
        d->lineage = ts_zalloc((size_t)all->n_lineage * sizeof *d->lineage, "lineage");
        if (!d->lineage) goto nomem;
        for (int i = 0; i < all->n_lineage; i++) {
            d->lineage[i] = all->lineage[i];
            d->lineage[i].path = NULL;
            d->n_lineage = i + 1;
            if (all->lineage[i].path && !(d->lineage[i].path = ts_strdup(all->lineage[i].path)))
                goto nomem;
        }
    }
    if (all->norm_mean && all->norm_std) {
        size_t nb = (size_t)all->n_norm * sizeof(float);
        d->norm_mean = ts_alloc(nb, "normalisation means");
        d->norm_std = ts_alloc(nb, "normalisation deviations");
        if (!d->norm_mean || !d->norm_std) goto nomem;
        memcpy(d->norm_mean, all->norm_mean, nb);
        memcpy(d->norm_std, all->norm_std, nb);
        d->n_norm = all->n_norm;
    }
    *out = d;
    return TS_OK;
nomem:
    ts_dataset_free(d);
    return TS_ERR_NOMEM;
}

ts_status ts_dataset_split(const ts_dataset *all, double val_fraction, uint64_t seed,
                           ts_dataset **train, ts_dataset **val) {
    if (train) *train = NULL;
    if (val) *val = NULL;
    if (!all || !train || !val)
        return ts_fail(TS_ERR_INVALID, "dataset split: missing dataset or output pointer");
    if (!(val_fraction >= 0.0 && val_fraction < 1.0))
        return ts_fail(TS_ERR_INVALID, "dataset split: validation fraction %g is not in [0, 1)",
                       val_fraction);
    const int64_t n = all->n;
    /* Round half up: the sizes are a pure function of (n, fraction). */
    const int64_t n_val = (int64_t)(val_fraction * (double)n + 0.5);
    const int64_t n_train = n - n_val;
    if (n_train < 1)
        return ts_fail(TS_ERR_INVALID,
                       "dataset split: %lld examples with validation fraction %g leave none for "
                       "training",
                       (long long)n, val_fraction);
    int64_t *perm = ts_alloc((size_t)(n ? n : 1) * sizeof *perm, "split permutation");
    if (!perm) return TS_ERR_NOMEM;
    const uint64_t key = ts_order_key(seed, PURPOSE_SPLIT);
    /* Each part keeps the examples' original relative order: the split only
     * decides membership, so an unshuffled loader still walks a time series
     * forwards. */
    ts_status s = TS_OK;
    if (n_val <= n / 4) {
        /* Validation is the permutation's last n_val entries, drawn without
         * the rest (order.c); training is what they leave, in order: the
         * same parts as sorting the whole permutation, in O(n) and no sort
         * of the n_train entries (a corpus of millions of windows). */
        int64_t *val = perm + n_train;
        s = ts_order_permutation_tail(n, n_val, key, 0, val);
        if (s == TS_OK) qsort(val, (size_t)n_val, sizeof *val, cmp_i64);
        for (int64_t e = 0, k = 0, t = 0; s == TS_OK && e < n; e++) {
            if (k < n_val && val[k] == e)
                k++;
            else
                perm[t++] = e;
        }
    } else {
        ts_order_permute(perm, n, key, 0);
        qsort(perm, (size_t)n_train, sizeof *perm, cmp_i64);
        qsort(perm + n_train, (size_t)n_val, sizeof *perm, cmp_i64);
    }
    /* Mapped data stays mapped for both parts: the loader reads training
     * batches from the mapping and evaluation its windows (ts_dataset_read),
     * so a validation split of a 4 GB token file is not a 3 GB copy. */
    if (s == TS_OK) s = subset(all, perm, n_train, train);
    if (s == TS_OK) s = subset(all, perm + n_train, n_val, val);
    free(perm);
    if (s != TS_OK) {
        ts_dataset_free(*train);
        *train = NULL;
    }
    return s;
}

/* ---- loaders ------------------------------------------------------------- */

struct ts_loader {
    const ts_dataset *d; /* borrowed: must outlive the loader */
    int64_t batch, per_epoch, pos;
    int shuffle;
    uint64_t key;
    size_t xb, yb;
    size_t vb;                /* one example's flags (data.valid; 0: none), after the batch's y */
    int64_t *perm;            /* permutation of the epoch perm_epoch (shuffle or sorting only) */
    int64_t perm_epoch;       /* -1: none computed yet */
    int bijective;            /* shuffled by `order` instead of perm (token windows) */
    ts_order_bijection order; /* of the epoch perm_epoch */
    int64_t window;           /* ts_loader_sort_window: examples sorted by length together */
    int64_t *len;             /* their lengths (sorting only) */
    int depth;                /* batches prefetched ahead (0: none) */
    ts_prefetch *pf;          /* the running prefetch (started by the first next) */
    double wait_s;            /* time ts_loader_next waited for a prefetched batch */
};

ts_status ts_loader_new(const ts_dataset *d, int64_t batch, int shuffle, uint64_t seed,
                        ts_loader **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "loader: no output pointer");
    *out = NULL;
    if (!d) return ts_fail(TS_ERR_INVALID, "loader: no dataset");
    if (batch < 1) return ts_fail(TS_ERR_INVALID, "loader: batch size %lld", (long long)batch);
    if (d->n < batch)
        return ts_fail(TS_ERR_INVALID,
                       "loader: the dataset has %lld examples, fewer than one batch of %lld",
                       (long long)d->n, (long long)batch);
    ts_loader *l = ts_zalloc(sizeof *l, "loader");
    if (!l) return TS_ERR_NOMEM;
    l->d = d;
    l->batch = batch;
    l->per_epoch = d->n / batch;
    l->shuffle = shuffle != 0;
    l->key = ts_order_key(seed, PURPOSE_LOADER);
    l->xb = ts_dataset_x_bytes(d);
    l->yb = ts_dataset_y_bytes(d);
    l->vb = d->valid ? (size_t)d->valid_cols : 0;
    l->perm_epoch = -1;
    l->bijective = l->shuffle && d->shuffle_bijection;
    if (l->shuffle && !l->bijective &&
        !(l->perm = ts_alloc((size_t)d->n * sizeof *l->perm, "loader permutation"))) {
        free(l);
        return TS_ERR_NOMEM;
    }
    *out = l;
    return TS_OK;
}

/* Stable order of (length, position) for qsort_r over perm entries; the
 * lengths come as the argument, so two loaders can sort at once. */
static int cmp_len(const void *a, const void *b, void *lengths) {
    const int64_t *len = lengths;
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    if (len[x] != len[y]) return len[x] < len[y] ? -1 : 1;
    return (x > y) - (x < y);
}

ts_status ts_loader_sort_window(ts_loader *l, int64_t batches) {
    if (!l || batches < 1)
        return ts_fail(TS_ERR_INVALID, "loader: sort window of %lld batches",
                       (long long)(l ? batches : 0));
    const ts_dataset *d = l->d;
    if (d->tokens || !d->y)
        return ts_fail(TS_ERR_INVALID,
                       "loader: sorting by length needs token documents (data.eot_id or "
                       "data.doc_offsets), not "
                       "fixed windows of a mapped token file");
    if (d->y_dtype != TS_I64 || d->y_rank != 1)
        return ts_fail(TS_ERR_INVALID, "loader: sorting by length needs token sequences");
    const int64_t T = d->y_dims[0];
    if (!l->perm && !(l->perm = ts_alloc((size_t)d->n * sizeof *l->perm, "loader permutation")))
        return TS_ERR_NOMEM;
    if (!(l->len = ts_alloc((size_t)d->n * sizeof *l->len, "sequence lengths")))
        return TS_ERR_NOMEM;
    const int64_t *y = d->y;
    for (int64_t i = 0; i < d->n; i++) {
        int64_t n = T;
        while (n > 0 && y[i * T + n - 1] == -100) n--;
        l->len[i] = n;
    }
    /* A running prefetch read the old order: the next batch restarts it. */
    ts_prefetch_stop(l->pf);
    l->pf = NULL;
    l->window = batches * l->batch;
    l->perm_epoch = -1;
    l->bijective = 0; /* the windows sort a drawn permutation */
    return TS_OK;
}

void ts_loader_keep_last(ts_loader *l) {
    if (!l) return;
    ts_prefetch_stop(l->pf); /* it counted batches per epoch the old way */
    l->pf = NULL;
    l->per_epoch = (l->d->n + l->batch - 1) / l->batch;
}

/* Rows of batch `pos`: the batch size, or what is left for the short last
 * batch (ts_loader_keep_last). A pure function of pos, so the prefetch
 * thread and the caller agree. */
static int64_t batch_rows(const ts_loader *l, int64_t pos) {
    const int64_t first = (pos % l->per_epoch) * l->batch;
    return first + l->batch <= l->d->n ? l->batch : l->d->n - first;
}

/* Batch `pos` into x and y. With a prefetch running only its thread calls
 * this (it owns perm and the token map's drops). */
ts_status ts_loader_fill(ts_loader *l, int64_t pos, void *x, void *y) {
    const int64_t epoch = pos / l->per_epoch, first = (pos % l->per_epoch) * l->batch;
    const int ordered = l->shuffle || l->window;
    if (l->bijective && l->perm_epoch != epoch) {
        ts_order_bijection_init(&l->order, l->d->n, l->key, (uint64_t)epoch);
        l->perm_epoch = epoch;
    } else if (ordered && !l->bijective && l->perm_epoch != epoch) {
        /* The epoch is the counter's high word: every epoch has its own
         * stream, computed on demand, so seeking costs one permutation. */
        if (l->shuffle)
            ts_order_permute(l->perm, l->d->n, l->key, (uint64_t)epoch);
        else
            for (int64_t i = 0; i < l->d->n; i++) l->perm[i] = i;
        /* Length-sorted windows: a batch holds sequences of similar length,
         * so its bucket pads little; still a pure function of (seed, epoch). */
        for (int64_t w = 0; l->window && w < l->d->n; w += l->window)
            qsort_r(l->perm + w, (size_t)(l->d->n - w < l->window ? l->d->n - w : l->window),
                    sizeof *l->perm, cmp_len, (void *)l->len);
        l->perm_epoch = epoch;
    }
    const int64_t n = batch_rows(l, pos);
    for (int64_t j = 0; j < n; j++) {
        const int64_t e = l->bijective ? ts_order_bijection_at(&l->order, first + j)
                          : ordered    ? l->perm[first + j]
                                       : first + j;
        /* The loader borrows d, but reading a mapped window updates the
         * mapping's page accounting (tokmap.c), not the examples. */
        const ts_status s = example(l->d, e, l->xb, l->yb, (char *)x + (size_t)j * l->xb,
                                    (char *)y + (size_t)j * l->yb);
        drop_mapped(l->d, j, n);
        if (s != TS_OK) return s;
        if (l->d->valid) /* after the whole batch's targets (ts_dataset_attach_valid) */
            memcpy((char *)y + (size_t)l->batch * l->yb + (size_t)j * l->vb,
                   l->d->valid + (size_t)e * l->vb, l->vb);
    }
    return TS_OK;
}

ts_status ts_loader_next(ts_loader *l, void *x, void *y) {
    int64_t rows;
    return ts_loader_next_rows(l, x, y, &rows);
}

ts_status ts_loader_next_rows(ts_loader *l, void *x, void *y, int64_t *rows) {
    if (!l || !x || !y || !rows)
        return ts_fail(TS_ERR_INVALID, "loader: missing loader or batch buffer");
    ts_status st;
    *rows = batch_rows(l, l->pos);
    if (l->depth > 0) {
        if (!l->pf &&
            (st = ts_prefetch_start(l, l->depth, (size_t)l->batch * l->xb,
                                    (size_t)l->batch * (l->yb + l->vb), l->pos, &l->pf)) != TS_OK)
            return st;
        st = ts_prefetch_take(l->pf, l->pos, x, y, &l->wait_s);
    } else {
        st = ts_loader_fill(l, l->pos, x, y);
    }
    if (st == TS_OK) l->pos++;
    return st;
}

ts_status ts_loader_prefetch(ts_loader *l, int depth) {
    if (!l || depth < 0 || depth > 64)
        return ts_fail(TS_ERR_INVALID, "loader prefetch: depth %d is not in [0, 64]", depth);
    ts_prefetch_stop(l->pf);
    l->pf = NULL;
    l->depth = depth;
    /* Started now, not at the first next: the first batches are ready by
     * the time the caller has compiled its plan. */
    if (depth == 0) return TS_OK;
    return ts_prefetch_start(l, depth, (size_t)l->batch * l->xb, (size_t)l->batch * (l->yb + l->vb),
                             l->pos, &l->pf);
}

double ts_loader_wait_seconds(const ts_loader *l) {
    return l ? l->wait_s : 0;
}

int64_t ts_loader_epoch(const ts_loader *l) {
    return l ? l->pos / l->per_epoch : 0;
}
int64_t ts_loader_position(const ts_loader *l) {
    return l ? l->pos : 0;
}
int64_t ts_loader_batches_per_epoch(const ts_loader *l) {
    return l ? l->per_epoch : 0;
}

ts_status ts_loader_seek(ts_loader *l, int64_t batches) {
    if (!l) return ts_fail(TS_ERR_INVALID, "loader seek: no loader");
    if (batches < 0)
        return ts_fail(TS_ERR_INVALID, "loader seek: negative position %lld", (long long)batches);
    /* Batches prefetched from the old position are of no use: the next
     * call starts the prefetch again from the new one. */
    ts_prefetch_stop(l->pf);
    l->pf = NULL;
    l->pos = batches;
    return TS_OK;
}

void ts_loader_free(ts_loader *l) {
    if (!l) return;
    ts_prefetch_stop(l->pf);
    free(l->perm);
    free(l->len);
    free(l);
}
