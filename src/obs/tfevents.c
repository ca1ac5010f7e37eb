/* tfevents.c — TensorBoard event files: TFRecord framing and hand-encoded
 * Event / Summary / HistogramProto messages (tensorflow/core/util/event.proto,
 * tensorflow/core/framework/summary.proto). */
#include "obs/tfevents.h"
#include "core/fsat.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "core/core.h"
#include "core/crc32c.h"

/* ---- protobuf encoding --------------------------------------------------- */

/* A growable byte buffer; kept in the writer and reused, so steady-state
 * writes do not allocate. */
typedef struct pbuf {
    uint8_t *p;
    size_t n, cap;
    int oom;
} pbuf;

static void pb_put(pbuf *b, const void *data, size_t k) {
    if (b->oom) return;
    if (b->n + k > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->n + k > cap) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, k);
    b->n += k;
}

static void pb_varint(pbuf *b, uint64_t v) {
    uint8_t tmp[10];
    int k = 0;
    do {
        tmp[k] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) tmp[k] |= 0x80;
        k++;
    } while (v);
    pb_put(b, tmp, (size_t)k);
}

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };

static void pb_key(pbuf *b, int field, int wire) {
    pb_varint(b, (uint64_t)field << 3 | (uint64_t)wire);
}

static void le64(uint8_t *o, uint64_t v) {
    for (int i = 0; i < 8; i++) o[i] = (uint8_t)(v >> (8 * i));
}

static void le32(uint8_t *o, uint32_t v) {
    for (int i = 0; i < 4; i++) o[i] = (uint8_t)(v >> (8 * i));
}

static void pb_raw_double(pbuf *b, double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    uint8_t o[8];
    le64(o, u);
    pb_put(b, o, 8);
}

static void pb_double(pbuf *b, int field, double d) {
    pb_key(b, field, WIRE_FIXED64);
    pb_raw_double(b, d);
}

static void pb_float(pbuf *b, int field, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint8_t o[4];
    le32(o, u);
    pb_key(b, field, WIRE_FIXED32);
    pb_put(b, o, 4);
}

static void pb_bytes(pbuf *b, int field, const void *data, size_t n) {
    pb_key(b, field, WIRE_LEN);
    pb_varint(b, n);
    pb_put(b, data, n);
}

/* ---- the writer ---------------------------------------------------------- */

struct ts_tfevents {
    pthread_mutex_t mu;
    FILE *f;
    char *path;
    ts_tfevents_options opt;
    int pending;          /* records written since the last flush */
    double pending_since; /* ts_now() of the oldest of them */
    ts_status failed;     /* sticky: after a failed write the file may end mid-record */
    pbuf event, summary, value, histo, packed;
    double *counts; /* one per default bucket, for histograms */
};

/* TensorFlow's default histogram limits: ±1e-12 * 1.1^k up to 1e20, with
 * ±DBL_MAX closing each side and 0 in the middle. Fine near zero and
 * relative-precision everywhere, so one set fits weights and gradients of
 * any scale. */
static double *limits;
static int n_limits;
static pthread_once_t limits_once = PTHREAD_ONCE_INIT;

/* The bucket of a float by its top 16 bits (sign, exponent, top 7 mantissa
 * bits): those name a range of values 2^-7 wide relative to their size,
 * narrower than the 1.1x between limits, so at most one limit falls inside
 * it. first_bucket[p] is the bucket of range p's smallest value, and one
 * compare against that bucket's limit gives the bucket of any value in the
 * range (bucket_of_f32). Entries for inf and NaN are unused. */
static uint16_t first_bucket[1 << 16];

static int bucket_of(double v);

static void first_bucket_init(void) {
    for (uint32_t p = 0; p < (1u << 16); p++) {
        if ((p & 0x7f80u) == 0x7f80u) continue; /* exponent 255: inf, NaN */
        /* Below zero the smallest value has the largest magnitude. */
        uint32_t u = p << 16 | (p & 0x8000u ? 0xffffu : 0);
        float f;
        memcpy(&f, &u, sizeof f);
        first_bucket[p] = (uint16_t)bucket_of(f);
    }
}

