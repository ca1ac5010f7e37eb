/* collectives.c — collective algorithms over point-to-point messages, and
 * the public collective calls.
 *
 * Every algorithm here fixes the order in which each element is reduced and
 * computes each reduced element on exactly one rank (or on a pair that
 * holds identical operands), so every rank ends with the same bits and a
 * rerun with the same algorithm reproduces them:
 *
 *   ring  reduce-scatter then all-gather around the ring; block b is
 *         reduced along the chain b+1, b+2, ..., b.
 *   rhd   recursive halving (reduce-scatter), then recursive doubling
 *         (all-gather); pairs combine in the tree of the highest rank bit
 *         first. Ranks beyond the largest power of two fold into a partner
 *         first and get the result back at the end.
 *   rd    recursive doubling on the whole message: log2(n) exchanges, for
 *         small messages; each pair combines lower rank first.
 *   hier  reduce to each host's first rank (in rank order), all-reduce
 *         among those leaders (rd below 64 KiB, ring above), broadcast
 *         within each host.
 */
#include <string.h>
#include "dist/comm.h"

/* The members of a collective: global ranks[0..n), this rank is ranks[me].
 * ranks == NULL means the whole comm in rank order. */
typedef struct grp {
    int n, me;
    const int *ranks;
} grp;

static inline int G(const grp *g, int i) {
    return g->ranks ? g->ranks[i] : i;
}

static ts_status xchg(ts_comm *c, int to, const void *sbuf, size_t sbytes, int from, void *rbuf,
                      size_t rbytes, int tag) {
    ts_req rs, rr;
    ts_req *list[2];
    int n = 0;
    ts_status s;
    if (to >= 0) {
        if ((s = ts_p2p_start(c, &rs, TS_REQ_SEND, to, tag, (void *)sbuf, sbytes)) != TS_OK)
            return s;
        list[n++] = &rs;
    }
    if (from >= 0) {
        if ((s = ts_p2p_start(c, &rr, TS_REQ_RECV, from, tag, rbuf, rbytes)) != TS_OK) return s;
        list[n++] = &rr;
    }
    return ts_p2p_waitall(c, list, n);
}

static void *scratch_or_fail(ts_comm *c, size_t bytes) {
    void *p = ts_comm_scratch(c, bytes ? bytes : 64);
    if (!p)
        ts_error_prefix("%s #%llu on rank %d", c->cur_op, (unsigned long long)c->cur_seq, c->rank);
    return p;
}

/* ---- all-reduce ------------------------------------------------------------- */

static ts_status ring_allreduce(ts_comm *c, const grp *g, char *buf, size_t count, ts_dtype dt,
                                ts_reduce_op op) {
    int n = g->n, me = g->me, tag = TS_TAG_COLL + TS_COLL_ALLREDUCE;
    size_t esz = ts_dtype_size(dt), maxlen = count / (size_t)n + 1;
    char *tmp = scratch_or_fail(c, maxlen * esz);
    if (!tmp) return TS_ERR_NOMEM;
    int right = G(g, (me + 1) % n), left = G(g, (me + n - 1) % n);
    ts_status s;
    for (int st = 0; st < n - 1; st++) {
        size_t so, sl, ro, rl;
        ts_comm_block(count, n, (me - st + n) % n, &so, &sl);
        ts_comm_block(count, n, (me - st - 1 + 2 * n) % n, &ro, &rl);
        if ((s = xchg(c, right, buf + so * esz, sl * esz, left, tmp, rl * esz, tag)) != TS_OK)
            return s;
        ts_red_pair(buf + ro * esz, tmp, buf + ro * esz, rl, dt, op);
    }
    for (int st = 0; st < n - 1; st++) {
        size_t so, sl, ro, rl;
        ts_comm_block(count, n, (me + 1 - st + n) % n, &so, &sl);
        ts_comm_block(count, n, (me - st + n) % n, &ro, &rl);
        if ((s = xchg(c, right, buf + so * esz, sl * esz, left, buf + ro * esz, rl * esz, tag)) !=
            TS_OK)
            return s;
    }
    return TS_OK;
}

/* Largest power of two <= n. */
static int pow2_floor(int n) {
    int p = 1;
    while (p * 2 <= n) p *= 2;
    return p;
}

/* Member index of virtual rank v when `rem` odd members carry the folded
 * pairs (members 2i and 2i+1 for i < rem become virtual rank i). */
