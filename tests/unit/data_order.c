/* Example orders (src/data/order.c): the tail of a Fisher-Yates
 * permutation drawn alone equals the whole permutation's tail, so the split
 * is the one the full permutation gave; the keyed bijection is a
 * permutation of [0, n) for every n, differs between seeds and epochs, and
 * a shuffled loader over token windows visits every window once per epoch,
 * seeks exactly (with and without prefetch) and needs no table. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "data/data.h"
#include "data/data_internal.h"

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void check_tail(int64_t n, int64_t count, uint64_t key, uint64_t hi) {
    int64_t *full = malloc(sizeof *full * (size_t)(n ? n : 1));
    int64_t *tail = malloc(sizeof *tail * (size_t)(count ? count : 1));
    ts_order_permute(full, n, key, hi);
    CHECK_OK(ts_order_permutation_tail(n, count, key, hi, tail));
    CHECK(!memcmp(full + (n - count), tail, sizeof *tail * (size_t)count),
          "tail of %lld entries of a permutation of %lld equals the full one's", (long long)count,
          (long long)n);
    free(full);
    free(tail);
}

/* b is a permutation of [0, n): every value in range, each once. */
static int is_permutation(const ts_order_bijection *b, int64_t n) {
    unsigned char *seen = calloc((size_t)n, 1);
    int ok = seen != NULL;
    for (int64_t i = 0; ok && i < n; i++) {
        const int64_t v = ts_order_bijection_at(b, i);
        ok = v >= 0 && v < n && !seen[v];
        if (ok) seen[v] = 1;
    }
    free(seen);
    return ok;
}

/* A dataset of n in-memory examples whose x and y are the example's number. */
static ts_dataset *numbered(int64_t n, int bijection) {
    ts_dataset *d = calloc(1, sizeof *d);
    d->n = n;
    d->x_dtype = d->y_dtype = TS_I64;
    d->x_rank = d->y_rank = 1;
    d->x_dims[0] = d->y_dims[0] = 1;
    d->x = malloc(sizeof(int64_t) * (size_t)n);
    d->y = malloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) ((int64_t *)d->x)[i] = ((int64_t *)d->y)[i] = i;
    d->shuffle_bijection = bijection;
    return d;
}

static void check_split(int64_t n, double fraction, uint64_t seed) {
    ts_dataset *all = numbered(n, 0), *train = NULL, *val = NULL;
    CHECK_OK(ts_dataset_split(all, fraction, seed, &train, &val));
    int64_t *perm = malloc(sizeof *perm * (size_t)n);
    CHECK_OK(ts_data_split_permutation(n, seed, perm));
    const int64_t n_val = (int64_t)(fraction * (double)n + 0.5), n_train = n - n_val;
    qsort(perm, (size_t)n_train, sizeof *perm, cmp_i64);
    qsort(perm + n_train, (size_t)n_val, sizeof *perm, cmp_i64);
    int ok = train && val && train->n == n_train && val->n == n_val;
    for (int64_t i = 0; ok && i < n_train; i++) ok = ((int64_t *)train->x)[i] == perm[i];
    for (int64_t i = 0; ok && i < n_val; i++) ok = ((int64_t *)val->x)[i] == perm[n_train + i];
    CHECK(ok, "split of %lld at %g (seed %llu) is the sorted parts of the full permutation",
          (long long)n, fraction, (unsigned long long)seed);
    free(perm);
    ts_dataset_free(all);
    ts_dataset_free(train);
    ts_dataset_free(val);
}

/* Every batch of loader a from position `from` on equals a fresh loader's
 * after seeking there; depth: prefetch of the second loader. */
static int seek_equals_replay(const ts_dataset *d, int64_t batch, int64_t from, int64_t count,
                              int depth) {
    ts_loader *a = NULL, *b = NULL;
    int ok =
        ts_loader_new(d, batch, 1, 9, &a) == TS_OK && ts_loader_new(d, batch, 1, 9, &b) == TS_OK;
    int64_t *xa = malloc(sizeof *xa * (size_t)batch), *ya = malloc(sizeof *ya * (size_t)batch);
    int64_t *xb = malloc(sizeof *xb * (size_t)batch), *yb = malloc(sizeof *yb * (size_t)batch);
    for (int64_t k = 0; ok && k < from; k++) ok = ts_loader_next(a, xa, ya) == TS_OK;
    ok = ok && ts_loader_seek(b, from) == TS_OK && ts_loader_prefetch(b, depth) == TS_OK;
    for (int64_t k = 0; ok && k < count; k++)
        ok = ts_loader_next(a, xa, ya) == TS_OK && ts_loader_next(b, xb, yb) == TS_OK &&
             !memcmp(xa, xb, sizeof *xa * (size_t)batch) &&
             !memcmp(ya, yb, sizeof *ya * (size_t)batch);
    free(xa), free(ya), free(xb), free(yb);
    ts_loader_free(a);
    ts_loader_free(b);
    return ok;
}

