/* TensorBoard event files: written by src/obs/tfevents.c, read back by the
 * small TFRecord + protobuf decoder below, which checks both masked CRCs of
 * every record, the Event fields, scalars and histograms; a flipped byte is
 * detected; the flush policy and the refusal to overwrite are checked. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "core/crc32c.h"
#include "obs/tfevents.h"

/* ---- decoder ---------------------------------------------------------------- */

#define MAX_VALUES  8
#define MAX_BUCKETS 256

typedef struct value {
    char tag[128];
    int has_simple, has_histo;
    float simple;
    double min, max, num, sum, sum_sq;
    double limit[MAX_BUCKETS], bucket[MAX_BUCKETS];
    int n_limit, n_bucket;
} value;

typedef struct event {
    double wall_time;
    int64_t step;
    char file_version[64];
    value values[MAX_VALUES];
    int n_values;
} event;

typedef struct cursor {
    const uint8_t *p, *end;
    int bad;
} cursor;

static uint64_t rd_varint(cursor *c) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (c->p >= c->end) {
            c->bad = 1;
            return 0;
        }
        uint8_t b = *c->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return v;
    }
    c->bad = 1;
    return 0;
}

static uint64_t rd_le(cursor *c, int n) {
    if (c->end - c->p < n) {
        c->bad = 1;
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)c->p[i] << (8 * i);
    c->p += n;
    return v;
}

static double rd_double(cursor *c) {
    uint64_t u = rd_le(c, 8);
    double d;
    memcpy(&d, &u, 8);
    return d;
}

static cursor rd_sub(cursor *c) {
    uint64_t n = rd_varint(c);
    cursor s = {c->p, c->p, 0};
    if (c->bad || (uint64_t)(c->end - c->p) < n) {
        c->bad = 1;
        s.bad = 1;
        return s;
    }
    s.end = c->p + n;
    c->p += n;
    return s;
}

static void skip_field(cursor *c, int wire) {
    if (wire == 0)
        rd_varint(c);
    else if (wire == 1)
        rd_le(c, 8);
    else if (wire == 5)
        rd_le(c, 4);
    else if (wire == 2)
        rd_sub(c);
    else
        c->bad = 1;
}

static int rd_packed(cursor *c, double *out, int max) {
    cursor s = rd_sub(c);
    int n = 0;
    while (s.p < s.end && !s.bad) {
        double d = rd_double(&s);
        if (n < max) out[n] = d;
        n++;
    }
    c->bad |= s.bad;
    return n;
}

static void decode_histo(cursor h, value *v) {
    while (h.p < h.end && !h.bad) {
        uint64_t key = rd_varint(&h);
        int field = (int)(key >> 3), wire = (int)(key & 7);
        if (wire == 1 && field >= 1 && field <= 5) {
            double d = rd_double(&h);
            double *dst[] = {&v->min, &v->max, &v->num, &v->sum, &v->sum_sq};
            *dst[field - 1] = d;
        } else if (field == 6 && wire == 2) {
            v->n_limit = rd_packed(&h, v->limit, MAX_BUCKETS);
        } else if (field == 7 && wire == 2) {
            v->n_bucket = rd_packed(&h, v->bucket, MAX_BUCKETS);
        } else {
            skip_field(&h, wire);
        }
    }
}

