/* Dynamic loss scaling against torch's GradScaler.
 *
 * tests/parity/fixtures/scaler_trace.txt (tests/parity/gen_scaler_trace.py,
 * torch 2.15 CPU) traces GradScaler with a deliberately huge initial scale
 * (2^127) on nn.Linear(4, 3) + MSE + SGD: eight backoffs until the
 * gradients are finite, growth after every 3 clean steps, overflow and
 * backoff again. Checked here:
 *   - the host rule alone (ts_scaler_update) replays the trace bit for bit;
 *   - a compiled plan with loss_scale dynamic reproduces every step: the
 *     scale it used, found_inf (= update skipped), the scale and growth
 *     tracker after, the loss, and the final weights; a skipped step leaves
 *     the weights untouched;
 *   - checkpoint + resume in the middle continues bit-identically (scale
 *     and growth tracker are plan state);
 *   - fp16 matmuls with the default scale 65536 overflow f16 and back off;
 *   - GradScaler's defaults and growth at exactly growth_interval, a
 *     growth that would overflow is dropped, bad settings are refused. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "plan/scaler.h"
#include "tessel/ckpt.h"

#define FIXTURE "tests/parity/fixtures/scaler_trace.txt"
enum { N = 8, IN = 4, OUT = 3, MAXSTEP = 64 };

typedef struct trace {
    double init_scale, growth, backoff, lr;
    int interval, steps;
    float x[N * IN], t[N * OUT], w0[OUT * IN], b0[OUT], w[OUT * IN], b[OUT];
    float used[MAXSTEP], loss[MAXSTEP], after[MAXSTEP];
    int found[MAXSTEP], tracker[MAXSTEP];
} trace;

static int read_floats(char *rest, float *dst, int n) {
    int k = 0;
    for (char *tok = strtok(rest, " \n"); tok && k < n; tok = strtok(NULL, " \n"))
        dst[k++] = (float)strtod(tok, NULL);
    return k == n;
}

static int load_trace(trace *tr) {
    FILE *f = fopen(FIXTURE, "r");
    if (!f) return 0;
    char line[4096];
    int ok = 1, steps = 0;
    while (fgets(line, sizeof line, f)) {
        char *sp = strchr(line, ' ');
        if (line[0] == '#' || !sp) continue;
        *sp = 0;
        char *rest = sp + 1;
        if (!strcmp(line, "config")) {
            char a[64], b[64], c[64], d[64];
            ok &= sscanf(rest, "%63s %63s %63s %d %63s %d", a, b, c, &tr->interval, d,
                         &tr->steps) == 6;
            tr->init_scale = strtod(a, NULL);
            tr->growth = strtod(b, NULL);
            tr->backoff = strtod(c, NULL);
            tr->lr = strtod(d, NULL);
        } else if (!strcmp(line, "x"))
            ok &= read_floats(rest, tr->x, N * IN);
        else if (!strcmp(line, "t"))
            ok &= read_floats(rest, tr->t, N * OUT);
        else if (!strcmp(line, "w0"))
            ok &= read_floats(rest, tr->w0, OUT * IN);
        else if (!strcmp(line, "b0"))
            ok &= read_floats(rest, tr->b0, OUT);
        else if (!strcmp(line, "w"))
            ok &= read_floats(rest, tr->w, OUT * IN);
        else if (!strcmp(line, "b"))
            ok &= read_floats(rest, tr->b, OUT);
        else if (!strcmp(line, "step")) {
            int st, fi, gt;
            char u[64], l[64], a[64];
            ok &= sscanf(rest, "%d %63s %63s %d %63s %d", &st, u, l, &fi, a, &gt) == 6;
            ok &= st == steps + 1 && st <= MAXSTEP;
            if (!ok) break;
            tr->used[steps] = (float)strtod(u, NULL);
            tr->loss[steps] = (float)strtod(l, NULL);
            tr->found[steps] = fi;
            tr->after[steps] = (float)strtod(a, NULL);
            tr->tracker[steps] = gt;
            steps++;
        }
    }
    fclose(f);
    return ok && steps == tr->steps;
}

static void test_host_rule(const trace *tr) {
    ts_scaler_config c = ts_scaler_config_default();
    CHECK(c.init_scale == 65536 && c.growth_factor == 2 && c.backoff_factor == 0.5 &&
              c.growth_interval == 2000,
          "GradScaler's defaults");
    c.mode = TS_LOSS_SCALE_DYNAMIC;
    c.init_scale = tr->init_scale;
    c.growth_factor = tr->growth;
    c.backoff_factor = tr->backoff;
    c.growth_interval = tr->interval;
    CHECK_OK(ts_scaler_config_check(&c));
    ts_scaler s;
    ts_scaler_init(&s, &c);
    int bad = 0, n_found = 0, n_grow = 0;
    for (int i = 0; i < tr->steps; i++) {
        bad += s.scale != tr->used[i];
        ts_scaler_update(&s, tr->found[i]);
        bad += s.scale != tr->after[i] || s.growth_tracker != tr->tracker[i];
        n_found += tr->found[i];
        n_grow += tr->after[i] > tr->used[i];
    }
    CHECK(bad == 0, "host rule replays torch's trace (%d mismatches)", bad);
    CHECK(n_found >= 4 && n_grow >= 2, "the trace shows backoff (%d) and growth (%d)", n_found,
          n_grow);
    CHECK(s.skipped == n_found, "skipped count %lld", (long long)s.skipped);

    /* defaults: growth exactly at step 2000, not before */
    ts_scaler_config d = ts_scaler_config_default();
    d.mode = TS_LOSS_SCALE_DYNAMIC;
    ts_scaler_init(&s, &d);
    for (int i = 0; i < 1999; i++) ts_scaler_update(&s, 0);
    CHECK(s.scale == 65536.0f && s.growth_tracker == 1999, "no growth before 2000 clean steps");
    ts_scaler_update(&s, 0);
    CHECK(s.scale == 131072.0f && s.growth_tracker == 0, "growth at step 2000");
    ts_scaler_update(&s, 1);
    CHECK(s.scale == 65536.0f && s.growth_tracker == 0, "backoff resets the tracker");
    CHECK(ts_scaler_inv_scale(&s) == 1.0f / 65536.0f, "inverse scale");
    /* growth past f32 is dropped, the tracker still resets */
    d.init_scale = 0x1p127;
    d.growth_interval = 1;
    ts_scaler_init(&s, &d);
    ts_scaler_update(&s, 0);
    CHECK(s.scale == 0x1p127f && s.growth_tracker == 0, "overflowing growth is dropped");
    /* static: never changes, still counts skips */
    d.mode = TS_LOSS_SCALE_STATIC;
    d.init_scale = 1024;
    ts_scaler_init(&s, &d);
    ts_scaler_update(&s, 1);
    ts_scaler_update(&s, 0);
    CHECK(s.scale == 1024.0f && s.skipped == 1, "static scale");

    ts_scaler_config e = c;
    e.growth_factor = 1;
    CHECK(ts_scaler_config_check(&e) == TS_ERR_INVALID && strstr(ts_last_error(), "growth_factor"),
          "growth_factor 1 refused: %s", ts_last_error());
    e = c;
    e.backoff_factor = 1.5;
    CHECK(ts_scaler_config_check(&e) == TS_ERR_INVALID, "backoff 1.5 refused");
    e = c;
    e.growth_interval = 0;
    CHECK(ts_scaler_config_check(&e) == TS_ERR_INVALID, "interval 0 refused");
    e = c;
    e.init_scale = 1e39;
    CHECK(ts_scaler_config_check(&e) == TS_ERR_INVALID, "a scale beyond f32 refused");
}

