/* Chrome trace writer (src/obs/trace): files are parsed back with jansson
 * and checked for the event fields, the order (start time, enclosing span
 * first), proper nesting per thread, arguments, escaping, thread names, the
 * drop and open counts; two threads record at once; recording allocates
 * nothing; two shm ranks trace their collectives and compute, and their
 * files merge into one with both processes. */
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "check.h"
#include "core/core.h"
#include "obs/trace.h"

/* ---- counting allocations (the plain build; ASan owns malloc) --------------- */

#if !defined(__SANITIZE_ADDRESS__)
#define COUNT_ALLOCS 1
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
static _Atomic long n_allocs;
static _Atomic int counting;
void *malloc(size_t n) {
    if (counting) n_allocs++;
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
    if (counting) n_allocs++;
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
    if (counting) n_allocs++;
    return __libc_realloc(p, n);
}
#endif

/* ---- reading a file back ------------------------------------------------- */

static json_t *load(const char *path) {
    json_error_t err;
    json_t *doc = json_load_file(path, 0, &err);
    CHECK(doc != NULL, "%s parses: line %d: %s", path, err.line, err.text);
    return doc;
}

typedef struct ev {
    const char *name, *cat;
    double ts, dur;
    int pid, tid;
    json_t *args;
} ev;

/* The "X" events of doc, in file order; checks each has every field. */
static int spans_of(json_t *doc, ev *out, int max) {
    json_t *arr = json_object_get(doc, "traceEvents");
    CHECK(json_is_array(arr), "traceEvents is an array");
    int n = 0;
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e) {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        CHECK(ph && (!strcmp(ph, "X") || !strcmp(ph, "M")), "event %zu: ph %s", i, ph ? ph : "?");
        if (!ph || strcmp(ph, "X") || n >= max) continue;
        ev *v = &out[n++];
        v->name = json_string_value(json_object_get(e, "name"));
        v->cat = json_string_value(json_object_get(e, "cat"));
        v->ts = json_number_value(json_object_get(e, "ts"));
        v->dur = json_number_value(json_object_get(e, "dur"));
        v->pid = (int)json_integer_value(json_object_get(e, "pid"));
        v->tid = (int)json_integer_value(json_object_get(e, "tid"));
        v->args = json_object_get(e, "args");
        CHECK(v->name && v->cat && json_is_number(json_object_get(e, "ts")) &&
                  json_is_number(json_object_get(e, "dur")) && v->dur >= 0 && v->tid > 0,
              "event %zu has name, cat, ts, dur >= 0, tid", i);
    }
    return n;
}

/* Events sorted by start; per thread, each event either lies inside the
 * innermost open one or starts after it ends (no partial overlap). */
static void check_order_and_nesting(const ev *e, int n) {
    int bad_order = 0, bad_nest = 0;
    for (int i = 1; i < n; i++) bad_order += e[i].ts < e[i - 1].ts;
    for (int i = 0; i < n; i++) {
        int stack[64], depth = 0;
        if (i > 0) { /* one pass per thread: start at its first event */
            int seen = 0;
            for (int j = 0; j < i; j++) seen |= e[j].tid == e[i].tid && e[j].pid == e[i].pid;
            if (seen) continue;
        }
        for (int j = i; j < n; j++) {
            if (e[j].tid != e[i].tid || e[j].pid != e[i].pid) continue;
            while (depth > 0 && e[j].ts >= e[stack[depth - 1]].ts + e[stack[depth - 1]].dur)
                depth--;
            if (depth > 0 && e[j].ts + e[j].dur > e[stack[depth - 1]].ts + e[stack[depth - 1]].dur)
                bad_nest++;
            if (depth < 64) stack[depth++] = j;
        }
    }
    CHECK(!bad_order, "%d events out of start order", bad_order);
    CHECK(!bad_nest, "%d events overlap their enclosing span partially", bad_nest);
}

static const ev *find(const ev *e, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(e[i].name, name)) return &e[i];
    return NULL;
}

static int inside(const ev *in, const ev *out) {
    return in && out && in->ts >= out->ts && in->ts + in->dur <= out->ts + out->dur;
}

static void spin_for(double seconds) {
    double until = ts_now() + seconds;
    while (ts_now() < until) {
    }
}

/* ---- one thread: nesting, arguments, escaping, counts ------------------------ */

