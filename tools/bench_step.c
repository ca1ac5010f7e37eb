/* The step benchmark: one workload compiled once with profiling on, timed
 * over rounds that alternate with the PyTorch reference in one or more
 * modes (bench_torch.c runs it, a separate process). Part of the
 * tessel tool (`tessel bench`) and of bench/step.c; uses the public API only. */
#include "bench_step.h"
#include "bench_ceiling.h"
#include "bench_torch.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include "tessel/tessel.h"

enum { N_BATCHES = 4, TOP_KERNELS = 12 };

ts_bench_options ts_bench_options_default(void) {
    ts_bench_options o;
    memset(&o, 0, sizeof o);
    o.workload = "W1";
    o.precision = "fp32";
    o.steps = 10;
    o.warmup = 2;
    o.threads = 2;
    o.rounds = 2;
    o.reference = "../shared/reference/torch_bench.py";
    o.python = "/usr/bin/python3";
    o.torch_min_time = 5;
    return o;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of n values (sorts them); the lower middle for even n. */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[(n - 1) / 2];
}

static double peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0; /* Linux reports KiB */
}

typedef struct workload {
    ts_graph *g;
    ts_model m;
    ts_plan *p;
    double per_step; /* samples, tokens or epochs */
    const char *unit;
    int has_reference;
    int n_batches; /* 1 for W5's single full batch */
    double first_loss;
    void *x[N_BATCHES], *y[N_BATCHES];
    size_t xb, yb;
} workload;

static void workload_free(workload *w) {
    for (int i = 0; i < N_BATCHES; i++) free(w->x[i]), free(w->y[i]);
    ts_plan_free(w->p);
    ts_graph_free(w->g);
}

/* A key per (batch, stream), as data/synthetic.c derives its own. */
static uint64_t bench_key(int64_t batch, uint64_t stream) {
    uint64_t parts[3] = {1234, (uint64_t)batch, stream};
    return ts_hash64(parts, sizeof parts, 0x62656e6368ULL /* "bench" */);
}

/* A uniform integer in [0, n) from word i of a Philox stream. */
static int64_t rand_below(uint64_t key, uint64_t i, int64_t n) {
    uint32_t r[4];
    ts_philox(key, 0, i, r);
    return (int64_t)((((uint64_t)r[0] << 32) | r[1]) % (uint64_t)n);
}

/* W2: x ~ N(0,1) [batch, seq, features]; y = (sum of feature 0 over the
 * last 16 steps > 0) as 0/1 floats [batch, 1]. */
static ts_status synth_w2(const ts_rnn_config *c, int64_t b, float *x, float *y) {
    const int64_t n = c->batch * c->seq_len * c->features;
    double *buf = ts_alloc((size_t)n * sizeof *buf, "bench batch");
    if (!buf) return TS_ERR_NOMEM;
    ts_rand_normal_f64(buf, n, bench_key(b, 1), 0.0, 1.0);
    for (int64_t i = 0; i < n; i++) x[i] = (float)buf[i];
    free(buf);
    const int64_t last = c->seq_len < 16 ? c->seq_len : 16;
    for (int64_t i = 0; i < c->batch; i++) {
        float sum = 0; /* in float, from the values the model sees, as torch sums */
        for (int64_t t = c->seq_len - last; t < c->seq_len; t++)
            sum += x[(i * c->seq_len + t) * c->features];
        y[i] = sum > 0 ? 1.0f : 0.0f;
    }
    return TS_OK;
}

/* W4: per sample a sphere, centre in [8, 24)^3 (scaled to the volume),
 * radius 4 + 6 U(0,1); x = mask + 0.5 N(0,1), y = mask (class ids). */
