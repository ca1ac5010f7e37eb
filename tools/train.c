/* tessel train: train the configured model on synthetic data (the data
 * layer proper comes later) with one progress line per step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cli.h"
#include "data/synthetic.h"

/* Like the reference benchmark, cycle over a few fixed batches: a GPT can
 * then lower its loss by memorising them, which fresh uniform tokens (whose
 * best loss is log(vocab) from the start) would not allow. */
enum { N_BATCHES = 4 };

typedef struct batches {
    const char *in_name, *tgt_name;
    size_t in_bytes, tgt_bytes;
    int n;
    char *in[N_BATCHES], *tgt[N_BATCHES];
} batches;

static void batches_free(batches *b) {
    for (int i = 0; i < b->n; i++) free(b->in[i]), free(b->tgt[i]);
}

static ts_status make_batches(const ts_config *c, const ts_graph *g, const ts_model *m,
                              int64_t steps, batches *b) {
    memset(b, 0, sizeof *b);
    b->in_name = ts_name(g, m->input);
    b->tgt_name = ts_name(g, m->target);
    b->in_bytes = (size_t)ts_numel(g, m->input) * ts_dtype_size(ts_dtype_of(g, m->input));
    b->tgt_bytes = (size_t)ts_numel(g, m->target) * ts_dtype_size(ts_dtype_of(g, m->target));
    int n = steps < N_BATCHES ? (int)steps : N_BATCHES;
    for (; b->n < n; b->n++) {
        b->in[b->n] = malloc(b->in_bytes);
        b->tgt[b->n] = malloc(b->tgt_bytes);
        if (!b->in[b->n] || !b->tgt[b->n]) {
            b->n++;
            return TS_ERR_NOMEM;
        }
        ts_status s;
        if (c->model.name == TS_CFG_MLP) {
            ts_mlp_config mc = ts_config_mlp(c);
            int64_t window = mc.window > 0 ? mc.window : mc.in_dim;
            int64_t features = mc.window > 0 ? mc.features : 1;
            s = ts_synth_regression(c->train.seed, b->n, mc.batch, window, features, mc.out_dim,
                                    (float *)b->in[b->n], (float *)b->tgt[b->n]);
        } else {
            ts_gpt_config gc = ts_config_gpt(c);
            s = ts_synth_tokens(c->train.seed, b->n, gc.batch, gc.ctx, gc.vocab,
                                (int64_t *)b->in[b->n], (int64_t *)b->tgt[b->n]);
        }
        if (s != TS_OK) return s;
    }
    return TS_OK;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double param_count(const ts_plan *p) {
    double n = 0;
    for (int i = 0; i < ts_plan_param_count(p); i++) {
        int rank;
        int64_t dims[TS_MAX_RANK];
        if (ts_plan_value_info(p, ts_plan_param_name(p, i), NULL, &rank, dims) != TS_OK) continue;
        double k = 1;
        for (int d = 0; d < rank; d++) k *= (double)dims[d];
        n += k;
    }
    return n;
}

static int run(const ts_config *c, ts_plan *plan, const batches *b) {
    const int gpt = c->model.name == TS_CFG_GPT;
    const double per_step = (double)c->model.batch * (gpt ? (double)c->model.ctx : 1.0);
    const char *unit = gpt ? "tokens/s" : "samples/s";
    const int64_t steps = c->train.steps;
    const int width = snprintf(NULL, 0, "%lld", (long long)steps);
    double *rate = malloc((size_t)steps * sizeof *rate);
    if (!rate) return cli_error(CLI_FAIL, "out of memory for %lld step timings", (long long)steps);
    double first = NAN, loss = NAN, t_start = now();
    for (int64_t step = 1; step <= steps; step++) {
        int k = (int)((step - 1) % b->n);
        double lr = ts_plan_lr(plan), t0 = now();
        ts_status s = ts_plan_set_input(plan, b->in_name, b->in[k], b->in_bytes);
        if (s == TS_OK) s = ts_plan_set_input(plan, b->tgt_name, b->tgt[k], b->tgt_bytes);
        if (s == TS_OK) s = ts_plan_step(plan);
        double dt = now() - t0;
        if (s != TS_OK) {
            free(rate);
            return cli_error(CLI_FAIL, "step %lld: %s", (long long)step, ts_last_error());
        }
        loss = ts_plan_loss(plan);
        if (step == 1) first = loss;
        rate[step - 1] = dt > 0 ? per_step / dt : 0;
        printf("step %*lld/%lld  loss %.6f  lr %.3e  %.0f %s\n", width, (long long)step,
               (long long)steps, loss, lr, rate[step - 1], unit);
        fflush(stdout);
        if (!isfinite(loss)) {
            free(rate);
            return cli_error(CLI_FAIL,
                             "step %lld: the loss is %g; lower train.lr, set "
                             "train.clip_grad_norm, or find the first bad value with "
                             "--set compile.debug_nan=true",
                             (long long)step, loss);
        }
    }
    /* The first step pays for page faults and caches; leave it out. */
    int64_t n = steps > 1 ? steps - 1 : steps;
    qsort(rate + (steps - n), (size_t)n, sizeof *rate, cmp_double);
    printf("done: %lld steps in %.2f s, loss %.6f -> %.6f, median %.0f %s\n", (long long)steps,
           now() - t_start, first, loss, rate[steps - n + n / 2], unit);
    free(rate);
    return CLI_OK;
}

int cli_train(const cli_args *a) {
    ts_config c;
    int rc = cli_load_config(a, &c);
    if (rc != CLI_OK) return rc;
    ts_graph *g = NULL;
    ts_plan *plan = NULL;
    ts_model m;
    ts_train_spec spec;
    ts_compile_options opt;
    ts_status s = ts_config_build(&c, &g, &m, &spec, &opt);
    if (s == TS_OK) s = ts_compile(g, &spec, &opt, &plan);
    if (s != TS_OK) {
        ts_graph_free(g);
        return cli_error(cli_status_code(s), "%s", ts_last_error());
    }
    batches b;
    s = make_batches(&c, g, &m, c.train.steps, &b);
    if (s != TS_OK) {
        rc = cli_error(CLI_FAIL, "synthetic data: %s", ts_last_error());
    } else {
        ts_plan_stats st;
        ts_plan_get_stats(plan, &st);
        const char *presets[] = {"w1", "w3", "gpt2-124m"};
        printf("training %s (preset %s): %.3f M parameters, batch %lld, %lld steps; plan: %d "
               "instructions, arena %.1f MiB\n",
               c.model.name == TS_CFG_MLP ? "mlp" : "gpt", presets[c.model.preset],
               param_count(plan) * 1e-6, (long long)c.model.batch, (long long)c.train.steps,
               st.n_instructions, (double)st.arena_bytes / (1024.0 * 1024.0));
        rc = run(&c, plan, &b);
    }
    batches_free(&b);
    ts_plan_free(plan);
    ts_graph_free(g);
    return rc;
}
