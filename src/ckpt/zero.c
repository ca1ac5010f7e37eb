/* Checkpoints of sharded optimizer state across ranks (dist.zero): the
 * chunk lists of logical tensors, the rank-K.json handshake through the
 * checkpoint's tmp directory, and its cleanup (docs/checkpoints.md,
 * "Sharded optimizer state"). The background writers of different ranks
 * never talk over the comm — training uses it meanwhile — only through
 * files: each rank publishes rank-K.json once its shards are durable, and
 * rank 0 waits for all of them before it writes the manifest. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "ckpt_internal.h"
#include "core/fsat.h"

void ck_zset_free(ck_zset *z) {
    for (int i = 0; i < z->nf; i++) free(z->f[i].name);
    for (int i = 0; i < z->nc; i++) {
        free(z->c[i].name);
        free(z->c[i].file);
        free(z->c[i].tensor);
    }
    free(z->f);
    free(z->c);
    memset(z, 0, sizeof *z);
}

ts_status ck_zset_add_file(ck_zset *z, const char *name, uint64_t bytes, const char *sha,
                           int rank) {
    ts_status s = ts_grow((void **)&z->f, &z->capf, z->nf + 1, sizeof *z->f, "ckpt rank files");
    if (s != TS_OK) return s;
    ck_zfile *f = &z->f[z->nf];
    memset(f, 0, sizeof *f);
    if (!(f->name = ts_strdup(name))) return ts_fail(TS_ERR_NOMEM, "ckpt: out of memory");
    f->bytes = bytes;
    f->rank = rank;
    snprintf(f->sha, sizeof f->sha, "%s", sha);
    z->nf++;
    return TS_OK;
}

ts_status ck_zset_add_chunk(ck_zset *z, const ck_zchunk *c) {
    ts_status s = ts_grow((void **)&z->c, &z->capc, z->nc + 1, sizeof *z->c, "ckpt chunks");
    if (s != TS_OK) return s;
    ck_zchunk *d = &z->c[z->nc];
    *d = *c;
    d->name = ts_strdup(c->name);
    d->file = ts_strdup(c->file);
    d->tensor = ts_strdup(c->tensor);
    z->nc++;
    if (!d->name || !d->file || !d->tensor) return ts_fail(TS_ERR_NOMEM, "ckpt: out of memory");
    return TS_OK;
}

json_t *ck_zchunk_json(const ck_zchunk *c) {
    char crc[9];
    snprintf(crc, sizeof crc, "%08x", c->crc);
    return json_pack("{s:s, s:i, s:s, s:I, s:I, s:I, s:s}", "file", c->file, "rank", c->rank,
                     "tensor", c->tensor, "start", (json_int_t)c->start, "count",
                     (json_int_t)c->count, "file_start", (json_int_t)c->file_start, "crc32c", crc);
}

/* ---- rank-K.json --------------------------------------------------------- */

ts_status ck_rank_publish(const char *dir, int rank, int world, uint64_t group, int64_t step,
                          const ck_zset *own) {
    char gh[17];
    snprintf(gh, sizeof gh, "%016llx", (unsigned long long)group);
    json_t *o = json_pack("{s:s, s:s, s:I, s:i, s:i, s:[], s:[]}", "format",
                          "tessel-checkpoint-rank", "group", gh, "step", (json_int_t)step, "rank",
                          rank, "world", world, "files", "chunks");
    int bad = !o;
    json_t *files = json_object_get(o, "files"), *chunks = json_object_get(o, "chunks");
    for (int i = 0; !bad && i < own->nf; i++)
        bad |= json_array_append_new(files, json_pack("{s:s, s:I, s:s}", "name", own->f[i].name,
                                                      "bytes", (json_int_t)own->f[i].bytes,
                                                      "sha256", own->f[i].sha));
    for (int i = 0; !bad && i < own->nc; i++) {
        const ck_zchunk *c = &own->c[i];
        json_t *e = ck_zchunk_json(c);
        bad |= !e || json_object_set_new(e, "name", json_string(c->name)) ||
               json_object_set_new(e, "dtype", json_string(ts_dtype_name(c->dtype))) ||
               json_object_set_new(e, "shape", ck_int_array(c->dims, c->ndim));
        bad |= json_array_append_new(chunks, e);
    }
    char *text = bad ? NULL : json_dumps(o, JSON_SORT_KEYS | JSON_COMPACT);
    json_decref(o);
    if (!text) return ts_fail(TS_ERR_NOMEM, "%s: cannot build rank-%d.json", dir, rank);
    char name[64];
    snprintf(name, sizeof name, "rank-%d.json", rank);
    /* Written whole, then renamed: rank 0 sees the old file or the new. */
    ts_dir d;
    ts_status s = ts_dir_open(&d, dir, 0);
    if (s == TS_OK) s = ts_dir_replace(&d, name, text, strlen(text), 0644, 1);
    if (s == TS_OK) s = ts_dir_sync(&d);
    ts_dir_close(&d);
    free(text);
    return s;
}

