/* group.c — a communicator over some ranks of another (group.h): its
 * point-to-point messages are the parent's, with the group's ranks turned
 * into the parent's; every collective algorithm of collectives.c runs on
 * them unchanged. */
#include "dist/group.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dist/comm.h"

typedef struct group_comm {
    ts_comm base; /* first: the ts_comm the callers see */
    ts_comm *parent;
    int *ranks; /* parent rank of each group rank */
    char gone[256];
} group_comm;

static group_comm *G(ts_comm *c) {
    return (group_comm *)c;
}

/* The request goes to the parent with the peer's parent rank (r->peer
 * keeps it: the parent's test reads it); the group's sequence number and
 * tag stay, so both ends match them as usual. */
static ts_status group_p2p(ts_comm *c, ts_req *r) {
    group_comm *g = G(c);
    if (r->peer < 0 || r->peer >= c->size)
        return ts_fail(TS_ERR_INVALID, "comm group of %d ranks: no rank %d", c->size, r->peer);
    r->peer = g->ranks[r->peer];
    return r->kind == TS_REQ_SEND ? g->parent->ops->isend(g->parent, r)
                                  : g->parent->ops->irecv(g->parent, r);
}

static ts_status group_test(ts_comm *c, ts_req *r) {
    return G(c)->parent->ops->test(G(c)->parent, r);
}

/* The parent's word on group rank k, naming it by both ranks. */
static const char *member_gone(group_comm *g, int k) {
    ts_comm *p = g->parent;
    const char *why = p->ops->peer_gone ? p->ops->peer_gone(p, g->ranks[k]) : NULL;
    if (!why) return NULL;
    snprintf(g->gone, sizeof g->gone, "group rank %d (rank %d of the parent comm): %s", k,
             g->ranks[k], why);
    return g->gone;
}

/* peer: a request's peer, which is the parent's rank once the request went
 * to the parent (group_p2p); -1: every other member. */
static const char *group_peer_gone(ts_comm *c, int peer) {
    group_comm *g = G(c);
    for (int k = 0; k < c->size; k++) {
        if (k == c->rank || (peer >= 0 && g->ranks[k] != peer)) continue;
        const char *why = member_gone(g, k);
        if (why) return why;
    }
    return NULL;
}

/* After a failure: the members the parent knows are gone (the group keeps
 * no record of who entered which of its collectives). */
static void group_absent(ts_comm *c, uint64_t seq, ts_absent *a) {
    (void)seq;
    a->n = 0;
    size_t len = 0;
    for (int k = 0; k < c->size; k++) {
        if (k == c->rank) continue;
        const char *why = member_gone(G(c), k);
        if (!why) continue;
        a->ranks[a->n++] = k;
        if (len < sizeof a->note)
            len +=
                (size_t)snprintf(a->note + len, sizeof a->note - len, "%s%s", len ? "; " : "", why);
    }
}

static void group_destroy(ts_comm *c) {
    free(G(c)->ranks);
    free(c);
}

static const ts_comm_ops group_ops = {.name = "group",
                                      .native_name = "none",
                                      .isend = group_p2p,
                                      .irecv = group_p2p,
                                      .test = group_test,
                                      .peer_gone = group_peer_gone,
                                      .absent = group_absent,
                                      .destroy = group_destroy};

ts_status ts_comm_group(ts_comm *parent, int n, const int *ranks, ts_comm **out) {
    if (!parent || !ranks || !out || n < 1)
        return ts_fail(TS_ERR_INVALID, "ts_comm_group: NULL argument or %d ranks", n);
    *out = NULL;
    int me = -1;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= parent->size)
            return ts_fail(TS_ERR_INVALID,
                           "ts_comm_group: rank %d is not a rank of the parent comm (%d ranks)",
                           ranks[i], parent->size);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return ts_fail(TS_ERR_INVALID, "ts_comm_group: rank %d listed twice", ranks[i]);
        if (ranks[i] == parent->rank) me = i;
    }
    if (me < 0)
        return ts_fail(TS_ERR_INVALID, "ts_comm_group: rank %d of the parent is not in the group",
                       parent->rank);
    group_comm *g = ts_zalloc(sizeof *g, "comm group");
    if (!g) return TS_ERR_NOMEM;
    if (!(g->ranks = ts_alloc(sizeof *g->ranks * (size_t)n, "comm group ranks"))) {
        free(g);
        return TS_ERR_NOMEM;
    }
    memcpy(g->ranks, ranks, sizeof *g->ranks * (size_t)n);
    g->parent = parent;
    ts_comm *c = &g->base;
    c->ops = &group_ops;
    c->rank = me, c->size = n;
    c->timeout = parent->timeout;
    c->thread_ok = parent->thread_ok;
    /* no probe: the defaults (ring all-gather); the parent's forced choices */
    c->tuned = 2;
    snprintf(c->tune_source, sizeof c->tune_source, "defaults (a group of %d ranks)", n);
    ts_status s = ts_comm_init_common(c, (uint64_t)ts_comm_host(parent, parent->rank) + 1);
    if (s == TS_OK) memcpy(c->forced, parent->forced, sizeof c->forced);
    if (s != TS_OK) {
        ts_error_prefix("making a comm group of %d ranks", n);
        ts_comm_close(c);
        return s;
    }
    *out = c;
    return TS_OK;
}
