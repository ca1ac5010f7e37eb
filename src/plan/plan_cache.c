/* The plan cache of shape buckets (plan_cache.h). */
#include "plan/plan_cache.h"

#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "plan/plan.h"

typedef struct entry {
    int64_t batch, seq;
    ts_plan *holder; /* holds this bucket's program; NULL while the handle runs it */
    uint64_t last_use;
    size_t bytes; /* its own memory */
} entry;

struct ts_plan_cache {
    ts_plan *plan; /* the handle */
    ts_plan_build_fn build;
    void *user;
    size_t limit;
    entry *e;
    int n, cap, cur; /* e[cur] runs in the handle; e[0] is the handle's own (the state's owner) */
    uint64_t tick;
    ts_plan_cache_stats st;
};

/* What a program costs beyond the shared state. */
static size_t own_bytes(const ts_plan *p) {
    ts_plan_stats s;
    if (ts_plan_get_stats(p, &s) != TS_OK) return 0;
    const size_t span = p->prog.layout.state_off + p->prog.layout.state_bytes;
    return s.arena_bytes - (p->rt.params_borrowed ? 0 : span) + p->rt.backend_scratch_bytes;
}

ts_status ts_plan_cache_new(ts_plan *plan, int64_t batch, int64_t seq, size_t limit_bytes,
                            ts_plan_build_fn build, void *user, ts_plan_cache **out) {
    *out = NULL;
    if (!plan || !build) return ts_fail(TS_ERR_INVALID, "plan cache: NULL plan or builder");
    ts_plan_cache *c = ts_zalloc(sizeof *c, "plan cache");
    if (!c) return TS_ERR_NOMEM;
    c->cap = 16;
    if (!(c->e = ts_zalloc(sizeof(entry) * (size_t)c->cap, "plan cache"))) {
        free(c);
        return TS_ERR_NOMEM;
    }
    c->plan = plan, c->build = build, c->user = user, c->limit = limit_bytes;
    c->e[0] = (entry){batch, seq, NULL, 0, own_bytes(plan)};
    c->n = 1;
    c->st.state_bytes = plan->prog.layout.state_off + plan->prog.layout.state_bytes;
    *out = c;
    return TS_OK;
}

static int find(const ts_plan_cache *c, int64_t batch, int64_t seq) {
    for (int i = 0; i < c->n; i++)
        if (c->e[i].batch == batch && c->e[i].seq == seq) return i;
    return -1;
}

/* Least recently used first, never the handle's own or the running one. */
static void evict(ts_plan_cache *c) {
    if (!c->limit) return;
    for (;;) {
        size_t total = 0;
        for (int i = 0; i < c->n; i++) total += c->e[i].bytes;
        if (total <= c->limit) return;
        int victim = -1;
        for (int i = 1; i < c->n; i++)
            if (i != c->cur && (victim < 0 || c->e[i].last_use < c->e[victim].last_use)) victim = i;
        if (victim < 0) return;
        ts_plan_free(c->e[victim].holder);
        c->e[victim] = c->e[--c->n];
        if (c->cur == c->n) c->cur = victim;
        c->st.evictions++;
    }
}

static ts_status compile_entry(ts_plan_cache *c, int64_t batch, int64_t seq, int *idx) {
    if (c->n == c->cap) {
        entry *ne = realloc(c->e, sizeof(entry) * (size_t)c->cap * 2);
        if (!ne) return ts_fail(TS_ERR_NOMEM, "plan cache: out of memory");
        c->e = ne, c->cap *= 2;
    }
    const double t0 = ts_now();
    ts_plan *p = NULL;
    ts_status s = c->build(c->user, batch, seq, c->plan, &p);
    if (s != TS_OK) {
        ts_error_prefix("compiling the plan of bucket batch %lld%s%.0lld", (long long)batch,
                        seq ? ", sequence " : "", (long long)seq);
        return s;
    }
    c->st.compile_seconds += ts_now() - t0;
    c->st.compiles++;
    c->e[c->n] = (entry){batch, seq, p, ++c->tick, own_bytes(p)};
    *idx = c->n++;
    return TS_OK;
}

ts_status ts_plan_cache_select(ts_plan_cache *c, int64_t batch, int64_t seq) {
    if (!c) return ts_fail(TS_ERR_INVALID, "plan cache: NULL");
    int i = find(c, batch, seq);
    if (i >= 0) {
        c->st.hits++;
    } else {
        c->st.misses++;
        ts_status s = compile_entry(c, batch, seq, &i);
        if (s != TS_OK) return s;
    }
    c->e[i].last_use = ++c->tick;
    if (i != c->cur) {
        ts_status s = ts_plan_swap_program(c->plan, c->e[i].holder);
        if (s != TS_OK) return s;
        c->e[c->cur].holder = c->e[i].holder; /* now holds the program that ran */
        c->e[i].holder = NULL;
        c->cur = i;
    }
    evict(c);
    return TS_OK;
}

ts_status ts_plan_cache_precompile(ts_plan_cache *c, int64_t batch, int64_t seq) {
    if (!c) return ts_fail(TS_ERR_INVALID, "plan cache: NULL");
    if (find(c, batch, seq) >= 0) return TS_OK;
    int i;
    ts_status s = compile_entry(c, batch, seq, &i);
    if (s == TS_OK) evict(c);
    return s;
}

void ts_plan_cache_note(ts_plan_cache *c, double real, double total) {
    if (!c) return;
    c->st.real += real;
    c->st.padded += total - real;
}

void ts_plan_cache_get_stats(const ts_plan_cache *c, ts_plan_cache_stats *out) {
    memset(out, 0, sizeof *out);
    if (!c) return;
    *out = c->st;
    out->cached = c->n;
    for (int i = 0; i < c->n; i++) {
        out->bytes += c->e[i].bytes;
        if (c->e[i].bytes > out->largest_bytes) out->largest_bytes = c->e[i].bytes;
    }
    out->own_bytes = c->e[0].bytes;
    out->cur_batch = c->e[c->cur].batch;
    out->cur_seq = c->e[c->cur].seq;
}

void ts_plan_cache_free(ts_plan_cache *c) {
    if (!c) return;
    if (c->cur != 0) { /* the handle gets its own program (the state's owner) back */
        ts_plan *h = c->e[0].holder;
        if (ts_plan_swap_program(c->plan, h) == TS_OK) {
            c->e[c->cur].holder = h;
            c->e[0].holder = NULL;
        }
    }
    for (int i = 0; i < c->n; i++) ts_plan_free(c->e[i].holder);
    free(c->e);
    free(c);
}
