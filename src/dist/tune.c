/* tune.c — choosing a collective algorithm per message size.
 *
 * At the first AUTO collective (or ts_comm_tune) every rank runs each
 * candidate algorithm on four probe sizes; rank 0 times them, picks the
 * fastest per size class and broadcasts the table, so all ranks always
 * agree. Rank 0 caches the table in $XDG_CACHE_HOME/tessel (or
 * ~/.cache/tessel), keyed by transport, rank count and host count, and
 * later runs load it instead of probing: the same machine then picks the
 * same algorithms, and so reduces in the same order, run after run.
 *
 * TESSEL_COLL_ALGO forces algorithms ("ring", or
 * "allreduce=rhd,allgather=native"); TESSEL_COLL_PROBE=0 skips probing and
 * uses the defaults; TESSEL_COLL_CACHE=0 neither reads nor writes the cache.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dist/comm.h"

#define TUNED_KINDS 3 /* all-reduce, reduce-scatter, all-gather */

static const size_t probe_bytes[TS_TUNE_CLASSES] = {64, 8192, 512 << 10, 8 << 20};
/* Calls per candidate in each of PROBE_ROUNDS rounds. The rounds take the
 * candidates in turn, and a candidate's time is its fastest round: on a
 * loaded machine a round another process interrupted is discarded instead
 * of deciding the choice (a mean over all calls once chose the mailbox's
 * algorithms over the in-place ones at every size, from noise). */
#define PROBE_ROUNDS 3
static const int probe_reps[TS_TUNE_CLASSES] = {7, 4, 1, 1};

int ts_tune_class(size_t bytes) {
    /* Class boundaries at the geometric means of neighbouring probes. */
    if (bytes < 724) return 0;
    if (bytes < 65536) return 1;
    if (bytes < (2u << 20)) return 2;
    return 3;
}

static int has_native(const ts_comm *c, ts_coll_kind kind, ts_dtype dt, ts_reduce_op op) {
    const ts_comm_ops *o = c->ops;
    int fn = kind == TS_COLL_ALLREDUCE        ? o->allreduce != NULL
             : kind == TS_COLL_REDUCE_SCATTER ? o->reduce_scatter != NULL
             : kind == TS_COLL_ALLGATHER      ? o->allgather != NULL
             : kind == TS_COLL_BROADCAST      ? o->broadcast != NULL
                                              : o->barrier != NULL;
    return fn && (!o->native_ok || o->native_ok(c, kind, dt, op));
}

ts_coll_algo ts_coll_usable(const ts_comm *c, ts_coll_kind kind, ts_dtype dt, ts_reduce_op op,
                            ts_coll_algo a) {
    int native = has_native(c, kind, dt, op);
    switch (kind) {
    case TS_COLL_ALLREDUCE:
        if (a == TS_ALGO_AUTO || (a == TS_ALGO_NATIVE && !native)) return TS_ALGO_RING;
        return a;
    case TS_COLL_REDUCE_SCATTER:
    case TS_COLL_ALLGATHER: return a == TS_ALGO_NATIVE && native ? TS_ALGO_NATIVE : TS_ALGO_RING;
    default: /* broadcast, barrier: RING stands for the point-to-point tree */
        return native && a != TS_ALGO_RING ? TS_ALGO_NATIVE : TS_ALGO_RING;
    }
}

static ts_coll_algo default_algo(const ts_comm *c, ts_coll_kind kind, size_t bytes) {
    if (has_native(c, kind, TS_F32, TS_RED_SUM)) return TS_ALGO_NATIVE;
    if (kind == TS_COLL_ALLREDUCE && bytes < 65536) return TS_ALGO_RD;
    return TS_ALGO_RING;
}

ts_coll_algo ts_comm_algo_for(const ts_comm *c, ts_coll_kind kind, size_t bytes, ts_dtype dt) {
    if (!c || (unsigned)kind >= TS_COLL_KIND_COUNT) return TS_ALGO_AUTO;
    ts_coll_algo a = c->forced[kind];
    if (a == TS_ALGO_AUTO && kind < TUNED_KINDS)
        a = c->tuned == 1 ? (ts_coll_algo)c->table[kind][ts_tune_class(bytes)]
                          : default_algo(c, kind, bytes);
    return ts_coll_usable(c, kind, dt, TS_RED_SUM, a);
}

