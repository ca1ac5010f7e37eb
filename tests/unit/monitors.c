/* Gradient monitor nodes (ts_compile_options.monitors): every monitor
 * matches the statistics of its gradient read back from the plan, runs
 * before the update phase (and, with the memory-aware schedule, right after
 * the gradient's producer), gives the same bits with 1 and 2 threads,
 * counts non-finite elements, leaves the trained weights bit-identical to a
 * plan without monitors, and feeds ts_plan_grad_norm. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "obs/monitor.h"
#include "plan/plan.h"

enum { B = 16, IN = 40, OUT = 3 };

static ts_plan *make_plan(ts_graph *g, ts_val loss, int monitors, int threads) {
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_adamw(1e-2, 0.9, 0.999, 1e-8, 0.01);
    spec.clip_grad_norm = 1.0;
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 5;
    opt.threads = threads;
    opt.monitors = monitors;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, &opt, &p));
    return p;
}

static void feed(ts_plan *p, unsigned seed, float poison) {
    float x[B * IN], y[B * OUT];
    for (int i = 0; i < B * IN; i++) x[i] = (float)rand_r(&seed) / RAND_MAX - 0.5f;
    for (int i = 0; i < B * OUT; i++) y[i] = (float)rand_r(&seed) / RAND_MAX;
    if (poison != 0) x[3] = poison;
    CHECK_OK(ts_plan_set_input(p, "x", x, sizeof x));
    CHECK_OK(ts_plan_set_input(p, "y", y, sizeof y));
    CHECK_OK(ts_plan_step(p));
}

/* Each monitor against its gradient read back and summed in double. */
static void check_against_grads(ts_plan *p) {
    const int nm = ts_plan_monitor_count(p);
    CHECK(nm == ts_plan_param_count(p), "%d monitors for %d parameters", nm,
          ts_plan_param_count(p));
    double total = 0;
    for (int i = 0; i < nm; i++) {
        ts_grad_monitor m;
        CHECK_OK(ts_plan_monitor(p, i, &m));
        char name[300];
        snprintf(name, sizeof name, "grad:%s", m.param);
        int rank;
        int64_t dims[TS_MAX_RANK], n = 1;
        CHECK_OK(ts_plan_value_info(p, name, NULL, &rank, dims));
        for (int d = 0; d < rank; d++) n *= dims[d];
        float *gbuf = malloc(sizeof(float) * (size_t)n);
        CHECK_OK(ts_plan_read(p, name, gbuf, sizeof(float) * (size_t)n));
        double sq = 0, s = 0;
        for (int64_t j = 0; j < n; j++) sq += (double)gbuf[j] * gbuf[j], s += gbuf[j];
        CHECK(m.numel == n && m.nonfinite == 0, "%s: numel %lld (want %lld), nonfinite %lld",
              m.param, (long long)m.numel, (long long)n, (long long)m.nonfinite);
        CHECK_NEAR(m.sumsq, sq, 1e-12 * (sq + 1e-300));
        CHECK_NEAR(m.sum, s, 1e-12 * (fabs(sq) + 1e-300) + 1e-15);
        total += sq;
        free(gbuf);
    }
    double norm = 0;
    CHECK_OK(ts_plan_grad_norm(p, &norm));
    CHECK_NEAR(norm, sqrt(total), 1e-12 * sqrt(total));
}

/* Every monitor runs before the gate; with the memory-aware schedule each
 * follows the instruction that wrote its gradient (after the monitors of
 * that instruction's other gradients: layer_norm_bwd writes dw and db). */
static void check_schedule(const ts_plan *p) {
    int mons = 0, adjacent = 0, before_gate = 0;
    const ts_program *prog = &p->prog;
    for (int i = 0; i < prog->n_ins; i++) {
        if (prog->ins[i].op != TS_OP_GRAD_STATS) continue;
        mons++;
        before_gate += prog->gate_ins >= 0 && i < prog->gate_ins;
        /* Monitors of one producer's several gradients follow each other. */
        int k = i - 1;
        while (k >= 0 && prog->ins[k].op == TS_OP_GRAD_STATS) k--;
        const ts_instr *prev = k >= 0 ? &prog->ins[k] : NULL;
        for (int j = 0; prev && j < prev->n_out; j++)
            adjacent += prev->out[j].off == prog->ins[i].in[0].off;
    }
    CHECK(mons > 0 && before_gate == mons, "%d of %d monitors before the gate (at %d)", before_gate,
          mons, prog->gate_ins);
    CHECK(adjacent == mons, "%d of %d monitors right after their gradient's producer", adjacent,
          mons);
}