static void limits_init(void) {
    int n_pos = 0;
    for (double v = 1e-12; v < 1e20; v *= 1.1) n_pos++;
    n_pos++; /* DBL_MAX */
    double *l = malloc(sizeof(double) * (size_t)(2 * n_pos + 1));
    if (!l) return;
    int k = n_pos;
    l[k++] = 0;
    double v = 1e-12;
    for (int i = 0; i < n_pos - 1; i++, v *= 1.1) l[k++] = v;
    l[k++] = DBL_MAX;
    for (int i = 0; i < n_pos; i++) l[n_pos - 1 - i] = -l[n_pos + 1 + i];
    limits = l;
    n_limits = 2 * n_pos + 1;
    first_bucket_init();
}

uint32_t ts_tfrecord_masked_crc(const void *data, size_t n) {
    uint32_t c = ts_crc32c(0, data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

ts_tfevents_options ts_tfevents_options_default(void) {
    return (ts_tfevents_options){NULL, 64, 5.0};
}

static double wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* mkdir -p: the run directory may exist while its tb/ subfolder does not. */
static ts_status make_dirs(const char *dir) {
    char path[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof path)
        return ts_fail(TS_ERR_INVALID, "tfevents: directory name empty or too long");
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] != '/' && path[i] != 0) continue;
        char c = path[i];
        path[i] = 0;
        if (mkdir(path, 0777) != 0 && errno != EEXIST)
            return ts_fail(TS_ERR_IO, "tfevents: cannot create directory '%s': %s", path,
                           strerror(errno));
        path[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return ts_fail(TS_ERR_IO, "tfevents: '%s' is not a directory", dir);
    return TS_OK;
}

static void free_writer(ts_tfevents *w) {
    free(w->path);
    free(w->event.p);
    free(w->summary.p);
    free(w->value.p);
    free(w->histo.p);
    free(w->packed.p);
    free(w->counts);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

/* Frame w->event as one TFRecord. The caller holds the mutex. */
static ts_status write_record(ts_tfevents *w) {
    if (w->failed) return ts_fail(w->failed, "tfevents: an earlier write to %s failed", w->path);
    if (w->event.oom || w->summary.oom || w->value.oom || w->histo.oom || w->packed.oom)
        return ts_fail(TS_ERR_NOMEM, "tfevents: out of memory encoding an event for %s", w->path);
    uint8_t head[12], tail[4];
    le64(head, (uint64_t)w->event.n);
    le32(head + 8, ts_tfrecord_masked_crc(head, 8));
    le32(tail, ts_tfrecord_masked_crc(w->event.p, w->event.n));
    if (fwrite(head, 1, sizeof head, w->f) != sizeof head ||
        fwrite(w->event.p, 1, w->event.n, w->f) != w->event.n ||
        fwrite(tail, 1, sizeof tail, w->f) != sizeof tail) {
        w->failed = TS_ERR_IO;
        return ts_fail(TS_ERR_IO, "tfevents: cannot write to %s: %s", w->path, strerror(errno));
    }
    double now = ts_now();
    if (w->pending++ == 0) w->pending_since = now;
    if (w->pending >= w->opt.max_pending || now - w->pending_since >= w->opt.flush_seconds) {
        if (fflush(w->f) != 0) {
            w->failed = TS_ERR_IO;
            return ts_fail(TS_ERR_IO, "tfevents: cannot write to %s: %s", w->path, strerror(errno));
        }
        w->pending = 0;
    }
    return TS_OK;
}

/* Start w->event with wall_time and step. */
static void event_begin(ts_tfevents *w, int64_t step) {
    w->event.n = 0;
    pb_double(&w->event, 1, wall_time());
    pb_key(&w->event, 2, WIRE_VARINT);
    pb_varint(&w->event, (uint64_t)step); /* int64: negative steps as 10-byte two's complement */
}

ts_status ts_tfevents_open(const char *dir, const ts_tfevents_options *o, ts_tfevents **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "tfevents: NULL output pointer");
    *out = NULL;
    if (!dir) return ts_fail(TS_ERR_INVALID, "tfevents: NULL directory");
    ts_tfevents_options opt = o ? *o : ts_tfevents_options_default();
    if (opt.max_pending < 1) opt.max_pending = 1;
    if (!(opt.flush_seconds >= 0)) opt.flush_seconds = 0;
    if (opt.suffix && strchr(opt.suffix, '/'))
        return ts_fail(TS_ERR_INVALID, "tfevents: suffix '%s' must not contain '/'", opt.suffix);
    pthread_once(&limits_once, limits_init);
    if (!limits) return ts_fail(TS_ERR_NOMEM, "tfevents: out of memory for histogram limits");
    ts_status st = make_dirs(dir);
    if (st != TS_OK) return st;

    ts_tfevents *w = ts_zalloc(sizeof *w, "tfevents writer");
    if (!w) return TS_ERR_NOMEM;
    if (pthread_mutex_init(&w->mu, NULL)) {
        free(w);
        return ts_fail(TS_ERR_INTERNAL, "tfevents: cannot create a mutex");
    }
    w->opt = opt;
    w->opt.suffix = NULL; /* not owned; only used for the name */
    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    size_t n = strlen(dir) + strlen(host) + (opt.suffix ? strlen(opt.suffix) : 0) + 64;
    w->path = ts_alloc(n, "tfevents path");
    w->counts = ts_alloc(sizeof(double) * (size_t)n_limits, "histogram counts");
    if (!w->path || !w->counts) {
        free_writer(w);
        return TS_ERR_NOMEM;
    }
    /* The time in the name orders a run's files; TensorBoard reads every
     * file whose name contains "tfevents". */
    snprintf(w->path, n, "%s/events.out.tfevents.%010lld.%s%s", dir, (long long)time(NULL), host,
             opt.suffix ? opt.suffix : "");
    /* The folder (tb/ of a run) and the file are reached without following
     * links (core/fsat.h): a link planted as tb/ is an error naming it. */
    ts_dir td;
    int fd = -1, err = 0;
    st = ts_dir_open(&td, dir, 0);
    if (st == TS_OK) {
        const char *name = strrchr(w->path, '/') + 1;
        fd = openat(td.fd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
        err = errno;
        ts_dir_close(&td);
    }
    if (st != TS_OK) {
        free_writer(w);
        return st;
    }
    errno = err;
    if (fd < 0) {
        if (errno == EEXIST)
            st = ts_fail(TS_ERR_IO,
                         "tfevents: %s already exists (another writer this second? give each "
                         "writer its own directory or suffix)",
                         w->path);
        else
            st = ts_fail(TS_ERR_IO, "tfevents: cannot create %s: %s", w->path, strerror(errno));
        free_writer(w);
        return st;
    }
    w->f = fdopen(fd, "wb");
    if (!w->f) {
        st = ts_fail(TS_ERR_IO, "tfevents: cannot open %s: %s", w->path, strerror(errno));
        close(fd);
        unlink(w->path);
        free_writer(w);
        return st;
    }
    event_begin(w, 0);
    static const char version[] = "brain.Event:2";
    pb_bytes(&w->event, 3, version, sizeof version - 1);
    st = write_record(w);
    /* TensorBoard recognises the file by its first record: have it on disk
     * before any step. */
    if (st == TS_OK && fflush(w->f) != 0)
        st = ts_fail(TS_ERR_IO, "tfevents: cannot write to %s: %s", w->path, strerror(errno));
    if (st != TS_OK) {
        fclose(w->f);
        unlink(w->path);
        free_writer(w);
        return st;
    }
    w->pending = 0;
    *out = w;
    return TS_OK;
}

const char *ts_tfevents_path(const ts_tfevents *w) {
    return w ? w->path : "";
}

static size_t varint_len(uint64_t v) {
    size_t k = 1;
    for (; v >= 0x80; v >>= 7) k++;
    return k;
}

/* Append Summary.Value {tag (1), then w->value: simple_value or histo}. */
static void summary_add(ts_tfevents *w, const char *tag) {
    size_t tag_len = strlen(tag);
    pb_key(&w->summary, 1, WIRE_LEN);
    pb_varint(&w->summary, 1 + varint_len(tag_len) + tag_len + w->value.n);
    pb_bytes(&w->summary, 1, tag, tag_len);
    pb_put(&w->summary, w->value.p, w->value.n);
}

static ts_status check_tag(const ts_tfevents *w, const char *tag) {
    if (!tag || !*tag) return ts_fail(TS_ERR_INVALID, "tfevents: empty tag for %s", w->path);
    if (strlen(tag) >= 2097152) return ts_fail(TS_ERR_INVALID, "tfevents: tag too long");
    return TS_OK;
}

/* Wrap w->summary into the event and write it. */
static ts_status finish_summary_event(ts_tfevents *w) {
    pb_bytes(&w->event, 5, w->summary.p, w->summary.n);
    return write_record(w);
}

ts_status ts_tfevents_scalars(ts_tfevents *w, int64_t step, int n, const char *const *tags,
                              const double *values) {
    if (!w) return ts_fail(TS_ERR_INVALID, "tfevents: NULL writer");
    if (n < 0 || (n && (!tags || !values)))
        return ts_fail(TS_ERR_INVALID, "tfevents: %d scalars without tags or values", n);
    for (int i = 0; i < n; i++) {
        ts_status st = check_tag(w, tags[i]);
        if (st != TS_OK) return st;
    }
    pthread_mutex_lock(&w->mu);
    event_begin(w, step);
    w->summary.n = 0;
    for (int i = 0; i < n; i++) {
        w->value.n = 0;
        pb_float(&w->value, 2, (float)values[i]);
        summary_add(w, tags[i]);
    }
    ts_status st = finish_summary_event(w);
    pthread_mutex_unlock(&w->mu);
    return st;
}

ts_status ts_tfevents_scalar(ts_tfevents *w, int64_t step, const char *tag, double value) {
    return ts_tfevents_scalars(w, step, 1, &tag, &value);
}

/* First limit greater than v (TensorFlow's upper_bound): bucket i holds
 * [limit[i-1], limit[i]). The limits grow by 1.1 away from zero, so a
 * logarithm lands within a step or two of the answer, and a walk over the
 * limits themselves makes it exact. Used for doubles and to fill
 * first_bucket; floats take bucket_of_f32 (about 28 ns a value here
 * against 1.1 ns, bench/tfevents_histo.c). */
static int bucket_of(double v) {
    const int n_pos = (n_limits - 1) / 2; /* limits[n_pos] == 0 */
    const double a = fabs(v);
    int g = n_pos;
    if (a >= 1e-12) {
        double k = floor(log(a * 1e12) / log(1.1));
        int i = k < (double)n_pos ? (int)k : n_pos;
        g = v > 0 ? n_pos + 1 + i : n_pos - 1 - i;
        if (g < 0) g = 0;
        if (g > n_limits - 1) g = n_limits - 1;
    }
    while (g > 0 && limits[g - 1] > v) g--;
    while (g < n_limits && limits[g] <= v) g++;
    return g < n_limits ? g : n_limits - 1;
}

/* bucket_of for a finite float, by the table: a load and a compare in place
 * of a logarithm and a walk, so the pass over W1's 6.3 M weights and
 * gradients runs at the speed of its sum (one double add after another). */
static inline int bucket_of_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const int g = first_bucket[u >> 16];
    return g + (limits[g] <= (double)f);
}

static int is_finite_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x7f800000u) != 0x7f800000u;
}

