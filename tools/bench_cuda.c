/* `tessel bench --backend cuda` (bench_cuda.h): the GPU figures of issue
 * #17 for W1, W3 and GPT-2 124M. Each mode (graph, no graph) gets a fresh
 * plan, freed before the next, so GPT-2 never holds two arenas at once.
 * Step times are wall-clock around ts_plan_step: the inputs' copy up, the
 * launch, the wait and the loss's copy back, i.e. what a training loop
 * sees. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "bench_cuda.h"

enum { N_BATCHES = 4 };

ts_bench_cuda_options ts_bench_cuda_options_default(void) {
    ts_bench_cuda_options o;
    memset(&o, 0, sizeof o);
    o.workload = "W1";
    o.precision = "fp32";
    o.steps = 100;
    o.warmup = 5;
    return o;
}

typedef struct wl {
    ts_graph *g;
    ts_model m;
    ts_train_spec spec;
    double per_step; /* samples or tokens */
    const char *unit;
    void *x[N_BATCHES], *y[N_BATCHES];
    size_t xb, yb;
} wl;

static void wl_free(wl *w) {
    for (int b = 0; b < N_BATCHES; b++) free(w->x[b]), free(w->y[b]);
    ts_graph_free(w->g);
}

static ts_status wl_build(const ts_bench_cuda_options *o, wl *w) {
    memset(w, 0, sizeof *w);
    int kind = !strcasecmp(o->workload, "W1")          ? 1
               : !strcasecmp(o->workload, "W3")        ? 3
               : !strcasecmp(o->workload, "gpt2-124m") ? 4
                                                       : 0;
    if (!kind)
        return ts_fail(TS_ERR_INVALID, "bench --backend cuda: workload '%s' (W1, W3 or gpt2-124m)",
                       o->workload);
    if (!(w->g = ts_graph_new())) return ts_fail(TS_ERR_NOMEM, "bench: out of memory");
    ts_mlp_config mc = ts_mlp_w1();
    ts_gpt_config gc = kind == 3 ? ts_gpt_w3() : ts_gpt2_124m();
    if (kind == 4) gc.batch = 16; /* the GPT-2 target: B 16, T 1024 */
    ts_status s;
    if (kind == 1) {
        s = ts_build_mlp(w->g, &mc, &w->m);
        w->per_step = (double)mc.batch;
        w->unit = "samples/s";
    } else {
        s = ts_build_gpt(w->g, &gc, &w->m);
        w->per_step = (double)(gc.batch * gc.ctx);
        w->unit = "tokens/s";
    }
    if (s != TS_OK) return ts_fail(s, "bench: building %s: %s", o->workload, ts_graph_error(w->g));
    w->spec = ts_train_spec_default(w->m.loss);
    w->spec.opt =
        kind == 1 ? ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01) : ts_adamw(3e-4, 0.9, 0.999, 1e-8, 0.1);
    const ts_graph *g = w->g;
    w->xb = (size_t)ts_numel(g, w->m.input) * ts_dtype_size(ts_dtype_of(g, w->m.input));
    w->yb = (size_t)ts_numel(g, w->m.target) * ts_dtype_size(ts_dtype_of(g, w->m.target));
    for (int b = 0; b < N_BATCHES; b++) {
        if (!(w->x[b] = malloc(w->xb)) || !(w->y[b] = malloc(w->yb)))
            return ts_fail(TS_ERR_NOMEM, "bench: batches");
        s = kind == 1 ? ts_synth_regression(1234, b, mc.batch, mc.window, mc.features, mc.out_dim,
                                            w->x[b], w->y[b])
                      : ts_synth_tokens(1234, b, gc.batch, gc.ctx, gc.vocab, w->x[b], w->y[b]);
        if (s != TS_OK) return s;
    }
    return TS_OK;
}

/* The workload's training step for the GPU: with the CUDA graph or without, and with every
 * instruction timed (profile, never captured). */
static ts_status compile_cuda(const ts_bench_cuda_options *o, const wl *w, int no_graph,
                              int profile, ts_plan **p) {
    ts_compile_options opt = ts_compile_options_default();
    opt.backend = "cuda";
    opt.no_cuda_graph = no_graph;
    opt.profile = profile;
    opt.discard_outputs = 1;
    opt.precision.compute = !strcasecmp(o->precision, "bf16") ? TS_BF16 : TS_F32;
    return ts_compile(w->g, &w->spec, &opt, p);
}

