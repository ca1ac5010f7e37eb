/* costmodel.c — the speeds of a pipeline device: read from a devices file
 * (dist.devices) or measured briefly in this process (tessel/pipeline.h). */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "tessel/compile.h"
#include "tessel/pipeline.h"
#include "tessel/plan.h"

ts_status ts_devices_load(const char *path, ts_device_speed *out, int max, int *n) {
    if (!path || !out || !n || max < 1)
        return ts_fail(TS_ERR_INVALID, "devices: missing file name or output");
    FILE *f = fopen(path, "r");
    if (!f) return ts_fail(TS_ERR_IO, "devices file %s: %s", path, strerror(errno));
    char line[512];
    int ln = 0;
    *n = 0;
    while (fgets(line, sizeof line, f)) {
        ln++;
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *p = line;
        while (isspace((unsigned char)*p)) p++;
        if (!*p) continue;
        if (*n == max) {
            fclose(f);
            return ts_fail(TS_ERR_FORMAT, "devices file %s:%d: more than %d devices", path, ln,
                           max);
        }
        ts_device_speed d = {{0}, 0, 0, 0, 0};
        char name[64], extra[8];
        const int k = sscanf(p, "%63s %lf %lf %lf %lf %7s", name, &d.gemm_gflops, &d.mem_gbps,
                             &d.link_gbps, &d.mem_mb, extra);
        if (k < 4 || k > 5 || !(d.gemm_gflops > 0) || !(d.mem_gbps > 0) || !(d.link_gbps > 0) ||
            !(d.mem_mb >= 0)) {
            fclose(f);
            return ts_fail(TS_ERR_FORMAT,
                           "devices file %s:%d: expected `name gemm_gflops mem_gbps link_gbps "
                           "[mem_mb]` with speeds > 0 and mem_mb >= 0",
                           path, ln);
        }
        snprintf(d.name, sizeof d.name, "%.31s", name);
        out[(*n)++] = d;
    }
    const int bad = ferror(f);
    fclose(f);
    if (bad) return ts_fail(TS_ERR_IO, "devices file %s: read error", path);
    if (*n == 0) return ts_fail(TS_ERR_FORMAT, "devices file %s: no device listed", path);
    return TS_OK;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Seconds per run of a one-op inference plan (best of a few, after a warm
 * run), its inputs filled with small values. */
static ts_status time_op(int gemm, int threads, double *sec) {
    ts_graph *g = ts_graph_new();
    if (!g) return ts_fail(TS_ERR_NOMEM, "device measure: out of memory");
    const int64_t mm_a[2] = {256, 512}, mm_w[2] = {512, 512}, vec[1] = {4 << 20};
    ts_val y;
    if (gemm) {
        ts_val a = ts_input(g, "a", TS_F32, 2, mm_a);
        ts_val w = ts_param(g, "w", TS_F32, 2, mm_w, ts_init_uniform(-0.01, 0.01));
        y = ts_matmul(g, a, w, 0, 0);
    } else {
        y = ts_add(g, ts_input(g, "a", TS_F32, 1, vec), ts_input(g, "b", TS_F32, 1, vec));
    }
    ts_plan *p = NULL;
    ts_status s = ts_mark_output(g, y, "y");
    ts_compile_options o = ts_compile_options_default();
    o.threads = threads;
    if (s == TS_OK) s = ts_compile(g, NULL, &o, &p);
    ts_graph_free(g);
    const size_t n = gemm ? 256 * 512 : (size_t)4 << 20;
    float *buf = s == TS_OK ? calloc(n, sizeof *buf) : NULL;
    if (s == TS_OK && !buf) s = ts_fail(TS_ERR_NOMEM, "device measure: out of memory");
    if (s == TS_OK) s = ts_plan_set_input(p, "a", buf, n * sizeof *buf);
    if (s == TS_OK && !gemm) s = ts_plan_set_input(p, "b", buf, n * sizeof *buf);
    if (s == TS_OK) s = ts_plan_step(p);
    double best = 1e30;
    for (int i = 0; i < 5 && s == TS_OK; i++) {
        const double t0 = now();
        s = ts_plan_step(p);
        if (now() - t0 < best) best = now() - t0;
    }
    free(buf);
    ts_plan_free(p);
    *sec = best;
    return s;
}

ts_status ts_device_measure(int threads, ts_device_speed *out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "device measure: NULL output");
    double tg, tm;
    ts_status s = time_op(1, threads, &tg);
    if (s == TS_OK) s = time_op(0, threads, &tm);
    if (s != TS_OK) return s;
    const size_t bytes = (size_t)16 << 20;
    unsigned char *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) {
        free(a), free(b);
        return ts_fail(TS_ERR_NOMEM, "device measure: out of memory");
    }
    memset(a, 1, bytes), memset(b, 0, bytes);
    double tl = 1e30;
    for (int i = 0; i < 4; i++) {
        const double t0 = now();
        memcpy(b, a, bytes);
        if (now() - t0 < tl) tl = now() - t0;
    }
    /* keep the copy observable */
    volatile unsigned char sink = b[bytes - 1];
    (void)sink;
    free(a), free(b);
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "measured");
    out->gemm_gflops = 2.0 * 256 * 512 * 512 / tg * 1e-9;
    out->mem_gbps = 3.0 * 4.0 * (4 << 20) / tm * 1e-9;
    out->link_gbps = (double)bytes / tl * 1e-9;
    return TS_OK;
}
