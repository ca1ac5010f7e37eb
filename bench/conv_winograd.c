/* conv_winograd.c — the Winograd F(2,3)^3 kernel (dnnl_conv_winograd.h)
 * against oneDNN's direct convolution on W4's 3^3 convolutions.
 *
 *     OMP_NUM_THREADS=1 build/bench_conv_winograd [rounds [SHAPE]]
 *
 * (rounds: default 7; SHAPE: only the shapes whose name contains it)
 *
 * For each W4 shape (batch 4, channels last, stride 1, padding 1), forward
 * and backward data: oneDNN's primitive (created as dnnl_conv.c creates it:
 * channels-last activations, weights in oneDNN's chosen layout, reordered
 * outside the timing) and the Winograd kernel (its weight transform inside
 * the timing, as in a step), alternated `rounds` times; the median CPU ms
 * of each (process CPU time, so that other processes' time on a shared core
 * is left out; with T threads it is T times the wall time at best), the ratio, oneDNN's
 * implementation and the largest difference between the two outputs relative to the output's
 * largest magnitude. The load average is printed before and after: the machine may be shared. */
#include <dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backends/cpu/dnnl_conv_winograd.h"
#include "core/core.h"

typedef struct shape {
    const char *name;
    int64_t S, C, O; /* volume S^3, input and output channels */
} shape;

static const shape shapes[] = {
    {"enc1.3 dec1.3", 32, 16, 16}, {"dec1.0", 32, 32, 16}, {"enc2.0", 16, 16, 32},
    {"enc2.3 dec2.3", 16, 32, 32}, {"dec2.0", 16, 64, 32}, {"bott.0", 8, 32, 64},
    {"bott.3", 8, 64, 64},
};
enum { N = 4 };

/* Process CPU time: on a shared machine the time this process ran, not the
 * time other processes held the cores (with one thread, the kernel's time). */
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void fill(float *p, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t w[4];
        ts_philox(seed, 7, (uint64_t)i, w);
        p[i] = (float)(w[0] >> 8) * (1.0f / 8388608.0f) - 1.0f;
    }
}