typedef struct mode_result {
    double step_ms, sigma_us, launch_us, launch_sigma_us, loss_first, loss_last;
    ts_device_info dev;
} mode_result;

/* The standard deviation of v[0..n) (population). */
static double sigma(const double *v, int n) {
    double mean = 0, var = 0;
    for (int i = 0; i < n; i++) mean += v[i] / n;
    for (int i = 0; i < n; i++) var += (v[i] - mean) * (v[i] - mean) / n;
    return sqrt(var);
}

/* One mode: compile, warm up (the first step captures the graph), time. */
static ts_status run_mode(const ts_bench_cuda_options *o, wl *w, int no_graph, mode_result *r) {
    memset(r, 0, sizeof *r);
    ts_plan *p = NULL;
    ts_status s = compile_cuda(o, w, no_graph, 0, &p);
    if (s != TS_OK) return s;
    const char *xn = ts_name(w->g, w->m.input), *yn = ts_name(w->g, w->m.target);
    double *t = malloc(sizeof(double) * (size_t)o->steps * 2);
    if (!t) {
        ts_plan_free(p);
        return ts_fail(TS_ERR_NOMEM, "bench: times");
    }
    double *launch = t + o->steps;
    for (int i = 0; i < o->warmup + o->steps && s == TS_OK; i++) {
        int k = i % N_BATCHES;
        s = ts_plan_set_input(p, xn, w->x[k], w->xb);
        if (s == TS_OK) s = ts_plan_set_input(p, yn, w->y[k], w->yb);
        double t0 = ts_now();
        if (s == TS_OK) s = ts_plan_step(p);
        double dt = ts_now() - t0;
        if (s == TS_OK && (s = ts_plan_device_info(p, &r->dev)) == TS_OK && i >= o->warmup) {
            t[i - o->warmup] = dt;
            launch[i - o->warmup] = r->dev.launch_us;
        }
        if (i == 0) r->loss_first = ts_plan_loss(p);
    }
    if (s == TS_OK) {
        r->sigma_us = 1e6 * sigma(t, o->steps); /* before ts_median, which sorts */
        r->step_ms = 1e3 * ts_median(t, o->steps);
        r->launch_sigma_us = sigma(launch, o->steps);
        r->launch_us = ts_median(launch, o->steps);
        r->loss_last = ts_plan_loss(p);
    }
    free(t);
    ts_plan_free(p);
    return s;
}

/* Three steps after one warm-up with every instruction timed (CUDA events,
 * no graph): the time per op kind, slowest first, with the GEMMs' rate. */
static ts_status run_profile(const ts_bench_cuda_options *o, wl *w, FILE *out) {
    ts_plan *p = NULL;
    ts_status s = compile_cuda(o, w, 1, 1, &p);
    if (s != TS_OK) return s;
    const char *xn = ts_name(w->g, w->m.input), *yn = ts_name(w->g, w->m.target);
    enum { STEPS = 3, TOP = 24 };
    for (int i = 0; i < 1 + STEPS && s == TS_OK; i++) {
        if (i == 1) ts_plan_profile_reset(p);
        s = ts_plan_set_input(p, xn, w->x[i % N_BATCHES], w->xb);
        if (s == TS_OK) s = ts_plan_set_input(p, yn, w->y[i % N_BATCHES], w->yb);
        if (s == TS_OK) s = ts_plan_step(p);
    }
    ts_profile_entry e[TOP];
    int n = s == TS_OK ? ts_plan_profile(p, e, TOP) : 0;
    if (n > TOP) n = TOP;
    double total = 0;
    for (int i = 0; i < n; i++) total += e[i].seconds / STEPS;
    if (s == TS_OK) {
        fprintf(out, "  profile (instructions timed one by one, ms per step):\n");
        for (int i = 0; i < n; i++) {
            double ms = 1e3 * e[i].seconds / STEPS;
            fprintf(out, "    %-22s %9.3f ms %5.1f %% %5d instr", e[i].op, ms,
                    total > 0 ? 100 * ms / (1e3 * total) : 0.0, e[i].instructions);
            if (e[i].flops > 0 && ms > 0)
                fprintf(out, "  %8.1f TFLOP/s", e[i].flops / (ms * 1e-3) / 1e12);
            fputc('\n', out);
        }
        fprintf(out, "    %-22s %9.3f ms\n", "sum", 1e3 * total);
    }
    ts_plan_free(p);
    return s;
}