static ts_status synth_w4(const ts_unet3d_config *c, int64_t b, float *x, int64_t *y) {
    const int64_t S = c->size, vol = S * S * S;
    double *noise = ts_alloc((size_t)vol * sizeof *noise, "bench batch"), u;
    if (!noise) return TS_ERR_NOMEM;
    for (int64_t i = 0; i < c->batch; i++) {
        const uint64_t key = bench_key(b * 1000 + i, 4);
        int64_t ctr[3];
        for (int k = 0; k < 3; k++) ctr[k] = S / 4 + rand_below(key, (uint64_t)k, S / 2);
        ts_rand_uniform_f64(&u, 1, bench_key(b * 1000 + i, 5), 0.0, 1.0);
        const double r = (4 + 6 * u) * (double)S / 32.0;
        ts_rand_normal_f64(noise, vol, bench_key(b * 1000 + i, 6), 0.0, 1.0);
        for (int64_t z = 0; z < S; z++)
            for (int64_t yy = 0; yy < S; yy++)
                for (int64_t xx = 0; xx < S; xx++) {
                    const int64_t v = (z * S + yy) * S + xx;
                    const double d2 =
                        (double)((z - ctr[0]) * (z - ctr[0]) + (yy - ctr[1]) * (yy - ctr[1]) +
                                 (xx - ctr[2]) * (xx - ctr[2]));
                    const int in = d2 <= r * r;
                    /* in_channels copies of the same volume (1 for W4) */
                    for (int64_t ch = 0; ch < c->in_channels; ch++)
                        x[(i * c->in_channels + ch) * vol + v] = (float)(in + 0.5 * noise[v]);
                    y[i * vol + v] = in;
                }
    }
    free(noise);
    return TS_OK;
}

/* W5: labels uniform in [0, classes), x = N(0,1) + 0.5 centroid[label]
 * with centroids ~ N(0,1) [classes, in_features]. */
static ts_status synth_w5(const ts_gcn_config *c, float *x, int64_t *y) {
    const int64_t n = c->nodes * c->in_features, nc = c->classes * c->in_features;
    double *buf = ts_alloc((size_t)(n + nc) * sizeof *buf, "bench batch");
    if (!buf) return TS_ERR_NOMEM;
    double *cent = buf + n;
    const uint64_t lk = bench_key(0, 7);
    for (int64_t i = 0; i < c->nodes; i++) y[i] = rand_below(lk, (uint64_t)i, c->classes);
    ts_rand_normal_f64(cent, nc, bench_key(0, 8), 0.0, 1.0);
    ts_rand_normal_f64(buf, n, bench_key(0, 9), 0.0, 1.0);
    for (int64_t i = 0; i < c->nodes; i++)
        for (int64_t f = 0; f < c->in_features; f++)
            x[i * c->in_features + f] =
                (float)(buf[i * c->in_features + f] + 0.5 * cent[y[i] * c->in_features + f]);
    free(buf);
    return TS_OK;
}

enum { WL_W1, WL_W2, WL_W3, WL_W4, WL_W5, WL_GPT2 };