ts_status ts_coll_choose(ts_comm *c, ts_coll_kind kind, size_t bytes, ts_dtype dt, ts_reduce_op op,
                         ts_coll_algo asked, ts_coll_algo *out) {
    ts_coll_algo a = asked == TS_ALGO_AUTO ? c->forced[kind] : asked;
    if (a == TS_ALGO_AUTO && kind < TUNED_KINDS) {
        if (c->size > 1) {
            if (!c->tuned && !c->tuning) {
                ts_status s = ts_tune_run(c);
                if (s != TS_OK) return s;
            }
            a = c->tuned == 1 ? (ts_coll_algo)c->table[kind][ts_tune_class(bytes)]
                              : default_algo(c, kind, bytes);
        }
    }
    *out = ts_coll_usable(c, kind, dt, op, a);
    return TS_OK;
}

/* ---- forcing from the environment ------------------------------------------ */

static int kind_parse(const char *s) {
    if (!strcmp(s, "allreduce") || !strcmp(s, "all_reduce")) return TS_COLL_ALLREDUCE;
    if (!strcmp(s, "reduce_scatter") || !strcmp(s, "reducescatter")) return TS_COLL_REDUCE_SCATTER;
    if (!strcmp(s, "allgather") || !strcmp(s, "all_gather")) return TS_COLL_ALLGATHER;
    return -1;
}

ts_status ts_tune_parse_env(ts_comm *c) {
    const char *e = getenv("TESSEL_COLL_ALGO");
    if (!e || !*e) return TS_OK;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", e);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        const char *name = eq ? eq + 1 : tok;
        int a = ts_coll_algo_parse(name), k = -1;
        if (eq) {
            *eq = 0;
            k = kind_parse(tok);
        }
        if (a < 0 || (eq && k < 0))
            return ts_fail(TS_ERR_INVALID,
                           "TESSEL_COLL_ALGO='%s': expected ALGO or KIND=ALGO,... with ALGO one of "
                           "auto, native, ring, rhd, rd, hier and KIND one of allreduce, "
                           "reduce_scatter, allgather",
                           e);
        for (int i = 0; i < TUNED_KINDS; i++)
            if (k < 0 || k == i) c->forced[i] = (ts_coll_algo)a;
    }
    return TS_OK;
}

ts_status ts_comm_set_algo(ts_comm *c, ts_coll_kind kind, ts_coll_algo algo) {
    if (!c) return ts_fail(TS_ERR_INVALID, "ts_comm_set_algo: comm is NULL");
    if ((unsigned)kind >= TS_COLL_KIND_COUNT)
        return ts_fail(TS_ERR_INVALID, "ts_comm_set_algo: unknown collective %d", (int)kind);
    if ((unsigned)algo >= TS_ALGO_COUNT)
        return ts_fail(TS_ERR_INVALID, "ts_comm_set_algo: unknown algorithm %d", (int)algo);
    c->forced[kind] = algo;
    return TS_OK;
}

const char *ts_comm_tune_source(const ts_comm *c) {
    if (!c) return "";
    if (!c->tuned) return c->size == 1 ? "single rank" : "not measured yet (defaults)";
    return c->tune_source;
}

/* ---- the cache file --------------------------------------------------------- */

static int cache_path(const ts_comm *c, char *out, size_t n, char *dir, size_t dn) {
    if (!ts_cache_dir("TESSEL_COLL_CACHE", dir, dn)) return 0;
    snprintf(out, n, "%s/coll-%s-%dr-%dh.txt", dir, c->ops->name, c->size, c->nhosts);
    return 1;
}

static const char *probe_kind_key[TUNED_KINDS] = {"all_reduce", "reduce_scatter", "all_gather"};

