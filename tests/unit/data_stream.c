/* Mapped token files (ts_data_map_tokens): the same examples, lineage,
 * errors, splits and loader batches as the in-memory reader
 * (ts_data_load_tokens), and a 320 MB file read through a shuffled loader
 * with resident memory (VmRSS) far below the file's size. The large file
 * is written to a temporary directory and removed afterwards. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "data/data.h"

#define HAS(sub) (strstr(ts_last_error(), (sub)) != NULL)

static char dir[64];

static const char *path_of(const char *name) {
    static char buf[8][320];
    static int k;
    char *b = buf[k++ % 8];
    snprintf(b, sizeof buf[0], "%s/%s", dir, name);
    return b;
}

static const char *write_bytes(const char *name, const void *data, size_t n) {
    const char *p = path_of(name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(data, 1, n, f) != n) CHECK(0, "cannot write %s", p);
    if (f) fclose(f);
    return p;
}

/* Resident memory of this process in KiB (VmRSS), -1 if unreadable. */
static long vm_rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
    fclose(f);
    return kib;
}

/* Both loaders over a and b hand out the same batches for `count` calls. */
static int same_batches(const ts_dataset *a, const ts_dataset *b, int64_t batch, int shuffle,
                        int64_t count, int64_t seek) {
    ts_loader *la = NULL, *lb = NULL;
    int ok = ts_loader_new(a, batch, shuffle, 11, &la) == TS_OK &&
             ts_loader_new(b, batch, shuffle, 11, &lb) == TS_OK;
    if (ok && seek) ok = ts_loader_seek(la, seek) == TS_OK && ts_loader_seek(lb, seek) == TS_OK;
    const size_t xb = (size_t)batch * ts_dataset_x_bytes(a),
                 yb = (size_t)batch * ts_dataset_y_bytes(a);
    uint8_t *buf = ok ? malloc(2 * (xb + yb)) : NULL;
    ok = ok && buf;
    for (int64_t i = 0; ok && i < count; i++) {
        ok = ts_loader_next(la, buf, buf + xb) == TS_OK &&
             ts_loader_next(lb, buf + xb + yb, buf + 2 * xb + yb) == TS_OK &&
             !memcmp(buf, buf + xb + yb, xb + yb);
    }
    free(buf);
    ts_loader_free(la);
    ts_loader_free(lb);
    return ok;
}

/* A loader with prefetch (depth) hands out the batches of one without,
 * across epochs and seeks, and rejects a depth out of range. */
static int same_with_prefetch(const ts_dataset *d, int64_t batch, int shuffle, int depth) {
    ts_loader *a = NULL, *b = NULL;
    int ok = ts_loader_new(d, batch, shuffle, 4, &a) == TS_OK &&
             ts_loader_new(d, batch, shuffle, 4, &b) == TS_OK &&
             ts_loader_prefetch(b, depth) == TS_OK;
    const size_t xb = (size_t)batch * ts_dataset_x_bytes(d),
                 yb = (size_t)batch * ts_dataset_y_bytes(d);
    uint8_t *buf = ok ? malloc(2 * (xb + yb)) : NULL;
    ok = ok && buf;
    const int64_t bpe = ok ? ts_loader_batches_per_epoch(a) : 0;
    for (int64_t i = 0; ok && i < 3 * bpe + 5; i++) {
        if (i == bpe + 2) /* a resume: both jump back into the first epoch */
            ok = ts_loader_seek(a, 3) == TS_OK && ts_loader_seek(b, 3) == TS_OK;
        if (i == 2 * bpe) /* a new depth mid-run */
            ok = ok && ts_loader_prefetch(b, depth + 1) == TS_OK;
        ok = ok && ts_loader_next(a, buf, buf + xb) == TS_OK &&
             ts_loader_next(b, buf + xb + yb, buf + 2 * xb + yb) == TS_OK &&
             !memcmp(buf, buf + xb + yb, xb + yb) &&
             ts_loader_position(a) == ts_loader_position(b) &&
             ts_loader_epoch(a) == ts_loader_epoch(b);
    }
    ok = ok && ts_loader_wait_seconds(b) >= 0 && ts_loader_wait_seconds(a) == 0;
    ok = ok && ts_loader_prefetch(b, 65) == TS_ERR_INVALID && HAS("depth 65") &&
         ts_loader_prefetch(b, -1) == TS_ERR_INVALID;
    /* Freed with a prefetch running and batches waiting in its ring. */
    ok = ok && ts_loader_prefetch(b, 4) == TS_OK && ts_loader_next(b, buf, buf + xb) == TS_OK;
    free(buf);
    ts_loader_free(a);
    ts_loader_free(b);
    return ok;
}