/* The model, optimizer and data of shared/reference/torch_bench.py. */
static ts_status workload_build(const ts_bench_options *o, workload *w, ts_bench_result *r) {
    const char *wl = o->workload;
    static const char *const names[] = {"W1", "W2", "W3", "W4", "W5", "gpt2-124m"};
    int kind = -1;
    for (int i = 0; i < 6; i++)
        if (!strcasecmp(wl, names[i])) kind = i;
    if (kind < 0)
        return ts_fail(TS_ERR_INVALID,
                       "bench: unknown workload '%s' (W1, W2, W3, W4, W5, gpt2-124m)", wl);
    if (o->compare_torch && kind == WL_GPT2) /* before building 124M parameters */
        return ts_fail(TS_ERR_UNSUPPORTED, "bench: the PyTorch reference has no %s workload", wl);
    const ts_dtype compute = !strcasecmp(o->precision, "bf16")   ? TS_BF16
                             : !strcasecmp(o->precision, "fp16") ? TS_F16
                                                                 : TS_F32;
    if (compute == TS_F32 && strcasecmp(o->precision, "fp32"))
        return ts_fail(TS_ERR_INVALID, "bench: precision '%s' is unknown (fp32, bf16, fp16)",
                       o->precision);
    if (!(w->g = ts_graph_new())) return ts_fail(TS_ERR_NOMEM, "bench: out of memory");
    ts_train_spec spec;
    ts_status s = TS_OK;
    w->has_reference = kind != WL_GPT2;
    w->unit = "samples/s";
    w->n_batches = N_BATCHES;
    ts_mlp_config mc = ts_mlp_w1();
    ts_gpt_config gc = kind == WL_W3 ? ts_gpt_w3() : ts_gpt2_124m();
    if (kind == WL_GPT2) gc.batch = 4, gc.ctx = 64; /* issue #4: batch 4, context 64 */
    ts_rnn_config rc = ts_gru_w2();
    ts_unet3d_config uc = ts_unet3d_w4();
    ts_gcn_config nc = ts_gcn_w5();
    /* Adam / AdamW with torch's defaults: betas (0.9, 0.999), eps 1e-8. */
    ts_optimizer opt_spec = ts_adam(1e-3, 0.9, 0.999, 1e-8, 0);
    switch (kind) {
    case WL_W1:
        s = ts_build_mlp(w->g, &mc, &w->m);
        opt_spec = ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
        w->per_step = (double)mc.batch;
        break;
    case WL_W2:
        s = ts_build_gru(w->g, &rc, &w->m);
        w->per_step = (double)rc.batch;
        break;
    case WL_W4:
        s = ts_build_unet3d(w->g, &uc, &w->m);
        w->per_step = (double)uc.batch;
        break;
    case WL_W5: {
        int64_t *src = NULL, *dst = NULL;
        nc.n_edges = ts_gcn_random_edges(nc.nodes, 10, 1234, &src, &dst);
        if (nc.n_edges < 0) return ts_fail(TS_ERR_NOMEM, "bench: out of memory for W5's edges");
        nc.src = src;
        nc.dst = dst;
        s = ts_build_gcn(w->g, &nc, &w->m);
        free(src);
        free(dst);
        nc.src = nc.dst = NULL;
        opt_spec = ts_adam(0.01, 0.9, 0.999, 1e-8, 0);
        w->per_step = 1;
        w->unit = "epochs/s";
        w->n_batches = 1;
        break;
    }
    default: /* W3, gpt2-124m */
        s = ts_build_gpt(w->g, &gc, &w->m);
        opt_spec = ts_adamw(3e-4, 0.9, 0.999, 1e-8, 0.1);
        w->per_step = (double)(gc.batch * gc.ctx);
        w->unit = "tokens/s";
        break;
    }
    if (s != TS_OK) return ts_fail(s, "bench: building %s: %s", wl, ts_graph_error(w->g));
    spec = ts_train_spec_default(w->m.loss);
    spec.opt = opt_spec;
    spec.fused_update = o->fused_update;
    ts_compile_options opt = ts_compile_options_default();
    opt.threads = o->threads;
    opt.profile = 1; /* two clock reads per instruction: noise next to a step */
    opt.no_fuse = o->no_fuse;
    /* nobody reads the logits after a benchmark step: their memory is reused */
    opt.discard_outputs = 1;
    opt.precision.compute = compute; /* fp16: dynamic loss scaling, as torch needs it */
    opt.precision.loss_scale = compute == TS_F16 ? TS_SCALE_DYNAMIC : TS_SCALE_NONE;
    double t0 = ts_now();
    if ((s = ts_compile(w->g, &spec, &opt, &w->p)) != TS_OK) return s;
    r->compile_s = ts_now() - t0;
    ts_plan_get_stats(w->p, &r->stats);
    const ts_graph *g = w->g;
    w->xb = (size_t)ts_numel(g, w->m.input) * ts_dtype_size(ts_dtype_of(g, w->m.input));
    w->yb = (size_t)ts_numel(g, w->m.target) * ts_dtype_size(ts_dtype_of(g, w->m.target));
    for (int b = 0; b < w->n_batches; b++) {
        if (!(w->x[b] = ts_alloc(w->xb, "bench batch")) ||
            !(w->y[b] = ts_alloc(w->yb, "bench batch")))
            return TS_ERR_NOMEM;
        switch (kind) {
        case WL_W1:
            s = ts_synth_regression(1234, b, mc.batch, mc.window, mc.features, mc.out_dim, w->x[b],
                                    w->y[b]);
            break;
        case WL_W2: s = synth_w2(&rc, b, w->x[b], w->y[b]); break;
        case WL_W4: s = synth_w4(&uc, b, w->x[b], w->y[b]); break;
        case WL_W5: s = synth_w5(&nc, w->x[b], w->y[b]); break;
        default: s = ts_synth_tokens(1234, b, gc.batch, gc.ctx, gc.vocab, w->x[b], w->y[b]);
        }
        if (s != TS_OK) return s;
    }
    return TS_OK;
}