static void check_kernel(void) {
    /* Sizes around the block and parallel thresholds, f32 and f64. */
    const int64_t sizes[] = {1, 7, 4096, 4097, 70001};
    for (int si = 0; si < 5; si++) {
        for (int f64 = 0; f64 < 2; f64++) {
            const int64_t n = sizes[si];
            ts_graph *g = ts_graph_new();
            int64_t dims[1] = {n};
            ts_val x = ts_input(g, "x", f64 ? TS_F64 : TS_F32, 1, dims);
            ts_attrs a = ts_attrs_zero();
            ts_val m = ts_node_add(g, TS_OP_GRAD_STATS, 1, &x, &a, NULL);
            CHECK_OK(ts_mark_output(g, m, "stats"));
            ts_plan *p = NULL;
            CHECK_OK(ts_compile(g, NULL, NULL, &p));
            void *buf = malloc((size_t)n * 8);
            double sq = 0, s = 0;
            unsigned seed = 3;
            for (int64_t i = 0; i < n; i++) {
                double v = (double)rand_r(&seed) / RAND_MAX * 4 - 2;
                if (f64)
                    ((double *)buf)[i] = v;
                else
                    ((float *)buf)[i] = (float)v, v = (float)v;
                sq += v * v, s += v;
            }
            if (n > 5 && f64) ((double *)buf)[5] = NAN;
            if (n > 5 && !f64) ((float *)buf)[5] = INFINITY;
            CHECK_OK(ts_plan_set_input(p, "x", buf, (size_t)n * (f64 ? 8 : 4)));
            CHECK_OK(ts_plan_step(p));
            double o[4];
            CHECK_OK(ts_plan_read(p, "stats", o, sizeof o));
            CHECK(o[3] == (double)n && o[2] == (n > 5 ? 1 : 0), "n %lld: numel %g, nonfinite %g",
                  (long long)n, o[3], o[2]);
            if (n <= 5) {
                CHECK_NEAR(o[0], sq, 1e-12 * sq);
                CHECK_NEAR(o[1], s, 1e-12 * (sq + 1));
            } else {
                CHECK(!isfinite(o[0]) && !isfinite(o[1]), "n %lld: sums not poisoned",
                      (long long)n);
            }
            free(buf);
            ts_plan_free(p);
            ts_graph_free(g);
        }
    }
}

/* The host side: groups (name up to the last '.'), variance and the update
 * ratio against values read back from the plan around one step. */
static ts_status host_gate(ts_plan *p, void *user, ts_gate_decision *out) {
    ts_monitor *m = user;
    ts_status s = ts_monitor_read(m, p, 0.0);
    if (s == TS_OK) s = ts_monitor_before_update(m, p);
    *out = TS_GATE_APPLY;
    return s;
}

static double *read_all(ts_plan *p, const char *prefix, int64_t *n_out) {
    int64_t total = 0;
    for (int i = 0; i < ts_plan_param_count(p); i++) {
        char name[300];
        snprintf(name, sizeof name, "%s%s", prefix, ts_plan_param_name(p, i));
        int rank;
        int64_t dims[TS_MAX_RANK], n = 1;
        ts_plan_value_info(p, name, NULL, &rank, dims);
        for (int d = 0; d < rank; d++) n *= dims[d];
        total += n;
    }
    double *v = malloc(sizeof(double) * (size_t)total);
    float *tmp = malloc(sizeof(float) * (size_t)total);
    int64_t off = 0;
    for (int i = 0; i < ts_plan_param_count(p); i++) {
        char name[300];
        snprintf(name, sizeof name, "%s%s", prefix, ts_plan_param_name(p, i));
        int rank;
        int64_t dims[TS_MAX_RANK], n = 1;
        ts_plan_value_info(p, name, NULL, &rank, dims);
        for (int d = 0; d < rank; d++) n *= dims[d];
        ts_plan_read(p, name, tmp + off, sizeof(float) * (size_t)n);
        off += n;
    }
    for (int64_t j = 0; j < total; j++) v[j] = tmp[j];
    free(tmp);
    *n_out = total;
    return v;
}