int ts_tfevents_default_limits(const double **out) {
    pthread_once(&limits_once, limits_init);
    if (out) *out = limits;
    return limits ? n_limits : 0;
}

int ts_tfevents_bucket_f32(float v) {
    pthread_once(&limits_once, limits_init);
    if (!limits || !is_finite_f32(v)) return -1;
    return bucket_of_f32(v);
}

/* The moments TensorBoard's HistogramProto carries, summed in the order of
 * the values (the same doubles whichever way the bucket is found). */
typedef struct moments {
    double mn, mx, sum, sum_sq, num;
} moments;

static inline void moments_add(moments *m, double v) {
    if (v < m->mn) m->mn = v;
    if (v > m->mx) m->mx = v;
    m->sum += v;
    m->sum_sq += v * v;
    m->num += 1;
}

static ts_status histogram(ts_tfevents *w, int64_t step, const char *tag, const float *f32,
                           const double *f64, int64_t n, int64_t *n_nonfinite) {
    if (n_nonfinite) *n_nonfinite = 0;
    if (!w) return ts_fail(TS_ERR_INVALID, "tfevents: NULL writer");
    ts_status st = check_tag(w, tag);
    if (st != TS_OK) return st;
    if (n < 0 || (n && !f32 && !f64))
        return ts_fail(TS_ERR_INVALID, "tfevents: histogram '%s': %lld values, no data", tag,
                       (long long)n);
    pthread_mutex_lock(&w->mu);
    memset(w->counts, 0, sizeof(double) * (size_t)n_limits);
    moments m = {INFINITY, -INFINITY, 0, 0, 0};
    int64_t bad = 0;
    double *counts = w->counts;
    if (f32) {
        for (int64_t i = 0; i < n; i++) {
            if (!is_finite_f32(f32[i])) {
                bad++;
                continue;
            }
            counts[bucket_of_f32(f32[i])] += 1;
            moments_add(&m, f32[i]);
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            if (!isfinite(f64[i])) {
                bad++;
                continue;
            }
            counts[bucket_of(f64[i])] += 1;
            moments_add(&m, f64[i]);
        }
    }
    if (m.num == 0) m.mn = m.mx = 0;
    pbuf *h = &w->histo;
    h->n = 0;
    pb_double(h, 1, m.mn);
    pb_double(h, 2, m.mx);
    pb_double(h, 3, m.num);
    pb_double(h, 4, m.sum);
    pb_double(h, 5, m.sum_sq);
    /* Buckets as TensorFlow's Histogram::EncodeToProto writes them: a run of
     * empty buckets becomes one, ending at the run's last limit. */
    pbuf *pk = &w->packed;
    pk->n = 0;
    for (int i = 0; i < n_limits;) {
        double end = limits[i], count = w->counts[i];
        i++;
        if (count <= 0)
            while (i < n_limits && w->counts[i] <= 0) end = limits[i], count = w->counts[i], i++;
        pb_raw_double(pk, end);
    }
    pb_key(h, 6, WIRE_LEN);
    pb_varint(h, pk->n);
    pb_put(h, pk->p, pk->n);
    pk->n = 0;
    for (int i = 0; i < n_limits;) {
        double count = w->counts[i];
        i++;
        if (count <= 0)
            while (i < n_limits && w->counts[i] <= 0) count = w->counts[i], i++;
        pb_raw_double(pk, count);
    }
    pb_key(h, 7, WIRE_LEN);
    pb_varint(h, pk->n);
    pb_put(h, pk->p, pk->n);

    event_begin(w, step);
    w->summary.n = 0;
    w->value.n = 0;
    pb_bytes(&w->value, 5, h->p, h->n);
    summary_add(w, tag);
    st = finish_summary_event(w);
    pthread_mutex_unlock(&w->mu);
    if (n_nonfinite) *n_nonfinite = bad;
    return st;
}