static ts_status run_steps(workload *w, int n, double *times, int64_t *done) {
    const char *in = ts_name(w->g, w->m.input), *tg = ts_name(w->g, w->m.target);
    for (int i = 0; i < n; i++) {
        int k = (int)(*done % w->n_batches);
        /* Outside the timed region: the plan may reuse input memory. */
        ts_status s = ts_plan_set_input(w->p, in, w->x[k], w->xb);
        if (s == TS_OK) s = ts_plan_set_input(w->p, tg, w->y[k], w->yb);
        double t0 = ts_now();
        if (s == TS_OK) s = ts_plan_step(w->p);
        if (s != TS_OK) return s;
        if (times) times[i] = ts_now() - t0;
        if (*done == 0) w->first_loss = ts_plan_loss(w->p); /* with or without warm-up */
        (*done)++;
    }
    return TS_OK;
}

static void print_profile(FILE *out, ts_plan *p, int steps_done, int top) {
    ts_profile_entry e[TOP_KERNELS];
    int n = ts_plan_profile(p, e, top < TOP_KERNELS ? top : TOP_KERNELS);
    double total = 0;
    ts_profile_entry all[256];
    int na = ts_plan_profile(p, all, 256);
    for (int i = 0; i < na && i < 256; i++) total += all[i].seconds;
    fprintf(out, "top kernels (per step, %d profiled steps):\n", steps_done);
    fprintf(out, "  %-22s %10s %7s %6s %10s\n", "op", "ms/step", "share", "instr", "GFLOP/s");
    for (int i = 0; i < n && i < top; i++) {
        double ms = 1e3 * e[i].seconds / (steps_done ? steps_done : 1);
        fprintf(out, "  %-22s %10.3f %6.1f%% %6d %10.1f%s\n", e[i].op, ms,
                total > 0 ? 100.0 * e[i].seconds / total : 0.0, e[i].instructions,
                e[i].seconds > 0 ? e[i].flops * steps_done / e[i].seconds * 1e-9 : 0.0,
                e[i].is_gemm ? "  (GEMM/conv)" : "");
    }
}

static double gemm_share(ts_plan *p) {
    ts_profile_entry all[256];
    int n = ts_plan_profile(p, all, 256);
    double total = 0, gemm = 0;
    for (int i = 0; i < n && i < 256; i++) {
        total += all[i].seconds;
        if (all[i].is_gemm) gemm += all[i].seconds;
    }
    return total > 0 ? gemm / total : NAN;
}

/* GFLOP/s of the plan's GEMM and convolution kernels over `steps` profiled steps. */
static double gemm_rate(ts_plan *p, int steps) {
    ts_profile_entry all[256];
    int n = ts_plan_profile(p, all, 256);
    double flops = 0, sec = 0;
    for (int i = 0; i < n && i < 256; i++)
        if (all[i].is_gemm) flops += all[i].flops * steps, sec += all[i].seconds;
    return sec > 0 ? flops / sec * 1e-9 : NAN;
}

/* The GEMM ceiling of W1/W3 in the step's compute type, measured now (after
 * the rounds, under the same load): the step's GFLOP/s as a share of it. */
static void print_ceiling(FILE *out, const ts_bench_options *o, ts_plan *p, ts_bench_result *r) {
    const ts_dtype dt = !strcasecmp(o->precision, "bf16")   ? TS_BF16
                        : !strcasecmp(o->precision, "fp32") ? TS_F32
                                                            : TS_F16;
    ts_bench_ceiling c;
    if (dt == TS_F16 || (strcasecmp(o->workload, "W1") && strcasecmp(o->workload, "W3"))) return;
    if (ts_bench_gemm_ceiling_print(o->workload, dt, o->threads, &c, o->profile ? out : NULL) !=
        TS_OK) {
        fprintf(out, "        GEMM ceiling not measured: %s\n", ts_last_error());
        return;
    }
    const double step = r->stats.flops_per_step * 1e-9 / (r->tessel.step_ms * 1e-3);
    r->ceiling_gflops = c.gflops;
    fprintf(out,
            "        %s GEMM ceiling %.1f GFLOP/s (oneDNN %s, %d linear-layer GEMM shapes of %s, "
            "fwd+bwd); step %.1f GFLOP/s = %.1f %% of it; GEMM kernels %.1f GFLOP/s\n",
            dt == TS_BF16 ? "bf16" : "f32", c.gflops, c.impl, c.n_shapes, o->workload, step,
            100.0 * step / c.gflops, gemm_rate(p, r->tessel.steps));
}