static void check_host(ts_plan *p) {
    ts_monitor *m = NULL;
    CHECK_OK(ts_monitor_new(p, 4, 0, 1, &m));
    if (!m) return;
    /* MLP parameters net.0.weight, net.0.bias, ...: groups net.0, net.2, ... */
    CHECK(m->n_groups * 2 == ts_plan_param_count(p) && !strcmp(m->groups[0].name, "net.0"),
          "%d groups, first '%s'", m->n_groups, m->groups[0].name);
    int64_t n;
    double *before = read_all(p, "", &n);
    ts_plan_set_update_gate(p, host_gate, m);
    feed(p, 4242, 0);
    ts_plan_set_update_gate(p, NULL, NULL);
    CHECK_OK(ts_monitor_after_update(m, p));
    double *after = read_all(p, "", &n), *g = read_all(p, "grad:", &n);
    double ps = 0, ds = 0, gs = 0, gq = 0;
    for (int64_t j = 0; j < n; j++) {
        ps += before[j] * before[j];
        ds += (after[j] - before[j]) * (after[j] - before[j]);
        gs += g[j];
        gq += g[j] * g[j];
    }
    const double var = gq / (double)n - (gs / (double)n) * (gs / (double)n);
    CHECK_NEAR(m->value[TS_MON_UPDATE_RATIO], sqrt(ds / ps), 1e-12 * sqrt(ds / ps));
    CHECK_NEAR(m->value[TS_MON_GRAD_VARIANCE], var, 1e-9 * var);
    CHECK_NEAR(m->value[TS_MON_GRAD_NORM], sqrt(gq), 1e-12 * sqrt(gq));
    CHECK(m->value[TS_MON_UPDATE_RATIO] > 0, "an update happened");
    free(before);
    free(after);
    free(g);
    ts_monitor_free(m);
}

int main(void) {
    check_kernel();
    ts_mlp_config mc = {B, 0, 0, IN, 32, 2, OUT, 1, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_mlp(g, &mc, &m));
    ts_plan *a = make_plan(g, m.loss, 1, 2), *b = make_plan(g, m.loss, 1, 1),
            *c = make_plan(g, m.loss, 0, 2);
    if (a && b && c) {
        check_schedule(a);
        CHECK(ts_plan_monitor_count(c) == 0, "no monitors without the option");
        for (int s = 0; s < 3; s++)
            feed(a, 10u + (unsigned)s, 0), feed(b, 10u + (unsigned)s, 0),
                feed(c, 10u + (unsigned)s, 0);
        check_against_grads(a);
        for (int i = 0; i < ts_plan_monitor_count(a); i++) {
            ts_grad_monitor ma, mb;
            ts_plan_monitor(a, i, &ma);
            ts_plan_monitor(b, i, &mb);
            CHECK(ma.sumsq == mb.sumsq && ma.sum == mb.sum, "%s: 1 and 2 threads differ", ma.param);
        }
        size_t n = ts_plan_snapshot_bytes(a);
        unsigned char *sa = malloc(n), *sc = malloc(n);
        ts_plan_snapshot(a, sa, n);
        ts_plan_snapshot(c, sc, n);
        CHECK(n == ts_plan_snapshot_bytes(c) && memcmp(sa, sc, n) == 0,
              "monitors changed the trained weights");
        free(sa);
        free(sc);
        check_host(b);
        /* A NaN input poisons every gradient: the monitors count it. */
        feed(a, 99, NAN);
        int64_t bad = 0;
        for (int i = 0; i < ts_plan_monitor_count(a); i++) {
            ts_grad_monitor mm;
            ts_plan_monitor(a, i, &mm);
            bad += mm.nonfinite;
        }
        double norm = 0;
        ts_plan_grad_norm(a, &norm);
        CHECK(bad > 0 && !isfinite(norm), "NaN step: %lld non-finite, norm %g", (long long)bad,
              norm);
    }
    ts_plan_free(a);
    ts_plan_free(b);
    ts_plan_free(c);
    ts_graph_free(g);
    return check_summary("monitors");
}