static int cache_load(const ts_comm *c, const char *path, uint8_t table[][TS_TUNE_CLASSES]) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[512];
    int seen = 0, ok = 1;
    while (fgets(line, sizeof line, f)) {
        char kind[64], algo[64];
        size_t bytes;
        if (line[0] == '#' || sscanf(line, "%63s %zu %63s", kind, &bytes, algo) != 3) continue;
        int k = -1, a = ts_coll_algo_parse(algo);
        for (int i = 0; i < TUNED_KINDS; i++)
            if (!strcmp(kind, probe_kind_key[i])) k = i;
        if (k < 0) continue;
        int cls = ts_tune_class(bytes);
        if (a <= TS_ALGO_AUTO || ts_coll_usable(c, (ts_coll_kind)k, TS_F32, TS_RED_SUM,
                                                (ts_coll_algo)a) != (ts_coll_algo)a) {
            ok = 0; /* written by a build with another algorithm set */
            continue;
        }
        table[k][cls] = (uint8_t)a;
        seen |= 1 << (k * TS_TUNE_CLASSES + cls);
    }
    fclose(f);
    return ok && seen == (1 << (TUNED_KINDS * TS_TUNE_CLASSES)) - 1;
}

static void cache_save(const ts_comm *c, const char *path, const char *dir,
                       uint8_t table[][TS_TUNE_CLASSES],
                       double us[][TS_TUNE_CLASSES][TS_ALGO_COUNT]) {
    char parent[1024], tmp[1200];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash) {
        *slash = 0;
        if (mkdir(parent, 0755) && errno != EEXIST) return;
    }
    if (mkdir(dir, 0755) && errno != EEXIST) {
        ts_logf(TS_LOG_WARN, "cannot create %s: %s (collective tuning not cached)", dir,
                strerror(errno));
        return;
    }
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f, "# tessel collective algorithms for transport %s, %d ranks, %d hosts.\n",
            c->ops->name, c->size, c->nhosts);
    fprintf(f, "# kind probe_bytes chosen, then microseconds per candidate. Delete the file to\n"
               "# measure again; edit the chosen column to pin an algorithm.\n");
    for (int k = 0; k < TUNED_KINDS; k++)
        for (int cls = 0; cls < TS_TUNE_CLASSES; cls++) {
            fprintf(f, "%s %zu %s", probe_kind_key[k], probe_bytes[cls],
                    ts_coll_algo_name((ts_coll_algo)table[k][cls]));
            for (int a = 1; a < TS_ALGO_COUNT; a++)
                if (us[k][cls][a] > 0)
                    fprintf(f, "  %s=%.2f", ts_coll_algo_name((ts_coll_algo)a), us[k][cls][a]);
            fprintf(f, "\n");
        }
    int bad = ferror(f);
    if (fclose(f) || bad || rename(tmp, path)) unlink(tmp);
}

/* ---- probing ---------------------------------------------------------------- */

static int candidates(const ts_comm *c, int kind, ts_coll_algo *out) {
    int n = 0;
    if (has_native(c, (ts_coll_kind)kind, TS_F32, TS_RED_SUM)) out[n++] = TS_ALGO_NATIVE;
    out[n++] = TS_ALGO_RING;
    if (kind == TS_COLL_ALLREDUCE) {
        out[n++] = TS_ALGO_RHD;
        out[n++] = TS_ALGO_RD;
        if (c->nhosts > 1 && c->nhosts < c->size) out[n++] = TS_ALGO_HIER;
    }
    return n;
}

static ts_status run_kind(ts_comm *c, int kind, void *a, void *b, size_t count, ts_coll_algo algo) {
    if (kind == TS_COLL_ALLREDUCE)
        return ts_coll_run_allreduce(c, a, count, TS_F32, TS_RED_SUM, algo);
    if (kind == TS_COLL_REDUCE_SCATTER)
        return ts_coll_run_reduce_scatter(c, a, b, count, TS_F32, TS_RED_SUM, algo);
    return ts_coll_run_allgather(c, NULL, a, count, TS_F32, algo);
}

