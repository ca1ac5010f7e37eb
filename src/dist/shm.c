/* shm.c — the shared-memory transport and its launcher.
 *
 * ts_shm_launch maps one anonymous MAP_SHARED segment and forks the
 * workers, so the segment sits at the same address in every worker:
 *
 *   [ header | per-rank control blocks | channels (head/tail per ordered
 *     pair) | mailbox slots | heap of rank 0 | heap of rank 1 | ... ]
 *
 * Point-to-point messages go through the mailbox of the ordered pair: a
 * single-producer single-consumer ring of SHM_SLOTS slots of SHM_SLOT_BYTES,
 * each stamped with the tag, the message size, and the sequence number and
 * kind of the collective it belongs to, so a rank that calls a different
 * collective than its peer is told so instead of receiving garbage.
 * Copied through the ring, a message longer than the ring moves only while
 * its sender calls into the comm. A point-to-point message outside the
 * collectives whose buffer lies in the segment (ts_comm_alloc) and that
 * needs more than one slot goes instead as one slot naming where it lies:
 * the receiver copies it straight from the sender's buffer, so it arrives
 * while the sender computes (pipeline stages: bench/pipeline.c), and the
 * send is done once the receiver has taken that slot.
 *
 * Each rank's heap starts with a staging area and two small-message slots,
 * and then serves ts_comm_alloc. The native collectives ("direct") read peers' buffers in
 * place: a rank publishes where its input lives, all meet at a barrier,
 * each rank reduces its slice of the elements over all ranks in rank order
 * (((x0 + x1) + x2) + ...) and writes the result into every rank's buffer,
 * and all meet again. Inputs outside the segment are first copied into the
 * staging area, in pieces of its size. All-reduces of up to 512 B instead
 * copy into a slot and meet once; every rank then folds all slots itself,
 * in the same rank order, which halves their latency.
 *
 * Barriers are per-rank epoch counters: a rank bumps its own and waits
 * until every peer's is as high. The launcher watches the workers; when
 * one ends, it records how in the control block, so a rank waiting for it
 * fails at once with a message naming it instead of waiting for the
 * timeout.
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "dist/comm.h"

#define SHM_MAGIC      0x74736d3173686dULL
#define SHM_SLOT_BYTES (64u << 10)
#define SHM_SLOTS      8
#define SHM_STAGING    (4u << 20)
#define SHM_SMALL      512u /* all-reduces up to this size take one barrier */
#define SHM_RESERVED   (SHM_STAGING + 2 * SHM_SMALL)
#define SHM_NOT_SHARED UINT64_MAX
#define SHM_MAX_RANKS  256

enum { ST_STARTING = 0, ST_RUNNING, ST_EXITED, ST_FAILED };

/* The line a peer reads on every collective holds what it needs of this
 * rank and nothing this rank writes on its own: the barrier epoch and, on
 * the same line, where the input of the direct collective lies, so a peer
 * that sees the epoch finds the offset without a second cache miss. The
 * rest is written on every collective (seq, kind, bytes) and read by peers
 * only when something went wrong: on its own line, it never makes the
 * epoch's line bounce. */
typedef struct shm_ctl {
    _Alignas(64) _Atomic uint64_t epoch; /* barriers passed into */
    _Atomic uint64_t src_off;            /* direct algorithms: where this rank's input is */
    _Alignas(64) _Atomic uint64_t seq;   /* collective entered */
    _Atomic uint32_t kind;
    _Atomic uint32_t state;
    _Atomic int32_t status; /* exit status, or 128 + signal */
    _Atomic int32_t pid;
    _Atomic uint64_t bytes;
    char error[768]; /* the worker's last error, for the launcher */
} shm_ctl;

typedef struct shm_chan {
    _Alignas(64) _Atomic uint64_t head; /* slots written by the sender */
    _Alignas(64) _Atomic uint64_t tail; /* slots consumed by the receiver */
} shm_chan;

typedef struct shm_slot {
    uint64_t seq, msg_bytes, chunk;
    uint32_t coll;
    int32_t tag;
    uint64_t direct; /* 0, or where the whole message lies (the sender's buffer) */
    unsigned char pad[24];
    unsigned char data[SHM_SLOT_BYTES];
} shm_slot;

/* A send posted as a direct slot: done once the receiver's tail passes it
 * (kept in ts_req's transport handle). */
typedef struct shm_direct_send {
    uint64_t slot; /* its slot's number on the channel */
    int posted;
} shm_direct_send;
_Static_assert(sizeof(shm_direct_send) <= sizeof(((ts_req *)0)->native), "ts_req.native too small");

typedef struct shm_hdr {
    uint64_t magic;
    int nprocs;
    size_t total, ctl_off, chan_off, slot_off, heap_off, heap_bytes;
    _Atomic int failed;       /* workers that ended with an error or a signal */
    _Atomic int first_failed; /* the first of them + 1 (0: none): the likely cause */
} shm_hdr;

typedef struct blk {
    size_t off, len;
    int used;
} blk;

typedef struct shm_comm {
    ts_comm base;
    unsigned char *seg;
    shm_hdr *hdr;
    shm_ctl *ctl;
    shm_chan *chan;
    shm_slot *slots;
    unsigned char *heap; /* this rank's */
    uint64_t epoch;
    uint64_t small;    /* small all-reduces so far: picks the slot parity */
    ts_req **sq, **rq; /* per peer: pending sends and receives, FIFO */
    blk *blks;         /* this rank's heap, sorted by offset */
    int nblk, cap_blk;
    char gone[256];
} shm_comm;

