/* Meetings on sequence counters in shared memory. See shm_meet.h. */
#include "dist/shm_meet.h"
#include <stdatomic.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include "dist/comm.h"
#include "tessel/util.h"

enum { LINE = 64 };

/* Rank r's line: the meetings it reached, then what its waits cost (published for the peers'
 * logs: late, naps, nanoseconds waited), then the word its last ts_meet_arrive_with carried. */
enum { SEQ, LATE, NAPS, WAIT_NS, CARRIED, WORDS };
_Static_assert(WORDS * sizeof(uint64_t) <= LINE, "a rank's words fit in its cache line");

static _Atomic uint64_t *word(const ts_meet *m, int r, int w) {
    return (_Atomic uint64_t *)(m->lines + (size_t)r * LINE) + w;
}

static _Atomic uint64_t *counter(const ts_meet *m, int r) {
    return word(m, r, SEQ);
}

size_t ts_meet_bytes(int N) {
    return (size_t)(N > 0 ? N : 0) * LINE;
}

void ts_meet_init(ts_meet *m, ts_comm *comm, void *lines, int N, int rank) {
    memset(m, 0, sizeof *m);
    m->comm = comm, m->lines = lines, m->N = N, m->rank = rank;
    for (int w = 0; w < WORDS; w++)
        atomic_store_explicit(word(m, rank, w), 0, memory_order_release);
    /* the naps of the waits below wake when asked (shm_meet.h); failing, they oversleep */
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
}

void ts_meet_peer_stats(const ts_meet *m, int r, ts_meet_stats *out) {
    memset(out, 0, sizeof *out);
    if (r < 0 || r >= m->N) return;
    out->meets = atomic_load_explicit(counter(m, r), memory_order_acquire);
    out->late = atomic_load_explicit(word(m, r, LATE), memory_order_relaxed);
    out->naps = atomic_load_explicit(word(m, r, NAPS), memory_order_relaxed);
    out->wait_s = 1e-9 * (double)atomic_load_explicit(word(m, r, WAIT_NS), memory_order_relaxed);
}

void ts_meet_arrive(ts_meet *m) {
    m->seq++;
    m->st.meets++;
    atomic_store_explicit(counter(m, m->rank), m->seq, memory_order_release);
}

void ts_meet_arrive_with(ts_meet *m, uint64_t w) {
    /* ordered before the counter by its release store: a peer past the meeting reads it */
    atomic_store_explicit(word(m, m->rank, CARRIED), w, memory_order_relaxed);
    ts_meet_arrive(m);
}

uint64_t ts_meet_or(const ts_meet *m) {
    uint64_t any = 0;
    for (int q = 0; q < m->N; q++)
        any |= atomic_load_explicit(word(m, q, CARRIED), memory_order_relaxed);
    return any;
}

/* The first rank that has not reached meeting seq, or -1 when all have. */
static int first_behind(const ts_meet *m, int from) {
    for (int q = from; q < m->N; q++)
        if (q != m->rank && atomic_load_explicit(counter(m, q), memory_order_acquire) < m->seq)
            return q;
    return -1;
}

ts_status ts_meet_wait(ts_meet *m) {
    int q = first_behind(m, 0);
    if (q < 0) return TS_OK;
    m->st.late++;
    const double t0 = ts_now(), spin = TS_MEET_SPIN_US * 1e-6, limit = ts_comm_timeout(m->comm);
    const struct timespec nap = {0, 50000};
    /* the short spin: the counter read every few pauses, the clock every 64 */
    for (unsigned i = 1; q >= 0; i++) {
        ts_cpu_pause();
        if (i % 8 == 0) q = first_behind(m, q);
        if (i % 64 == 0 && ts_now() - t0 > spin) break;
    }
    /* then naps, each followed by a look at the peer (cheap atomics on shm) and the clock */
    while (q >= 0) {
        nanosleep(&nap, NULL);
        m->st.naps++;
        if ((q = first_behind(m, q)) < 0) break;
        const char *gone = m->comm->ops->peer_gone ? m->comm->ops->peer_gone(m->comm, q) : NULL;
        /* a peer that arrived just before it ended delivered what it had to; `gone` names
         * the rank that ended, which need not be q, the first of those still missing */
        if (gone && (q = first_behind(m, q)) >= 0)
            return ts_fail(TS_ERR_IO, "rank %d waiting at meeting %llu: %s", m->rank,
                           (unsigned long long)m->seq, gone);
        if (q >= 0 && ts_now() - t0 > limit)
            return ts_fail(TS_ERR_IO,
                           "rank %d timed out after %.1f s waiting for rank %d at "
                           "meeting %llu",
                           m->rank, ts_now() - t0, q, (unsigned long long)m->seq);
    }
    m->st.wait_s += ts_now() - t0;
    atomic_store_explicit(word(m, m->rank, LATE), m->st.late, memory_order_relaxed);
    atomic_store_explicit(word(m, m->rank, NAPS), m->st.naps, memory_order_relaxed);
    atomic_store_explicit(word(m, m->rank, WAIT_NS), (uint64_t)(m->st.wait_s * 1e9),
                          memory_order_relaxed);
    return TS_OK;
}
