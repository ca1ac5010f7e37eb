/* trace.c — spans in preallocated memory, written as Chrome trace JSON.
 *
 * Recording claims the next slot with one atomic increment, so the step's
 * thread and the communication thread record at once without a lock; each
 * slot is then written only by the thread that claimed it. Timestamps are
 * kept as ts_now() seconds and converted to integer nanoseconds before
 * writing, so a span inside another stays inside it after rounding. */
#include "obs/trace.h"
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "core/core.h"

#define MAX_THREADS 32

typedef struct span {
    const char *name, *cat, *label;
    int64_t bytes, seq;
    double start, end; /* end < start: still open */
    int tid;
} span;

typedef struct thread_name {
    int tid;
    char name[48];
} thread_name;

struct ts_trace {
    int rank;
    size_t cap;
    span *spans;
    atomic_size_t next;    /* slots claimed (may exceed cap) */
    atomic_size_t dropped; /* claims past cap */
    pthread_mutex_t names_lock;
    thread_name names[MAX_THREADS];
    int n_names;
};

/* ---- the calling thread's id -------------------------------------------- */

/* Cached per thread; a forked child (the shm launcher's workers) forgets
 * the parent's value. */
static _Thread_local int cached_tid;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void forget_tid(void) {
    cached_tid = 0;
}
static void install_atfork(void) {
    pthread_atfork(NULL, NULL, forget_tid);
}

static int my_tid(void) {
    if (!cached_tid) {
        pthread_once(&atfork_once, install_atfork);
        cached_tid = (int)syscall(SYS_gettid);
    }
    return cached_tid;
}

/* ---- recording ----------------------------------------------------------- */

ts_status ts_trace_create(int rank, size_t capacity, ts_trace **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "ts_trace_create: out is NULL");
    *out = NULL;
    if (capacity == 0 || capacity > (size_t)INT32_MAX)
        return ts_fail(TS_ERR_INVALID, "ts_trace_create: capacity %zu outside 1..%d", capacity,
                       INT32_MAX);
    ts_trace *t = ts_zalloc(sizeof *t, "trace");
    if (!t) return TS_ERR_NOMEM;
    /* calloc'd pages are mapped lazily; writing them now keeps page
     * faults out of the step. */
    t->spans = ts_alloc(capacity * sizeof *t->spans, "trace spans");
    if (!t->spans) {
        free(t);
        return TS_ERR_NOMEM;
    }
    memset(t->spans, 0, capacity * sizeof *t->spans);
    t->rank = rank;
    t->cap = capacity;
    atomic_init(&t->next, 0);
    atomic_init(&t->dropped, 0);
    pthread_mutex_init(&t->names_lock, NULL);
    *out = t;
    return TS_OK;
}

void ts_trace_free(ts_trace *t) {
    if (!t) return;
    pthread_mutex_destroy(&t->names_lock);
    free(t->spans);
    free(t);
}

static span *claim(ts_trace *t, int *index) {
    size_t i = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
    if (i >= t->cap) {
        atomic_fetch_add_explicit(&t->dropped, 1, memory_order_relaxed);
        return NULL;
    }
    *index = (int)i;
    return &t->spans[i];
}

static void fill(span *s, const char *name, const char *cat, ts_trace_args a) {
    s->name = name ? name : "";
    s->cat = cat ? cat : "";
    s->label = a.label;
    s->bytes = a.bytes;
    s->seq = a.seq;
    s->tid = my_tid();
}

int ts_trace_begin_args(ts_trace *t, const char *name, const char *cat, ts_trace_args args) {
    int h = -1;
    span *s = t ? claim(t, &h) : NULL;
    if (!s) return -1;
    fill(s, name, cat, args);
    s->end = -INFINITY;
    s->start = ts_now();
    return h;
}

int ts_trace_begin(ts_trace *t, const char *name, const char *cat) {
    return ts_trace_begin_args(t, name, cat, TS_TRACE_NO_ARGS);
}

void ts_trace_end(ts_trace *t, int h) {
    if (!t || h < 0 || (size_t)h >= t->cap) return;
    t->spans[h].end = ts_now();
}

int ts_trace_add(ts_trace *t, const char *name, const char *cat, double start, double end,
                 ts_trace_args args) {
    int h = -1;
    span *s = t ? claim(t, &h) : NULL;
    if (!s) return -1;
    fill(s, name, cat, args);
    s->start = start;
    s->end = end;
    return 0;
}

