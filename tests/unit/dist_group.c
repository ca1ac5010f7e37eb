/* ts_comm_group (src/dist/group.h) on 4 shm ranks split into the two
 * groups a 2-stage x 2-replica pipeline makes ({0, 2} and {1, 3}): an
 * all-gather, an all-reduce and a non-blocking all-gather inside each
 * group give the group's values only, parent messages between the same
 * ranks before and after keep their order, and bad rank lists are refused
 * with a message naming the rank. A member killed before a group
 * collective is named by the survivor. Workers record their checks in a
 * MAP_SHARED block the parent adds to its counts. */
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "check.h"
#include "dist/group.h"
#include "tessel/dist.h"

typedef struct shared {
    _Atomic int checks, fails;
    char msg[4][512];
} shared;
static shared *SH;

static void wcheck(int ok, int rank, const char *what) {
    atomic_fetch_add(&SH->checks, 1);
    if (!ok) {
        atomic_fetch_add(&SH->fails, 1);
        snprintf(SH->msg[rank], sizeof SH->msg[rank], "%s: %s", what, ts_last_error());
    }
}

static int work(ts_comm *c, void *user) {
    (void)user;
    const int r = ts_comm_rank(c), peer = r ^ 2; /* the other member of r's group */
    /* a parent message to the group peer before the group exists */
    double before = 100 + r, got = 0;
    ts_comm_req q[2];
    ts_status s = ts_comm_isend(c, peer, 7, &before, sizeof before, &q[0]);
    if (s == TS_OK) s = ts_comm_irecv(c, peer, 7, &got, sizeof got, &q[1]);
    if (s == TS_OK) s = ts_comm_wait(c, q, 2);
    wcheck(s == TS_OK && got == 100 + peer, r, "parent message before");
    const int ranks[2] = {r % 2, r % 2 + 2};
    ts_comm *g = NULL;
    s = ts_comm_group(c, 2, ranks, &g);
    wcheck(s == TS_OK && ts_comm_size(g) == 2 && ts_comm_rank(g) == r / 2, r, "group made");
    if (s != TS_OK) return 1;
    /* all-gather: each group sees its own members' values, in group order */
    float mine[3] = {(float)r, (float)r + 0.5f, (float)(10 * r)}, all[6];
    memcpy(all + 3 * (r / 2), mine, sizeof mine);
    s = ts_allgather(g, NULL, all, 6, TS_F32, TS_ALGO_AUTO);
    int ok = s == TS_OK;
    for (int k = 0; k < 2 && ok; k++)
        ok = all[3 * k] == (float)ranks[k] && all[3 * k + 2] == (float)(10 * ranks[k]);
    wcheck(ok, r, "group all-gather");
    double sum = r;
    s = ts_allreduce(g, &sum, 1, TS_F64, TS_RED_SUM, TS_ALGO_AUTO);
    wcheck(s == TS_OK && sum == (double)(ranks[0] + ranks[1]), r, "group all-reduce");
    /* non-blocking (the group's communication thread) */
    int32_t v[2] = {0, 0};
    v[r / 2] = 1000 + r;
    ts_coll_ticket t;
    s = ts_allgather_start(g, NULL, v, 2, TS_I32, TS_ALGO_AUTO, &t);
    if (s == TS_OK) s = ts_coll_wait(g, t);
    wcheck(s == TS_OK && v[0] == 1000 + ranks[0] && v[1] == 1000 + ranks[1], r,
           "group all-gather started and waited");
    /* the parent after: a message, then a collective over all 4 */
    double after = 200 + r;
    got = 0;
    s = ts_comm_isend(c, peer, 7, &after, sizeof after, &q[0]);
    if (s == TS_OK) s = ts_comm_irecv(c, peer, 7, &got, sizeof got, &q[1]);
    if (s == TS_OK) s = ts_comm_wait(c, q, 2);
    wcheck(s == TS_OK && got == 200 + peer, r, "parent message after");
    double total = r;
    s = ts_allreduce(c, &total, 1, TS_F64, TS_RED_SUM, TS_ALGO_AUTO);
    wcheck(s == TS_OK && total == 6, r, "parent all-reduce after");
    /* bad rank lists (nothing is sent) */
    ts_comm *bad = NULL;
    const int out_of[2] = {r, 4}, twice[2] = {r, r}, without[1] = {(r + 1) % 4};
    s = ts_comm_group(c, 2, out_of, &bad);
    wcheck(s == TS_ERR_INVALID && !bad && strstr(ts_last_error(), "rank 4 is not a rank"), r,
           "rank out of range");
    s = ts_comm_group(c, 2, twice, &bad);
    wcheck(s == TS_ERR_INVALID && strstr(ts_last_error(), "listed twice"), r, "rank twice");
    s = ts_comm_group(c, 1, without, &bad);
    wcheck(s == TS_ERR_INVALID && strstr(ts_last_error(), "is not in the group"), r,
           "own rank missing");
    ts_comm_close(g);
    return 0;
}

/* Rank 2 dies before the group's all-gather: rank 0, its group peer,
 * fails naming it. */
static int dying(ts_comm *c, void *user) {
    (void)user;
    const int r = ts_comm_rank(c), ranks[2] = {r % 2, r % 2 + 2};
    ts_comm *g = NULL;
    if (ts_comm_group(c, 2, ranks, &g) != TS_OK) return 1;
    if (r == 2) raise(SIGKILL);
    float v[2] = {0, 0};
    ts_status s = ts_allgather(g, NULL, v, 2, TS_F32, TS_ALGO_RING);
    if (r == 0)
        wcheck(s != TS_OK && strstr(ts_last_error(), "group rank 1 (rank 2 of the parent comm)") &&
                   strstr(ts_last_error(), "signal 9"),
               r, "a dead member named");
    ts_comm_close(g);
    return s == TS_OK ? 0 : 1;
}

int main(void) {
    SH = mmap(NULL, sizeof *SH, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (SH == MAP_FAILED) return 1;
    memset(SH, 0, sizeof *SH);
    ts_shm_options o = {.timeout_s = 60};
    ts_status s = ts_shm_launch(4, &o, work, NULL, NULL);
    CHECK(s == TS_OK, "4 workers with groups: %s", ts_last_error());
    o.grace_s = 20;
    int codes[4] = {0};
    s = ts_shm_launch(4, &o, dying, NULL, codes);
    CHECK(s != TS_OK && codes[2] == 128 + SIGKILL && codes[0] == 1,
          "a killed member fails the launch: exit codes %d %d %d %d", codes[0], codes[1], codes[2],
          codes[3]);
    const int checks = atomic_load(&SH->checks), fails = atomic_load(&SH->fails);
    CHECK(checks == 4 * 10 + 1, "workers made %d checks", checks);
    CHECK(fails == 0, "%d worker checks failed: %s | %s | %s | %s", fails, SH->msg[0], SH->msg[1],
          SH->msg[2], SH->msg[3]);
    return check_summary("unit/dist_group");
}