static ts_status append_json(const ts_bench_options *o, const ts_bench_result *r) {
    json_t *j = json_pack(
        "{s:s, s:s, s:i, s:s, s:{s:f, s:f, s:f, s:i, s:f}, s:f, s:f}", "workload", o->workload,
        "precision", o->precision, "threads", o->threads, "unit", r->unit, "tessel", "step_ms",
        r->tessel.step_ms, "throughput", r->tessel.throughput, "peak_rss_mb", r->tessel.rss_mb,
        "steps", r->tessel.steps, "gemm_share", isfinite(r->gemm_share) ? r->gemm_share : 0.0,
        "compile_s", r->compile_s, "flops_per_step", r->stats.flops_per_step);
    if (!j) return ts_fail(TS_ERR_NOMEM, "bench: out of memory for JSON");
    if (r->ceiling_gflops > 0)
        json_object_set_new(j, "gemm_ceiling_gflops", json_real(r->ceiling_gflops));
    if (r->has_torch) {
        json_t *modes = json_array();
        for (int i = 0; modes && i < r->n_modes; i++)
            json_array_append_new(modes, json_pack("{s:s, s:f, s:f, s:f}", "mode", r->modes[i],
                                                   "step_ms", r->mode_sides[i].step_ms,
                                                   "throughput", r->mode_sides[i].throughput,
                                                   "peak_rss_mb", r->mode_sides[i].rss_mb));
        json_t *t =
            json_pack("{s:f, s:f, s:f, s:s, s:s, s:s}", "step_ms", r->torch.step_ms, "throughput",
                      r->torch.throughput, "peak_rss_mb", r->torch.rss_mb, "mode", r->torch_mode,
                      "label", ts_torch_mode_label(r->torch_mode), "version", r->torch_version);
        if (!t || !modes || json_object_set_new(t, "modes", modes)) {
            json_decref(t);
            json_decref(j);
            return ts_fail(TS_ERR_NOMEM, "bench: out of memory for JSON");
        }
        json_object_set_new(j, "torch", t);
        json_object_set_new(j, "ratio", json_real(r->tessel.throughput / r->torch.throughput));
        if (r->n_round_ratios > 0) {
            json_t *rr = json_array();
            for (int k = 0; rr && k < r->n_round_ratios; k++)
                json_array_append_new(rr, json_real(r->round_ratios[k]));
            if (!rr) {
                json_decref(j);
                return ts_fail(TS_ERR_NOMEM, "bench: out of memory for JSON");
            }
            json_object_set_new(j, "round_ratios", rr);
        }
    }
    char *text = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(j);
    if (!text) return ts_fail(TS_ERR_NOMEM, "bench: out of memory for JSON");
    FILE *f = fopen(o->json_path, "a");
    int bad = !f || fprintf(f, "%s\n", text) < 0;
    if (f) bad |= fclose(f) != 0;
    free(text);
    return bad ? ts_fail(TS_ERR_IO, "bench: cannot write %s", o->json_path) : TS_OK;
}

/* The interpreter and the modes of the comparison, checked before the
 * workload is built so a wrong --torch-python fails at once. */
static ts_status torch_plan(const ts_bench_options *o, ts_bench_result *r) {
    ts_status s = ts_torch_check_python(o->python);
    int major = 0; /* unknown: the default modes assume torch 1.x, as before */
    if (s == TS_OK && (o->torch_mode || o->torch_best))
        s = ts_torch_version(o->python, r->torch_version, sizeof r->torch_version, &major);
    if (s != TS_OK) return s;
    if (o->torch_mode && !ts_torch_mode_valid(o->torch_mode))
        return ts_fail(TS_ERR_INVALID,
                       "bench: --torch-mode: expected eager, compile, compile_opt, bf16 or "
                       "bf16_compile, got '%s'",
                       o->torch_mode);
    if (o->torch_mode && strstr(o->torch_mode, "compile") && major < 2)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "bench: --torch-mode %s needs torch >= 2; '%s' has torch %s", o->torch_mode,
                       o->python, r->torch_version);
    r->n_modes = ts_torch_pick_modes(o, major, r->modes);
    return TS_OK;
}

/* The fastest mode by median throughput (the upper middle of the rounds'
 * throughputs, the lower middle of their step times: for two rounds, the
 * better run); returns its index. tmp: scratch for `rounds` values. */