static ts_status probe(ts_comm *c, uint8_t table[][TS_TUNE_CLASSES],
                       double us[][TS_TUNE_CLASSES][TS_ALGO_COUNT]) {
    size_t maxb = probe_bytes[TS_TUNE_CLASSES - 1];
    char *a = ts_comm_alloc(c, maxb), *b = ts_comm_alloc(c, maxb);
    ts_status s = TS_OK;
    if (!a || !b) s = TS_ERR_NOMEM;
    if (s == TS_OK) {
        memset(a, 0, maxb);
        memset(b, 0, maxb);
    }
    for (int k = 0; k < TUNED_KINDS && s == TS_OK; k++) {
        ts_coll_algo cand[TS_ALGO_COUNT];
        int nc = candidates(c, k, cand);
        for (int cls = 0; cls < TS_TUNE_CLASSES && s == TS_OK; cls++) {
            size_t count = probe_bytes[cls] / sizeof(float);
            double t_best[TS_ALGO_COUNT] = {0};
            for (int round = 0; round < PROBE_ROUNDS && s == TS_OK; round++) {
                for (int j = 0; j < nc && s == TS_OK; j++) {
                    int i = (j + round) % nc; /* each round starts with another candidate */
                    s = run_kind(c, k, a, b, count, cand[i]); /* warm-up */
                    if (s == TS_OK) s = ts_coll_run_barrier(c);
                    double t0 = ts_now();
                    for (int r = 0; r < probe_reps[cls] && s == TS_OK; r++)
                        s = run_kind(c, k, a, b, count, cand[i]);
                    double t = (ts_now() - t0) / probe_reps[cls] * 1e6;
                    if (round == 0 || t < t_best[i]) t_best[i] = t;
                }
            }
            for (int i = 0; i < nc; i++) {
                us[k][cls][cand[i]] = t_best[i];
                if (i == 0 || t_best[i] < us[k][cls][table[k][cls]])
                    table[k][cls] = (uint8_t)cand[i];
            }
        }
    }
    ts_comm_free(c, a);
    ts_comm_free(c, b);
    return s;
}

ts_status ts_tune_run(ts_comm *c) {
    /* msg[0]: 0 probe now, 1 table from rank 0's cache, 2 defaults;
     * msg[1..]: the table. Rank 0 decides for everyone. */
    uint8_t msg[1 + TUNED_KINDS * TS_TUNE_CLASSES] = {0};
    uint8_t(*table)[TS_TUNE_CLASSES] = (uint8_t(*)[TS_TUNE_CLASSES])(msg + 1);
    double us[TUNED_KINDS][TS_TUNE_CLASSES][TS_ALGO_COUNT];
    memset(us, 0, sizeof us);
    char path[1024] = "", dir[900] = "";
    int cached = 0;
    c->tuning = 1;
    if (c->rank == 0) {
        const char *p = getenv("TESSEL_COLL_PROBE");
        cached = cache_path(c, path, sizeof path, dir, sizeof dir);
        if (p && !strcmp(p, "0"))
            msg[0] = 2;
        else if (cached && cache_load(c, path, table))
            msg[0] = 1;
    }
    ts_status s = ts_coll_run_broadcast(c, msg, sizeof msg, 0);
    if (s == TS_OK && msg[0] == 0) {
        s = probe(c, table, us);
        if (s == TS_OK) s = ts_coll_run_broadcast(c, msg, sizeof msg, 0);
    }
    c->tuning = 0;
    if (s != TS_OK) {
        ts_error_prefix("measuring collective algorithms");
        return s;
    }
    if (msg[0] == 2) {
        snprintf(c->tune_source, sizeof c->tune_source, "default (TESSEL_COLL_PROBE=0)");
        c->tuned = 2;
        return TS_OK;
    }
    memcpy(c->table, table, sizeof c->table[0] * TUNED_KINDS);
    c->tuned = 1;
    if (msg[0] == 1) {
        size_t k = 0;
        ts_catf(c->tune_source, sizeof c->tune_source, &k, "cache %s",
                c->rank == 0 ? path : "(rank 0)");
    } else if (c->rank == 0 && cached) {
        cache_save(c, path, dir, table, us);
        size_t k = 0;
        ts_catf(c->tune_source, sizeof c->tune_source, &k, "probe (saved to %s)", path);
    } else {
        snprintf(c->tune_source, sizeof c->tune_source, "probe");
    }
    return TS_OK;
}

ts_status ts_comm_tune(ts_comm *c) {
    ts_status s = ts_coll_validate(c, TS_COLL_BARRIER, NULL, NULL, NULL, 0, TS_U8, TS_RED_SUM,
                                   TS_ALGO_AUTO, 0);
    if (s != TS_OK) return s;
    if (c->tuned || c->size == 1) return TS_OK;
    /* With a communication thread, tuning queues behind the collectives
     * already started, like any collective. */
    if (ts_async_route(c, TS_COLL_KIND_COUNT, NULL, NULL, NULL, 0, TS_U8, TS_RED_SUM, TS_ALGO_AUTO,
                       0, &s))
        return s;
    return ts_tune_run(c);
}
