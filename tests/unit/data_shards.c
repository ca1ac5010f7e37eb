/* Sharded token corpora (src/data/tokmap.c): data.path a directory or a
 * glob pattern maps every shard, in name order, without copying it; the
 * windows are each shard's own windows one after the other (none crosses
 * a shard), each shard is hashed once into the lineage, and every error
 * names the shard at fault. One file named directly is unchanged. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "core/sha256.h"
#include "data/data.h"

static char root[128];

static void write_shard(const char *name, int ntok, int salt, int bad_at) {
    char path[300];
    snprintf(path, sizeof path, "%s/%s", root, name);
    FILE *f = fopen(path, "wb");
    for (int i = 0; f && i < ntok; i++) {
        uint16_t t = (uint16_t)((i * 7 + salt * 13) % 64);
        if (i == bad_at) t = 64;
        fwrite(&t, 2, 1, f);
    }
    if (f) fclose(f);
}

/* Every window of `d` equals the next window of the files, in order. */
static void check_windows(const ts_dataset *d, const char *const *files, int nf, const char *what) {
    const int64_t ctx = 8;
    int64_t w = 0, bad = 0;
    int64_t *x = malloc(ctx * 8), *y = malloc(ctx * 8);
    ts_loader *ld = NULL;
    for (int k = 0; k < nf; k++) {
        char path[300];
        snprintf(path, sizeof path, "%s/%s", root, files[k]);
        ts_dataset *one = NULL;
        CHECK_OK(ts_data_load_tokens(path, 16, ctx, 64, &one));
        if (!one) continue;
        for (int64_t i = 0; i < one->n; i++, w++) {
            if (w >= d->n) {
                bad++;
                continue;
            }
            /* a loader over d in file order hands out window w next */
            if (!ld) CHECK_OK(ts_loader_new(d, 1, 0, 1, &ld));
            if (ld) CHECK_OK(ts_loader_next(ld, x, y));
            bad += memcmp(x, (int64_t *)one->x + i * ctx, ctx * 8) != 0 ||
                   memcmp(y, (int64_t *)one->y + i * ctx, ctx * 8) != 0;
        }
        ts_dataset_free(one);
    }
    CHECK(w == d->n && bad == 0, "%s: %lld windows, %lld expected, %lld differ", what,
          (long long)d->n, (long long)w, (long long)bad);
    ts_loader_free(ld);
    free(x);
    free(y);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/tessel-shards-%d", (int)getpid());
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s/sub", root, root);
    CHECK(system(cmd) == 0, "%s", cmd);
    /* written out of order: the name decides */
    write_shard("s-02.u16", 513, 2, -1);
    write_shard("s-00.u16", 1000, 0, -1);
    write_shard("s-01.u16", 37, 1, -1);
    write_shard(".hidden.u16", 100, 9, -1); /* ignored: a dot file */
    write_shard("sub/x.u16", 100, 8, -1);   /* ignored: not in the directory itself */
    const char *files[3] = {"s-00.u16", "s-01.u16", "s-02.u16"};

    ts_dataset *d = NULL;
    CHECK_OK(ts_data_map_tokens(root, 16, 8, 64, &d));
    if (d) {
        CHECK(d->n == 999 / 8 + 36 / 8 + 512 / 8, "windows: %lld", (long long)d->n);
        CHECK(d->n_lineage == 3, "one lineage entry per shard: %d", d->n_lineage);
        for (int k = 0; k < d->n_lineage && k < 3; k++) {
            char path[300], hex[65];
            snprintf(path, sizeof path, "%s/%s", root, files[k]);
            CHECK_OK(ts_sha256_path(path, hex, NULL));
            CHECK(!strcmp(d->lineage[k].path, path) && !strcmp(d->lineage[k].sha256, hex),
                  "lineage %d: %s %s", k, d->lineage[k].path, d->lineage[k].sha256);
        }
        check_windows(d, files, 3, "directory");
        /* a split keeps the shards' windows (views share the mapping) */
        ts_dataset *tr = NULL, *va = NULL;
        CHECK_OK(ts_dataset_split(d, 0.1, 5, &tr, &va));
        CHECK(tr && va && tr->n + va->n == d->n, "split of a sharded corpus");
        ts_dataset_free(tr);
        ts_dataset_free(va);
        ts_dataset_free(d);
    }
    char pat[200];
    snprintf(pat, sizeof pat, "%s/s-0[02].u16", root);
    const char *two[2] = {"s-00.u16", "s-02.u16"};
    d = NULL;
    CHECK_OK(ts_data_map_tokens(pat, 16, 8, 64, &d));
    if (d) {
        CHECK(d->n_lineage == 2, "glob: %d shards", d->n_lineage);
        check_windows(d, two, 2, "glob");
        ts_dataset_free(d);
    }
    /* one file named directly: its windows, one lineage entry */
    char one[300];
    snprintf(one, sizeof one, "%s/s-02.u16", root);
    d = NULL;
    CHECK_OK(ts_data_map_tokens(one, 16, 8, 64, &d));
    if (d) {
        CHECK(d->n == 64 && d->n_lineage == 1, "one file: %lld windows", (long long)d->n);
        check_windows(d, files + 2, 1, "one file");
        ts_dataset_free(d);
    }

    /* errors name the shard */
    write_shard("s-01.u16", 37, 1, 20);
    CHECK(ts_data_map_tokens(root, 16, 8, 64, &d) == TS_ERR_FORMAT, "a token out of range");
    CHECK(strstr(ts_last_error(), "s-01.u16: token at byte offset 40 is 64") &&
              strstr(ts_last_error(), "3 shards"),
          "%s", ts_last_error());
    write_shard("s-01.u16", 5, 1, -1);
    CHECK(ts_data_map_tokens(root, 16, 8, 64, &d) == TS_ERR_INVALID, "a shard too short");
    CHECK(strstr(ts_last_error(), "s-01.u16: 5 tokens, fewer than one example"), "%s",
          ts_last_error());
    snprintf(pat, sizeof pat, "%s/none-*.u16", root);
    CHECK(ts_data_map_tokens(pat, 16, 8, 64, &d) == TS_ERR_NOT_FOUND, "no match");
    CHECK(strstr(ts_last_error(), "none-*.u16: no file matches"), "%s", ts_last_error());
    snprintf(pat, sizeof pat, "%s/sub2", root);
    mkdir(pat, 0755);
    CHECK(ts_data_map_tokens(pat, 16, 8, 64, &d) == TS_ERR_NOT_FOUND, "an empty directory");
    CHECK(strstr(ts_last_error(), "sub2: a directory with no token files"), "%s", ts_last_error());
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    CHECK(system(cmd) == 0, "cleanup");
    return check_summary("data_shards");
}