static int same_examples(const ts_dataset *a, const ts_dataset *b) {
    return a->n == b->n && a->x_dtype == b->x_dtype && a->y_dtype == b->y_dtype &&
           a->x_rank == b->x_rank && a->x_dims[0] == b->x_dims[0] && a->y_dims[0] == b->y_dims[0];
}

/* Every example of a and b through ts_dataset_read, in batches of 3 (the
 * last one short), compared byte for byte; reads past the end refused. */
static int same_read(const ts_dataset *a, const ts_dataset *b) {
    const size_t xb = ts_dataset_x_bytes(a), yb = ts_dataset_y_bytes(a);
    uint8_t *x1 = malloc(3 * xb), *x2 = malloc(3 * xb), *y1 = malloc(3 * yb), *y2 = malloc(3 * yb);
    int same = x1 && x2 && y1 && y2 && a->n == b->n && a->n > 3;
    for (int64_t s = 0; same && s < a->n; s += 3) {
        const int64_t c = a->n - s < 3 ? a->n - s : 3;
        same = ts_dataset_read(a, s, c, x1, y1) == TS_OK &&
               ts_dataset_read(b, s, c, x2, y2) == TS_OK && !memcmp(x1, x2, (size_t)c * xb) &&
               !memcmp(y1, y2, (size_t)c * yb);
    }
    same = same && ts_dataset_read(b, b->n - 1, 2, x2, y2) == TS_ERR_INVALID &&
           ts_dataset_read(b, -1, 1, x2, y2) == TS_ERR_INVALID;
    free(x1), free(x2), free(y1), free(y2);
    return same;
}