ts_status ts_bench_cuda_run(const ts_bench_cuda_options *o) {
    FILE *out = o->out ? o->out : stdout;
    if (strcasecmp(o->precision, "fp32") && strcasecmp(o->precision, "bf16"))
        return ts_fail(TS_ERR_INVALID, "bench --backend cuda: precision '%s' (fp32 or bf16)",
                       o->precision);
    wl w;
    ts_status s = wl_build(o, &w);
    mode_result g, ng;
    if (s == TS_OK) s = run_mode(o, &w, 0, &g);
    if (s == TS_OK) s = run_mode(o, &w, 1, &ng);
    if (s != TS_OK) {
        wl_free(&w);
        return s;
    }
    fprintf(out, "%s on %s (%s), %d steps per mode after %d warm-up\n", o->workload, g.dev.name,
            o->precision, o->steps, o->warmup);
    fprintf(out, "  %-28s %14s %14s\n", "", "CUDA graph", "no graph");
    fprintf(out, "  %-28s %14.3f %14.3f\n", "step time, median (ms)", g.step_ms, ng.step_ms);
    fprintf(out, "  %-28s %14.0f %14.0f\n", w.unit, w.per_step / (g.step_ms * 1e-3),
            w.per_step / (ng.step_ms * 1e-3));
    fprintf(out, "  %-28s %14.2f %14.2f\n", "launch cost per step (us)", g.launch_us, ng.launch_us);
    fprintf(out, "  %-28s %14.2f %14.2f\n", "launch jitter, sigma (us)", g.launch_sigma_us,
            ng.launch_sigma_us);
    fprintf(out, "  %-28s %14.2f %14.2f\n", "step jitter, sigma (us)", g.sigma_us, ng.sigma_us);
    fprintf(out, "  kernels per step %lld; device memory %.1f MiB; loss %.6g -> %.6g\n",
            (long long)g.dev.kernels_per_step, g.dev.device_bytes / 1048576.0, g.loss_first,
            g.loss_last);
    fprintf(out, "  GPU utilisation %.0f %%, memory used %.1f MiB, power %.0f W (NVML)\n",
            g.dev.util_pct, g.dev.mem_used_bytes / 1048576.0, g.dev.power_w);
    if (o->profile && (s = run_profile(o, &w, out)) != TS_OK) {
        wl_free(&w);
        return s;
    }
    if (o->json_path) {
        FILE *f = fopen(o->json_path, "a");
        if (!f) {
            wl_free(&w);
            return ts_fail(TS_ERR_IO, "bench: cannot append to %s", o->json_path);
        }
        fprintf(f,
                "{\"workload\":\"%s\",\"backend\":\"cuda\",\"gpu\":\"%s\",\"precision\":\"%s\","
                "\"steps\":%d,\"step_ms\":%.4f,\"step_ms_nograph\":%.4f,\"per_s\":%.1f,"
                "\"unit\":\"%s\",\"launch_us\":%.3f,\"launch_us_nograph\":%.3f,"
                "\"launch_sigma_us\":%.3f,\"launch_sigma_us_nograph\":%.3f,"
                "\"sigma_us\":%.3f,\"sigma_us_nograph\":%.3f,\"kernels_per_step\":%lld}\n",
                o->workload, g.dev.name, o->precision, o->steps, g.step_ms, ng.step_ms,
                w.per_step / (g.step_ms * 1e-3), w.unit, g.launch_us, ng.launch_us,
                g.launch_sigma_us, ng.launch_sigma_us, g.sigma_us, ng.sigma_us,
                (long long)g.dev.kernels_per_step);
        fclose(f);
    }
    wl_free(&w);
    return TS_OK;
}
