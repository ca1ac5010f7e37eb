/* Token files hashed in the background (ts_data_map_tokens_async): the
 * loader works before the pass ends, ts_dataset_lineage_wait then gives the
 * lineage ts_data_map_tokens gives (the file's SHA-256); a token outside
 * the vocabulary is an error of the loader when a window holds it and of
 * the wait wherever it is, with the synchronous reader's message; a file
 * written while it is hashed is reported; freeing a data set whose pass
 * still runs stops it. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "data/data.h"

#define HAS(sub) (strstr(ts_last_error(), (sub)) != NULL)

static char root[64];

/* ntok uint16 tokens below 64, but 64 at bad_at (-1: none). */
static const char *write_tokens(const char *name, int64_t ntok, int64_t bad_at) {
    static char paths[8][128];
    static int k;
    char *p = paths[k++ % 8];
    snprintf(p, sizeof paths[0], "%s/%s", root, name);
    FILE *f = fopen(p, "wb");
    enum { CH = 1 << 16 };
    static uint16_t buf[CH];
    for (int64_t i = 0; f && i < ntok; i += CH) {
        const int64_t n = ntok - i < CH ? ntok - i : CH;
        for (int64_t j = 0; j < n; j++)
            buf[j] = i + j == bad_at ? 64 : (uint16_t)((i + j) * 11 % 64);
        CHECK(fwrite(buf, 2, (size_t)n, f) == (size_t)n, "writing %s", p);
    }
    if (f) fclose(f);
    return p;
}

static void test_same_lineage(void) {
    const char *p = write_tokens("good.u16", 3 << 20, -1);
    ts_dataset *a = NULL, *b = NULL;
    CHECK_OK(ts_data_map_tokens(p, 16, 32, 64, &a));
    CHECK_OK(ts_data_map_tokens_async(p, 16, 32, 64, &b));
    if (!a || !b) return;
    /* Batches are handed out while the pass may still run. */
    ts_loader *l = NULL;
    CHECK_OK(ts_loader_new(b, 4, 1, 1, &l));
    int64_t x[4 * 32], y[4 * 32];
    for (int i = 0; l && i < 20; i++) CHECK_OK(ts_loader_next(l, x, y));
    ts_loader_free(l);
    CHECK_OK(ts_dataset_lineage_wait(b));
    CHECK(!ts_dataset_lineage_pending(b), "nothing pending after the wait");
    CHECK(a->n == b->n && b->n_lineage == 1 && strlen(b->lineage[0].sha256) == 64 &&
              !strcmp(a->lineage[0].sha256, b->lineage[0].sha256) &&
              a->lineage[0].bytes == b->lineage[0].bytes,
          "same lineage: %s vs %s", a->lineage[0].sha256, b->lineage[0].sha256);
    CHECK_OK(ts_dataset_lineage_wait(b)); /* again: the same answer */
    ts_dataset_free(a);
    ts_dataset_free(b);
}

static void test_bad_token(void) {
    /* Token 64 at window 1000's third input (ctx 32: window w starts at 32 w). */
    const int64_t at = 32 * 1000 + 2;
    const char *p = write_tokens("bad.u16", 1 << 20, at);
    ts_dataset *d = NULL;
    CHECK(ts_data_map_tokens(p, 16, 32, 64, &d) == TS_ERR_FORMAT && !d, "sync: %s",
          ts_last_error());
    char want[512];
    snprintf(want, sizeof want, "%s", ts_last_error());
    CHECK(strstr(want, "token at byte offset 64004 is 64"), "sync message: %s", want);
    /* The loader meets it in window 1000 (in file order, batch 1000 of 1). */
    CHECK_OK(ts_data_map_tokens_async(p, 16, 32, 64, &d));
    if (!d) return;
    ts_loader *l = NULL;
    CHECK_OK(ts_loader_new(d, 1, 0, 1, &l));
    int64_t x[32], y[32];
    if (l) CHECK_OK(ts_loader_seek(l, 999));
    if (l) CHECK_OK(ts_loader_next(l, x, y));
    CHECK(l && ts_loader_next(l, x, y) == TS_ERR_FORMAT && !strcmp(ts_last_error(), want),
          "the loader names it: %s", ts_last_error());
    /* The window before holds it as its last target. */
    if (l) CHECK_OK(ts_loader_seek(l, 998));
    if (l) CHECK_OK(ts_loader_next(l, x, y));
    CHECK(l && ts_loader_next(l, x, y) == TS_OK, "window 999 ends at token 32000: fine");
    ts_loader_free(l);
    CHECK(ts_dataset_lineage_wait(d) == TS_ERR_FORMAT && !strcmp(ts_last_error(), want),
          "the wait names it: %s", ts_last_error());
    CHECK(ts_dataset_lineage_wait(d) == TS_ERR_FORMAT, "and again");
    ts_dataset_free(d);
}

static void test_changed(void) {
    const char *p = write_tokens("changing.u16", 48 << 20, -1); /* 96 MB */
    ts_dataset *d = NULL;
    CHECK_OK(ts_data_map_tokens_async(p, 16, 32, 64, &d));
    /* Written while the pass runs: hashing 96 MB takes far longer than this. */
    const int fd = open(p, O_WRONLY);
    const uint16_t t = 5;
    CHECK(fd >= 0 && pwrite(fd, &t, 2, 2) == 2, "rewriting a token");
    if (fd >= 0) close(fd);
    if (!d) return;
    CHECK(ts_dataset_lineage_wait(d) == TS_ERR_IO && HAS("changed while it was hashed") && HAS(p),
          "a file written while hashed: %s", ts_last_error());
    ts_dataset_free(d);
    /* Freed with the pass running: it stops (and nothing leaks, under ASan). */
    CHECK_OK(ts_data_map_tokens_async(p, 16, 32, 64, &d));
    ts_dataset_free(d);
    unlink(p);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/tessel-hash-async-XXXXXX");
    if (!mkdtemp(root)) return 1;
    test_same_lineage();
    test_bad_token();
    test_changed();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0) printf("could not remove %s\n", root);
    return check_summary("data_hash_async");
}