static void test_same_as_memory(int bits) {
    enum { N = 1001 };
    uint8_t raw[4 * N];
    for (int i = 0; i < N; i++) {
        const uint32_t t = (uint32_t)(i * 2654435761u >> 9) % 60000u;
        if (bits == 16)
            raw[2 * i] = (uint8_t)t, raw[2 * i + 1] = (uint8_t)(t >> 8);
        else
            for (int k = 0; k < 4; k++) raw[4 * i + k] = (uint8_t)(t >> (8 * k));
    }
    const char *p =
        write_bytes(bits == 16 ? "t16.bin" : "t32.bin", raw, (size_t)N * (size_t)bits / 8);
    ts_dataset *mem = NULL, *map = NULL;
    CHECK_OK(ts_data_load_tokens(p, bits, 7, 60000, &mem));
    CHECK_OK(ts_data_map_tokens(p, bits, 7, 60000, &map));
    if (!mem || !map) goto out;
    CHECK(same_examples(mem, map) && !map->x && !map->y && map->tokens,
          "%d-bit: mapped dataset has the in-memory shape and no copy", bits);
    CHECK(map->n_lineage == 1 && mem->n_lineage == 1 &&
              !strcmp(map->lineage[0].sha256, mem->lineage[0].sha256) &&
              map->lineage[0].bytes == mem->lineage[0].bytes &&
              !strcmp(map->lineage[0].path, mem->lineage[0].path),
          "%d-bit: same lineage", bits);
    CHECK(same_batches(mem, map, 5, 0, 60, 0), "%d-bit: same batches in file order", bits);
    CHECK(same_batches(mem, map, 5, 1, 90, 0), "%d-bit: same shuffled batches, 3 epochs", bits);
    CHECK(same_batches(mem, map, 5, 1, 10, 47), "%d-bit: same batches after a seek", bits);
    for (int depth = 1; depth <= 3; depth += 2) {
        CHECK(same_with_prefetch(map, 5, 1, depth), "%d-bit: prefetch %d, shuffled", bits, depth);
        CHECK(same_with_prefetch(map, 5, 0, depth), "%d-bit: prefetch %d, file order", bits, depth);
        CHECK(same_with_prefetch(mem, 3, 1, depth), "%d-bit: prefetch %d in memory", bits, depth);
    }

    ts_dataset *mt = NULL, *mv = NULL, *pt = NULL, *pv = NULL;
    CHECK_OK(ts_dataset_split(mem, 0.2, 5, &mt, &mv));
    CHECK_OK(ts_dataset_split(map, 0.2, 5, &pt, &pv));
    if (mt && mv && pt && pv) {
        CHECK(pt->tokens && pt->index && !pt->x && same_examples(mt, pt),
              "%d-bit: the training split maps the file", bits);
        CHECK(!pv->x && !pv->y && pv->tokens && pv->index && same_examples(mv, pv),
              "%d-bit: the validation split maps the file too (no copy)", bits);
        CHECK(same_read(mv, pv), "%d-bit: the validation windows read from the mapping are equal",
              bits);
        CHECK(same_batches(mt, pt, 4, 1, 100, 0), "%d-bit: same training batches", bits);
        CHECK(pt->n_lineage == 1 && !strcmp(pt->lineage[0].sha256, mem->lineage[0].sha256),
              "%d-bit: the split keeps the lineage", bits);
    }
    /* The split outlives the dataset it came from (the mapping is shared). */
    ts_dataset_free(map);
    map = NULL;
    if (mt && pt) CHECK(same_batches(mt, pt, 4, 0, 30, 0), "%d-bit: split after free", bits);
    ts_dataset_free(mt);
    ts_dataset_free(mv);
    ts_dataset_free(pt);
    ts_dataset_free(pv);
out:
    ts_dataset_free(mem);
    ts_dataset_free(map);
}

/* The in-memory reader's errors, word for word. */
static void test_errors(void) {
    uint32_t t32[11];
    for (int i = 0; i < 11; i++) t32[i] = (uint32_t)(70000 + i);
    const char *p32 = write_bytes("e32.bin", t32, sizeof t32);
    ts_dataset *d = NULL;
    CHECK(ts_data_map_tokens(p32, 32, 5, 70010, &d) == TS_ERR_FORMAT && HAS(p32) &&
              HAS("token at byte offset 40 is 70010, not below the vocabulary size 70010"),
          "token >= vocab: %s", ts_last_error());
    const char *odd = write_bytes("odd.bin", t32, 21);
    CHECK(ts_data_map_tokens(odd, 16, 3, 50, &d) == TS_ERR_FORMAT &&
              HAS("21 bytes is not a whole number of 16-bit tokens"),
          "odd size: %s", ts_last_error());
    CHECK(ts_data_map_tokens(p32, 32, 11, 80000, &d) == TS_ERR_INVALID && HAS("11 tokens"),
          "too short: %s", ts_last_error());
    const char *none = write_bytes("none.bin", t32, 0);
    CHECK(ts_data_map_tokens(none, 16, 1, 100, &d) == TS_ERR_INVALID && HAS("0 tokens"),
          "empty: %s", ts_last_error());
    CHECK(ts_data_map_tokens(path_of("missing.bin"), 16, 1, 100, &d) == TS_ERR_NOT_FOUND &&
              HAS("missing.bin"),
          "missing: %s", ts_last_error());
    CHECK(ts_data_map_tokens(p32, 8, 3, 50, &d) == TS_ERR_INVALID && HAS("8 bits"), "8-bit: %s",
          ts_last_error());
    CHECK(!d, "no dataset after errors");
}

