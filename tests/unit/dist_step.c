/* The distributed step (distribute pass, allreduce_start/wait, buckets in
 * the shared segment): N ranks x batch B/N against 1 rank x batch B, ranks
 * bit-identical to each other, bucket sizes not changing a bit, the plan
 * dump showing buckets and their overlap, and a rank that dies mid-run.
 *
 * The model is W1's shape at a small size: [Linear -> ReLU -> LayerNorm] x 2
 * -> Linear, MSE, AdamW with weight decay and clipping by global norm. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "check.h"

enum { B = 16, WIN = 8, FEAT = 8, IN = WIN * FEAT, HID = 64, STEPS = 4, MAXP = 16 };
enum { MAX_FLOATS = 40000 };

/* What every worker leaves behind, in memory shared with the parent. */
typedef struct shared {
    float params[4][MAX_FLOATS]; /* per rank: every parameter, concatenated */
    size_t n_floats;
    int steps_ok[4];
    int n_start, n_wait, overlap_ok, waits_before_update;
    size_t arena_bytes, state_bytes; /* rank 0's plan */
    char err[4][512];
} shared;

static shared *SH;

typedef struct run_cfg {
    ts_graph *g; /* built for the per-rank batch */
    ts_val loss;
    double bucket_mb, first_mb;
    int die_rank; /* >= 0: this rank exits before step 2 */
    int dump;     /* rank 0 checks the plan dump */
    int zero;     /* ZeRO stage */
    int no_clip;  /* no clipping by global norm */
    int sgd;      /* SGD with Nesterov momentum and weight decay instead of AdamW */
} run_cfg;

/* Global batch of step s: fixed pseudo-random values. */
static void batch(int step, float *x, float *y) {
    unsigned seed = 1000u + (unsigned)step;
    for (int i = 0; i < B * IN; i++) x[i] = (float)rand_r(&seed) / (float)RAND_MAX - 0.5f;
    for (int i = 0; i < B; i++) y[i] = (float)rand_r(&seed) / (float)RAND_MAX;
}

static ts_status compile(const run_cfg *rc, ts_comm *comm, ts_plan **p) {
    ts_train_spec spec = ts_train_spec_default(rc->loss);
    spec.opt = ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
    if (rc->sgd) spec.opt = ts_sgd(0.05, 0.9, 0, 1, 1e-4);
    spec.clip_grad_norm = rc->no_clip ? 0.0 : 1.0;
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 7;
    opt.threads = 1;
    opt.comm = comm;
    opt.bucket_mb = rc->bucket_mb;
    opt.first_bucket_mb = rc->first_mb;
    opt.dist_algo = TS_ALGO_NATIVE;
    opt.zero = rc->zero;
    return ts_compile(rc->g, &spec, &opt, p);
}

static size_t save_params(const ts_plan *p, float *dst) {
    size_t k = 0;
    for (int i = 0; i < ts_plan_param_count(p); i++) {
        const char *name = ts_plan_param_name(p, i);
        int rank;
        int64_t dims[8];
        ts_plan_value_info(p, name, NULL, &rank, dims);
        size_t n = 1;
        for (int d = 0; d < rank; d++) n *= (size_t)dims[d];
        if (k + n > MAX_FLOATS) return 0;
        ts_plan_read(p, name, dst + k, n * sizeof(float));
        k += n;
    }
    return k;
}

/* Positions of the collectives in rank 0's instruction dump. */
static void check_dump(ts_plan *p) {
    char path[] = "/tmp/tessel-dist-step-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return;
    FILE *f = fdopen(fd, "w+");
    ts_plan_dump(p, TS_DUMP_PLAN, f);
    rewind(f);
    char line[1024];
    int i = 0, first_start = -1, first_wait = -1, last_wait = -1, update = -1, matmuls_between = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        if (strstr(line, " allreduce_start ")) {
            SH->n_start++;
            if (first_start < 0) first_start = i;
        } else if (strstr(line, " allreduce_wait ")) {
            SH->n_wait++;
            if (first_wait < 0) first_wait = i;
            last_wait = i;
        } else if (strstr(line, " adam_update ") || strstr(line, " clip_coef ")) {
            if (update < 0) update = i;
        } else if (strstr(line, " matmul ") && first_start >= 0 && first_wait < 0) {
            matmuls_between++;
        }
        i++;
    }
    fclose(f);
    unlink(path);
    /* Backward matmuls run while the first bucket is in flight. */
    SH->overlap_ok = first_start >= 0 && matmuls_between > 0;
    SH->waits_before_update = last_wait >= 0 && update > last_wait;
}