static inline shm_comm *S(ts_comm *c) {
    return (shm_comm *)c;
}
static inline const shm_comm *CS(const ts_comm *c) {
    return (const shm_comm *)c;
}

/* Each rank's heap: [staging | two small-message slots | ts_comm_alloc]. */
static inline unsigned char *heap_of(const shm_comm *s, int r) {
    return s->seg + s->hdr->heap_off + (size_t)r * s->hdr->heap_bytes;
}

static inline unsigned char *small_slot(const shm_comm *s, int r, uint64_t parity) {
    return heap_of(s, r) + SHM_STAGING + (parity & 1) * SHM_SMALL;
}

/* ---- what the others are doing ----------------------------------------------- */

static void describe_end(const shm_ctl *k, int r, char *out, size_t n) {
    int st = atomic_load(&k->status);
    if (st >= 128)
        snprintf(out, n, "rank %d killed by signal %d", r, st - 128);
    else if (atomic_load(&k->state) == ST_FAILED)
        snprintf(out, n, "rank %d exited with status %d", r, st);
    else
        snprintf(out, n, "rank %d exited", r);
}

static const char *shm_peer_gone(ts_comm *c, int peer) {
    shm_comm *s = S(c);
    int n = c->size;
    if (atomic_load_explicit(&s->hdr->failed, memory_order_acquire) > 0) {
        int first = atomic_load(&s->hdr->first_failed) - 1;
        for (int k = -1; k < n; k++) {
            int r = k < 0 ? first : k;
            if (r >= 0 && r != c->rank && atomic_load(&s->ctl[r].state) == ST_FAILED) {
                describe_end(&s->ctl[r], r, s->gone, sizeof s->gone);
                return s->gone;
            }
        }
    }
    for (int r = 0; r < n; r++) {
        if (r == c->rank || (peer >= 0 && r != peer)) continue;
        if (atomic_load_explicit(&s->ctl[r].state, memory_order_acquire) >= ST_EXITED) {
            describe_end(&s->ctl[r], r, s->gone, sizeof s->gone);
            return s->gone;
        }
    }
    return NULL;
}

static void shm_absent(ts_comm *c, uint64_t seq, ts_absent *a) {
    shm_comm *s = S(c);
    size_t k = 0;
    a->n = 0;
    a->note[0] = 0;
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank) continue;
        const shm_ctl *q = &s->ctl[r];
        uint64_t at = atomic_load_explicit(&q->seq, memory_order_acquire);
        uint32_t st = atomic_load(&q->state);
        /* A rank that entered this collective and then gave up arrived;
         * one killed by a signal may have died half-way through it. */
        if (at >= seq && (st < ST_EXITED || atomic_load(&q->status) < 128)) continue;
        a->ranks[a->n++] = r;
        char one[128];
        if (st >= ST_EXITED)
            describe_end(q, r, one, sizeof one);
        else
            snprintf(one, sizeof one, "rank %d last entered #%llu", r, (unsigned long long)at);
        if (k < sizeof a->note)
            k += (size_t)snprintf(a->note + k, sizeof a->note - k, "%s%s", k ? "; " : "", one);
    }
}

static void shm_enter(ts_comm *c, uint64_t seq, ts_coll_kind kind, size_t bytes) {
    shm_ctl *k = &S(c)->ctl[c->rank];
    atomic_store_explicit(&k->kind, (uint32_t)kind, memory_order_relaxed);
    atomic_store_explicit(&k->bytes, bytes, memory_order_relaxed);
    atomic_store_explicit(&k->seq, seq, memory_order_release);
}

/* ---- point to point ------------------------------------------------------------- */

static void enqueue(ts_req **q, ts_req *r) {
    while (*q) q = &(*q)->next;
    *q = r;
}

static int shm_is_shared(const ts_comm *c, const void *p, size_t bytes);

static ts_status push_sends(shm_comm *s, int peer) {
    int n = s->base.size, me = s->base.rank;
    shm_chan *ch = &s->chan[me * n + peer];
    shm_slot *ring = s->slots + (size_t)(me * n + peer) * SHM_SLOTS;
    uint64_t head = atomic_load_explicit(&ch->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&ch->tail, memory_order_acquire);
    ts_req *r;
    while ((r = s->sq[peer]) && head - tail < SHM_SLOTS) {
        if (r->moved == 0 && !r->coll && r->bytes > SHM_SLOT_BYTES &&
            shm_is_shared(&s->base, r->buf, r->bytes)) {
            shm_slot *sl = &ring[head % SHM_SLOTS];
            sl->seq = r->seq;
            sl->coll = r->coll;
            sl->tag = r->tag;
            sl->msg_bytes = r->bytes;
            sl->chunk = 0;
            sl->direct = (uint64_t)(uintptr_t)r->buf;
            r->moved = r->bytes;
            *(shm_direct_send *)r->native = (shm_direct_send){head, 1};
            atomic_store_explicit(&ch->head, ++head, memory_order_release);
            s->sq[peer] = r->next; /* done when the receiver took the slot (shm_test) */
            continue;
        }
        while (!r->done && head - tail < SHM_SLOTS) {
            shm_slot *sl = &ring[head % SHM_SLOTS];
            size_t chunk = r->bytes - r->moved;
            if (chunk > SHM_SLOT_BYTES) chunk = SHM_SLOT_BYTES;
            sl->seq = r->seq;
            sl->coll = r->coll;
            sl->tag = r->tag;
            sl->msg_bytes = r->bytes;
            sl->chunk = chunk;
            sl->direct = 0;
            if (chunk) memcpy(sl->data, (char *)r->buf + r->moved, chunk);
            r->moved += chunk;
            atomic_store_explicit(&ch->head, ++head, memory_order_release);
            if (r->moved == r->bytes) r->done = 1;
        }
        if (r->done) s->sq[peer] = r->next;
        if (head - tail == SHM_SLOTS) tail = atomic_load_explicit(&ch->tail, memory_order_acquire);
    }
    return TS_OK;
}