static int decode_event(const uint8_t *data, size_t n, event *e) {
    memset(e, 0, sizeof *e);
    cursor c = {data, data + n, 0};
    while (c.p < c.end && !c.bad) {
        uint64_t key = rd_varint(&c);
        int field = (int)(key >> 3), wire = (int)(key & 7);
        if (field == 1 && wire == 1) {
            e->wall_time = rd_double(&c);
        } else if (field == 2 && wire == 0) {
            e->step = (int64_t)rd_varint(&c);
        } else if (field == 3 && wire == 2) {
            cursor s = rd_sub(&c);
            snprintf(e->file_version, sizeof e->file_version, "%.*s", (int)(s.end - s.p), s.p);
        } else if (field == 5 && wire == 2) {
            cursor sm = rd_sub(&c);
            while (sm.p < sm.end && !sm.bad) {
                uint64_t k = rd_varint(&sm);
                if (k != (1 << 3 | 2)) {
                    skip_field(&sm, (int)(k & 7));
                    continue;
                }
                cursor vc = rd_sub(&sm);
                value *v = e->n_values < MAX_VALUES ? &e->values[e->n_values++] : NULL;
                while (v && vc.p < vc.end && !vc.bad) {
                    uint64_t vk = rd_varint(&vc);
                    int vf = (int)(vk >> 3), vw = (int)(vk & 7);
                    if (vf == 1 && vw == 2) {
                        cursor t = rd_sub(&vc);
                        snprintf(v->tag, sizeof v->tag, "%.*s", (int)(t.end - t.p), t.p);
                    } else if (vf == 2 && vw == 5) {
                        uint32_t u = (uint32_t)rd_le(&vc, 4);
                        memcpy(&v->simple, &u, 4);
                        v->has_simple = 1;
                    } else if (vf == 5 && vw == 2) {
                        decode_histo(rd_sub(&vc), v);
                        v->has_histo = 1;
                    } else {
                        skip_field(&vc, vw);
                    }
                }
                sm.bad |= vc.bad;
            }
            c.bad |= sm.bad;
        } else {
            skip_field(&c, wire);
        }
    }
    return !c.bad;
}

/* The mask written independently of the library, from the TFRecord spec. */
static uint32_t mask(uint32_t crc) {
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* Reads every record of `path` into events[]; returns the count, or -1 -
 * (index of the first bad record) when a CRC or the framing is wrong. */
static int read_events(const char *path, event *events, int max) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1000;
    int n = 0;
    for (;;) {
        uint8_t head[12], tail[4];
        size_t got = fread(head, 1, 12, f);
        if (got == 0) break;
        uint64_t len = 0;
        for (int i = 0; i < 8; i++) len |= (uint64_t)head[i] << (8 * i);
        uint32_t len_crc = 0, data_crc = 0;
        for (int i = 0; i < 4; i++) len_crc |= (uint32_t)head[8 + i] << (8 * i);
        if (got != 12 || len_crc != mask(ts_crc32c(0, head, 8)) || len > (1u << 24)) {
            fclose(f);
            return -1 - n;
        }
        uint8_t *data = malloc(len ? len : 1);
        int ok = data && fread(data, 1, len, f) == len && fread(tail, 1, 4, f) == 4;
        for (int i = 0; ok && i < 4; i++) data_crc |= (uint32_t)tail[i] << (8 * i);
        ok = ok && data_crc == mask(ts_crc32c(0, data, len));
        if (ok && n < max) ok = decode_event(data, len, &events[n]);
        free(data);
        if (!ok) {
            fclose(f);
            return -1 - n;
        }
        n++;
    }
    fclose(f);
    return n;
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    int ch;
    while (a && b && (ch = fgetc(a)) != EOF) fputc(ch, b);
    if (a) fclose(a);
    if (b) fclose(b);
}