static int torch_medians(ts_bench_result *r, const double *ms, double *tp, int rounds,
                         double *tmp) {
    int best = 0;
    for (int m = 0; m < r->n_modes; m++) {
        ts_bench_side *side = &r->mode_sides[m];
        /* a copy: ms stays in round order for the rounds' own ratios */
        memcpy(tmp, ms + m * rounds, sizeof(double) * (size_t)rounds);
        side->step_ms = median(tmp, rounds);
        qsort(tp + m * rounds, (size_t)rounds, sizeof *tp, cmp_d);
        side->throughput = tp[m * rounds + rounds / 2];
        side->steps = rounds;
        if (side->throughput > r->mode_sides[best].throughput) best = m;
    }
    r->has_torch = 1;
    r->torch = r->mode_sides[best];
    r->torch_mode = r->modes[best];
    return best;
}

static void print_torch(FILE *out, const ts_bench_options *o, const ts_bench_result *r) {
    if (r->n_modes > 1)
        for (int m = 0; m < r->n_modes; m++)
            fprintf(out, "  torch mode %-13s %10.1f %s  median step %8.1f ms  peak RSS %6.0f MB\n",
                    r->modes[m], r->mode_sides[m].throughput, r->unit, r->mode_sides[m].step_ms,
                    r->mode_sides[m].rss_mb);
    fprintf(out, "pytorch %s: %10.1f %s  median step %8.1f ms  peak RSS %6.0f MB\n", o->workload,
            r->torch.throughput, r->unit, r->torch.step_ms, r->torch.rss_mb);
    char which[160] = "";
    if (r->n_modes > 1) {
        int k = snprintf(which, sizeof which, ", the fastest of");
        for (int m = 0; m < r->n_modes && k > 0 && (size_t)k < sizeof which; m++)
            k += snprintf(which + k, sizeof which - (size_t)k, " %s", r->modes[m]);
    }
    fprintf(out, "ratio   %s: throughput %.2fx PyTorch %s (mode %s%s%s%s), peak RSS %.2fx\n",
            o->workload, r->tessel.throughput / r->torch.throughput,
            ts_torch_mode_label(r->torch_mode), r->torch_mode, which,
            r->torch_version[0] ? "; torch " : "", r->torch_version,
            r->torch.rss_mb > 0 ? r->tessel.rss_mb / r->torch.rss_mb : NAN);
}

/* The spread behind the ratio: each round's own, tessel's median step of the round against the
 * fastest mode's step of the same round (best_ms, measured right after it, under the same load),
 * kept in r for --json and printed as a range and median. On a shared machine the ratio of the
 * medians can sit on either side of a target the rounds straddle. */
static void record_round_ratios(FILE *out, const ts_bench_options *o, ts_bench_result *r,
                                const double *round_ms, const double *best_ms) {
    if (o->rounds < 2) return;
    const int n = o->rounds < 64 ? o->rounds : 64;
    double sorted[64];
    for (int k = 0; k < n; k++) sorted[k] = r->round_ratios[k] = best_ms[k] / round_ms[k];
    r->n_round_ratios = n;
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_d);
    fprintf(out, "rounds  %s: the rounds' own ratios %.2fx to %.2fx, median %.2fx (%d rounds)\n",
            o->workload, sorted[0], sorted[n - 1], median(sorted, n), n);
}

