/* Meetings on sequence counters in shared memory (dist/shm_meet.h), 2 to 4 forked ranks: what a
 * rank wrote before arriving is what every rank reads past the meeting, over many meetings with
 * ranks held up at random, and the words carried on meetings; a late rank's peers wait (the counts
 * and the time they publish); a peer that exits fails the wait naming it, soon, not at the timeout;
 * a peer that never comes fails it at the timeout. Each worker returns the number of its failed
 * checks, with a message on stderr. */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "dist/shm_meet.h"
#include "tessel/dist.h"
#include "tessel/util.h"

enum { MEETINGS = 3000, MAXR = 4 };

#define WFAIL(...)                                                                                 \
    do {                                                                                           \
        fprintf(stderr, "FAIL rank %d %s:%d: ", ts_comm_rank(c), __FILE__, __LINE__);              \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        bad++;                                                                                     \
    } while (0)

/* The block: the counters, then one value per rank. */
static ts_status open_block(ts_comm *c, ts_meet *m, uint64_t **vals) {
    const int N = ts_comm_size(c);
    void *p;
    ts_status s = ts_comm_alloc_shared(c, ts_meet_bytes(N) + MAXR * 64, &p);
    if (s != TS_OK) return s;
    ts_meet_init(m, c, p, N, ts_comm_rank(c));
    *vals = (uint64_t *)((unsigned char *)p + ts_meet_bytes(N));
    return ts_barrier(c); /* every counter zeroed before the first meeting */
}

/* The word rank r carries to its second meeting of round i. */
static uint64_t carried(uint64_t i, int r) {
    return (i * 31 + (uint64_t)r * 7) % 5 == 0 ? (uint64_t)1 << r : 0;
}

/* Each meeting: write the meeting's number, meet, read every rank's, meet again before the next
 * write (the protocol of repro_gather's split finish), the second carrying a word per rank whose
 * or every rank reads. A rank sleeps now and then so that the others spin and nap. Without the
 * wait, a reader would see a peer's older number. */
static int work_order(ts_comm *c, void *user) {
    (void)user;
    const int N = ts_comm_size(c), r = ts_comm_rank(c);
    int bad = 0;
    ts_meet m;
    uint64_t *vals;
    if (open_block(c, &m, &vals) != TS_OK) return 100;
    for (uint64_t i = 1; i <= MEETINGS && !bad; i++) {
        if ((i * 7 + (uint64_t)r * 13) % 97 == 0) usleep(200 + 100 * (unsigned)r);
        ((volatile uint64_t *)vals)[r * 8] = i;
        ts_meet_arrive(&m);
        if (ts_meet_wait(&m) != TS_OK)
            WFAIL("meeting %llu: %s", (unsigned long long)i, ts_last_error());
        for (int q = 0; q < N; q++)
            if (((volatile uint64_t *)vals)[q * 8] != i)
                WFAIL("meeting %llu: rank %d's value is %llu", (unsigned long long)i, q,
                      (unsigned long long)((volatile uint64_t *)vals)[q * 8]);
        /* the second meeting carries a word per rank: bit q set at about one meeting in 5 */
        ts_meet_arrive_with(&m, carried(i, r));
        if (ts_meet_wait(&m) != TS_OK) WFAIL("second meeting %llu", (unsigned long long)i);
        uint64_t want = 0;
        for (int q = 0; q < N; q++) want |= carried(i, q);
        if (ts_meet_or(&m) != want)
            WFAIL("second meeting %llu: or of the words %llx, not %llx", (unsigned long long)i,
                  (unsigned long long)ts_meet_or(&m), (unsigned long long)want);
    }
    if (m.seq != 2 * MEETINGS || m.st.meets != 2 * MEETINGS)
        WFAIL("%llu meetings", (unsigned long long)m.seq);
    return bad;
}

/* The last rank arrives 20 ms after the others, 5 times: every other rank waits each time, for at
 * least that long in all, napping; the late rank waits at none; the peers' published counts agree.
 */
