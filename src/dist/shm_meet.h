/* shm_meet.h — ranks that share memory meet on sequence counters instead of a collective.
 *
 *     void *lines;                                       // ts_meet_bytes(N), shared by all ranks
 *     ts_meet m;
 *     ts_meet_init(&m, comm, lines, N, rank);            // then one barrier before the first meet
 *     ...write data the peers read...
 *     ts_meet_arrive(&m);                                // publishes it: meeting m.seq
 *     ts_meet_wait(&m);                                  // every rank has arrived there
 *     ...read what every rank wrote before arriving...
 *     ts_meet_arrive_with(&m, flag);                     // or: arrive carrying a word
 *     ts_meet_wait(&m);
 *     any = ts_meet_or(&m);                              // every rank's word, or-ed
 *
 * Each rank counts the meetings it has reached on a cache line of its own (release) and a rank
 * past a meeting has seen (acquire) everything every rank wrote before arriving there, so data
 * written before arriving needs no collective of its own: the meeting's sequence number orders
 * it. Counters only grow, so a rank already at the next meeting never holds up one still
 * waiting at this one. The comm's own barrier would do the same with the comm's waits; these
 * waits spin briefly (TS_MEET_SPIN_US) and then nap (50 us sleeps, as ts_comm_wait_naps does
 * for the collectives), never yield in a loop: a waiter that keeps its vCPU busy can slow a peer
 * whose vCPU shares the physical core with it (docs/reproducibility.md, "Cost", session 15). A peer
 * that ended (killed, exited) or the comm's timeout fails the wait with a message naming the rank.
 * A word can ride on a meeting (ts_meet_arrive_with), so a small agreement, such as the session's
 * stop flag, needs no collective of its own (docs/reproducibility.md, session 16).
 */
#ifndef TS_DIST_SHM_MEET_H
#define TS_DIST_SHM_MEET_H

#include <stddef.h>
#include <stdint.h>
#include "tessel/dist.h"
#include "tessel/status.h"

/* How long a waiter spins before it naps: about the pause phase of the collectives' waits
 * (2048 pauses, 55-67 us on the AMD EPYC of docs/reproducibility.md), long enough for the skew of
 * two ranks doing the same work, and a nap (50 us asked, 100-190 us taken there) costs little
 * beside a step of milliseconds. The collectives' waits then yield 1024 times before they nap
 * (0.3-20 ms there, depending on what else runs); these do not. */
enum { TS_MEET_SPIN_US = 60 };

/* What the waits cost this rank (for the step's log, docs/reproducibility.md). */
typedef struct ts_meet_stats {
    uint64_t meets; /* meetings reached */
    uint64_t late;  /* of them, those this rank reached before some peer (it waited) */
    uint64_t naps;  /* naps taken once the spin was over */
    double wait_s;  /* wall seconds spent waiting */
} ts_meet_stats;

typedef struct ts_meet {
    ts_comm *comm;
    unsigned char *lines; /* [N] counters, one cache line each */
    int N, rank;
    uint64_t seq; /* the meetings this rank has arrived at */
    ts_meet_stats st;
} ts_meet;

/* Bytes of the counters of N ranks (a cache line each). */
size_t ts_meet_bytes(int N);

/* Zeroes this rank's counter in lines (ts_meet_bytes(N), mapped by every rank of comm). The
 * ranks must be ordered after every rank's init (a barrier) before the first meeting: a peer's
 * counter may hold a stale count until its owner zeroed it. Also asks for the calling thread's
 * timers to be exact (PR_SET_TIMERSLACK 1 ns; the waits must run on this thread to gain from
 * it): a 50 us nap then takes about 85 us on the AMD EPYC of docs/reproducibility.md instead
 * of 130-135 us with the default 50 us slack, so a waiter that napped starts sooner after its
 * peer arrived. */
void ts_meet_init(ts_meet *m, ts_comm *comm, void *lines, int N, int rank);

/* Rank r's waits as it last published them (after each of its waits; this rank's own: m->st),
 * for a log line of every rank's: which rank waits for which, and how long. */
void ts_meet_peer_stats(const ts_meet *m, int r, ts_meet_stats *out);

/* Arrives at the next meeting: what this rank wrote before is visible to every rank past it. */
void ts_meet_arrive(ts_meet *m);

/* The same, carrying `word` to every rank past this meeting (ts_meet_or). */
void ts_meet_arrive_with(ts_meet *m, uint64_t word);

/* After ts_meet_wait of a meeting every rank arrived at with ts_meet_arrive_with: the or of their
 * words. Read it before this rank arrives at its next meeting (a peer past that one may carry a
 * new word). */
uint64_t ts_meet_or(const ts_meet *m);

/* Waits until every rank has arrived at this rank's last meeting (ts_meet_arrive first). Fails
 * when a peer ended or after the comm's timeout. */
ts_status ts_meet_wait(ts_meet *m);

#endif