static inline int real_of(int v, int rem) {
    return v < rem ? 2 * v + 1 : v + rem;
}

/* Non-power-of-two groups: members 2i (i < rem) hand their data to 2i+1
 * and sit out. Returns this member's virtual rank, or -1. */
static ts_status fold_in(ts_comm *c, const grp *g, char *buf, size_t count, ts_dtype dt,
                         ts_reduce_op op, int rem, int tag, int *vr) {
    size_t bytes = count * ts_dtype_size(dt);
    int me = g->me;
    if (me < 2 * rem) {
        if (me % 2 == 0) {
            *vr = -1;
            return xchg(c, G(g, me + 1), buf, bytes, -1, NULL, 0, tag);
        }
        char *tmp = scratch_or_fail(c, bytes);
        if (!tmp) return TS_ERR_NOMEM;
        ts_status s = xchg(c, -1, NULL, 0, G(g, me - 1), tmp, bytes, tag);
        if (s != TS_OK) return s;
        ts_red_pair(buf, tmp, buf, count, dt, op);
        *vr = me / 2;
        return TS_OK;
    }
    *vr = me - rem;
    return TS_OK;
}

static ts_status fold_out(ts_comm *c, const grp *g, char *buf, size_t bytes, int rem, int tag) {
    int me = g->me;
    if (me >= 2 * rem) return TS_OK;
    if (me % 2 == 0) return xchg(c, -1, NULL, 0, G(g, me + 1), buf, bytes, tag);
    return xchg(c, G(g, me - 1), buf, bytes, -1, NULL, 0, tag);
}

static ts_status rd_allreduce(ts_comm *c, const grp *g, char *buf, size_t count, ts_dtype dt,
                              ts_reduce_op op) {
    int n = g->n, p = pow2_floor(n), rem = n - p, vr, tag = TS_TAG_COLL + TS_COLL_ALLREDUCE;
    size_t bytes = count * ts_dtype_size(dt);
    ts_status s = fold_in(c, g, buf, count, dt, op, rem, tag, &vr);
    if (s != TS_OK) return s;
    if (vr >= 0) {
        char *tmp = scratch_or_fail(c, bytes);
        if (!tmp) return TS_ERR_NOMEM;
        for (int d = 1; d < p; d *= 2) {
            int pv = vr ^ d, peer = G(g, real_of(pv, rem));
            if ((s = xchg(c, peer, buf, bytes, peer, tmp, bytes, tag)) != TS_OK) return s;
            if (vr < pv)
                ts_red_pair(buf, buf, tmp, count, dt, op);
            else
                ts_red_pair(buf, tmp, buf, count, dt, op);
        }
    }
    return fold_out(c, g, buf, bytes, rem, tag);
}

static ts_status rhd_allreduce(ts_comm *c, const grp *g, char *buf, size_t count, ts_dtype dt,
                               ts_reduce_op op) {
    int n = g->n, p = pow2_floor(n), rem = n - p, vr, tag = TS_TAG_COLL + TS_COLL_ALLREDUCE;
    size_t esz = ts_dtype_size(dt);
    ts_status s = fold_in(c, g, buf, count, dt, op, rem, tag, &vr);
    if (s != TS_OK) return s;
    if (vr >= 0 && p > 1) {
        char *tmp = scratch_or_fail(c, (count / 2 + 1) * esz);
        if (!tmp) return TS_ERR_NOMEM;
        size_t lo = 0, hi = count, stack_lo[32], stack_hi[32];
        int level = 0;
        for (int d = p / 2; d >= 1; d /= 2) {
            int pv = vr ^ d, peer = G(g, real_of(pv, rem));
            size_t mid = lo + (hi - lo) / 2, klo, khi, glo, ghi;
            if (!(vr & d)) {
                klo = lo, khi = mid, glo = mid, ghi = hi;
            } else {
                klo = mid, khi = hi, glo = lo, ghi = mid;
            }
            stack_lo[level] = lo;
            stack_hi[level++] = hi;
            if ((s = xchg(c, peer, buf + glo * esz, (ghi - glo) * esz, peer, tmp, (khi - klo) * esz,
                          tag)) != TS_OK)
                return s;
            char *k = buf + klo * esz;
            if (vr < pv)
                ts_red_pair(k, k, tmp, khi - klo, dt, op);
            else
                ts_red_pair(k, tmp, k, khi - klo, dt, op);
            lo = klo, hi = khi;
        }
        for (int d = 1; d < p; d *= 2) {
            int pv = vr ^ d, peer = G(g, real_of(pv, rem));
            size_t plo = stack_lo[--level], phi = stack_hi[level];
            size_t olo = lo == plo ? hi : plo, ohi = lo == plo ? phi : lo;
            if ((s = xchg(c, peer, buf + lo * esz, (hi - lo) * esz, peer, buf + olo * esz,
                          (ohi - olo) * esz, tag)) != TS_OK)
                return s;
            lo = plo, hi = phi;
        }
    }
    return fold_out(c, g, buf, count * esz, rem, tag);
}