ts_status ts_bench_run(const ts_bench_options *opts, ts_bench_result *r) {
    if (!opts || !r) return ts_fail(TS_ERR_INVALID, "bench: NULL argument");
    ts_bench_options o = *opts;
    FILE *out = o.out ? o.out : stdout;
    memset(r, 0, sizeof *r);
    if (o.steps < 1 || o.warmup < 0 || o.threads < 1 || o.rounds < 1)
        return ts_fail(TS_ERR_INVALID, "bench: steps, threads and rounds must be >= 1");
    if (!o.compare_torch) o.rounds = 1;
    ts_status s = o.compare_torch ? torch_plan(&o, r) : TS_OK;
    if (s != TS_OK) return s;
    workload w;
    memset(&w, 0, sizeof w);
    s = workload_build(&o, &w, r);
    if (s == TS_OK && o.compare_torch && !w.has_reference)
        s = ts_fail(TS_ERR_UNSUPPORTED, "bench: the PyTorch reference has no %s workload",
                    o.workload);
    if (s != TS_OK) {
        workload_free(&w);
        return s;
    }
    r->unit = w.unit;
    fprintf(out, "tessel %s: compiled in %.2f s, %d instructions, %d threads, %s%s\n", o.workload,
            r->compile_s, r->stats.n_instructions, o.threads, o.precision,
            o.fused_update ? ", fused update" : "");
    fflush(out);
    const int total = o.steps * o.rounds, nm = r->n_modes ? r->n_modes : 1;
    double *times = ts_alloc(sizeof(double) * (size_t)total, "bench timings");
    double *torch_ms = ts_alloc(sizeof(double) * (size_t)(o.rounds * nm), "bench timings");
    double *torch_tp = ts_alloc(sizeof(double) * (size_t)(o.rounds * nm), "bench timings");
    /* a round's steps, then the torch medians' scratch */
    double *copy = ts_alloc(sizeof(double) * (size_t)(o.steps > o.rounds ? o.steps : o.rounds),
                            "bench timings");
    double *round_ms = ts_alloc(sizeof(double) * (size_t)o.rounds, "bench timings");
    int64_t done = 0;
    if (!times || !torch_ms || !torch_tp || !copy || !round_ms) s = TS_ERR_NOMEM;
    if (s == TS_OK) s = run_steps(&w, o.warmup ? o.warmup : 0, NULL, &done);
    r->loss_first = w.first_loss;
    /* Warm-up pays for page faults and cold caches: profile only what is timed. */
    ts_plan_profile_reset(w.p);
    for (int round = 0; s == TS_OK && round < o.rounds; round++) {
        s = run_steps(&w, o.steps, times + round * o.steps, &done);
        if (s != TS_OK || !o.compare_torch) continue;
        memcpy(copy, times + round * o.steps, sizeof(double) * (size_t)o.steps);
        round_ms[round] = 1e3 * median(copy, o.steps);
        fprintf(out, "  round %d/%d: tessel %.1f ms per step; pytorch", round + 1, o.rounds,
                round_ms[round]);
        fflush(out);
        /* Each mode once per round, after tessel: the same load for all. */
        for (int m = 0; s == TS_OK && m < r->n_modes; m++) {
            ts_bench_side t = {0, 0, 0, 0};
            s = ts_torch_run(&o, r->modes[m], &t);
            torch_ms[m * o.rounds + round] = t.step_ms;
            torch_tp[m * o.rounds + round] = t.throughput;
            if (t.rss_mb > r->mode_sides[m].rss_mb) r->mode_sides[m].rss_mb = t.rss_mb;
            if (s == TS_OK) fprintf(out, "%s %s %.1f ms", m ? "," : "", r->modes[m], t.step_ms);
            fflush(out);
        }
        fprintf(out, " per step\n");
    }
    if (s == TS_OK) {
        r->loss_last = ts_plan_loss(w.p);
        const double med = median(times, total);
        r->tessel = (ts_bench_side){1e3 * med, w.per_step / med, peak_rss_mb(), total};
        r->gemm_share = gemm_share(w.p);
        fprintf(out,
                "tessel  %s: %10.1f %s  median step %8.1f ms  peak RSS %6.0f MB  loss %.4f -> "
                "%.4f\n",
                o.workload, r->tessel.throughput, r->unit, r->tessel.step_ms, r->tessel.rss_mb,
                r->loss_first, r->loss_last);
        const ts_plan_stats *st = &r->stats;
        fprintf(out,
                "        arena %.1f MiB (params %.1f, grads %.1f, state %.1f, temps %.1f), "
                "%.2f GFLOP/step = %.1f GFLOP/s, GEMM/conv %.1f %% of kernel time\n",
                st->arena_bytes / 1048576.0, st->param_bytes / 1048576.0,
                st->grad_bytes / 1048576.0, st->state_bytes / 1048576.0, st->temp_bytes / 1048576.0,
                st->flops_per_step * 1e-9, st->flops_per_step * 1e-9 / med, 100.0 * r->gemm_share);
        print_ceiling(out, &o, w.p, r);
        if (o.profile) print_profile(out, w.p, total, TOP_KERNELS);
        if (o.compare_torch) {
            const int best = torch_medians(r, torch_ms, torch_tp, o.rounds, copy);
            print_torch(out, &o, r);
            record_round_ratios(out, &o, r, round_ms, torch_ms + best * o.rounds);
        }
        fflush(out);
        if (o.json_path) s = append_json(&o, r);
    }
    free(times);
    free(torch_ms);
    free(torch_tp);
    free(copy);
    free(round_ms);
    workload_free(&w);
    return s;
}