static void test_single(const char *dir) {
    ts_trace *t;
    CHECK_OK(ts_trace_create(3, 16, &t));
    ts_trace_name_thread(t, "step \"main\"");
    int outer = ts_trace_begin(t, "step", TS_TRACE_COMPUTE);
    int a = ts_trace_begin(t, "forward", TS_TRACE_COMPUTE);
    spin_for(1e-4);
    ts_trace_end(t, a);
    int b = ts_trace_begin_args(t, "bucket \\0\"\n", TS_TRACE_COMM,
                                (ts_trace_args){.bytes = 4096, .seq = 7, .label = "ring"});
    int c = ts_trace_begin(t, "inner", TS_TRACE_COMPUTE);
    spin_for(1e-4);
    ts_trace_end(t, c);
    ts_trace_end(t, b);
    ts_trace_end(t, outer);
    double t0 = ts_now();
    CHECK(ts_trace_add(t, "later", TS_TRACE_COMM, t0 + 1.0, t0 + 1.5,
                       (ts_trace_args){.bytes = -1, .seq = 9, .label = NULL}) == 0,
          "add");
    int open = ts_trace_begin(t, "never ended", TS_TRACE_COMPUTE);
    CHECK(open >= 0, "open span recorded");
    CHECK(ts_trace_count(t) == 6 && ts_trace_dropped(t) == 0, "count %zu dropped %zu",
          ts_trace_count(t), ts_trace_dropped(t));

    char path[512];
    snprintf(path, sizeof path, "%s/one.json", dir);
    CHECK_OK(ts_trace_write(t, path));
    CHECK(access(path, F_OK) == 0, "file written");
    json_t *doc = load(path);
    if (doc) {
        ev e[16];
        int n = spans_of(doc, e, 16);
        CHECK(n == 5, "5 finished spans written (open one left out): %d", n);
        check_order_and_nesting(e, n);
        const ev *st = find(e, n, "step"), *fw = find(e, n, "forward"),
                 *bk = find(e, n, "bucket \\0\"\n"), *in = find(e, n, "inner"),
                 *la = find(e, n, "later");
        CHECK(st && fw && bk && in && la, "every span found by name (escaping round-trips)");
        CHECK(st && st == &e[0], "the enclosing span comes first");
        CHECK(inside(fw, st) && inside(bk, st) && inside(in, bk), "spans nest");
        CHECK(fw && bk && fw->ts + fw->dur <= bk->ts, "forward ends before the bucket starts");
        CHECK(fw && fw->dur >= 100.0, "forward lasted >= 100 us: %g", fw ? fw->dur : -1);
        CHECK(la && st && la->ts - st->ts > 9.9e5 && fabs(la->dur - 5e5) < 1, "add: times kept");
        CHECK(st && st->pid == 3 && !strcmp(st->cat, "compute"), "pid is the rank, category");
        CHECK(bk && !strcmp(bk->cat, "comm") &&
                  json_integer_value(json_object_get(bk->args, "bytes")) == 4096 &&
                  json_integer_value(json_object_get(bk->args, "seq")) == 7 &&
                  !strcmp(json_string_value(json_object_get(bk->args, "label")), "ring"),
              "args bytes, seq, label");
        CHECK(la && !json_object_get(la->args, "bytes") &&
                  json_integer_value(json_object_get(la->args, "seq")) == 9 &&
                  !json_object_get(la->args, "label"),
              "only the arguments given");
        CHECK(st && !st->args, "no args object without arguments");
        /* Metadata: the process and the named thread. */
        json_t *arr = json_object_get(doc, "traceEvents"), *x;
        size_t i;
        int pname = 0, tname = 0;
        json_array_foreach(arr, i, x) {
            const char *nm = json_string_value(json_object_get(x, "name"));
            const char *v = json_string_value(json_object_get(json_object_get(x, "args"), "name"));
            if (nm && v && !strcmp(nm, "process_name")) pname += !strcmp(v, "rank 3");
            if (nm && v && !strcmp(nm, "thread_name"))
                tname += !strcmp(v, "step \"main\"") &&
                         json_integer_value(json_object_get(x, "tid")) == (st ? st->tid : -1);
        }
        CHECK(pname == 1 && tname == 1, "process_name %d thread_name %d", pname, tname);
        json_t *od = json_object_get(doc, "otherData");
        CHECK(json_integer_value(json_object_get(od, "open")) == 1 &&
                  json_integer_value(json_object_get(od, "dropped")) == 0 &&
                  json_integer_value(json_object_get(od, "spans")) == 5,
              "otherData counts");
        json_decref(doc);
    }
    /* Full: later spans are dropped and counted; their end is a no-op. */
    for (int i = 0; i < 12; i++) ts_trace_end(t, ts_trace_begin(t, "fill", TS_TRACE_COMPUTE));
    CHECK(ts_trace_count(t) == 16 && ts_trace_dropped(t) == 2, "full: count %zu dropped %zu",
          ts_trace_count(t), ts_trace_dropped(t));
    CHECK(ts_trace_begin(t, "x", "y") == -1, "begin on a full trace gives -1");
    ts_trace_end(t, -1);
    CHECK_OK(ts_trace_write(t, path));
    doc = load(path);
    if (doc) {
        json_t *od = json_object_get(doc, "otherData");
        CHECK(json_integer_value(json_object_get(od, "dropped")) == 3, "dropped in the file");
        json_decref(doc);
    }
    ts_trace_free(t);

    /* Errors name what failed. */
    CHECK(ts_trace_create(0, 0, &t) == TS_ERR_INVALID, "capacity 0 refused");
    CHECK_OK(ts_trace_create(0, 4, &t));
    CHECK(ts_trace_write(t, "/nonexistent-dir/x.json") == TS_ERR_IO &&
              strstr(ts_last_error(), "/nonexistent-dir/x.json.tmp"),
          "unwritable path named: %s", ts_last_error());
    ts_trace_free(t);
    ts_trace_free(NULL);
    CHECK(ts_trace_begin(NULL, "x", "y") == -1, "NULL trace records nothing");

    char rp[64];
    CHECK(!ts_trace_rank_path("out/t.json", 2, rp, sizeof rp) && !strcmp(rp, "out/t.rank2.json"),
          "rank path %s", rp);
    CHECK(!ts_trace_rank_path("t", 0, rp, sizeof rp) && !strcmp(rp, "t.rank0.json"), "rank path %s",
          rp);
    CHECK(ts_trace_rank_path("a-long-name", 0, rp, 8) == -1, "rank path too long");
}