/* Binomial tree from member `root`. */
static ts_status tree_bcast(ts_comm *c, const grp *g, void *buf, size_t bytes, int root) {
    int n = g->n, vr = (g->me - root + n) % n, mask = 1, tag = TS_TAG_COLL + TS_COLL_BROADCAST;
    ts_status s;
    while (mask < n) {
        if (vr & mask) {
            if ((s = xchg(c, -1, NULL, 0, G(g, (vr - mask + root) % n), buf, bytes, tag)) != TS_OK)
                return s;
            break;
        }
        mask *= 2;
    }
    for (mask /= 2; mask > 0; mask /= 2)
        if (vr + mask < n &&
            (s = xchg(c, G(g, (vr + mask + root) % n), buf, bytes, -1, NULL, 0, tag)) != TS_OK)
            return s;
    return TS_OK;
}

static ts_status hier_allreduce(ts_comm *c, char *buf, size_t count, ts_dtype dt, ts_reduce_op op) {
    size_t bytes = count * ts_dtype_size(dt);
    int *local = c->members, *leaders = c->members + c->size, nl = 0, nh = 0, me_local = 0;
    int myhost = c->host[c->rank], tag = TS_TAG_COLL + TS_COLL_ALLREDUCE;
    for (int r = 0; r < c->size; r++) {
        if (c->host[r] == myhost) {
            if (r == c->rank) me_local = nl;
            local[nl++] = r;
        }
        int first = 1;
        for (int q = 0; q < r && first; q++)
            if (c->host[q] == c->host[r]) first = 0;
        if (first) leaders[nh++] = r;
    }
    ts_status s;
    /* Within the host: the leader folds its members in in rank order. */
    if (me_local == 0) {
        char *tmp = scratch_or_fail(c, bytes);
        if (!tmp) return TS_ERR_NOMEM;
        for (int i = 1; i < nl; i++) {
            if ((s = xchg(c, -1, NULL, 0, local[i], tmp, bytes, tag)) != TS_OK) return s;
            ts_red_pair(buf, buf, tmp, count, dt, op);
        }
        int me_lead = 0;
        while (leaders[me_lead] != c->rank) me_lead++;
        grp lg = {nh, me_lead, leaders};
        if (nh > 1) {
            s = bytes < 65536 ? rd_allreduce(c, &lg, buf, count, dt, op)
                              : ring_allreduce(c, &lg, buf, count, dt, op);
            if (s != TS_OK) return s;
        }
    } else if ((s = xchg(c, local[0], buf, bytes, -1, NULL, 0, tag)) != TS_OK) {
        return s;
    }
    grp hg = {nl, me_local, local};
    return tree_bcast(c, &hg, buf, bytes, 0);
}

/* ---- reduce-scatter, all-gather, barrier --------------------------------- */

static ts_status ring_reduce_scatter(ts_comm *c, const char *send, char *recv, size_t count,
                                     ts_dtype dt, ts_reduce_op op) {
    int n = c->size, me = c->rank, tag = TS_TAG_COLL + TS_COLL_REDUCE_SCATTER;
    size_t esz = ts_dtype_size(dt), maxlen = count / (size_t)n + 1;
    char *tmp = scratch_or_fail(c, 2 * maxlen * esz);
    if (!tmp) return TS_ERR_NOMEM;
    char *bufs[2] = {tmp, tmp + maxlen * esz};
    const char *partial = NULL; /* what the last step reduced */
    int right = (me + 1) % n, left = (me + n - 1) % n;
    for (int st = 0; st < n - 1; st++) {
        size_t so, sl, ro, rl;
        int sb = (me - st - 1 + 2 * n) % n, rb = (me - st - 2 + 2 * n) % n;
        ts_comm_block(count, n, sb, &so, &sl);
        ts_comm_block(count, n, rb, &ro, &rl);
        const char *src = st == 0 ? send + so * esz : partial;
        char *in = bufs[st % 2];
        ts_status s = xchg(c, right, src, sl * esz, left, in, rl * esz, tag);
        if (s != TS_OK) return s;
        char *out = st == n - 2 ? recv : in;
        ts_red_pair(out, in, send + ro * esz, rl, dt, op);
        partial = out;
    }
    return TS_OK;
}