static ts_status pull_recvs(shm_comm *s, int peer) {
    ts_comm *c = &s->base;
    int n = c->size, me = c->rank;
    shm_chan *ch = &s->chan[peer * n + me];
    shm_slot *ring = s->slots + (size_t)(peer * n + me) * SHM_SLOTS;
    uint64_t tail = atomic_load_explicit(&ch->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&ch->head, memory_order_acquire);
    ts_req *r;
    while ((r = s->rq[peer]) && tail < head) {
        while (!r->done && tail < head) {
            const shm_slot *sl = &ring[tail % SHM_SLOTS];
            if (r->moved == 0 && (sl->msg_bytes != r->bytes || sl->tag != r->tag ||
                                  sl->seq != r->seq || sl->coll != r->coll)) {
                char got[96] = "", want[96] = "";
                if (sl->coll)
                    snprintf(got, sizeof got, ", %s #%llu",
                             ts_coll_kind_name((ts_coll_kind)(sl->coll - 1)),
                             (unsigned long long)sl->seq);
                if (r->coll)
                    snprintf(want, sizeof want, ", %s #%llu",
                             ts_coll_kind_name((ts_coll_kind)(r->coll - 1)),
                             (unsigned long long)r->seq);
                return ts_coll_fail(c,
                                    "rank %d sent a %llu-byte message (tag %d%s) where this rank "
                                    "expects %zu bytes (tag %d%s)",
                                    peer, (unsigned long long)sl->msg_bytes, sl->tag, got, r->bytes,
                                    r->tag, want);
            }
            if (sl->direct) { /* the whole message, from the sender's buffer */
                memcpy(r->buf, (const void *)(uintptr_t)sl->direct, r->bytes);
                r->moved = r->bytes;
            } else {
                if (sl->chunk) memcpy((char *)r->buf + r->moved, sl->data, sl->chunk);
                r->moved += sl->chunk;
            }
            atomic_store_explicit(&ch->tail, ++tail, memory_order_release);
            if (r->moved == r->bytes) r->done = 1;
        }
        if (r->done) s->rq[peer] = r->next;
        if (tail == head) head = atomic_load_explicit(&ch->head, memory_order_acquire);
    }
    return TS_OK;
}

static ts_status shm_isend(ts_comm *c, ts_req *r) {
    shm_comm *s = S(c);
    r->coll = c->cur_op ? (uint32_t)atomic_load(&s->ctl[c->rank].kind) + 1 : 0;
    enqueue(&s->sq[r->peer], r);
    return push_sends(s, r->peer);
}

static ts_status shm_irecv(ts_comm *c, ts_req *r) {
    shm_comm *s = S(c);
    r->coll = c->cur_op ? (uint32_t)atomic_load(&s->ctl[c->rank].kind) + 1 : 0;
    enqueue(&s->rq[r->peer], r);
    return pull_recvs(s, r->peer);
}

static ts_status shm_test(ts_comm *c, ts_req *r) {
    if (r->done) return TS_OK;
    const shm_direct_send *d = (const shm_direct_send *)r->native;
    if (r->kind == TS_REQ_SEND && d->posted) {
        shm_comm *s = S(c);
        const shm_chan *ch = &s->chan[c->rank * c->size + r->peer];
        if (atomic_load_explicit(&ch->tail, memory_order_acquire) > d->slot) r->done = 1;
        return push_sends(s, r->peer); /* sends queued behind it */
    }
    return r->kind == TS_REQ_SEND ? push_sends(S(c), r->peer) : pull_recvs(S(c), r->peer);
}

/* ---- barrier ----------------------------------------------------------------------- */

typedef struct epoch_wait {
    shm_comm *s;
    int peer;
    uint64_t e;
} epoch_wait;

static int epoch_reached(void *arg) {
    epoch_wait *w = arg;
    return atomic_load_explicit(&w->s->ctl[w->peer].epoch, memory_order_acquire) >= w->e;
}

/* Lines a rank will touch first once a barrier opens, brought into its
 * cache while it waits there: `rd` it will read, `wr` it will write.
 * Either may be empty. */
typedef struct warm_lines {
    const char *rd;
    char *wr;
    size_t rd_bytes, wr_bytes;
} warm_lines;

/* At most this many lines of each range: with the peers' lines the fold
 * reads beside them, 2 x 16 KiB stay within a 48 KiB L1. */
#define WARM_LINES 256

static int all_reached(const shm_comm *s, uint64_t e) {
    for (int q = 0; q < s->base.size; q++)
        if (atomic_load_explicit(&s->ctl[q].epoch, memory_order_acquire) < e) return 0;
    return 1;
}

/* Prefetches w's lines one pair at a time until every peer has arrived
 * or WARM_LINES are done. A 64 KiB reduce-scatter's fold is bound by the
 * lines it moves into L1 (its time is a 64 KiB memcpy's), and the wait
 * at its first barrier would otherwise move none (docs/distributed.md,
 * session 16). Prefetches change no data: the fold still reads after the
 * barrier, so it sees what the peers wrote. */