static int plain_name(const char *n) {
    return n && *n && !strchr(n, '/') && strcmp(n, ".") && strcmp(n, "..");
}

/* Parse one rank's file into z. 1: taken; 0: absent or another save's
 * (a leftover of an earlier launch, or of an earlier step); <0: error. */
static int take_rank(const char *dir, int rank, int world, uint64_t group, int64_t step, ck_zset *z,
                     ts_status *err) {
    char name[64];
    snprintf(name, sizeof name, "rank-%d.json", rank);
    char *path = ck_join(dir, name), *text = NULL;
    if (!path) {
        *err = TS_ERR_NOMEM;
        return -1;
    }
    ts_dir d;
    int kind = 0;
    ts_status s = ts_dir_open(&d, dir, 0);
    if (s == TS_OK) s = ts_dir_kind(&d, name, &kind);
    if (s == TS_OK && kind == 1 && ts_dir_read(&d, name, (size_t)64 << 20, &text, NULL) != TS_OK)
        kind = 0; /* being replaced, or unreadable: looked at again in the next round */
    ts_dir_close(&d);
    if (s != TS_OK || kind != 1) {
        free(path);
        if (s != TS_OK) *err = s;
        return s != TS_OK ? -1 : 0;
    }
    json_t *o = json_loads(text, 0, NULL);
    free(text);
    char gh[17];
    snprintf(gh, sizeof gh, "%016llx", (unsigned long long)group);
    const char *g = json_string_value(json_object_get(o, "group"));
    if (!g || strcmp(g, gh) || json_integer_value(json_object_get(o, "step")) != step) {
        json_decref(o);
        free(path);
        return 0;
    }
    int r = 1;
    if (json_integer_value(json_object_get(o, "rank")) != rank ||
        json_integer_value(json_object_get(o, "world")) != world) {
        *err = ts_fail(TS_ERR_FORMAT, "%s: written by rank %lld of %lld, expected rank %d of %d",
                       path, (long long)json_integer_value(json_object_get(o, "rank")),
                       (long long)json_integer_value(json_object_get(o, "world")), rank, world);
        r = -1;
    }
    json_t *files = json_object_get(o, "files"), *chunks = json_object_get(o, "chunks");
    const int f0 = z->nf;
    for (size_t i = 0; r > 0 && i < json_array_size(files); i++) {
        json_t *e = json_array_get(files, i);
        const char *fn = json_string_value(json_object_get(e, "name"));
        const char *sha = json_string_value(json_object_get(e, "sha256"));
        json_t *b = json_object_get(e, "bytes");
        unsigned char h[32];
        if (!plain_name(fn) || !json_is_integer(b) || !ck_unhex(sha, h, 32)) {
            *err = ts_fail(TS_ERR_FORMAT, "%s: files[%zu] needs a plain name, bytes and sha256",
                           path, i);
            r = -1;
        } else if ((*err = ck_zset_add_file(z, fn, (uint64_t)json_integer_value(b), sha, rank)) !=
                   TS_OK) {
            r = -1;
        }
    }
    for (size_t i = 0; r > 0 && i < json_array_size(chunks); i++) {
        json_t *e = json_array_get(chunks, i);
        ck_zchunk c;
        memset(&c, 0, sizeof c);
        c.name = (char *)json_string_value(json_object_get(e, "name"));
        c.file = (char *)json_string_value(json_object_get(e, "file"));
        c.tensor = (char *)json_string_value(json_object_get(e, "tensor"));
        const char *dt = json_string_value(json_object_get(e, "dtype"));
        const char *crc = json_string_value(json_object_get(e, "crc32c"));
        json_t *shape = json_object_get(e, "shape");
        unsigned char cb[4];
        int known = 0;
        for (int k = f0; c.file && k < z->nf; k++) known |= !strcmp(z->f[k].name, c.file);
        int ok = c.name && c.tensor && known && dt && ts_dtype_parse(dt) >= 0 &&
                 ck_unhex(crc, cb, 4) && json_is_array(shape) &&
                 json_array_size(shape) <= TS_MAX_RANK;
        if (ok) {
            c.dtype = (ts_dtype)ts_dtype_parse(dt);
            c.ndim = (int)json_array_size(shape);
            for (int d = 0; d < c.ndim; d++)
                c.dims[d] = json_integer_value(json_array_get(shape, (size_t)d));
            c.start = json_integer_value(json_object_get(e, "start"));
            c.count = json_integer_value(json_object_get(e, "count"));
            c.file_start = json_integer_value(json_object_get(e, "file_start"));
            c.crc = (uint32_t)cb[0] << 24 | (uint32_t)cb[1] << 16 | (uint32_t)cb[2] << 8 | cb[3];
            c.rank = rank;
            ok = c.start >= 0 && c.count > 0 && c.file_start >= 0;
        }
        if (!ok) {
            *err = ts_fail(TS_ERR_FORMAT,
                           "%s: chunks[%zu] needs name, dtype, shape, one of the rank's files, "
                           "tensor, start, count, file_start and crc32c",
                           path, i);
            r = -1;
        } else if ((*err = ck_zset_add_chunk(z, &c)) != TS_OK) {
            r = -1;
        }
    }
    json_decref(o);
    free(path);
    return r;
}