static ts_plan *linear_plan(const trace *tr) {
    ts_graph *g = ts_graph_new();
    int64_t dx[2] = {N, IN}, dt[2] = {N, OUT}, dw[2] = {OUT, IN}, db[1] = {OUT};
    ts_val x = ts_input(g, "x", TS_F32, 2, dx), t = ts_input(g, "t", TS_F32, 2, dt);
    ts_val w = ts_param(g, "weight", TS_F32, 2, dw, ts_init_buffer(tr->w0));
    ts_val b = ts_param(g, "bias", TS_F32, 1, db, ts_init_buffer(tr->b0));
    ts_val loss = ts_mse_loss(g, ts_linear(g, x, w, b), t);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_sgd(tr->lr, 0, 0, 0, 0);
    ts_compile_options o = ts_compile_options_default();
    o.precision.loss_scale = TS_SCALE_DYNAMIC;
    o.precision.init_scale = tr->init_scale;
    o.precision.growth_factor = tr->growth;
    o.precision.backoff_factor = tr->backoff;
    o.precision.growth_interval = tr->interval;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, &o, &p));
    ts_graph_free(g);
    if (p) {
        CHECK_OK(ts_plan_set_input(p, "x", tr->x, sizeof tr->x));
        CHECK_OK(ts_plan_set_input(p, "t", tr->t, sizeof tr->t));
    }
    return p;
}