static int worker(ts_comm *comm, void *user) {
    const run_cfg *rc = user;
    const int r = ts_comm_rank(comm), n = ts_comm_size(comm), per = B / n;
    ts_plan *p = NULL;
    if (compile(rc, comm, &p) != TS_OK) {
        snprintf(SH->err[r], sizeof SH->err[r], "compile: %s", ts_last_error());
        return 1;
    }
    if (rc->dump && r == 0) check_dump(p);
    if (r == 0) {
        ts_plan_stats st;
        ts_plan_get_stats(p, &st);
        SH->arena_bytes = st.arena_bytes;
        SH->state_bytes = st.state_bytes;
    }
    static float x[B * IN], y[B];
    int ok = 0;
    for (int s = 0; s < STEPS; s++) {
        if (s == 1 && r == rc->die_rank) _exit(3);
        batch(s, x, y);
        if (ts_plan_set_input(p, "x", x + (size_t)r * per * IN, sizeof(float) * per * IN) !=
                TS_OK ||
            ts_plan_set_input(p, "y", y + (size_t)r * per, sizeof(float) * per) != TS_OK ||
            ts_plan_step(p) != TS_OK) {
            snprintf(SH->err[r], sizeof SH->err[r], "%s", ts_last_error());
            break;
        }
        ok++;
    }
    SH->steps_ok[r] = ok;
    size_t k = save_params(p, SH->params[r]);
    if (r == 0) SH->n_floats = k;
    ts_plan_free(p);
    return ok == STEPS ? 0 : 1;
}

static ts_graph *mlp(int batch_rows, ts_val *loss) {
    ts_mlp_config mc = {batch_rows, WIN, FEAT, 0, HID, 2, 1, 1, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_mlp(g, &mc, &m));
    *loss = m.loss;
    return g;
}

/* One process, batch B: the reference. */
static size_t reference(float *out) {
    run_cfg rc = {0};
    rc.g = mlp(B, &rc.loss);
    rc.die_rank = -1;
    ts_plan *p;
    size_t k = 0;
    CHECK_OK(compile(&rc, NULL, &p));
    static float x[B * IN], y[B];
    for (int s = 0; s < STEPS; s++) {
        batch(s, x, y);
        CHECK_OK(ts_plan_set_input(p, "x", x, sizeof x));
        CHECK_OK(ts_plan_set_input(p, "y", y, sizeof y));
        CHECK_OK(ts_plan_step(p));
    }
    k = save_params(p, out);
    ts_plan_free(p);
    ts_graph_free(rc.g);
    return k;
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d; /* NaN sticks */
    }
    return m;
}

static ts_status launch(int n, run_cfg *rc, int *codes);

/* ZeRO-1 against ZeRO-0 on n ranks: the reduce-scatter folds each element
 * in the same rank order as the all-reduce and the shard update is the
 * fused update's arithmetic element by element, so without clipping the
 * weights are the same bits. With clipping the coefficient's norm is summed
 * over shards instead of per tensor (see zero_clip_coef), which may move
 * it by an ulp: equal up to that rounding. */
static void check_zero(int n, ts_graph *g, ts_val loss, int no_clip, int sgd) {
    static float base[MAX_FLOATS];
    run_cfg rc = {0};
    rc.g = g;
    rc.loss = loss;
    rc.die_rank = -1;
    rc.no_clip = no_clip;
    rc.sgd = sgd;
    rc.bucket_mb = 16.0 / 1024;
    rc.first_mb = 4.0 / 1024;
    ts_status s = launch(n, &rc, NULL);
    CHECK(s == TS_OK, "zero 0, %d ranks: %s (%s)", n, ts_last_error(), SH->err[0]);
    const size_t nf = SH->n_floats, state0 = SH->state_bytes, arena0 = SH->arena_bytes;
    memcpy(base, SH->params[0], sizeof(float) * nf);
    rc.zero = 1;
    s = launch(n, &rc, NULL);
    CHECK(s == TS_OK, "zero 1, %d ranks: %s (%s)", n, ts_last_error(), SH->err[0]);
    CHECK(SH->n_floats == nf, "zero 1: %zu parameters, zero 0 %zu", SH->n_floats, nf);
    for (int r = 1; r < n; r++)
        CHECK(!memcmp(SH->params[0], SH->params[r], sizeof(float) * nf),
              "zero 1, %d ranks: rank %d's weights differ from rank 0's", n, r);
    double d = max_abs_diff(SH->params[0], base, nf);
    if (no_clip)
        CHECK(d == 0, "zero 1 vs zero 0 without clipping, %d ranks: max |dw| %.3g (want 0)", n, d);
    else
        CHECK(d <= 1e-6, "zero 1 vs zero 0 with clipping, %d ranks: max |dw| %.3g", n, d);
    /* The optimizer state shrinks to the rank's shard (plus padding). */
    CHECK(SH->state_bytes * (size_t)n <= state0 + (size_t)n * 4096,
          "zero 1 state %zu bytes per rank, zero 0 %zu", SH->state_bytes, state0);
    printf(
        "%d ranks, %s, %s: zero 1 vs zero 0 max |dw| = %.3g; per-rank optimizer state %zu -> %zu "
        "bytes, arena %zu -> %zu bytes\n",
        n, sgd ? "sgd" : "adamw", no_clip ? "no clipping" : "clipping", d, state0, SH->state_bytes,
        arena0, SH->arena_bytes);
}