#if defined(__x86_64__)
__attribute__((target("prfchw"))) /* the output's lines fetched for writing */
#endif
static void
warm_while_waiting(const shm_comm *s, uint64_t e, const warm_lines *w) {
    size_t nrd = w->rd_bytes / 64, nwr = w->wr_bytes / 64;
    for (size_t k = 0; k < WARM_LINES && (k < nrd || k < nwr); k++) {
        if (all_reached(s, e)) return;
        if (k < nrd) __builtin_prefetch(w->rd + 64 * k, 0, 3);
        if (k < nwr) __builtin_prefetch(w->wr + 64 * k, 1, 3);
    }
}

/* Everything this rank wrote before is visible to every peer after. With
 * `w`, its lines are prefetched while the barrier waits. */
static ts_status epoch_barrier_warm(shm_comm *s, const warm_lines *w) {
    ts_comm *c = &s->base;
    uint64_t e = ++s->epoch;
    atomic_store_explicit(&s->ctl[c->rank].epoch, e, memory_order_release);
    if (w) warm_while_waiting(s, e, w);
    for (int q = 0; q < c->size; q++) {
        if (q == c->rank) continue;
        epoch_wait w = {s, q, e};
        unsigned spins = 0;
        while (!epoch_reached(&w)) {
            if (ts_spin(&spins)) {
                ts_status st = ts_wait_check(c, q, epoch_reached, &w);
                if (st != TS_OK) return st;
            }
        }
    }
    return TS_OK;
}

static ts_status epoch_barrier(shm_comm *s) {
    return epoch_barrier_warm(s, NULL);
}

static ts_status shm_barrier(ts_comm *c) {
    return epoch_barrier(S(c));
}

/* ---- direct collectives ------------------------------------------------------------ */

typedef struct direct {
    ts_coll_kind kind;
    size_t count, esz;
    ts_dtype dt;
    ts_reduce_op op;
    const char *src; /* this rank's input */
    char *dst;       /* this rank's output */
    int root;
    size_t slo[SHM_MAX_RANKS], shi[SHM_MAX_RANKS]; /* element range of each rank's input */
    uint64_t off[SHM_MAX_RANKS];                   /* its offset, or SHM_NOT_SHARED */
} direct;

/* Address of global element e of rank q's input while piece [a, b) is staged. */
static inline const char *src_at(const shm_comm *s, const direct *d, int q, size_t e, size_t a) {
    if (d->off[q] != SHM_NOT_SHARED)
        return (const char *)s->seg + d->off[q] + (e - d->slo[q]) * d->esz;
    size_t base = a > d->slo[q] ? a : d->slo[q];
    return (const char *)heap_of(s, q) + (e - base) * d->esz;
}

static inline void clip(size_t lo, size_t hi, size_t a, size_t b, size_t *x, size_t *y) {
    *x = lo > a ? lo : a;
    *y = hi < b ? hi : b;
    if (*y < *x) *y = *x;
}

/* This rank's share of piece [a, b) for all-reduce: whole 64-byte lines,
 * so no two ranks write into the same cache line. */
static void slice(const direct *d, int n, int r, size_t a, size_t b, size_t *x, size_t *y) {
    size_t per = d->esz < 64 ? 64 / d->esz : 1, units = (b - a + per - 1) / per;
    size_t u0 = units * (size_t)r / (size_t)n, u1 = units * (size_t)(r + 1) / (size_t)n;
    *x = a + u0 * per;
    *y = a + u1 * per;
    if (*x > b) *x = b;
    if (*y > b) *y = b;
}

static void direct_work(shm_comm *s, const direct *d, size_t a, size_t b) {
    int n = s->base.size, me = s->base.rank;
    const void *srcs[SHM_MAX_RANKS];
    void *dsts[SHM_MAX_RANKS];
    size_t x, y;
    switch (d->kind) {
    case TS_COLL_ALLREDUCE:
        slice(d, n, me, a, b, &x, &y);
        for (size_t e = x; e < y; e += TS_RED_BLOCK) {
            size_t len = y - e < TS_RED_BLOCK ? y - e : TS_RED_BLOCK;
            for (int q = 0; q < n; q++) dsts[q] = (void *)(srcs[q] = src_at(s, d, q, e, a));
            ts_red_fold_store(dsts, n, srcs, n, len, d->dt, d->op);
        }
        break;
    case TS_COLL_REDUCE_SCATTER: {
        size_t lo, len;
        ts_comm_block(d->count, n, me, &lo, &len);
        clip(lo, lo + len, a, b, &x, &y);
        /* Inputs past the LLC: the output goes straight to memory. */
        if (y > x && d->count * d->esz * (size_t)n >= ts_red_stream_threshold()) {
            for (int q = 0; q < n; q++) srcs[q] = src_at(s, d, q, x, a);
            if (ts_red_fold_stream(d->dst + (x - lo) * d->esz, srcs, n, y - x, d->dt, d->op)) break;
        }
        for (size_t e = x; e < y; e += TS_RED_BLOCK) {
            size_t m = y - e < TS_RED_BLOCK ? y - e : TS_RED_BLOCK;
            for (int q = 0; q < n; q++) srcs[q] = src_at(s, d, q, e, a);
            dsts[0] = d->dst + (e - lo) * d->esz;
            ts_red_fold_store(dsts, 1, srcs, n, m, d->dt, d->op);
        }
        break;
    }
    case TS_COLL_ALLGATHER:
        for (int q = 0; q < n; q++) {
            clip(d->slo[q], d->shi[q], a, b, &x, &y);
            const char *from = src_at(s, d, q, x, a);
            char *to = d->dst + x * d->esz;
            if (y > x && from != to) memcpy(to, from, (y - x) * d->esz);
        }
        break;
    default: /* broadcast */
        if (me != d->root && b > a) memcpy(d->dst + a, src_at(s, d, d->root, a, a), b - a);
        break;
    }
}