static int work_late(ts_comm *c, void *user) {
    (void)user;
    const int N = ts_comm_size(c), r = ts_comm_rank(c), late = N - 1;
    int bad = 0;
    ts_meet m;
    uint64_t *vals;
    if (open_block(c, &m, &vals) != TS_OK) return 100;
    for (int i = 0; i < 5; i++) {
        /* the late rank comes 20 ms after every other rank has arrived (however loaded the
         * machine: they wait at every one of these meetings) */
        for (int q = 0; r == late && q < N; q++) {
            ts_meet_stats w;
            do {
                ts_meet_peer_stats(&m, q, &w);
                if (q != r && w.meets <= m.seq) usleep(100);
            } while (q != r && w.meets <= m.seq);
        }
        if (r == late) usleep(20 * 1000);
        ts_meet_arrive(&m);
        if (ts_meet_wait(&m) != TS_OK) WFAIL("meeting %d: %s", i, ts_last_error());
    }
    /* one more meeting: every rank published its waits before arriving here */
    ts_meet_arrive(&m);
    if (ts_meet_wait(&m) != TS_OK) WFAIL("last meeting");
    for (int q = 0; q < N; q++) {
        ts_meet_stats w;
        ts_meet_peer_stats(&m, q, &w);
        if (w.meets < 6) WFAIL("rank %d published %llu meetings", q, (unsigned long long)w.meets);
        if (q == late && w.late > 1)
            WFAIL("the late rank waited at %llu", (unsigned long long)w.late);
        if (q != late && (w.late < 5 || w.naps < 5 || w.wait_s < 0.08))
            WFAIL("rank %d waited at %llu meetings, %.3f s, %llu naps", q,
                  (unsigned long long)w.late, w.wait_s, (unsigned long long)w.naps);
    }
    return bad;
}

/* The last rank exits without arriving: the others fail with its rank named, long before the
 * 60 s timeout. */
static int work_gone(ts_comm *c, void *user) {
    (void)user;
    const int N = ts_comm_size(c), r = ts_comm_rank(c);
    int bad = 0;
    ts_meet m;
    uint64_t *vals;
    ts_comm_set_timeout(c, 60);
    if (open_block(c, &m, &vals) != TS_OK) return 100;
    if (r == N - 1) raise(SIGKILL);
    const double t0 = ts_now();
    ts_meet_arrive(&m);
    if (ts_meet_wait(&m) == TS_OK) WFAIL("a meeting without rank %d", N - 1);
    char want[64];
    /* the rank that ended is named, even while another (rank 1 under load) is still on its
     * way to the meeting */
    snprintf(want, sizeof want, "waiting at meeting 1: rank %d killed", N - 1);
    if (!strstr(ts_last_error(), want)) WFAIL("message: %s", ts_last_error());
    if (ts_now() - t0 > 20) WFAIL("noticed after %.1f s", ts_now() - t0);
    return bad ? bad : 50; /* a known code: the launcher fails the run */
}

/* Rank 1 comes 1.5 s late, after rank 0's 0.3 s timeout: rank 0 fails naming it and the
 * timeout; rank 1 then passes (rank 0 did arrive). */
static int work_timeout(ts_comm *c, void *user) {
    (void)user;
    const int r = ts_comm_rank(c);
    int bad = 0;
    ts_meet m;
    uint64_t *vals;
    if (open_block(c, &m, &vals) != TS_OK) return 100;
    ts_comm_set_timeout(c, 0.3);
    if (r == 1) usleep(1500 * 1000);
    ts_meet_arrive(&m);
    const ts_status s = ts_meet_wait(&m);
    if (r == 0 && (s == TS_OK || !strstr(ts_last_error(), "timed out") ||
                   !strstr(ts_last_error(), "waiting for rank 1")))
        WFAIL("rank 0: %s", s == TS_OK ? "passed" : ts_last_error());
    if (r == 1 && s != TS_OK) WFAIL("rank 1: %s", ts_last_error());
    return bad;
}

int main(void) {
    for (int n = 2; n <= MAXR; n++) {
        CHECK(ts_shm_launch(n, NULL, work_order, NULL, NULL) == TS_OK,
              "%d ranks: every value written before a meeting is read after it: %s", n,
              ts_last_error());
        CHECK(ts_shm_launch(n, NULL, work_late, NULL, NULL) == TS_OK,
              "%d ranks: the peers of a late rank wait and say so: %s", n, ts_last_error());
    }
    /* the launcher leaves the survivors time to notice (a loaded machine) */
    ts_shm_options o = {0};
    o.grace_s = 20;
    int codes[3] = {0};
    CHECK(ts_shm_launch(3, &o, work_gone, NULL, codes) != TS_OK && codes[0] == 50 &&
              codes[1] == 50 && codes[2] == 128 + SIGKILL,
          "a killed peer fails the wait: codes %d %d %d", codes[0], codes[1], codes[2]);
    CHECK(ts_shm_launch(2, &o, work_timeout, NULL, NULL) == TS_OK,
          "a peer later than the timeout: %s", ts_last_error());
    CHECK(ts_meet_bytes(3) == 192, "a cache line per rank");
    return check_summary("unit/shm_meet");
}