ts_status ck_rank_collect(const char *dir, int world, uint64_t group, int64_t step,
                          double timeout_s, const atomic_int *cancel, ck_zset *z) {
    char *have = ts_zalloc((size_t)world + 1, "ckpt ranks");
    if (!have) return TS_ERR_NOMEM;
    const double t0 = ts_now();
    ts_status s = TS_OK;
    for (int left = world - 1; left > 0 && s == TS_OK;) {
        for (int r = 1; r < world && s == TS_OK; r++) {
            if (have[r]) continue;
            int got = take_rank(dir, r, world, group, step, z, &s);
            if (got > 0) have[r] = 1, left--;
        }
        if (left == 0 || s != TS_OK) break;
        if (cancel && atomic_load(cancel)) {
            s = ts_fail(TS_ERR_IO,
                        "%s: abandoned while waiting for the other ranks' shards (the run "
                        "failed)",
                        dir);
            break;
        }
        if (ts_now() - t0 > timeout_s) {
            char missing[512] = "";
            size_t ml = 0;
            for (int r = 1; r < world; r++)
                if (!have[r]) ts_catf(missing, sizeof missing, &ml, "%s%d", ml ? ", " : "", r);
            s = ts_fail(TS_ERR_IO,
                        "%s: rank%s %s of %d did not publish %s shards (rank-K.json) within %.0f s",
                        dir, left > 1 ? "s" : "", missing, world, left > 1 ? "their" : "its",
                        timeout_s);
            break;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    free(have);
    return s;
}

/* ---- the tmp directory ---------------------------------------------------- */

ts_status ck_tmp_cleanup(const char *dir, const ck_zset *keep, const char *const *own, int n_own) {
    ts_dir td;
    ts_status s = ts_dir_open(&td, dir, 0);
    if (s != TS_OK) return s;
    DIR *d;
    if ((s = ts_dir_list(&td, &d)) != TS_OK) {
        ts_dir_close(&td);
        return s;
    }
    struct dirent *e;
    while (s == TS_OK && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        int listed = 0;
        for (int i = 0; i < keep->nf && !listed; i++) listed = !strcmp(keep->f[i].name, e->d_name);
        for (int i = 0; i < n_own && !listed; i++) listed = !strcmp(own[i], e->d_name);
        if (listed) continue;
        /* unlinkat removes a link itself, never what it points to. */
        if (unlinkat(td.fd, e->d_name, 0) != 0 && errno != ENOENT)
            s = ts_fail(TS_ERR_IO, "%s/%s: cannot remove: %s", dir, e->d_name, strerror(errno));
    }
    closedir(d);
    ts_dir_close(&td);
    return s;
}

static int cmp_chunk(const void *a, const void *b) {
    const ck_zchunk *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c) return c;
    return (x->start > y->start) - (x->start < y->start);
}

ts_status ck_zset_check(ck_zset *z, const char *dir) {
    qsort(z->c, (size_t)z->nc, sizeof *z->c, cmp_chunk);
    for (int i = 0; i < z->nc;) {
        const ck_zchunk *c0 = &z->c[i];
        const int64_t numel = ts_shape_numel(c0->ndim, c0->dims);
        int64_t at = 0;
        int j = i;
        for (; j < z->nc && !strcmp(z->c[j].name, c0->name); j++) {
            const ck_zchunk *c = &z->c[j];
            if (c->dtype != c0->dtype || c->ndim != c0->ndim ||
                memcmp(c->dims, c0->dims, sizeof(int64_t) * (size_t)c->ndim))
                return ts_fail(TS_ERR_INTERNAL, "%s: ranks %d and %d disagree on the shape of '%s'",
                               dir, c0->rank, c->rank, c->name);
            if (c->start != at)
                return ts_fail(TS_ERR_INTERNAL,
                               "%s: '%s': elements from %lld are %s (chunk of rank %d at %lld)",
                               dir, c->name, (long long)at,
                               c->start > at ? "held by no rank" : "held twice", c->rank,
                               (long long)c->start);
            at += c->count;
        }
        if (at != numel)
            return ts_fail(TS_ERR_INTERNAL, "%s: '%s': ranks hold %lld of its %lld elements", dir,
                           c0->name, (long long)at, (long long)numel);
        i = j;
    }
    return TS_OK;
}