static ts_status ring_allgather(ts_comm *c, char *recv, size_t count, ts_dtype dt) {
    int n = c->size, me = c->rank, tag = TS_TAG_COLL + TS_COLL_ALLGATHER;
    size_t esz = ts_dtype_size(dt);
    int right = (me + 1) % n, left = (me + n - 1) % n;
    for (int st = 0; st < n - 1; st++) {
        size_t so, sl, ro, rl;
        ts_comm_block(count, n, (me - st + n) % n, &so, &sl);
        ts_comm_block(count, n, (me - st - 1 + n) % n, &ro, &rl);
        ts_status s =
            xchg(c, right, recv + so * esz, sl * esz, left, recv + ro * esz, rl * esz, tag);
        if (s != TS_OK) return s;
    }
    return TS_OK;
}

/* Dissemination: log2(n) rounds of empty messages. */
static ts_status dissemination_barrier(ts_comm *c) {
    int n = c->size, me = c->rank, tag = TS_TAG_COLL + TS_COLL_BARRIER;
    char dummy = 0;
    for (int k = 1; k < n; k *= 2) {
        ts_status s = xchg(c, (me + k) % n, &dummy, 0, (me - k + n) % n, &dummy, 0, tag);
        if (s != TS_OK) return s;
    }
    return TS_OK;
}

/* ---- dispatch ---------------------------------------------------------------- */

static const char *label(const ts_comm *c, ts_coll_algo a) {
    if (a == TS_ALGO_NATIVE) return c->ops->native_name ? c->ops->native_name : "native";
    return ts_coll_algo_name(a);
}

const char *ts_comm_algo_label(const ts_comm *c, ts_coll_algo a) {
    return c ? label(c, a) : ts_coll_algo_name(a);
}

static ts_status finish(ts_comm *c, ts_status s) {
    ts_coll_leave(c, s);
    return s;
}

ts_status ts_coll_run_allreduce(ts_comm *c, void *buf, size_t count, ts_dtype dt, ts_reduce_op op,
                                ts_coll_algo algo) {
    size_t bytes = count * ts_dtype_size(dt);
    ts_coll_algo a;
    ts_status s = ts_coll_choose(c, TS_COLL_ALLREDUCE, bytes, dt, op, algo, &a);
    if (s != TS_OK) return s;
    ts_coll_enter(c, TS_COLL_ALLREDUCE, bytes, dt, 1, op);
    c->cur_algo = label(c, a);
    if (c->size == 1 || count == 0) return finish(c, TS_OK);
    grp g = {c->size, c->rank, NULL};
    switch (a) {
    case TS_ALGO_NATIVE: s = c->ops->allreduce(c, buf, count, dt, op); break;
    case TS_ALGO_RHD: s = rhd_allreduce(c, &g, buf, count, dt, op); break;
    case TS_ALGO_RD: s = rd_allreduce(c, &g, buf, count, dt, op); break;
    case TS_ALGO_HIER: s = hier_allreduce(c, buf, count, dt, op); break;
    default: s = ring_allreduce(c, &g, buf, count, dt, op); break;
    }
    return finish(c, s);
}

ts_status ts_coll_run_reduce_scatter(ts_comm *c, const void *send, void *recv, size_t count,
                                     ts_dtype dt, ts_reduce_op op, ts_coll_algo algo) {
    size_t esz = ts_dtype_size(dt), bytes = count * esz;
    ts_coll_algo a;
    ts_status s = ts_coll_choose(c, TS_COLL_REDUCE_SCATTER, bytes, dt, op, algo, &a);
    if (s != TS_OK) return s;
    ts_coll_enter(c, TS_COLL_REDUCE_SCATTER, bytes, dt, 1, op);
    c->cur_algo = label(c, a);
    if (c->size == 1) {
        if (count && send != recv) memmove(recv, send, bytes);
        return finish(c, TS_OK);
    }
    if (a == TS_ALGO_NATIVE)
        s = c->ops->reduce_scatter(c, send, recv, count, dt, op);
    else
        s = ring_reduce_scatter(c, send, recv, count, dt, op);
    return finish(c, s);
}