void ts_trace_comm_span(const ts_comm_span *sp, void *user) {
    ts_trace_args a = {(int64_t)sp->bytes, (int64_t)sp->seq,
                       sp->algo && *sp->algo ? sp->algo : NULL};
    ts_trace_add(user, ts_coll_kind_name(sp->kind), sp->ok ? TS_TRACE_COMM : "comm,failed",
                 sp->start, sp->end, a);
}

void ts_trace_name_thread(ts_trace *t, const char *name) {
    if (!t || !name) return;
    int tid = my_tid();
    pthread_mutex_lock(&t->names_lock);
    int i = 0;
    while (i < t->n_names && t->names[i].tid != tid) i++;
    if (i < MAX_THREADS) {
        t->names[i].tid = tid;
        snprintf(t->names[i].name, sizeof t->names[i].name, "%s", name);
        if (i == t->n_names) t->n_names++;
    }
    pthread_mutex_unlock(&t->names_lock);
}

size_t ts_trace_count(const ts_trace *t) {
    if (!t) return 0;
    size_t n = atomic_load(&((ts_trace *)t)->next);
    return n < t->cap ? n : t->cap;
}

size_t ts_trace_dropped(const ts_trace *t) {
    return t ? atomic_load(&((ts_trace *)t)->dropped) : 0;
}

/* ---- writing ------------------------------------------------------------- */

typedef struct item {
    int64_t start_ns, end_ns;
    size_t index;
} item;

/* Start time first; of two spans starting together the longer (the
 * enclosing one) first; then recording order, so the output is stable. */
static int item_cmp(const void *pa, const void *pb) {
    const item *a = pa, *b = pb;
    if (a->start_ns != b->start_ns) return a->start_ns < b->start_ns ? -1 : 1;
    if (a->end_ns != b->end_ns) return a->end_ns > b->end_ns ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

static void put_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* Microseconds with three decimals from integer nanoseconds. */
static void put_us(FILE *f, int64_t ns) {
    if (ns < 0) {
        fputc('-', f);
        ns = -ns;
    }
    fprintf(f, "%lld.%03lld", (long long)(ns / 1000), (long long)(ns % 1000));
}

static void put_span(FILE *f, int rank, const span *s, const item *it) {
    fputs("{\"name\":", f);
    put_string(f, s->name);
    fputs(",\"cat\":", f);
    put_string(f, s->cat);
    fputs(",\"ph\":\"X\",\"ts\":", f);
    put_us(f, it->start_ns);
    fputs(",\"dur\":", f);
    put_us(f, it->end_ns - it->start_ns);
    fprintf(f, ",\"pid\":%d,\"tid\":%d", rank, s->tid);
    if (s->bytes >= 0 || s->seq >= 0 || s->label) {
        const char *sep = "";
        fputs(",\"args\":{", f);
        if (s->bytes >= 0) {
            fprintf(f, "\"bytes\":%lld", (long long)s->bytes);
            sep = ",";
        }
        if (s->seq >= 0) {
            fprintf(f, "%s\"seq\":%lld", sep, (long long)s->seq);
            sep = ",";
        }
        if (s->label) {
            fprintf(f, "%s\"label\":", sep);
            put_string(f, s->label);
        }
        fputc('}', f);
    }
    fputc('}', f);
}

ts_status ts_trace_write(ts_trace *t, const char *path) {
    if (!t || !path) return ts_fail(TS_ERR_INVALID, "ts_trace_write: trace or path is NULL");
    size_t n = ts_trace_count(t), open = 0, m = 0;
    item *items = ts_alloc((n ? n : 1) * sizeof *items, "trace write");
    if (!items) return TS_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        const span *s = &t->spans[i];
        if (!(s->end >= s->start)) {
            open++;
            continue;
        }
        items[m].start_ns = llround(s->start * 1e9);
        items[m].end_ns = llround(s->end * 1e9);
        items[m].index = i;
        m++;
    }
    qsort(items, m, sizeof *items, item_cmp);

    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        free(items);
        return ts_fail(TS_ERR_INVALID, "trace: path '%s' too long", path);
    }
    FILE *f = fopen(tmp, "w");
    if (!f) {
        free(items);
        return ts_fail(TS_ERR_IO, "trace: cannot create '%s': %s", tmp, strerror(errno));
    }
    fprintf(f,
            "{\"traceEvents\":[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
            "\"args\":{\"name\":\"rank %d\"}},\n{\"name\":\"process_sort_index\",\"ph\":\"M\","
            "\"pid\":%d,\"tid\":0,\"args\":{\"sort_index\":%d}}",
            t->rank, t->rank, t->rank, t->rank);
    pthread_mutex_lock(&t->names_lock);
    for (int i = 0; i < t->n_names; i++) {
        fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{",
                t->rank, t->names[i].tid);
        fputs("\"name\":", f);
        put_string(f, t->names[i].name);
        fputs("}}", f);
    }
    pthread_mutex_unlock(&t->names_lock);
    for (size_t i = 0; i < m; i++) {
        fputs(",\n", f);
        put_span(f, t->rank, &t->spans[items[i].index], &items[i]);
    }
    fprintf(f,
            "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"rank\":%d,\"spans\":%zu,"
            "\"dropped\":%zu,\"open\":%zu}}\n",
            t->rank, m, ts_trace_dropped(t), open);
    free(items);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        unlink(tmp);
        return ts_fail(TS_ERR_IO, "trace: writing '%s' failed", tmp);
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return ts_fail(TS_ERR_IO, "trace: cannot rename '%s' to '%s': %s", tmp, path, strerror(e));
    }
    return TS_OK;
}

