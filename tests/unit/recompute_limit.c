/* compile.max_memory_mb (src/passes/recompute.c): a small 3D U-Net trained
 * under a limit its stored activations exceed recomputes some of them in
 * the backward, fits the limit, and trains to bit-identical parameters and
 * losses; build order (naive_schedule) trains to the same bits as the
 * searched order; the same limit gives the same plan twice; a limit below
 * what the step needs is refused with the need. */
#include <stdlib.h>
#include <string.h>
#include "check.h"

enum { MAXP = 64 };

typedef struct run {
    int n;
    float *params[MAXP];
    size_t bytes[MAXP];
    float loss[3];
    ts_plan_stats st;
} run;

static const ts_unet3d_config UC = {2, 1, 16, 8, 16, 32, 2};

static ts_status compile(double limit_mb, int naive, ts_plan **p) {
    ts_graph *g = ts_graph_new();
    ts_model m;
    ts_status s = ts_build_unet3d(g, &UC, &m);
    if (s != TS_OK) {
        ts_graph_free(g);
        return s;
    }
    ts_train_spec spec = ts_train_spec_default(m.loss);
    spec.opt = ts_adam(1e-3, 0.9, 0.999, 1e-8, 0.0);
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 3;
    opt.threads = 2;
    opt.max_memory_mb = limit_mb;
    opt.naive_schedule = naive;
    s = ts_compile(g, &spec, &opt, p);
    ts_graph_free(g);
    return s;
}

static int train(double limit_mb, int naive, run *out) {
    memset(out, 0, sizeof *out);
    ts_plan *p = NULL;
    ts_status s = compile(limit_mb, naive, &p);
    CHECK(s == TS_OK, "compile (limit %.2f MiB): %s", limit_mb, ts_last_error());
    if (s != TS_OK) return 1;
    const size_t nx = (size_t)(UC.batch * UC.size * UC.size * UC.size);
    float *x = malloc(sizeof(float) * nx);
    int64_t *y = malloc(sizeof(int64_t) * nx);
    unsigned seed = 9;
    for (int step = 0; step < 3; step++) {
        for (size_t i = 0; i < nx; i++) {
            y[i] = rand_r(&seed) % 2;
            x[i] = (float)y[i] + (float)rand_r(&seed) / (float)RAND_MAX - 0.5f;
        }
        CHECK_OK(ts_plan_set_input(p, "x", x, sizeof(float) * nx));
        CHECK_OK(ts_plan_set_input(p, "y", y, sizeof(int64_t) * nx));
        CHECK_OK(ts_plan_step(p));
        ts_plan_read(p, "loss", &out->loss[step], sizeof(float));
    }
    free(x);
    free(y);
    ts_plan_get_stats(p, &out->st);
    out->n = ts_plan_param_count(p);
    for (int i = 0; i < out->n && i < MAXP; i++) {
        const char *name = ts_plan_param_name(p, i);
        int rank;
        int64_t dims[8];
        ts_plan_value_info(p, name, NULL, &rank, dims);
        out->bytes[i] = sizeof(float);
        for (int d = 0; d < rank; d++) out->bytes[i] *= (size_t)dims[d];
        out->params[i] = malloc(out->bytes[i]);
        ts_plan_read(p, name, out->params[i], out->bytes[i]);
    }
    ts_plan_free(p);
    return 0;
}

static int same(const run *a, const run *b) {
    if (a->n != b->n || a->n == 0 || memcmp(a->loss, b->loss, sizeof a->loss)) return 0;
    for (int i = 0; i < a->n && i < MAXP; i++)
        if (a->bytes[i] != b->bytes[i] || memcmp(a->params[i], b->params[i], a->bytes[i])) return 0;
    return 1;
}

static void release(run *r) {
    for (int i = 0; i < r->n && i < MAXP; i++) free(r->params[i]);
}