/* ---- two threads at once, and no allocation while recording --------------- */

typedef struct worker_arg {
    ts_trace *t;
    int n;
} worker_arg;

static void *record_many(void *p) {
    worker_arg *w = p;
    ts_trace_name_thread(w->t, "comm");
    for (int i = 0; i < w->n; i++) {
        int o = ts_trace_begin_args(w->t, "outer", TS_TRACE_COMM,
                                    (ts_trace_args){.bytes = i, .seq = i, .label = NULL});
        int in = ts_trace_begin(w->t, "inner", TS_TRACE_COMPUTE);
        ts_trace_end(w->t, in);
        ts_trace_end(w->t, o);
    }
    return NULL;
}

static void test_threads(const char *dir) {
    enum { PER = 2000 };
    ts_trace *t;
    CHECK_OK(ts_trace_create(0, 4 * PER + 8, &t));
    ts_trace_name_thread(t, "main"); /* first call per process sets up fork handling */
    worker_arg w = {t, PER};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, record_many, &w) == 0, "thread");
    /* While both threads record, nothing is allocated (pthread_create itself
     * may allocate, so counting starts after it). */
#ifdef COUNT_ALLOCS
    n_allocs = 0;
    counting = 1;
#endif
    for (int i = 0; i < PER; i++) {
        int o = ts_trace_begin(t, "outer", TS_TRACE_COMPUTE);
        ts_trace_end(t, ts_trace_begin(t, "inner", TS_TRACE_COMPUTE));
        ts_trace_end(t, o);
    }
#ifdef COUNT_ALLOCS
    long main_allocs = n_allocs;
    counting = 0;
#endif
    pthread_join(th, NULL);
#ifdef COUNT_ALLOCS
    CHECK(main_allocs == 0, "recording allocated %ld times", main_allocs);
#endif
    CHECK(ts_trace_count(t) == 4 * PER && ts_trace_dropped(t) == 0, "count %zu", ts_trace_count(t));
    char path[512];
    snprintf(path, sizeof path, "%s/threads.json", dir);
    CHECK_OK(ts_trace_write(t, path));
    json_t *doc = load(path);
    if (doc) {
        static ev e[4 * PER];
        int n = spans_of(doc, e, 4 * PER);
        CHECK(n == 4 * PER, "%d spans", n);
        check_order_and_nesting(e, n);
        int tids[2] = {0, 0}, ntid = 0;
        for (int i = 0; i < n; i++)
            if (e[i].tid != tids[0] && e[i].tid != tids[1] && ntid < 2) tids[ntid++] = e[i].tid;
        CHECK(ntid == 2, "two threads seen");
        json_decref(doc);
    }
    ts_trace_free(t);
}

/* ---- two shm ranks: collectives and compute, merged --------------------------- */

static char rank_base[512];