static void flip_byte(const char *path, long at) {
    FILE *f = fopen(path, "r+b");
    if (!f) return;
    fseek(f, at, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(ch ^ 0x20, f);
    fclose(f);
}

/* ---- tests ------------------------------------------------------------------------ */

static char dir[64];

static void test_crc(void) {
    CHECK(ts_crc32c(0, "123456789", 9) == 0xE3069283u, "CRC-32C check value");
    CHECK(ts_tfrecord_masked_crc("123456789", 9) == mask(0xE3069283u), "masked");
}

static void test_write_read(void) {
    char sub[128];
    snprintf(sub, sizeof sub, "%s/run/tb", dir); /* parents are created */
    ts_tfevents_options o = ts_tfevents_options_default();
    o.max_pending = 1000;
    o.flush_seconds = 1000;
    ts_tfevents *w = NULL;
    CHECK_OK(ts_tfevents_open(sub, &o, &w));
    if (!w) return;
    char path[512];
    snprintf(path, sizeof path, "%s", ts_tfevents_path(w));
    char host[256] = "";
    gethostname(host, sizeof host);
    CHECK(strstr(path, "/events.out.tfevents.") && strstr(path, host), "file name %s", path);
    long first = file_size(path);
    CHECK(first > 12, "the version record is on disk at once (%ld bytes)", first);

    CHECK_OK(ts_tfevents_scalar(w, 10, "train/loss", 2.5));
    CHECK(file_size(path) == first, "buffered under the flush policy");
    const char *tags[] = {"train/lr", "train/grad_norm"};
    const double vals[] = {3e-4, 1.75};
    CHECK_OK(ts_tfevents_scalars(w, 11, 2, tags, vals));
    const double hv[] = {-1, 0, 0.5, 0.5, 2, NAN, 1e-13};
    int64_t bad = -1;
    CHECK_OK(ts_tfevents_histogram_f64(w, 12, "grad/w", hv, 7, &bad));
    CHECK(bad == 1, "one non-finite value left out (%lld)", (long long)bad);
    const float hf[] = {1.0f, 1.0f, 1.0f};
    CHECK_OK(ts_tfevents_histogram(w, 13, "weights/b", hf, 3, NULL));
    CHECK_OK(ts_tfevents_histogram(w, 14, "weights/empty", NULL, 0, NULL));
    CHECK_OK(ts_tfevents_scalar(w, -5, "neg/step", -1));
    CHECK(ts_tfevents_scalar(w, 1, "", 1) == TS_ERR_INVALID, "empty tag");
    CHECK_OK(ts_tfevents_flush(w));
    CHECK(file_size(path) > first, "flushed");
    CHECK_OK(ts_tfevents_close(w));

    event ev[16];
    int n = read_events(path, ev, 16);
    CHECK(n == 7, "7 records, got %d", n);
    if (n != 7) return;
    CHECK(!strcmp(ev[0].file_version, "brain.Event:2") && ev[0].n_values == 0, "version");
    double now = (double)time(NULL);
    CHECK(fabs(ev[0].wall_time - now) < 60, "wall time %f", ev[0].wall_time);
    CHECK(ev[1].step == 10 && ev[1].n_values == 1 && !strcmp(ev[1].values[0].tag, "train/loss") &&
              ev[1].values[0].has_simple && ev[1].values[0].simple == 2.5f,
          "scalar");
    CHECK(ev[1].file_version[0] == 0, "version only in the first record");
    CHECK(ev[2].step == 11 && ev[2].n_values == 2 && !strcmp(ev[2].values[1].tag, tags[1]) &&
              ev[2].values[0].simple == (float)3e-4 && ev[2].values[1].simple == 1.75f,
          "two scalars in one event");
    value *h = &ev[3].values[0];
    CHECK(ev[3].step == 12 && h->has_histo && !strcmp(h->tag, "grad/w"), "histogram event");
    CHECK(h->num == 6 && h->min == -1 && h->max == 2 && h->sum == 2 + 1e-13 &&
              fabs(h->sum_sq - 5.5) < 1e-12,
          "histogram stats num %g min %g max %g sum %g sumsq %g", h->num, h->min, h->max, h->sum,
          h->sum_sq);
    CHECK(h->n_limit == h->n_bucket && h->n_limit > 0 && h->n_limit < 40,
          "%d limits, %d buckets (empty runs merged)", h->n_limit, h->n_bucket);
    /* bucket i holds [limit[i-1], limit[i]): the cumulative count through
     * bucket i is the number of values below limit[i] */
    double cum = 0;
    int ok = 1;
    for (int i = 0; i < h->n_limit; i++) {
        cum += h->bucket[i];
        double below = 0;
        for (int k = 0; k < 7; k++) below += isfinite(hv[k]) && hv[k] < h->limit[i];
        if (cum != below || (i && !(h->limit[i] > h->limit[i - 1]))) ok = 0;
    }
    CHECK(ok && cum == 6, "buckets agree with the values (total %g)", cum);
    value *hb = &ev[4].values[0];
    CHECK(hb->num == 3 && hb->min == 1 && hb->max == 1 && hb->sum == 3, "f32 histogram");
    double nonempty = 0;
    for (int i = 0; i < hb->n_bucket; i++) nonempty += hb->bucket[i] > 0;
    CHECK(nonempty == 1, "one non-empty bucket");
    CHECK(ev[5].values[0].num == 0 && ev[5].values[0].has_histo, "empty histogram");
    CHECK(ev[6].step == -5 && ev[6].values[0].simple == -1.0f, "negative step round trip");

    /* A flipped byte in the data of record 1, then in its length. */
    char bad_path[600];
    snprintf(bad_path, sizeof bad_path, "%s.corrupt", path);
    copy_file(path, bad_path);
    flip_byte(bad_path, first + 12 + 3);
    CHECK(read_events(bad_path, ev, 16) == -2, "corrupted data detected in record 1");
    copy_file(path, bad_path);
    flip_byte(bad_path, first + 1);
    CHECK(read_events(bad_path, ev, 16) == -2, "corrupted length detected in record 1");
    copy_file(path, bad_path);
    flip_byte(bad_path, file_size(path) - 1);
    CHECK(read_events(bad_path, ev, 16) == -7, "corrupted last CRC detected");
    unlink(bad_path);

    /* max_pending = 1: every record reaches the file at once. */
    o.max_pending = 1;
    o.suffix = ".rank1";
    CHECK_OK(ts_tfevents_open(sub, &o, &w));
    if (w) {
        long before = file_size(ts_tfevents_path(w));
        CHECK_OK(ts_tfevents_scalar(w, 1, "x", 1));
        CHECK(file_size(ts_tfevents_path(w)) > before, "written through");
        CHECK(strstr(ts_tfevents_path(w), ".rank1"), "suffix in %s", ts_tfevents_path(w));
        /* a second writer on the same name in the same second is refused */
        ts_tfevents *w2 = NULL;
        ts_status s = ts_tfevents_open(sub, &o, &w2);
        if (s == TS_OK) {
            CHECK(strcmp(ts_tfevents_path(w2), ts_tfevents_path(w)), "distinct names");
            unlink(ts_tfevents_path(w2));
            ts_tfevents_close(w2);
        } else {
            CHECK(s == TS_ERR_IO && strstr(ts_last_error(), "already exists"), "%s",
                  ts_last_error());
        }
        unlink(ts_tfevents_path(w));
        CHECK_OK(ts_tfevents_close(w));
    }
    unlink(path);
    CHECK(ts_tfevents_open("/proc/nonexistent/tb", NULL, &w) == TS_ERR_IO && w == NULL,
          "unwritable directory: %s", ts_last_error());
    CHECK_OK(ts_tfevents_close(NULL));
}

/* Values on, next to and between the default limits (1e-12 * 1.1^k, both
 * signs), below 1e-12, beyond 1e20 and zero land in the right bucket: the
 * cumulative count through bucket i is the number of values below
 * limit[i], for every limit written. */
static void test_histogram_buckets(void) {
    enum { NV = 100 };
    double v[NV];
    unsigned seed = 5;
    int n = 0;
    double lim = 1e-12;
    for (int k = 0; k < 560 && n + 3 <= NV - 8; k += 1 + rand_r(&seed) % 23) {
        while (lim < 1e-12 * pow(1.1, k) * 0.999)
            lim *= 1.1; /* the limits as the writer makes them */
        const double sign = rand_r(&seed) % 2 ? 1.0 : -1.0;
        v[n++] = sign * lim;
        v[n++] = sign * nextafter(lim, 0);
        v[n++] = sign * lim * (1 + (double)rand_r(&seed) / RAND_MAX * 0.09);
    }
    const double extra[] = {0, -0.0, 3e-13, -7e-15, 1e21, -5e30, 1e-12, 2.0};
    for (int i = 0; i < 8; i++) v[n++] = extra[i];
    char sub[128];
    snprintf(sub, sizeof sub, "%s/buckets", dir);
    ts_tfevents *w = NULL;
    CHECK_OK(ts_tfevents_open(sub, NULL, &w));
    if (!w) return;
    char path[512];
    snprintf(path, sizeof path, "%s", ts_tfevents_path(w));
    CHECK_OK(ts_tfevents_histogram_f64(w, 1, "h", v, n, NULL));
    CHECK_OK(ts_tfevents_close(w));
    event ev[2];
    CHECK(read_events(path, ev, 2) == 2, "version and histogram records");
    const value *h = &ev[1].values[0];
    CHECK(h->has_histo && h->num == n && h->n_limit == h->n_bucket && h->n_limit < MAX_BUCKETS,
          "%g values, %d limits", h->num, h->n_limit);
    double cum = 0;
    int bad = 0;
    for (int i = 0; i < h->n_limit; i++) {
        cum += h->bucket[i];
        double below = 0;
        for (int k = 0; k < n; k++) below += v[k] < h->limit[i];
        bad += cum != below;
    }
    CHECK(bad == 0 && cum == n, "%d limits whose cumulative count is wrong (total %g of %d)", bad,
          cum, n);
}

/* TensorFlow's upper_bound over the limits by binary search, the last
 * bucket for values at or past the last limit: the reference for the
 * writer's lookup table. */
static int upper_bound_ref(const double *lim, int n, double v) {
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (lim[mid] <= v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n ? lo : n - 1;
}

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The float bucket lookup (a table on the top 16 bits and one compare)
 * agrees with a binary search for every 4099th bit pattern, both ends of
 * every table range, every limit and its float neighbours (two steps each
 * way) and the special values; inf and NaN have no bucket. */
static void test_bucket_table(void) {
    const double *lim = NULL;
    const int n = ts_tfevents_default_limits(&lim);
    CHECK(n > 1000 && lim && lim[0] == -DBL_MAX && lim[n - 1] == DBL_MAX && lim[n / 2] == 0,
          "%d default limits", n);
    if (n <= 0 || !lim) return;
    long checked = 0, bad = 0;
    float first_bad = 0;
#define CHECK_BUCKET(f)                                                                            \
    do {                                                                                           \
        const float f_ = (f);                                                                      \
        const int want_ = isfinite(f_) ? upper_bound_ref(lim, n, f_) : -1;                         \
        checked++;                                                                                 \
        if (ts_tfevents_bucket_f32(f_) != want_ && bad++ == 0) first_bad = f_;                     \
    } while (0)
    for (uint64_t u = 0; u < (1ull << 32); u += 4099) CHECK_BUCKET(from_bits((uint32_t)u));
    for (uint32_t p = 0; p < (1u << 16); p++) {
        CHECK_BUCKET(from_bits(p << 16));
        CHECK_BUCKET(from_bits(p << 16 | 0xffffu));
    }
    for (int i = 0; i < n; i++) {
        const float f = (float)lim[i];
        CHECK_BUCKET(f);
        float up = f, down = f;
        for (int k = 0; k < 2; k++) {
            up = nextafterf(up, INFINITY);
            down = nextafterf(down, -INFINITY);
            CHECK_BUCKET(up);
            CHECK_BUCKET(down);
        }
    }
    const float special[] = {0.0f,
                             -0.0f,
                             FLT_TRUE_MIN,
                             -FLT_TRUE_MIN,
                             FLT_MIN,
                             -FLT_MIN,
                             FLT_MAX,
                             -FLT_MAX,
                             1e-12f,
                             -1e-12f,
                             1e20f,
                             -1e20f,
                             INFINITY,
                             -INFINITY,
                             NAN,
                             -NAN,
                             from_bits(0x7f800001u),
                             from_bits(0xffc00001u)};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) CHECK_BUCKET(special[i]);
#undef CHECK_BUCKET
    CHECK(bad == 0, "%ld of %ld floats in the wrong bucket (first %a)", bad, checked,
          (double)first_bad);
}

/* A float histogram (the table) and a double histogram of the same values
 * (the logarithm and walk) write the same record but for the wall time:
 * min, max, count, sum, sum of squares, limits and counts, bit for bit. */
static void test_histogram_f32_matches_f64(void) {
    enum { NV = 3000 };
    float *f = malloc(sizeof(float) * NV);
    double *d = malloc(sizeof(double) * NV);
    if (!f || !d) {
        CHECK(0, "out of memory");
        free(f);
        free(d);
        return;
    }
    const double *lim = NULL;
    const int n_lim = ts_tfevents_default_limits(&lim);
    unsigned seed = 11;
    int n = 0;
    /* Weight-like values over two decades, limits 300..330 and neighbours,
     * then zeros, subnormals, the ends and non-finite values. */
    while (n < 2000) {
        const double u = (double)rand_r(&seed) / RAND_MAX;
        f[n++] = (float)((rand_r(&seed) % 2 ? 1 : -1) * pow(10, -3 + 2 * u));
    }
    for (int i = 300; i < 330 && i < n_lim; i++) {
        const float l = (float)lim[i];
        f[n++] = l;
        f[n++] = nextafterf(l, INFINITY);
        f[n++] = nextafterf(l, -INFINITY);
    }
    const float extra[] = {0.0f,    -0.0f,    FLT_TRUE_MIN, -FLT_MIN, 1e-12f,   -1e-12f,
                           FLT_MAX, -FLT_MAX, INFINITY,     NAN,      -INFINITY};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) f[n++] = extra[i];
    for (int i = 0; i < n; i++) d[i] = f[i];
    char sub[128];
    snprintf(sub, sizeof sub, "%s/f32f64", dir);
    ts_tfevents *w = NULL;
    CHECK_OK(ts_tfevents_open(sub, NULL, &w));
    if (!w) {
        free(f);
        free(d);
        return;
    }
    char path[512];
    snprintf(path, sizeof path, "%s", ts_tfevents_path(w));
    int64_t bad32 = -1, bad64 = -1;
    CHECK_OK(ts_tfevents_histogram(w, 1, "h", f, n, &bad32));
    CHECK_OK(ts_tfevents_histogram_f64(w, 1, "h", d, n, &bad64));
    CHECK_OK(ts_tfevents_close(w));
    CHECK(bad32 == 3 && bad64 == 3, "non-finite: %lld f32, %lld f64", (long long)bad32,
          (long long)bad64);
    static event ev[3];
    CHECK(read_events(path, ev, 3) == 3, "version and two histogram records");
    const value *a = &ev[1].values[0], *b = &ev[2].values[0];
    CHECK(a->has_histo && b->has_histo && a->num == n - 3 && a->n_limit < MAX_BUCKETS,
          "%g values, %d limits", a->num, a->n_limit);
    CHECK(!memcmp(&a->min, &b->min, sizeof(double)) && !memcmp(&a->max, &b->max, sizeof(double)) &&
              !memcmp(&a->num, &b->num, sizeof(double)) &&
              !memcmp(&a->sum, &b->sum, sizeof(double)) &&
              !memcmp(&a->sum_sq, &b->sum_sq, sizeof(double)),
          "moments f32 %a %a %a %a vs f64 %a %a %a %a", a->min, a->max, a->sum, a->sum_sq, b->min,
          b->max, b->sum, b->sum_sq);
    if (a->n_limit > MAX_BUCKETS || a->n_bucket > MAX_BUCKETS) {
        free(f);
        free(d);
        return;
    }
    CHECK(a->n_limit == b->n_limit && a->n_bucket == b->n_bucket &&
              !memcmp(a->limit, b->limit, sizeof(double) * (size_t)a->n_limit) &&
              !memcmp(a->bucket, b->bucket, sizeof(double) * (size_t)a->n_bucket),
          "limits and counts differ: %d/%d limits", a->n_limit, b->n_limit);
    free(f);
    free(d);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/tessel-tfevents-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_crc();
    test_write_read();
    test_histogram_buckets();
    test_bucket_table();
    test_histogram_f32_matches_f64();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("tfevents");
}