int main(void) {
    /* The tail alone: every count from none to all, small and larger n. */
    const int64_t ns[] = {1, 2, 3, 7, 64, 1000};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
        for (int64_t c = 0; c <= ns[k]; c += ns[k] > 64 ? 97 : 1)
            check_tail(ns[k], c, 0x1234 + (uint64_t)k, (uint64_t)k);
    check_tail(1000, 1000, 5, 0);
    check_tail(100003, 1, 6, 2);
    CHECK(ts_order_permutation_tail(5, 6, 1, 0, (int64_t[6]){0}) == TS_ERR_INVALID,
          "a tail longer than the permutation is refused");

    /* Splits: the drawn tail (val <= n / 4) and the full permutation give the
     * parts the full permutation sorted gave before. */
    check_split(1000, 0.1, 3);
    check_split(1000, 0.25, 4);
    check_split(1000, 0.5, 5);
    check_split(12345, 0.00001, 0);
    check_split(7, 0.0, 1);
    check_split(2, 0.5, 2);

    /* The bijection: a permutation for every n, including around powers of two. */
    int all_perm = 1;
    for (int64_t n = 1; n <= 300; n++)
        for (uint64_t e = 0; e < 3; e++) {
            ts_order_bijection b;
            ts_order_bijection_init(&b, n, 77 + (uint64_t)n, e);
            all_perm &= is_permutation(&b, n);
        }
    CHECK(all_perm, "the bijection is a permutation of [0, n) for n = 1..300, 3 epochs");
    const int64_t big[] = {4095, 4096, 4097, 65536 * 3 + 1, 1000003};
    for (size_t k = 0; k < sizeof big / sizeof big[0]; k++) {
        ts_order_bijection b;
        ts_order_bijection_init(&b, big[k], 11, 1);
        CHECK(is_permutation(&b, big[k]), "the bijection permutes [0, %lld)", (long long)big[k]);
    }
    /* Seeds and epochs change the order; the same pair repeats it. */
    ts_order_bijection e0, e1, s1, again;
    ts_order_bijection_init(&e0, 100000, 21, 0);
    ts_order_bijection_init(&e1, 100000, 21, 1);
    ts_order_bijection_init(&s1, 100000, 22, 0);
    ts_order_bijection_init(&again, 100000, 21, 0);
    int diff_e = 0, diff_s = 0, same = 1, moved = 0;
    for (int64_t i = 0; i < 1000; i++) {
        const int64_t v = ts_order_bijection_at(&e0, i);
        diff_e += v != ts_order_bijection_at(&e1, i);
        diff_s += v != ts_order_bijection_at(&s1, i);
        same &= v == ts_order_bijection_at(&again, i);
        moved += v != i;
    }
    CHECK(diff_e > 990 && diff_s > 990, "epochs (%d) and seeds (%d) give other orders", diff_e,
          diff_s);
    CHECK(same, "the same key and epoch give the same order");
    CHECK(moved > 990, "the order is shuffled (%d of 1000 moved)", moved);
    /* Not clumped: the first 1000 positions spread over the whole range. */
    int64_t lo = 100000, hi = -1;
    for (int64_t i = 0; i < 1000; i++) {
        const int64_t v = ts_order_bijection_at(&e0, i);
        lo = v < lo ? v : lo, hi = v > hi ? v : hi;
    }
    CHECK(lo < 1000 && hi > 99000, "first 1000 positions span [%lld, %lld]", (long long)lo,
          (long long)hi);

    /* A shuffled loader over windows: each epoch visits every example once,
     * epochs differ, seeking equals replay (mid-epoch and across epochs). */
    ts_dataset *d = numbered(1000, 1);
    ts_loader *l = NULL;
    CHECK_OK(ts_loader_new(d, 10, 1, 9, &l));
    int once = 1, differs = 0;
    int64_t first_epoch[1000];
    for (int epoch = 0; epoch < 3; epoch++) {
        unsigned char seen[1000] = {0};
        for (int k = 0; k < 100; k++) {
            int64_t x[10], y[10];
            CHECK_OK(ts_loader_next(l, x, y));
            for (int j = 0; j < 10; j++) {
                once &= x[j] >= 0 && x[j] < 1000 && !seen[x[j]] && x[j] == y[j];
                if (x[j] >= 0 && x[j] < 1000) seen[x[j]] = 1;
                if (epoch == 0)
                    first_epoch[k * 10 + j] = x[j];
                else
                    differs += first_epoch[k * 10 + j] != x[j];
            }
        }
    }
    CHECK(once, "every epoch visits every example once");
    CHECK(differs > 1900, "epochs 1 and 2 are other orders than epoch 0 (%d differ)", differs);
    ts_loader_free(l);
    CHECK(seek_equals_replay(d, 10, 37, 150, 0), "seek mid-epoch equals replay");
    CHECK(seek_equals_replay(d, 10, 37, 150, 3), "seek mid-epoch equals replay, prefetch 3");
    CHECK(seek_equals_replay(d, 7, 250, 30, 2), "seek into epoch 1 equals replay, batch 7");
    ts_dataset_free(d);
    return check_summary("unit/data_order");
}