ts_status ts_coll_run_allgather(ts_comm *c, const void *send, void *recv, size_t count, ts_dtype dt,
                                ts_coll_algo algo) {
    size_t esz = ts_dtype_size(dt), bytes = count * esz, off, len;
    ts_coll_algo a;
    ts_status s = ts_coll_choose(c, TS_COLL_ALLGATHER, bytes, dt, TS_RED_SUM, algo, &a);
    if (s != TS_OK) return s;
    ts_coll_enter(c, TS_COLL_ALLGATHER, bytes, dt, 0, TS_RED_SUM);
    c->cur_algo = label(c, a);
    ts_comm_block(count, c->size, c->rank, &off, &len);
    char *mine = (char *)recv + off * esz;
    if (a == TS_ALGO_NATIVE) return finish(c, c->ops->allgather(c, send, recv, count, dt));
    if (send && send != mine && len) memmove(mine, send, len * esz);
    if (c->size == 1) return finish(c, TS_OK);
    return finish(c, ring_allgather(c, recv, count, dt));
}

ts_status ts_coll_run_broadcast(ts_comm *c, void *buf, size_t bytes, int root) {
    ts_coll_algo a;
    ts_status s = ts_coll_choose(c, TS_COLL_BROADCAST, bytes, TS_U8, TS_RED_SUM, TS_ALGO_AUTO, &a);
    if (s != TS_OK) return s;
    ts_coll_enter(c, TS_COLL_BROADCAST, bytes, TS_U8, 0, TS_RED_SUM);
    c->cur_algo = a == TS_ALGO_NATIVE ? label(c, a) : "tree";
    if (c->size == 1) return finish(c, TS_OK);
    grp g = {c->size, c->rank, NULL};
    if (a == TS_ALGO_NATIVE) return finish(c, c->ops->broadcast(c, buf, bytes, root));
    return finish(c, tree_bcast(c, &g, buf, bytes, root));
}

ts_status ts_coll_run_barrier(ts_comm *c) {
    ts_coll_algo a;
    ts_status s = ts_coll_choose(c, TS_COLL_BARRIER, 0, TS_U8, TS_RED_SUM, TS_ALGO_AUTO, &a);
    if (s != TS_OK) return s;
    ts_coll_enter(c, TS_COLL_BARRIER, 0, TS_U8, 0, TS_RED_SUM);
    c->cur_algo = a == TS_ALGO_NATIVE ? label(c, a) : "dissemination";
    if (c->size == 1) return finish(c, TS_OK);
    if (a == TS_ALGO_NATIVE) return finish(c, c->ops->barrier(c));
    return finish(c, dissemination_barrier(c));
}

/* ---- the public calls ----------------------------------------------------- */