static int traced_worker(ts_comm *c, void *user) {
    (void)user;
    int r = ts_comm_rank(c);
    ts_trace *t;
    if (ts_trace_create(r, 256, &t) != TS_OK) return 2;
    ts_comm_set_trace(c, ts_trace_comm_span, t);
    enum { N = 10001 };
    float *g = ts_comm_alloc(c, N * sizeof *g);
    int fails = !g;
    for (int step = 0; step < 3 && !fails; step++) {
        int s = ts_trace_begin(t, "step", TS_TRACE_COMPUTE);
        for (int i = 0; i < N; i++) g[i] = (float)(r + i % 7);
        ts_coll_ticket tk;
        fails += ts_allreduce_start(c, g, N, TS_F32, TS_RED_SUM, TS_ALGO_RING, &tk) != TS_OK;
        int o = ts_trace_begin(t, "optimizer", TS_TRACE_COMPUTE);
        spin_for(2e-4);
        fails += ts_coll_wait(c, tk) != TS_OK;
        ts_trace_end(t, o);
        ts_trace_end(t, s);
        fails += g[5] != (float)(2 * 5 + 1);
    }
    fails += ts_barrier(c) != TS_OK;
    ts_comm_set_trace(c, NULL, NULL);
    char path[600];
    fails += ts_trace_rank_path(rank_base, r, path, sizeof path) != 0;
    fails += ts_trace_write(t, path) != TS_OK;
    ts_trace_free(t);
    ts_comm_free(c, g);
    return fails ? 1 : 0;
}

static void test_ranks_merged(const char *dir) {
    snprintf(rank_base, sizeof rank_base, "%s/run.json", dir);
    int codes[2] = {-1, -1};
    fflush(NULL);
    CHECK_OK(ts_shm_launch(2, NULL, traced_worker, NULL, codes));
    CHECK(codes[0] == 0 && codes[1] == 0, "workers: %d %d", codes[0], codes[1]);
    char p0[600], p1[600], merged[600];
    ts_trace_rank_path(rank_base, 0, p0, sizeof p0);
    ts_trace_rank_path(rank_base, 1, p1, sizeof p1);
    snprintf(merged, sizeof merged, "%s/run.json", dir);
    CHECK_OK(ts_trace_merge((const char *[]){p0, p1}, 2, merged));
    json_t *doc = load(merged);
    if (!doc) return;
    ev e[64];
    int n = spans_of(doc, e, 64);
    int per[2][3] = {{0}}; /* rank: steps, optimizer, all_reduce */
    int args_ok = 0;
    for (int i = 0; i < n; i++) {
        if (e[i].pid < 0 || e[i].pid > 1) continue;
        int *c = per[e[i].pid];
        c[0] += !strcmp(e[i].name, "step");
        c[1] += !strcmp(e[i].name, "optimizer");
        if (!strcmp(e[i].name, "all_reduce") && !strcmp(e[i].cat, "comm")) {
            c[2]++;
            args_ok += json_integer_value(json_object_get(e[i].args, "bytes")) == 10001 * 4 &&
                       json_integer_value(json_object_get(e[i].args, "seq")) > 0 &&
                       json_string_value(json_object_get(e[i].args, "label"));
        }
    }
    for (int r = 0; r < 2; r++)
        CHECK(per[r][0] == 3 && per[r][1] == 3 && per[r][2] == 3,
              "rank %d: %d steps, %d optimizer, %d all_reduce spans", r, per[r][0], per[r][1],
              per[r][2]);
    CHECK(args_ok == 6, "all_reduce spans carry bytes, seq, algorithm: %d", args_ok);
    /* Each rank's events, taken alone, are ordered and nest per thread. */
    for (int r = 0; r < 2; r++) {
        ev mine[64];
        int m = 0;
        for (int i = 0; i < n; i++)
            if (e[i].pid == r) mine[m++] = e[i];
        check_order_and_nesting(mine, m);
    }
    json_t *files = json_object_get(json_object_get(doc, "otherData"), "files");
    CHECK(json_array_size(files) == 2, "otherData of both files kept");
    json_decref(doc);
    char missing[600];
    snprintf(missing, sizeof missing, "%s/missing.json", dir);
    CHECK(ts_trace_merge((const char *[]){p0, missing}, 2, merged) == TS_ERR_IO &&
              strstr(ts_last_error(), "missing.json"),
          "a missing input is named: %s", ts_last_error());
    unlink(p0);
    unlink(p1);
    unlink(merged);
}

int main(void) {
    char dir[] = "/tmp/tessel-trace-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "mkdtemp failed\n");
        return 1;
    }
    test_single(dir);
    test_threads(dir);
    test_ranks_merged(dir);
    char path[600];
    snprintf(path, sizeof path, "%s/one.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/threads.json", dir);
    unlink(path);
    rmdir(dir);
    return check_summary("trace");
}