static ts_status launch(int n, run_cfg *rc, int *codes) {
    memset(SH, 0, sizeof *SH);
    ts_shm_options o = {0};
    o.timeout_s = 5;
    o.heap_bytes = (size_t)64 << 20;
    o.grace_s = 2;
    return ts_shm_launch(n, &o, worker, rc, codes);
}

int main(void) {
    SH = mmap(NULL, sizeof *SH, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (SH == MAP_FAILED) return 1;
    static float ref[MAX_FLOATS], small_buckets[MAX_FLOATS];
    size_t nref = reference(ref);
    CHECK(nref > 0, "reference run saved no parameters");

    for (int n = 2; n <= 4; n += 2) {
        run_cfg rc = {0};
        rc.g = mlp(B / n, &rc.loss);
        rc.die_rank = -1;
        rc.dump = 1;
        /* Small buckets (about 16 KiB, the first 4 KiB): several buckets. */
        rc.bucket_mb = 16.0 / 1024;
        rc.first_mb = 4.0 / 1024;
        ts_status s = launch(n, &rc, NULL);
        CHECK(s == TS_OK, "%d ranks: %s (rank 0: %s)", n, ts_last_error(), SH->err[0]);
        CHECK(SH->n_floats == nref, "%d ranks: %zu parameters, reference %zu", n, SH->n_floats,
              nref);
        for (int r = 1; r < n; r++)
            CHECK(!memcmp(SH->params[0], SH->params[r], sizeof(float) * SH->n_floats),
                  "%d ranks: rank %d's weights differ from rank 0's", n, r);
        /* Not bit-identical to one process: the weight gradients sum the
         * batch in a different order (two partial sums of B/N rows added by
         * the all-reduce), so gradients differ by float rounding (~1e-7
         * relative); through 4 AdamW steps of lr 1e-3 (update m / sqrt(v),
         * about lr per step) that moves weights of size ~0.1 by a few ulps
         * (6e-8 measured). 1e-6 (0.1 % of one step) leaves room for other
         * machines' kernels and still catches a wrong average (a missing
         * 1/N changes the clipped, normalised update by ~lr). */
        double d = max_abs_diff(SH->params[0], ref, nref);
        CHECK(d <= 1e-6, "%d ranks x batch %d vs 1 rank x batch %d: max |dw| %.3g > 1e-6", n, B / n,
              B, d);
        printf("%d ranks x batch %d vs 1 x %d: max |dw| = %.3g after %d AdamW steps\n", n, B / n, B,
               d, STEPS);
        CHECK(SH->n_start >= 3 && SH->n_start == SH->n_wait,
              "%d ranks: %d bucket starts, %d waits (want >= 3 buckets)", n, SH->n_start,
              SH->n_wait);
        CHECK(SH->overlap_ok, "%d ranks: no backward matmul between the first start and wait", n);
        CHECK(SH->waits_before_update, "%d ranks: a wait comes after the update phase", n);
        if (n == 2) memcpy(small_buckets, SH->params[0], sizeof(float) * nref);

        if (n == 2) {
            /* One bucket for everything: the same bits (each element is
             * reduced the same way whatever the bucket it travels in). */
            rc.bucket_mb = rc.first_mb = 64;
            rc.dump = 1;
            s = launch(n, &rc, NULL);
            CHECK(s == TS_OK, "one bucket: %s", ts_last_error());
            CHECK(SH->n_start == 1, "one bucket: %d starts", SH->n_start);
            CHECK(!memcmp(SH->params[0], small_buckets, sizeof(float) * nref),
                  "one bucket and small buckets give different weights");

            /* A rank that dies: the other's step fails naming the
             * collective and the missing rank; the launcher fails. */
            rc.die_rank = 1;
            rc.dump = 0;
            int codes[2] = {0, 0};
            s = launch(n, &rc, codes);
            CHECK(s == TS_ERR_IO, "a dead rank: launcher returned %s", ts_status_name(s));
            CHECK(codes[1] == 3 && codes[0] == 1, "exit codes %d %d", codes[0], codes[1]);
            CHECK(SH->steps_ok[0] == 1, "rank 0 ran %d steps", SH->steps_ok[0]);
            CHECK(strstr(SH->err[0], "all_reduce #") && strstr(SH->err[0], "did not arrive") &&
                      strstr(SH->err[0], "allreduce_"),
                  "rank 0's error: %s", SH->err[0]);
            printf("rank 1 died: rank 0 reported: %s\n", SH->err[0]);
        }
        check_zero(n, rc.g, rc.loss, 1, 0);
        check_zero(n, rc.g, rc.loss, 0, 0);
        check_zero(n, rc.g, rc.loss, 1, 1);
        ts_graph_free(rc.g);
    }
    munmap(SH, sizeof *SH);
    return check_summary("dist_step");
}