int main(void) {
    run free_run, naive, limited;
    if (train(0, 0, &free_run) || train(0, 1, &naive)) return check_summary("recompute_limit");
    CHECK(same(&free_run, &naive), "build order and the searched order train to different bits");
    CHECK(free_run.st.n_recomputed == 0 && free_run.st.arena_no_recompute_bytes == 0,
          "no limit: %d recomputed", free_run.st.n_recomputed);
    /* a limit 15 % under the arena: some activations must be recomputed */
    const double arena_mb = (double)free_run.st.arena_bytes / 1048576.0;
    const double limit = arena_mb * 0.85;
    if (train(limit, 0, &limited)) return check_summary("recompute_limit");
    CHECK(limited.st.n_recomputed > 0 && limited.st.recompute_flops > 0,
          "limit %.2f of %.2f MiB: %d recomputed (%.0f FLOPs)", limit, arena_mb,
          limited.st.n_recomputed, limited.st.recompute_flops);
    CHECK((double)limited.st.arena_bytes <= limit * 1048576.0, "arena %zu above the limit %.2f MiB",
          limited.st.arena_bytes, limit);
    CHECK(limited.st.arena_no_recompute_bytes == free_run.st.arena_bytes,
          "arena without recompute %zu, the free run's %zu", limited.st.arena_no_recompute_bytes,
          free_run.st.arena_bytes);
    CHECK(limited.st.flops_per_step >=
              free_run.st.flops_per_step + limited.st.recompute_flops * 0.999,
          "step FLOPs %.0f do not include the recompute's %.0f (free run %.0f)",
          limited.st.flops_per_step, limited.st.recompute_flops, free_run.st.flops_per_step);
    CHECK(same(&free_run, &limited), "recompute changed the trained parameters or losses");
    /* deterministic: the same limit gives the same plan */
    ts_plan *a = NULL, *b = NULL;
    CHECK_OK(compile(limit, 0, &a));
    CHECK_OK(compile(limit, 0, &b));
    if (a && b) {
        char *ta = NULL, *tb = NULL;
        size_t la = 0, lb = 0;
        FILE *fa = open_memstream(&ta, &la), *fb = open_memstream(&tb, &lb);
        ts_plan_dump(a, TS_DUMP_PLAN, fa);
        ts_plan_dump(b, TS_DUMP_PLAN, fb);
        fclose(fa);
        fclose(fb);
        CHECK(la > 0 && la == lb && !memcmp(ta, tb, la), "two compiles gave different plans");
        free(ta);
        free(tb);
    }
    ts_plan_free(a);
    ts_plan_free(b);
    /* impossible: less than the parameters, gradients and state need */
    ts_plan *p = NULL;
    ts_status s = compile(0.01, 0, &p);
    CHECK(s == TS_ERR_INVALID && strstr(ts_last_error(), "compile.max_memory_mb 0.01") &&
              strstr(ts_last_error(), "needs at least"),
          "limit 0.01 MiB: %s: %s", ts_status_name(s), ts_last_error());
    ts_plan_free(p);
    /* impossible after recompute: just above the persistent part */
    const double persistent =
        (double)(free_run.st.arena_bytes - free_run.st.temp_bytes) / 1048576.0;
    s = compile(persistent + 0.01, 0, &p);
    CHECK(s == TS_ERR_INVALID && strstr(ts_last_error(), "activations recomputed") &&
              strstr(ts_last_error(), "the step needs"),
          "limit %.2f MiB: %s: %s", persistent + 0.01, ts_status_name(s), ts_last_error());
    ts_plan_free(p);
    printf("unet3d 16^3: arena %.2f MiB, %.2f MiB under a %.2f MiB limit with %d recomputed "
           "(%.1f %% more FLOPs)\n",
           arena_mb, (double)limited.st.arena_bytes / 1048576.0, limit, limited.st.n_recomputed,
           100.0 * limited.st.recompute_flops / free_run.st.flops_per_step);
    release(&free_run);
    release(&naive);
    release(&limited);
    return check_summary("recompute_limit");
}