ts_status ts_tfevents_histogram(ts_tfevents *w, int64_t step, const char *tag, const float *values,
                                int64_t n, int64_t *n_nonfinite) {
    return histogram(w, step, tag, values, NULL, n, n_nonfinite);
}

ts_status ts_tfevents_histogram_f64(ts_tfevents *w, int64_t step, const char *tag,
                                    const double *values, int64_t n, int64_t *n_nonfinite) {
    return histogram(w, step, tag, NULL, values, n, n_nonfinite);
}

ts_status ts_tfevents_flush(ts_tfevents *w) {
    if (!w) return ts_fail(TS_ERR_INVALID, "tfevents: NULL writer");
    pthread_mutex_lock(&w->mu);
    ts_status st = TS_OK;
    if (w->failed) {
        st = ts_fail(w->failed, "tfevents: an earlier write to %s failed", w->path);
    } else if (fflush(w->f) != 0) {
        w->failed = TS_ERR_IO;
        st = ts_fail(TS_ERR_IO, "tfevents: cannot write to %s: %s", w->path, strerror(errno));
    } else {
        w->pending = 0;
    }
    pthread_mutex_unlock(&w->mu);
    return st;
}

ts_status ts_tfevents_close(ts_tfevents *w) {
    if (!w) return TS_OK;
    ts_status st = ts_tfevents_flush(w);
    if (fclose(w->f) != 0 && st == TS_OK)
        st = ts_fail(TS_ERR_IO, "tfevents: cannot close %s: %s", w->path, strerror(errno));
    free_writer(w);
    return st;
}