ts_status ts_coll_validate(const ts_comm *c, ts_coll_kind kind, const void *buf, const void *send,
                           void *recv, size_t count, ts_dtype dt, ts_reduce_op op,
                           ts_coll_algo algo, int root) {
    const char *what = ts_coll_kind_name(kind);
    if (!c) return ts_fail(TS_ERR_INVALID, "%s: comm is NULL", what);
    if (c->broken)
        return ts_fail(TS_ERR_IO, "%s: comm unusable after an earlier failure: %s", what,
                       c->broken_msg);
    if ((unsigned)algo >= TS_ALGO_COUNT)
        return ts_fail(TS_ERR_INVALID, "%s: unknown algorithm %d", what, (int)algo);
    if (kind == TS_COLL_BARRIER) return TS_OK;
    if (kind == TS_COLL_BROADCAST) {
        if (root < 0 || root >= c->size)
            return ts_fail(TS_ERR_INVALID, "broadcast: root %d outside 0..%d", root, c->size - 1);
        if (!buf && count) return ts_fail(TS_ERR_INVALID, "broadcast: buffer is NULL");
        return TS_OK;
    }
    if ((unsigned)dt >= TS_DTYPE_COUNT)
        return ts_fail(TS_ERR_INVALID, "%s: unknown dtype %d", what, (int)dt);
    if (kind != TS_COLL_ALLGATHER && !ts_red_dtype_ok(dt))
        return ts_fail(TS_ERR_UNSUPPORTED, "%s: cannot reduce %s (f32, f64, bf16, f16, i32, i64)",
                       what, ts_dtype_name(dt));
    if (kind != TS_COLL_ALLGATHER && (unsigned)op >= TS_RED_COUNT)
        return ts_fail(TS_ERR_INVALID, "%s: unknown reduction %d", what, (int)op);
    size_t esz = ts_dtype_size(dt);
    if (count > ((size_t)1 << 62) / esz)
        return ts_fail(TS_ERR_INVALID, "%s: count %zu too large", what, count);
    if (count && kind == TS_COLL_ALLREDUCE && !buf)
        return ts_fail(TS_ERR_INVALID, "%s: buffer is NULL", what);
    if (count && kind == TS_COLL_REDUCE_SCATTER && (!send || !recv))
        return ts_fail(TS_ERR_INVALID, "%s: send or recv is NULL", what);
    if (count && kind == TS_COLL_ALLGATHER && !recv)
        return ts_fail(TS_ERR_INVALID, "%s: recv is NULL", what);
    return TS_OK;
}

ts_status ts_allreduce(ts_comm *c, void *buf, size_t count, ts_dtype dt, ts_reduce_op op,
                       ts_coll_algo algo) {
    ts_status s = ts_coll_validate(c, TS_COLL_ALLREDUCE, buf, NULL, NULL, count, dt, op, algo, 0);
    if (s != TS_OK) return s;
    if (ts_async_route(c, TS_COLL_ALLREDUCE, buf, NULL, NULL, count, dt, op, algo, 0, &s)) return s;
    return ts_coll_run_allreduce(c, buf, count, dt, op, algo);
}

ts_status ts_reduce_scatter(ts_comm *c, const void *send, void *recv, size_t count, ts_dtype dt,
                            ts_reduce_op op, ts_coll_algo algo) {
    ts_status s =
        ts_coll_validate(c, TS_COLL_REDUCE_SCATTER, NULL, send, recv, count, dt, op, algo, 0);
    if (s != TS_OK) return s;
    if (ts_async_route(c, TS_COLL_REDUCE_SCATTER, NULL, send, recv, count, dt, op, algo, 0, &s))
        return s;
    return ts_coll_run_reduce_scatter(c, send, recv, count, dt, op, algo);
}

ts_status ts_allgather(ts_comm *c, const void *send, void *recv, size_t count, ts_dtype dt,
                       ts_coll_algo algo) {
    ts_status s =
        ts_coll_validate(c, TS_COLL_ALLGATHER, NULL, send, recv, count, dt, TS_RED_SUM, algo, 0);
    if (s != TS_OK) return s;
    if (ts_async_route(c, TS_COLL_ALLGATHER, NULL, send, recv, count, dt, TS_RED_SUM, algo, 0, &s))
        return s;
    return ts_coll_run_allgather(c, send, recv, count, dt, algo);
}

ts_status ts_broadcast(ts_comm *c, void *buf, size_t bytes, int root) {
    ts_status s = ts_coll_validate(c, TS_COLL_BROADCAST, buf, NULL, NULL, bytes, TS_U8, TS_RED_SUM,
                                   TS_ALGO_AUTO, root);
    if (s != TS_OK) return s;
    if (ts_async_route(c, TS_COLL_BROADCAST, buf, NULL, NULL, bytes, TS_U8, TS_RED_SUM,
                       TS_ALGO_AUTO, root, &s))
        return s;
    return ts_coll_run_broadcast(c, buf, bytes, root);
}

ts_status ts_barrier(ts_comm *c) {
    ts_status s = ts_coll_validate(c, TS_COLL_BARRIER, NULL, NULL, NULL, 0, TS_U8, TS_RED_SUM,
                                   TS_ALGO_AUTO, 0);
    if (s != TS_OK) return s;
    if (ts_async_route(c, TS_COLL_BARRIER, NULL, NULL, NULL, 0, TS_U8, TS_RED_SUM, TS_ALGO_AUTO, 0,
                       &s))
        return s;
    return ts_coll_run_barrier(c);
}