/* Copies this rank's part of piece [a, b) between its input and staging. */
static void stage(shm_comm *s, const direct *d, size_t a, size_t b, int in) {
    int me = s->base.rank;
    size_t x, y;
    clip(d->slo[me], d->shi[me], a, b, &x, &y);
    if (y <= x) return;
    unsigned char *st = heap_of(s, me);
    if (in)
        memcpy(st, d->src + (x - d->slo[me]) * d->esz, (y - x) * d->esz);
    else
        memcpy(d->dst + (x - d->slo[me]) * d->esz, st, (y - x) * d->esz);
}

static ts_status run_direct(shm_comm *s, direct *d) {
    ts_comm *c = &s->base;
    int n = c->size, me = c->rank;
    for (int q = 0; q < n; q++) {
        size_t lo = 0, len = d->count;
        if (d->kind == TS_COLL_ALLGATHER) ts_comm_block(d->count, n, q, &lo, &len);
        if (d->kind == TS_COLL_BROADCAST && q != d->root) len = 0;
        d->slo[q] = lo;
        d->shi[q] = lo + len;
    }
    size_t mine = (d->shi[me] - d->slo[me]) * d->esz;
    int shared = mine == 0 || c->ops->is_shared(c, d->src, mine);
    size_t piece = SHM_STAGING / d->esz;
    atomic_store_explicit(&s->ctl[me].src_off,
                          shared ? (uint64_t)((uintptr_t)d->src - (uintptr_t)s->seg)
                                 : SHM_NOT_SHARED,
                          memory_order_relaxed);
    if (!shared) stage(s, d, 0, piece < d->count ? piece : d->count, 1);
    warm_lines w = {0}, *warm = NULL;
    if (d->kind == TS_COLL_REDUCE_SCATTER && shared) {
        /* The fold starts on this rank's own block of its input and on
         * its output, both known before the peers arrive. */
        size_t lo, len;
        ts_comm_block(d->count, n, me, &lo, &len);
        w = (warm_lines){d->src + lo * d->esz, d->dst, len * d->esz, len * d->esz};
        warm = &w;
    }
    ts_status st = epoch_barrier_warm(s, warm);
    if (st != TS_OK) return st;
    int all = 1;
    for (int q = 0; q < n; q++) {
        d->off[q] = atomic_load_explicit(&s->ctl[q].src_off, memory_order_relaxed);
        if (d->off[q] == SHM_NOT_SHARED) all = 0;
    }
    if (all) piece = d->count ? d->count : 1;
    for (size_t a = 0; a < d->count || a == 0; a += piece) {
        size_t b = d->count - a < piece ? d->count : a + piece;
        if (a > 0) {
            if (!shared) stage(s, d, a, b, 1);
            if ((st = epoch_barrier(s)) != TS_OK) return st;
        }
        direct_work(s, d, a, b);
        /* Past this barrier every rank has finished reading every input:
         * a caller may overwrite its buffer as soon as this returns (ZeRO-2
         * reuses a gradient bucket's memory after its reduce-scatter).
         * Copying inputs into alternating slots instead, to meet once,
         * made 16-64 KiB reduce-scatters and all-gathers 2-7x slower: the
         * slot's lines cross between cores on every call, where a caller's
         * unchanged buffer stays cached (docs/distributed.md, session 15). */
        if ((st = epoch_barrier(s)) != TS_OK) return st;
        if (!shared && d->kind == TS_COLL_ALLREDUCE) stage(s, d, a, b, 0);
        if (b >= d->count) break;
    }
    return TS_OK;
}

/* A small all-reduce in one barrier: each rank copies its input into a
 * slot, all meet, and every rank folds all slots in rank order itself, so
 * all get the bits the two-barrier path gives. Slots alternate between two
 * parities: a rank writes parity p again only two small all-reduces later,
 * after the barrier of the one in between, which every peer reaches only
 * once it has finished reading parity p. */
static ts_status small_allreduce(shm_comm *s, void *buf, size_t count, ts_dtype dt,
                                 ts_reduce_op op) {
    int n = s->base.size, me = s->base.rank;
    size_t esz = ts_dtype_size(dt);
    uint64_t p = s->small++;
    memcpy(small_slot(s, me, p), buf, count * esz);
    ts_status st = epoch_barrier(s);
    if (st != TS_OK) return st;
    const void *srcs[SHM_MAX_RANKS];
    void *dst[1];
    for (size_t e = 0; e < count; e += TS_RED_BLOCK) {
        size_t len = count - e < TS_RED_BLOCK ? count - e : TS_RED_BLOCK;
        for (int q = 0; q < n; q++) srcs[q] = small_slot(s, q, p) + e * esz;
        dst[0] = (char *)buf + e * esz;
        ts_red_fold_store(dst, 1, srcs, n, len, dt, op);
    }
    return TS_OK;
}

/* Runs one direct collective. The descriptor is filled field by field:
 * an initialiser would zero its three per-rank arrays (6 KiB, tens of ns)
 * on every call, where a 64 KiB all-gather takes 0.4 us; run_direct sets
 * the entries of the ranks there are. */
static ts_status direct_run(ts_comm *c, ts_coll_kind kind, size_t count, ts_dtype dt,
                            ts_reduce_op op, const void *src, void *dst, int root) {
    direct d;
    d.kind = kind;
    d.count = count;
    d.esz = ts_dtype_size(dt);
    d.dt = dt;
    d.op = op;
    d.src = src;
    d.dst = dst;
    d.root = root;
    return run_direct(S(c), &d);
}

