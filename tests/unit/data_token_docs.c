/* Token files as documents (src/data/token_docs.c, data.eot_id and
 * data.doc_offsets, docs/shapes.md "Documents of many lengths"): every
 * example holds the tokens of one document only, then padding (inputs the
 * pad token, targets -100), so no position of a row can attend across
 * documents; a document longer than ctx + 1 tokens is cut into pieces
 * that share a token; a one-token document gives no example. The same
 * file read by its end-of-text id and by an offsets file gives the same
 * rows but for the pad token. Length-sorted windows (shape.sort_window)
 * sort each window of an epoch by length, a pure function of the seed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "data/data.h"
#include "testfiles.h"

enum { CTX = 4, VOCAB = 64, EOT = 63, ROWS = 5 };

/* Documents of 4, 3, 8, 2 and 1 tokens; the first four end with EOT. */
static const uint16_t tokens[] = {1,  2,  3,  EOT, 10, 11,  EOT, 20,  21,
                                  22, 23, 24, 25,  26, EOT, 40,  EOT, 50};
static const char offsets[] = "0 4 7\n15 17\n";

/* The rows, x then y, with P for the pad input and I for the ignored target. */
enum { P = -1, I = -100 };
static const int64_t want_x[ROWS][CTX] = {
    {1, 2, 3, P}, {10, 11, P, P}, {20, 21, 22, 23}, {24, 25, 26, P}, {40, P, P, P}};
static const int64_t want_y[ROWS][CTX] = {
    {2, 3, EOT, I}, {11, EOT, I, I}, {21, 22, 23, 24}, {25, 26, EOT, I}, {EOT, I, I, I}};

static void check_rows(const char *what, const ts_dataset *d, int64_t pad) {
    CHECK(d && d->n == ROWS, "%s: %lld examples, expected %d", what, d ? (long long)d->n : -1LL,
          ROWS);
    if (!d || d->n != ROWS) return;
    const int64_t *x = d->x, *y = d->y;
    for (int r = 0; r < ROWS; r++)
        for (int t = 0; t < CTX; t++) {
            const int64_t wx = want_x[r][t] == P ? pad : want_x[r][t];
            CHECK(x[r * CTX + t] == wx && y[r * CTX + t] == want_y[r][t],
                  "%s: row %d position %d: x %lld y %lld, expected x %lld y %lld", what, r, t,
                  (long long)x[r * CTX + t], (long long)y[r * CTX + t], (long long)wx,
                  (long long)want_y[r][t]);
        }
}

/* The first input token of each of the next n batches of one row. */
static void firsts(ts_loader *l, int n, int64_t *out) {
    int64_t x[CTX], y[CTX];
    for (int i = 0; i < n; i++) {
        CHECK_OK(ts_loader_next(l, x, y));
        out[i] = x[0];
    }
}

/* Length-sorted windows (shape.sort_window): a window of the whole epoch
 * gives the rows by length (3, 2, 4, 3, 1 targets), ties by position,
 * whatever the shuffle; windows of 2 rows are each sorted and the order is
 * a pure function of the seed. */
static void test_sort_window(const ts_dataset *d) {
    ts_loader *l = NULL;
    int64_t got[10], again[10];
    CHECK_OK(ts_loader_new(d, 1, 1, 7, &l));
    if (l) CHECK_OK(ts_loader_sort_window(l, ROWS));
    if (l) firsts(l, 10, got);
    ts_loader_free(l);
    const int64_t by_length[ROWS] = {40, 10, 1, 24, 20};
    int sorted = 1;
    for (int i = 0; i < 10; i++) sorted &= got[i] == by_length[i % ROWS];
    CHECK(sorted, "a window of the epoch: %lld %lld %lld %lld %lld", (long long)got[0],
          (long long)got[1], (long long)got[2], (long long)got[3], (long long)got[4]);
    for (int k = 0; k < 2; k++) {
        l = NULL;
        CHECK_OK(ts_loader_new(d, 1, 1, 7, &l));
        if (l) CHECK_OK(ts_loader_sort_window(l, 2));
        if (l) firsts(l, 10, k ? again : got);
        ts_loader_free(l);
    }
    CHECK(!memcmp(got, again, sizeof got), "the same seed gave another order");
    /* the length of a row, from its first token */
    int len[64] = {0}, pairs = 1;
    len[1] = 3, len[10] = 2, len[20] = 4, len[24] = 3, len[40] = 1;
    for (int e = 0; e < 2; e++)
        for (int w = 0; w + 1 < ROWS; w += 2)
            pairs &= len[got[e * ROWS + w]] <= len[got[e * ROWS + w + 1]];
    CHECK(pairs, "a window of 2 rows is not sorted by length");
}

int main(void) {
    char dir[] = "/tmp/tessel-docs-XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp failed");
        return check_summary("data_token_docs");
    }
    const char *bin = tf_path(dir, "docs.bin"), *off = tf_path(dir, "offsets.txt");
    FILE *f = fopen(bin, "wb");
    for (size_t i = 0; f && i < sizeof tokens / sizeof tokens[0]; i++) {
        const unsigned char le[2] = {(unsigned char)(tokens[i] & 0xff),
                                     (unsigned char)(tokens[i] >> 8)};
        fwrite(le, 1, 2, f);
    }
    if (f) fclose(f);
    f = fopen(off, "w");
    if (f) fputs(offsets, f), fclose(f);
    ts_dataset *d = NULL;
    CHECK_OK(ts_data_load_token_docs(bin, 16, CTX, VOCAB, EOT, &d));
    check_rows("data.eot_id", d, EOT);
    if (d) test_sort_window(d);
    ts_dataset_free(d);
    d = NULL;
    CHECK_OK(ts_data_load_token_docs_at(bin, 16, CTX, VOCAB, EOT, off, &d));
    check_rows("data.doc_offsets", d, 0);
    ts_dataset_free(d);
    unlink(bin), unlink(off), rmdir(dir);
    return check_summary("data_token_docs");
}