/* 160 M uint16 tokens (320 MB), ctx 256, batch 64, shuffled: resident
 * memory while loading and reading prefetched batches stays under 64 MB more than
 * before (measured: +12 MB), and unshuffled batches are the file's windows. */
static void test_large(void) {
    const int64_t ntok = (int64_t)160 << 20, ctx = 256, B = 64, vocab = 50257;
    const char *p = path_of("large.bin");
    FILE *f = fopen(p, "wb");
    enum { CH = 1 << 20 };
    uint16_t *chunk = malloc(CH * sizeof *chunk);
    int ok = f && chunk;
    for (int64_t i = 0; ok && i < ntok; i += CH) {
        for (int64_t j = 0; j < CH; j++)
            chunk[j] = (uint16_t)((uint64_t)(i + j) * 2654435761u % (uint64_t)vocab);
        ok = fwrite(chunk, sizeof *chunk, CH, f) == CH;
    }
    free(chunk);
    if (f) ok &= fclose(f) == 0;
    CHECK(ok, "writing %s", p);
    if (!ok) return;
    const long before = vm_rss_kib();
    long peak = before;
    ts_dataset *d = NULL, *tr = NULL, *va = NULL;
    ts_loader *ld = NULL;
    CHECK_OK(ts_data_map_tokens(p, 16, ctx, vocab, &d));
    if (vm_rss_kib() > peak) peak = vm_rss_kib();
    if (d) CHECK_OK(ts_dataset_split(d, 0.001, 3, &tr, &va));
    if (tr) CHECK_OK(ts_loader_new(tr, B, 1, 3, &ld));
    if (ld) CHECK_OK(ts_loader_prefetch(ld, 2));
    int64_t *x = malloc((size_t)(B * ctx) * sizeof *x), *y = malloc((size_t)(B * ctx) * sizeof *y);
    ok = ld && x && y;
    /* 3000 batches: 192 k random windows, touching most of the file's pages. */
    for (int i = 0; ok && i < 3000; i++) {
        ok = ts_loader_next(ld, x, y) == TS_OK;
        for (int64_t k = 0; ok && k < B * ctx; k++) ok = x[k] < vocab && y[k] < vocab;
        if (i % 100 == 0 && vm_rss_kib() > peak) peak = vm_rss_kib();
    }
    CHECK(ok, "3000 shuffled batches of the mapped file");
    const long grew = peak - before;
    printf("large: %lld MB file, VmRSS %ld MB before, peak %ld MB (+%ld MB)\n",
           (long long)(ntok * 2 >> 20), before >> 10, peak >> 10, grew >> 10);
    CHECK(before > 0 && grew < 64 * 1024, "resident memory grew %ld MB for a 320 MB file",
          grew >> 10);
    ts_loader_free(ld);
    ld = NULL;
    /* File order: batch k is windows k*B .. k*B+B-1 of d read straight from the file. */
    if (d && ts_loader_new(d, B, 0, 3, &ld) == TS_OK && ts_loader_seek(ld, 9000) == TS_OK &&
        ts_loader_next(ld, x, y) == TS_OK) {
        int same = 1;
        for (int64_t k = 0; k < B * ctx; k++) {
            const int64_t w = 9000 * B + k / ctx, i = w * ctx + k % ctx;
            same &= x[k] == (int64_t)((uint64_t)i * 2654435761u % (uint64_t)vocab) &&
                    y[k] == (int64_t)((uint64_t)(i + 1) * 2654435761u % (uint64_t)vocab);
        }
        CHECK(same, "batch 9000 in file order holds the file's windows");
    } else {
        CHECK(0, "file-order loader: %s", ts_last_error());
    }
    ts_loader_free(ld);
    free(x);
    free(y);
    ts_dataset_free(tr);
    ts_dataset_free(va);
    ts_dataset_free(d);
    if (remove(p) != 0) CHECK(0, "removing %s", p);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/tessel-stream-XXXXXX");
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return check_summary("unit/data_stream");
    }
    test_same_as_memory(16);
    test_same_as_memory(32);
    test_errors();
    test_large();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("unit/data_stream");
}