static ts_status shm_allreduce(ts_comm *c, void *buf, size_t count, ts_dtype dt, ts_reduce_op op) {
    if (count * ts_dtype_size(dt) <= SHM_SMALL) return small_allreduce(S(c), buf, count, dt, op);
    return direct_run(c, TS_COLL_ALLREDUCE, count, dt, op, buf, buf, 0);
}

static ts_status shm_reduce_scatter(ts_comm *c, const void *send, void *recv, size_t count,
                                    ts_dtype dt, ts_reduce_op op) {
    return direct_run(c, TS_COLL_REDUCE_SCATTER, count, dt, op, send, recv, 0);
}

static ts_status shm_allgather(ts_comm *c, const void *send, void *recv, size_t count,
                               ts_dtype dt) {
    size_t off, len, esz = ts_dtype_size(dt);
    ts_comm_block(count, c->size, c->rank, &off, &len);
    return direct_run(c, TS_COLL_ALLGATHER, count, dt, TS_RED_SUM,
                      send ? send : (char *)recv + off * esz, recv, 0);
}

static ts_status shm_broadcast(ts_comm *c, void *buf, size_t bytes, int root) {
    return direct_run(c, TS_COLL_BROADCAST, bytes, TS_U8, TS_RED_SUM, buf, buf, root);
}

static int shm_native_ok(const ts_comm *c, ts_coll_kind kind, ts_dtype dt, ts_reduce_op op) {
    (void)c;
    (void)op;
    return kind == TS_COLL_ALLGATHER || kind >= TS_COLL_BROADCAST || ts_red_dtype_ok(dt);
}

/* ---- the heap ---------------------------------------------------------------------- */

static int shm_is_shared(const ts_comm *c, const void *p, size_t bytes) {
    const shm_comm *s = CS(c);
    const unsigned char *u = p;
    return u >= s->seg && u <= s->seg + s->hdr->total &&
           bytes <= (size_t)(s->seg + s->hdr->total - u);
}

static void *shm_alloc(ts_comm *c, size_t bytes) {
    shm_comm *s = S(c);
    size_t need = TS_ALIGN_UP(bytes ? bytes : 1, 64);
    for (int i = 0; i < s->nblk; i++) {
        blk *b = &s->blks[i];
        if (b->used || b->len < need) continue;
        if (b->len > need) {
            if (ts_grow((void **)&s->blks, &s->cap_blk, s->nblk + 1, sizeof *s->blks,
                        "shm heap blocks") != TS_OK)
                return NULL;
            b = &s->blks[i];
            memmove(b + 2, b + 1, (size_t)(s->nblk - i - 1) * sizeof *b);
            b[1] = (blk){b->off + need, b->len - need, 0};
            b->len = need;
            s->nblk++;
        }
        b->used = 1;
        return s->heap + b->off;
    }
    ts_fail(TS_ERR_NOMEM,
            "shm heap of rank %d exhausted: %zu bytes asked, heap is %zu bytes (raise "
            "ts_shm_options.heap_bytes or TESSEL_SHM_HEAP)",
            c->rank, bytes, s->hdr->heap_bytes);
    return NULL;
}

static int shm_free(ts_comm *c, void *p) {
    shm_comm *s = S(c);
    unsigned char *u = p;
    if (u < s->seg || u >= s->seg + s->hdr->total) return 0;
    if (u < s->heap || u >= s->heap + s->hdr->heap_bytes) {
        ts_logf(TS_LOG_WARN, "ts_comm_free: %p belongs to another rank's heap; ignored", p);
        return 1;
    }
    size_t off = (size_t)(u - s->heap);
    int i = 0;
    while (i < s->nblk && s->blks[i].off != off) i++;
    if (i == s->nblk || !s->blks[i].used) {
        ts_logf(TS_LOG_WARN, "ts_comm_free: %p was not allocated by ts_comm_alloc; ignored", p);
        return 1;
    }
    s->blks[i].used = 0;
    if (i + 1 < s->nblk && !s->blks[i + 1].used) {
        s->blks[i].len += s->blks[i + 1].len;
        memmove(&s->blks[i + 1], &s->blks[i + 2], (size_t)(s->nblk - i - 2) * sizeof *s->blks);
        s->nblk--;
    }
    if (i > 0 && !s->blks[i - 1].used) {
        s->blks[i - 1].len += s->blks[i].len;
        memmove(&s->blks[i], &s->blks[i + 1], (size_t)(s->nblk - i - 1) * sizeof *s->blks);
        s->nblk--;
        i--;
    }
    /* Give large free ranges' pages back, so a freed 256 MiB buffer does
     * not keep holding memory. */
    blk *b = &s->blks[i];
    size_t pg = 4096, lo = TS_ALIGN_UP(b->off, pg), hi = (b->off + b->len) & ~(pg - 1);
    if (hi > lo && hi - lo >= (1u << 20)) madvise(s->heap + lo, hi - lo, MADV_REMOVE);
    return 1;
}

static void shm_destroy(ts_comm *c) {
    shm_comm *s = S(c);
    free(s->sq);
    free(s->rq);
    free(s->blks);
    free(s);
}

static const ts_comm_ops shm_ops = {
    .name = "shm",
    .native_name = "direct",
    .isend = shm_isend,
    .irecv = shm_irecv,
    .test = shm_test,
    .enter = shm_enter,
    .peer_gone = shm_peer_gone,
    .absent = shm_absent,
    .allreduce = shm_allreduce,
    .reduce_scatter = shm_reduce_scatter,
    .allgather = shm_allgather,
    .broadcast = shm_broadcast,
    .barrier = shm_barrier,
    .alloc = shm_alloc,
    .free = shm_free,
    .is_shared = shm_is_shared,
    .shares_memory = 1,
    .native_ok = shm_native_ok,
    .destroy = shm_destroy,
};