static void loadavg(const char *when) {
    char buf[128] = "?";
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (!fgets(buf, sizeof buf, f)) strcpy(buf, "?\n");
        fclose(f);
    }
    printf("load average %s: %s", when, buf);
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        dnnl_status_t st_ = (call);                                                                \
        if (st_ != dnnl_success) {                                                                 \
            fprintf(stderr, "%s failed: %d\n", #call, (int)st_);                                   \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* One direction on oneDNN: y = conv(x) (bwd = 0) or x = conv_bwd_data(y). */
typedef struct onednn {
    dnnl_primitive_t prim, wre;
    dnnl_memory_t src, wei, weip, dst, pad;
    const char *impl;
} onednn;

static void onednn_make(dnnl_engine_t eng, const shape *sh, int bwd, float *x, float *w, float *y,
                        onednn *o) {
    dnnl_dims_t xd = {N, sh->C, sh->S, sh->S, sh->S}, yd = {N, sh->O, sh->S, sh->S, sh->S},
                wd = {sh->O, sh->C, 3, 3, 3}, st = {1, 1, 1}, dl = {0, 0, 0}, pd = {1, 1, 1};
    dnnl_memory_desc_t xm, ym, wany, wplain;
    CK(dnnl_memory_desc_init_by_tag(&xm, 5, xd, dnnl_f32, dnnl_ndhwc));
    CK(dnnl_memory_desc_init_by_tag(&ym, 5, yd, dnnl_f32, dnnl_ndhwc));
    CK(dnnl_memory_desc_init_by_tag(&wany, 5, wd, dnnl_f32, dnnl_format_tag_any));
    CK(dnnl_memory_desc_init_by_tag(&wplain, 5, wd, dnnl_f32, dnnl_oidhw));
    dnnl_convolution_desc_t fd, bd;
    CK(dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training,
                                                  dnnl_convolution_direct, &xm, &wany, NULL, &ym,
                                                  st, dl, pd, pd));
    dnnl_primitive_attr_t attr;
    CK(dnnl_primitive_attr_create(&attr));
    CK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    dnnl_primitive_desc_t fpd, bpd = NULL;
    CK(dnnl_primitive_desc_create(&fpd, &fd, attr, eng, NULL));
    if (bwd) {
        CK(dnnl_dilated_convolution_backward_data_desc_init(&bd, dnnl_convolution_direct, &xm,
                                                            &wany, &ym, st, dl, pd, pd));
        CK(dnnl_primitive_desc_create(&bpd, &bd, attr, eng, fpd));
    }
    dnnl_primitive_desc_t p = bwd ? bpd : fpd;
    CK(dnnl_primitive_desc_query(p, dnnl_query_impl_info_str, 0, &o->impl));
    const dnnl_memory_desc_t *wm = dnnl_primitive_desc_query_md(p, dnnl_query_weights_md, 0);
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(p, dnnl_query_scratchpad_md, 0);
    CK(dnnl_primitive_create(&o->prim, p));
    CK(dnnl_memory_create(&o->src, &xm, eng, x));
    CK(dnnl_memory_create(&o->dst, &ym, eng, y));
    CK(dnnl_memory_create(&o->weip, &wplain, eng, w));
    CK(dnnl_memory_create(&o->wei, wm, eng, DNNL_MEMORY_ALLOCATE));
    CK(dnnl_memory_create(&o->pad, sp, eng, DNNL_MEMORY_ALLOCATE));
    dnnl_primitive_desc_t rpd;
    CK(dnnl_reorder_primitive_desc_create(&rpd, &wplain, eng, wm, eng, NULL));
    CK(dnnl_primitive_create(&o->wre, rpd));
    dnnl_primitive_desc_destroy(rpd);
    dnnl_primitive_desc_destroy(fpd);
    if (bpd) dnnl_primitive_desc_destroy(bpd);
    dnnl_primitive_attr_destroy(attr);
}

static void onednn_run(dnnl_stream_t s, const onednn *o, int bwd) {
    dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, o->weip}, {DNNL_ARG_TO, o->wei}};
    CK(dnnl_primitive_execute(o->wre, s, 2, ra));
    dnnl_exec_arg_t a[4] = {{bwd ? DNNL_ARG_DIFF_SRC : DNNL_ARG_SRC, o->src},
                            {DNNL_ARG_WEIGHTS, o->wei},
                            {bwd ? DNNL_ARG_DIFF_DST : DNNL_ARG_DST, o->dst},
                            {DNNL_ARG_SCRATCHPAD, o->pad}};
    CK(dnnl_primitive_execute(o->prim, s, 4, a));
    CK(dnnl_stream_wait(s));
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 7;
    if (rounds < 1 || rounds > 100) rounds = 7;
    if (!ts_wino_enabled()) {
        printf("bench_conv_winograd: no AVX-512F (or TESSEL_CONV_WINOGRAD=0): nothing to time\n");
        return 0;
    }
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    CK(dnnl_engine_create(&eng, dnnl_cpu, 0));
    CK(dnnl_stream_create(&strm, eng, dnnl_stream_default_flags));
    int thr = omp_get_max_threads();
    loadavg("before");
    printf("%d thread(s), batch %d, median of %d alternated rounds\n", thr, N, rounds);
    printf("%-14s %-3s %-6s %8s %9s %7s %8s %8s %7s %9s  %s\n", "shape", "vol", "dir", "oneDNN",
           "winograd", "ratio", "min oDNN", "min wino", "ratio", "max rdiff", "oneDNN impl");
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const shape *sh = &shapes[k];
        if (argc > 2 && !strstr(sh->name, argv[2])) continue;
        const int64_t vox = N * sh->S * sh->S * sh->S;
        for (int bwd = 0; bwd < 2; bwd++) {
            float *x = ts_aligned_alloc(sizeof(float) * (size_t)(vox * sh->C), "x");
            float *y = ts_aligned_alloc(sizeof(float) * (size_t)(vox * sh->O), "y");
            float *w = ts_aligned_alloc(sizeof(float) * (size_t)(sh->O * sh->C * 27), "w");
            float *r = ts_aligned_alloc(sizeof(float) * (size_t)(vox * (bwd ? sh->C : sh->O)),
                                        "winograd output");
            fill(bwd ? y : x, vox * (bwd ? sh->O : sh->C), 1 + k);
            fill(w, sh->O * sh->C * 27, 100 + k);
            onednn o;
            onednn_make(eng, sh, bwd, x, w, y, &o);
            ts_wino s = {.N = N,
                         .D = sh->S,
                         .H = sh->S,
                         .W = sh->S,
                         .C = bwd ? sh->O : sh->C,
                         .O = bwd ? sh->C : sh->O,
                         .flip = bwd};
            ts_wino_init(&s);
            void *scratch = ts_aligned_alloc(ts_wino_scratch(&s, thr), "scratch");
            double td[100], tw[100];
            for (int i = -1; i < rounds; i++) {
                double t0 = now();
                onednn_run(strm, &o, bwd);
                double t1 = now();
                ts_wino_conv(&s, bwd ? y : x, w, r, scratch);
                double t2 = now();
                if (i >= 0) td[i] = t1 - t0, tw[i] = t2 - t1;
            }
            const float *ref = bwd ? x : y;
            int64_t n = vox * (bwd ? sh->C : sh->O);
            double mx = 0, md = 0;
            for (int64_t i = 0; i < n; i++) {
                double a = ref[i] < 0 ? -ref[i] : ref[i], d = (double)ref[i] - r[i];
                if (a > mx) mx = a;
                if ((d < 0 ? -d : d) > md) md = d < 0 ? -d : d;
            }
            qsort(td, (size_t)rounds, sizeof(double), cmp);
            qsort(tw, (size_t)rounds, sizeof(double), cmp);
            double a = td[rounds / 2] * 1e3, b = tw[rounds / 2] * 1e3;
            printf("%-14s %-3lld %-6s %8.2f %9.2f %6.2fx %8.2f %8.2f %6.2fx %9.1e  %s\n", sh->name,
                   (long long)sh->S, bwd ? "bwd_dt" : "fwd", a, b, a / b, td[0] * 1e3, tw[0] * 1e3,
                   td[0] / tw[0], md / (mx > 0 ? mx : 1), o.impl);
            fflush(stdout);
            dnnl_primitive_destroy(o.prim);
            dnnl_primitive_destroy(o.wre);
            dnnl_memory_destroy(o.src);
            dnnl_memory_destroy(o.dst);
            dnnl_memory_destroy(o.wei);
            dnnl_memory_destroy(o.weip);
            dnnl_memory_destroy(o.pad);
            ts_aligned_free(scratch);
            ts_aligned_free(x);
            ts_aligned_free(y);
            ts_aligned_free(w);
            ts_aligned_free(r);
        }
    }
    loadavg("after");
    dnnl_stream_destroy(strm);
    dnnl_engine_destroy(eng);
    return 0;
}