/* Steps [from, to) of the trace on p; returns mismatches. */
static int run_steps(ts_plan *p, const trace *tr, int from, int to) {
    int bad = 0;
    for (int i = from; i < to; i++) {
        double sc = 0;
        int64_t gt = -1;
        float w_before[OUT * IN], w_after[OUT * IN];
        ts_plan_read(p, "weight", w_before, sizeof w_before);
        CHECK(ts_plan_loss_scale(p, &sc, NULL, NULL) == 1, "the plan has a scaler");
        if ((float)sc != tr->used[i]) {
            bad++;
            fprintf(stderr, "step %d: scale used %a, torch %a\n", i + 1, sc, (double)tr->used[i]);
        }
        if (ts_plan_step(p) != TS_OK) {
            CHECK(0, "step %d: %s", i + 1, ts_last_error());
            return bad + 1;
        }
        ts_plan_read(p, "weight", w_after, sizeof w_after);
        int skipped = ts_plan_last_step_skipped(p);
        ts_plan_loss_scale(p, &sc, &gt, NULL);
        double l = ts_plan_loss(p);
        int ok = skipped == tr->found[i] && (float)sc == tr->after[i] && gt == tr->tracker[i] &&
                 fabs(l - tr->loss[i]) <= 1e-5 * fabs(tr->loss[i]) &&
                 (!skipped || !memcmp(w_before, w_after, sizeof w_after));
        if (!ok)
            fprintf(stderr,
                    "step %d: skipped %d (torch %d), scale %a (%a), tracker %lld (%d), "
                    "loss %.9g (%.9g)\n",
                    i + 1, skipped, tr->found[i], sc, (double)tr->after[i], (long long)gt,
                    tr->tracker[i], l, (double)tr->loss[i]);
        bad += !ok;
    }
    return bad;
}

static double max_rel(const float *a, const float *b, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]) / (fabs((double)b[i]) + 1e-3);
        if (e > m) m = e;
    }
    return m;
}

static void test_plan(const trace *tr, const char *run_dir) {
    ts_plan *p = linear_plan(tr);
    if (!p) return;
    const int half = 12;
    CHECK(run_steps(p, tr, 0, half) == 0, "steps 1..%d follow torch", half);
    CHECK_OK(ts_ckpt_save(p, run_dir, NULL, NULL));
    /* Steps 13..24 drive the scale to f32's overflow edge: whether a scaled weight gradient
     * overflows there depends on the GEMM's partial sums (a partial sum can pass FLT_MAX
     * before later terms cancel it), so it depends on the kernel's summation order. The
     * fixture was made where oneDNN and torch take AVX-512 kernels; with AVX2 kernels the
     * same steps are skipped in total (checked below), at shifted steps. There the
     * step-by-step comparison is reported, not required. */
    const int exact_edge = __builtin_cpu_supports("avx512f");
    int late = run_steps(p, tr, half, tr->steps);
    CHECK(late == 0 || !exact_edge, "steps %d..%d follow torch", half + 1, tr->steps);
    if (late && !exact_edge)
        printf("note: steps %d..%d: %d overflow-edge decisions differ from torch's "
               "(no AVX-512: other GEMM kernels)\n",
               half + 1, tr->steps, late);
    float w[OUT * IN], b[OUT];
    CHECK_OK(ts_plan_read(p, "weight", w, sizeof w));
    CHECK_OK(ts_plan_read(p, "bias", b, sizeof b));
    CHECK(max_rel(w, tr->w, OUT * IN) < 1e-4 && max_rel(b, tr->b, OUT) < 1e-4,
          "final weights match torch (max rel err %.3g, %.3g)", max_rel(w, tr->w, OUT * IN),
          max_rel(b, tr->b, OUT));
    int64_t skipped = 0;
    ts_plan_loss_scale(p, NULL, NULL, &skipped);
    int n_found = 0;
    for (int i = 0; i < tr->steps; i++) n_found += tr->found[i];
    CHECK(skipped == n_found, "skipped steps counted: %lld", (long long)skipped);
    CHECK(ts_plan_updates_applied(p) == tr->steps - n_found, "updates applied %lld",
          (long long)ts_plan_updates_applied(p));

    /* resume from step 12: the same steps, the same bits */
    ts_plan *q = linear_plan(tr);
    if (q) {
        ts_ckpt *ck = NULL;
        CHECK_OK(ts_ckpt_open(run_dir, NULL, NULL, &ck));
        if (ck) {
            CHECK_OK(ts_ckpt_restore(ck, q, NULL));
            ts_ckpt_close(ck);
        }
        CHECK(run_steps(q, tr, half, tr->steps) == late, "resumed steps %d..%d as uninterrupted",
              half + 1, tr->steps);
        size_t nb = ts_plan_snapshot_bytes(p);
        void *sa = malloc(nb), *sb = malloc(nb);
        CHECK_OK(ts_plan_snapshot(p, sa, nb));
        CHECK_OK(ts_plan_snapshot(q, sb, nb));
        CHECK(nb == ts_plan_snapshot_bytes(q) && memcmp(sa, sb, nb) == 0,
              "resumed run bit-identical to the uninterrupted one (weights, scale, tracker)");
        free(sa);
        free(sb);
        ts_plan_free(q);
    }
    ts_plan_free(p);
}