/* ---- the launcher -------------------------------------------------------------------- */

static size_t env_bytes(const char *name, size_t dflt) {
    const char *e = getenv(name);
    if (!e || !*e) return dflt;
    char *end;
    double v = strtod(e, &end);
    if (end == e || v <= 0) return dflt;
    switch (*end) {
    case 'k':
    case 'K': v *= 1024.0; break;
    case 'm':
    case 'M': v *= 1048576.0; break;
    case 'g':
    case 'G': v *= 1073741824.0; break;
    default: break;
    }
    return (size_t)v;
}

/* Pins this worker to its group of `k` CPUs among those it may use, so
 * ranks stop migrating between cores (as mpirun's --bind-to core does). */
static void pin(int rank, int k) {
    cpu_set_t allowed, mine;
    if (k <= 0 || sched_getaffinity(0, sizeof allowed, &allowed)) return;
    int ncpu = CPU_COUNT(&allowed), cpus[CPU_SETSIZE], m = 0;
    for (int i = 0; i < CPU_SETSIZE && m < ncpu; i++)
        if (CPU_ISSET(i, &allowed)) cpus[m++] = i;
    if (m == 0) return;
    CPU_ZERO(&mine);
    for (int j = 0; j < k; j++) CPU_SET(cpus[(rank * k + j) % m], &mine);
    sched_setaffinity(0, sizeof mine, &mine);
}

/* The worker side: never returns. */
static void worker(unsigned char *seg, int rank, const ts_shm_options *opt, ts_worker_fn fn,
                   void *user, pid_t parent, double timeout) {
    /* A worker must not outlive the launcher that watches it. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    if (opt) pin(rank, opt->cpus_per_rank);
    shm_hdr *hdr = (shm_hdr *)seg;
    shm_ctl *ctl = (shm_ctl *)(seg + hdr->ctl_off);
    int n = hdr->nprocs, rc = 1;
    atomic_store(&ctl[rank].pid, (int32_t)getpid());
    atomic_store_explicit(&ctl[rank].state, ST_RUNNING, memory_order_release);
    shm_comm *s = ts_zalloc(sizeof *s, "shm comm");
    if (s) {
        s->seg = seg;
        s->hdr = hdr;
        s->ctl = ctl;
        s->chan = (shm_chan *)(seg + hdr->chan_off);
        s->slots = (shm_slot *)(seg + hdr->slot_off);
        s->base.ops = &shm_ops;
        s->base.rank = rank;
        s->base.size = n;
        s->base.timeout = timeout;
        s->base.thread_ok = 1;
        s->heap = heap_of(s, rank);
        s->sq = ts_zalloc((size_t)n * sizeof *s->sq, "shm send queues");
        s->rq = ts_zalloc((size_t)n * sizeof *s->rq, "shm receive queues");
        s->cap_blk = 16;
        s->blks = ts_alloc((size_t)s->cap_blk * sizeof *s->blks, "shm heap blocks");
    }
    if (s && s->sq && s->rq && s->blks) {
        s->blks[0] = (blk){SHM_RESERVED, hdr->heap_bytes - SHM_RESERVED, 0};
        s->nblk = 1;
        uint64_t host = opt && opt->host_ids
                            ? ts_hash64(&opt->host_ids[rank], sizeof opt->host_ids[rank], 77)
                            : ts_dist_host_hash();
        if (ts_comm_init_common(&s->base, host) == TS_OK) {
            s->base.no_close = 1;
            rc = fn(&s->base, user);
        }
        s->base.no_close = 0;
        ts_comm_close(&s->base);
    }
    if (rc != 0) {
        snprintf(ctl[rank].error, sizeof ctl[rank].error, "%s", ts_last_error());
        atomic_store(&ctl[rank].status, rc & 0x7f ? rc & 0x7f : 1);
        atomic_store_explicit(&ctl[rank].state, ST_FAILED, memory_order_release);
        int none = 0;
        atomic_compare_exchange_strong(&hdr->first_failed, &none, rank + 1);
        atomic_fetch_add_explicit(&hdr->failed, 1, memory_order_release);
    } else {
        atomic_store_explicit(&ctl[rank].state, ST_EXITED, memory_order_release);
    }
    fflush(stdout);
    fflush(stderr);
    /* _exit, not exit: the worker is a copy of the caller's process, whose
     * atexit handlers and stdio buffers belong to the launcher. */
    _exit(rc != 0 ? (rc & 0x7f ? rc & 0x7f : 1) : 0);
}