/* ---- merging ------------------------------------------------------------- */

ts_status ts_trace_merge(const char *const *paths, int n, const char *out) {
    if (!paths || n < 1 || !out)
        return ts_fail(TS_ERR_INVALID, "ts_trace_merge: no inputs or no output");
    json_t *events = json_array(), *others = json_array(), *root = json_object();
    ts_status s = TS_OK;
    if (!events || !others || !root) s = ts_fail(TS_ERR_NOMEM, "trace merge: out of memory");
    for (int i = 0; i < n && s == TS_OK; i++) {
        json_error_t err;
        json_t *doc = json_load_file(paths[i], 0, &err);
        json_t *ev = doc ? json_object_get(doc, "traceEvents") : NULL;
        if (!doc && json_error_code(&err) == json_error_cannot_open_file)
            s = ts_fail(TS_ERR_IO, "trace merge: %s", err.text);
        else if (!doc)
            s = ts_fail(TS_ERR_FORMAT, "trace merge: %s:%d: %s", paths[i], err.line, err.text);
        else if (!json_is_array(ev))
            s = ts_fail(TS_ERR_FORMAT, "trace merge: %s has no traceEvents array", paths[i]);
        else if (json_array_extend(events, ev) != 0)
            s = ts_fail(TS_ERR_NOMEM, "trace merge: out of memory");
        json_t *other = doc ? json_object_get(doc, "otherData") : NULL;
        if (s == TS_OK && other) json_array_append(others, other);
        json_decref(doc);
    }
    if (s == TS_OK) {
        json_object_set(root, "traceEvents", events);
        json_object_set_new(root, "displayTimeUnit", json_string("ms"));
        json_object_set_new(root, "otherData", json_pack("{sO}", "files", others));
        char tmp[4096];
        if (snprintf(tmp, sizeof tmp, "%s.tmp", out) >= (int)sizeof tmp)
            s = ts_fail(TS_ERR_INVALID, "trace merge: path '%s' too long", out);
        else if (json_dump_file(root, tmp, JSON_COMPACT) != 0) {
            unlink(tmp);
            s = ts_fail(TS_ERR_IO, "trace merge: cannot write '%s'", tmp);
        } else if (rename(tmp, out) != 0) {
            int e = errno;
            unlink(tmp);
            s = ts_fail(TS_ERR_IO, "trace merge: cannot rename '%s' to '%s': %s", tmp, out,
                        strerror(e));
        }
    }
    json_decref(events);
    json_decref(others);
    json_decref(root);
    return s;
}

int ts_trace_rank_path(const char *base, int rank, char *buf, size_t n) {
    if (!base || !buf || n == 0) return -1;
    size_t len = strlen(base);
    if (len > 5 && !strcmp(base + len - 5, ".json")) len -= 5;
    int k = snprintf(buf, n, "%.*s.rank%d.json", (int)len, base, rank);
    return k >= 0 && (size_t)k < n ? 0 : -1;
}