/* f16 GEMMs: gradients of a few hundred times 65536 do not fit f16 (max
 * 65504), so the first steps overflow and the scale backs off until they
 * do; training then proceeds. */
static void test_fp16(void) {
    ts_mlp_config c = {16, 0, 0, 8, 32, 1, 2, 0, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_mlp(g, &c, &m));
    ts_train_spec spec = ts_train_spec_default(m.loss);
    spec.opt = ts_sgd(1e-4, 0, 0, 0, 0);
    ts_compile_options o = ts_compile_options_default();
    o.precision.compute = TS_F16;
    o.precision.loss_scale = TS_SCALE_DYNAMIC;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, &o, &p));
    ts_graph_free(g);
    if (!p) return;
    float x[16 * 8], y[16 * 2];
    for (int i = 0; i < 16 * 8; i++) x[i] = (float)((i * 37) % 17 - 8);
    for (int i = 0; i < 16 * 2; i++) y[i] = (float)(300 * ((i * 11) % 7 - 3));
    ts_plan_set_input(p, "x", x, sizeof x);
    ts_plan_set_input(p, "y", y, sizeof y);
    ts_scaler_config hc = ts_scaler_config_default();
    hc.mode = TS_LOSS_SCALE_DYNAMIC;
    ts_scaler host;
    ts_scaler_init(&host, &hc);
    int first_ok = -1, bad = 0;
    double l0 = 0, l_end = 0;
    for (int s = 0; s < 30; s++) {
        CHECK_OK(ts_plan_step(p));
        int sk = ts_plan_last_step_skipped(p);
        if (s == 0) l0 = ts_plan_loss(p);
        if (!sk && first_ok < 0) first_ok = s;
        ts_scaler_update(&host, sk);
        double sc;
        ts_plan_loss_scale(p, &sc, NULL, NULL);
        bad += (float)sc != host.scale;
        l_end = ts_plan_loss(p);
    }
    CHECK(first_ok >= 1, "f16 overflow at scale 65536 backs off (first clean step %d)", first_ok);
    CHECK(bad == 0, "plan scale follows the host rule over the skips (%d mismatches)", bad);
    CHECK(l_end < l0, "training proceeds after the backoff (%.4g -> %.4g)", l0, l_end);
    ts_plan_free(p);
}

int main(void) {
    static trace tr;
    CHECK(load_trace(&tr), "read %s", FIXTURE);
    if (tr.steps > 0) {
        test_host_rule(&tr);
        char run_dir[] = "/tmp/tessel_scaler_XXXXXX";
        CHECK(mkdtemp(run_dir) != NULL, "mkdtemp");
        test_plan(&tr, run_dir);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", run_dir);
        CHECK(system(cmd) == 0, "cleanup");
    }
    test_fp16();
    return check_summary("scaler");
}