static void sleep_ms(int ms) {
    struct timespec ts = {0, (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

ts_status ts_shm_launch(int nprocs, const ts_shm_options *opt, ts_worker_fn fn, void *user,
                        int *exit_codes) {
    if (nprocs < 1 || nprocs > SHM_MAX_RANKS)
        return ts_fail(TS_ERR_INVALID, "ts_shm_launch: %d workers (1..%d)", nprocs, SHM_MAX_RANKS);
    if (!fn) return ts_fail(TS_ERR_INVALID, "ts_shm_launch: worker function is NULL");
    size_t n = (size_t)nprocs;
    size_t heap =
        opt && opt->heap_bytes ? opt->heap_bytes : env_bytes("TESSEL_SHM_HEAP", 2ull << 30);
    heap = TS_ALIGN_UP(heap < 2 * SHM_RESERVED ? 2 * SHM_RESERVED : heap, 1u << 21);
    double timeout = opt && opt->timeout_s > 0 ? opt->timeout_s : ts_dist_default_timeout();
    double grace = opt && opt->grace_s > 0 ? opt->grace_s : 10.0;

    size_t ctl_off = TS_ALIGN_UP(sizeof(shm_hdr), 4096);
    size_t chan_off = TS_ALIGN_UP(ctl_off + n * sizeof(shm_ctl), 4096);
    size_t slot_off = TS_ALIGN_UP(chan_off + n * n * sizeof(shm_chan), 4096);
    size_t heap_off = TS_ALIGN_UP(slot_off + n * n * SHM_SLOTS * sizeof(shm_slot), 1u << 21);
    size_t total = heap_off + n * heap;
    unsigned char *seg = mmap(NULL, total, PROT_READ | PROT_WRITE,
                              MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (seg == MAP_FAILED)
        return ts_fail(TS_ERR_NOMEM,
                       "ts_shm_launch: cannot map %zu bytes of shared memory: %s (lower "
                       "ts_shm_options.heap_bytes or TESSEL_SHM_HEAP)",
                       total, strerror(errno));
    shm_hdr *hdr = (shm_hdr *)seg;
    hdr->magic = SHM_MAGIC;
    hdr->nprocs = nprocs;
    hdr->total = total;
    hdr->ctl_off = ctl_off;
    hdr->chan_off = chan_off;
    hdr->slot_off = slot_off;
    hdr->heap_off = heap_off;
    hdr->heap_bytes = heap;
    shm_ctl *ctl = (shm_ctl *)(seg + ctl_off);

    pid_t *pids = ts_zalloc(n * sizeof *pids, "worker ids");
    int *codes = ts_zalloc(n * sizeof *codes, "worker exit codes");
    if (!pids || !codes) {
        free(pids);
        free(codes);
        munmap(seg, total);
        return TS_ERR_NOMEM;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    int started = 0;
    ts_status result = TS_OK;
    for (int r = 0; r < nprocs; r++) {
        pid_t p = fork();
        if (p == 0) worker(seg, r, opt, fn, user, parent, timeout);
        if (p < 0) {
            result = ts_fail(TS_ERR_IO, "ts_shm_launch: fork of worker %d failed: %s", r,
                             strerror(errno));
            break;
        }
        pids[r] = p;
        started++;
    }
    if (started < nprocs) {
        for (int r = 0; r < started; r++) kill(pids[r], SIGKILL);
    }

    /* Watch the workers: record how each ended where its peers can see
     * it, and after the first failure give the others `grace` seconds to
     * report before stopping them. */
    int alive = started, killed = 0, forwarded = 0;
    double fail_at = started < nprocs ? ts_now() - grace : 0;
    while (alive > 0) {
        for (int r = 0; r < started; r++) {
            if (!pids[r]) continue;
            int st;
            pid_t w = waitpid(pids[r], &st, WNOHANG);
            if (w == 0 || (w < 0 && errno == EINTR)) continue;
            int code = w < 0 ? 255 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            codes[r] = code;
            pids[r] = 0;
            alive--;
            atomic_store(&ctl[r].status, code);
            if (code != 0) {
                uint32_t prev = atomic_exchange(&ctl[r].state, ST_FAILED);
                if (prev != ST_FAILED) {
                    int none = 0;
                    atomic_compare_exchange_strong(&hdr->first_failed, &none, r + 1);
                    atomic_fetch_add(&hdr->failed, 1);
                }
                if (!fail_at) fail_at = ts_now();
            } else {
                atomic_store(&ctl[r].state, ST_EXITED);
            }
        }
        if (alive && opt && opt->forward_stop && *opt->forward_stop && !forwarded) {
            /* the launcher was asked to stop (e.g. SIGINT or SIGTERM sent to it
             * alone): the workers hear it too */
            for (int r = 0; r < started; r++)
                if (pids[r]) kill(pids[r], SIGUSR2);
            forwarded = 1;
        }
        if (alive && fail_at && !killed && ts_now() - fail_at > grace) {
            for (int r = 0; r < started; r++)
                if (pids[r]) kill(pids[r], SIGKILL);
            killed = 1;
        }
        if (alive) sleep_ms(1);
    }

    int nfail = 0;
    for (int r = 0; r < started; r++) nfail += codes[r] != 0;
    if (exit_codes)
        for (int r = 0; r < nprocs; r++) exit_codes[r] = r < started ? codes[r] : -1;
    if (result == TS_OK && nfail) {
        char msg[1024];
        size_t k =
            (size_t)snprintf(msg, sizeof msg, "shm: %d of %d workers failed:", nfail, nprocs);
        int first_err = -1;
        for (int r = 0; r < nprocs && k < sizeof msg; r++) {
            if (!codes[r]) continue;
            if (codes[r] >= 128) {
                const char *name = sigabbrev_np(codes[r] - 128); /* "KILL", NULL if unknown */
                k += (size_t)snprintf(msg + k, sizeof msg - k,
                                      " rank %d killed by signal %d%s%s%s%s;", r, codes[r] - 128,
                                      name ? " (SIG" : "", name ? name : "", name ? ")" : "",
                                      killed ? " (stopped by the launcher)" : "");
            } else
                k += (size_t)snprintf(msg + k, sizeof msg - k, " rank %d exit status %d;", r,
                                      codes[r]);
            if (first_err < 0 && ctl[r].error[0]) first_err = r;
        }
        if (first_err >= 0 && k < sizeof msg)
            snprintf(msg + k, sizeof msg - k, " rank %d: %s", first_err, ctl[first_err].error);
        result = ts_fail(TS_ERR_IO, "%s", msg);
    }
    free(pids);
    free(codes);
    munmap(seg, total);
    return result;
}
