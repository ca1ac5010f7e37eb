/* Back-to-back shm reduce-scatters and all-gathers whose callers rewrite
 * their buffers the moment a call returns, as ZeRO does with a gradient
 * bucket: the direct collectives read peers' inputs in place, so a rank
 * must not return while a peer still reads its input. If it did, the
 * peer would fold or copy the next round's values, and its result for
 * this round would be wrong. Many rounds, odd sizes around the 64 KiB the
 * bench's smallest target point uses, 2-4 ranks (4 on fewer cores
 * oversubscribe them, so a rank is often descheduled half-way through a
 * call), inputs inside the segment (read in place) and outside it
 * (staged). Values are small integers, so every sum is exact in f32. */
#include <stdio.h>
#include <stdlib.h>
#include "check.h"
#include "tessel/dist.h"

#define ROUNDS 100

static float val(int rank, size_t i, int round) {
    return (float)((rank * 7 + (int)(i % 1009) * 3 + round * 5) % 23 - 11);
}

static float sum(int n, size_t i, int round) {
    float acc = 0;
    for (int r = 0; r < n; r++) acc += val(r, i, round);
    return acc;
}

static void fill(float *x, int rank, size_t lo, size_t len, int round) {
    for (size_t i = 0; i < len; i++) x[i] = val(rank, lo + i, round);
}

/* The rounds of one size: `wrong` counts result elements that differ. */
static ts_status rounds(ts_comm *c, size_t count, int in_segment, size_t *wrong) {
    int n = ts_comm_size(c), me = ts_comm_rank(c);
    size_t lo, len;
    ts_comm_block(count, n, me, &lo, &len);
    size_t in_bytes = count * sizeof(float) + 64;
    float *in = in_segment ? ts_comm_alloc(c, in_bytes) : malloc(in_bytes);
    float *part = malloc((len + 1) * sizeof *part), *all = malloc(in_bytes);
    float *mine = in_segment ? ts_comm_alloc(c, (len + 1) * sizeof *mine) : malloc(in_bytes);
    ts_status st = in && part && all && mine ? TS_OK : TS_ERR_NOMEM;
    if (st == TS_OK) fill(in, me, 0, count, 0);
    if (st == TS_OK) fill(mine, me, lo, len, 0);
    for (int k = 0; k < ROUNDS && st == TS_OK; k++) {
        st = ts_reduce_scatter(c, in, part, count, TS_F32, TS_RED_SUM, TS_ALGO_NATIVE);
        if (st != TS_OK) break;
        fill(in, me, 0, count, k + 1); /* at once: a peer still reading sees round k + 1 */
        for (size_t i = 0; i < len; i++) *wrong += part[i] != sum(n, lo + i, k);
        st = ts_allgather(c, mine, all, count, TS_F32, TS_ALGO_NATIVE);
        if (st != TS_OK) break;
        fill(mine, me, lo, len, k + 1);
        for (int q = 0; q < n; q++) {
            size_t qlo, qlen;
            ts_comm_block(count, n, q, &qlo, &qlen);
            for (size_t i = qlo; i < qlo + qlen; i++) *wrong += all[i] != val(q, i, k);
        }
    }
    if (in_segment) {
        ts_comm_free(c, in);
        ts_comm_free(c, mine);
    } else {
        free(in);
        free(mine);
    }
    free(part);
    free(all);
    return st;
}

static int work(ts_comm *c, void *user) {
    (void)user;
    const size_t counts[] = {1, 17, 1031, 4099, 16383, 16384, 16385, 65539};
    for (size_t s = 0; s < sizeof counts / sizeof counts[0]; s++) {
        for (int seg = 0; seg < 2; seg++) {
            size_t wrong = 0;
            ts_status st = rounds(c, counts[s], seg, &wrong);
            if (st != TS_OK || wrong) {
                fprintf(stderr, "rank %d, %zu floats, input %s the segment: %s, %zu wrong\n",
                        ts_comm_rank(c), counts[s], seg ? "in" : "outside",
                        st == TS_OK ? "ok" : ts_last_error(), wrong);
                return 1;
            }
        }
    }
    return 0;
}

int main(void) {
    setenv("TESSEL_COLL_CACHE", "0", 1);
    setenv("TESSEL_COLL_PROBE", "0", 1);
    for (int n = 2; n <= 4; n++)
        CHECK(ts_shm_launch(n, NULL, work, NULL, NULL) == TS_OK, "%d ranks: %s", n,
              ts_last_error());
    return check_summary("dist_reuse");
}
