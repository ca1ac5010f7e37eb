/* ZeRO-1/2 with summed gradients (ts_compile_options.zero_summed_grads,
 * what dist.reproducible compiles): the plan reduces no gradient; each
 * rank's shard update reads its block of the gradients in place, with the
 * unsharded clip coefficient. When every rank's gradients are the batch's
 * (here: every rank gets the same rows, so its own gradients are the sum
 * the update gate would write), 2, 3 and 4 ranks end with the weights of
 * one process without ZeRO, bit for bit, with clipping, for AdamW and SGD
 * with momentum, shared parameters (one copy, no all-gather) and private
 * ones (all-gathered). The dump has no reduce-scatter and no all-reduce,
 * and keeps the unsharded clip_coef.
 *
 * The model: [Linear -> ReLU -> LayerNorm] x 3 -> Linear, MSE, odd sizes
 * (input 35, hidden 37), with buckets small enough for several per run. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "check.h"
#include "plan/plan.h"

enum { ROWS = 8, WIN = 5, FEAT = 7, IN = WIN * FEAT, HID = 37, LAYERS = 3, STEPS = 4, MAXR = 4 };
enum { MAX_FLOATS = 8000 };

typedef struct shared {
    float params[MAXR][MAX_FLOATS];
    size_t n_floats;
    int n_collective, n_shard_update, n_clip, n_gather;
    char err[MAXR][512];
} shared;

static shared *SH;

typedef struct run_cfg {
    int zero, sgd, private_params, plain; /* plain: one process, no comm in the plan */
} run_cfg;

static void count_dump(ts_plan *p) {
    char path[] = "/tmp/tessel-zsum-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return;
    FILE *f = fdopen(fd, "w+");
    ts_plan_dump(p, TS_DUMP_PLAN, f);
    rewind(f);
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        SH->n_collective += strstr(line, " reduce_scatter_start ") != NULL ||
                            strstr(line, " allreduce_start ") != NULL;
        SH->n_shard_update += strstr(line, " shard_update ") != NULL;
        SH->n_clip += strstr(line, " clip_coef ") != NULL;
        SH->n_gather += strstr(line, " all_gather_start ") != NULL;
    }
    fclose(f);
    unlink(path);
}

static int worker(ts_comm *comm, void *user) {
    const run_cfg *rc = user;
    const int r = ts_comm_rank(comm);
    ts_mlp_config mc = {ROWS, WIN, FEAT, 0, HID, LAYERS, 1, 1, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    if (ts_build_mlp(g, &mc, &m) != TS_OK) return 1;
    ts_train_spec spec = ts_train_spec_default(m.loss);
    spec.opt = rc->sgd ? ts_sgd(0.05, 0.9, 0, 1, 1e-4) : ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
    spec.clip_grad_norm = 0.5; /* small enough to clip */
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 11;
    opt.threads = 1;
    opt.comm = rc->plain ? NULL : comm;
    opt.bucket_mb = 0.004;
    opt.first_bucket_mb = 0.002;
    opt.zero = rc->plain ? 0 : rc->zero;
    opt.zero_private_params = rc->private_params;
    opt.zero_summed_grads = !rc->plain;
    ts_plan *p = NULL;
    if (ts_compile(g, &spec, &opt, &p) != TS_OK) {
        snprintf(SH->err[r], sizeof SH->err[r], "compile: %s", ts_last_error());
        ts_graph_free(g);
        return 1;
    }
    if (r == 0) count_dump(p);
    static float x[ROWS * IN], y[ROWS];
    int ok = 0;
    for (int s = 0; s < STEPS; s++) {
        unsigned seed = 77u + (unsigned)s; /* the same rows on every rank */
        for (int i = 0; i < ROWS * IN; i++) x[i] = (float)rand_r(&seed) / (float)RAND_MAX - 0.5f;
        for (int i = 0; i < ROWS; i++) y[i] = 4.0f * (float)rand_r(&seed) / (float)RAND_MAX;
        if (ts_plan_set_input(p, "x", x, sizeof x) != TS_OK ||
            ts_plan_set_input(p, "y", y, sizeof y) != TS_OK || ts_plan_step(p) != TS_OK) {
            snprintf(SH->err[r], sizeof SH->err[r], "step %d: %s", s, ts_last_error());
            break;
        }
        ok++;
    }
    size_t k = 0;
    for (int i = 0; i < ts_plan_param_count(p); i++) {
        const char *name = ts_plan_param_name(p, i);
        int rank;
        int64_t dims[8];
        ts_plan_value_info(p, name, NULL, &rank, dims);
        size_t e = 1;
        for (int d = 0; d < rank; d++) e *= (size_t)dims[d];
        if (k + e > MAX_FLOATS) break;
        ts_plan_read(p, name, SH->params[r] + k, e * sizeof(float));
        k += e;
    }
    if (r == 0) SH->n_floats = k;
    ts_plan_free(p);
    ts_graph_free(g);
    return ok == STEPS ? 0 : 1;
}

static ts_status launch(int n, run_cfg *rc) {
    memset(SH, 0, sizeof *SH);
    ts_shm_options o = {0};
    o.timeout_s = 20;
    o.heap_bytes = (size_t)32 << 20;
    o.grace_s = 2;
    return ts_shm_launch(n, &o, worker, rc, NULL);
}

static void compare(int n, int zero, int sgd, int private_params) {
    static float want[MAX_FLOATS];
    run_cfg plain = {0, sgd, 0, 1};
    ts_status s = launch(1, &plain);
    CHECK(s == TS_OK, "one process: %s (%s)", ts_last_error(), SH->err[0]);
    if (s != TS_OK) return;
    const size_t nf = SH->n_floats;
    memcpy(want, SH->params[0], nf * sizeof(float));
    CHECK(SH->n_clip == 1, "one process: one clip_coef (%d)", SH->n_clip);
    run_cfg rc = {zero, sgd, private_params, 0};
    s = launch(n, &rc);
    CHECK(s == TS_OK, "%d ranks, ZeRO-%d: %s (%s)", n, zero, ts_last_error(), SH->err[0]);
    if (s != TS_OK) return;
    const char *what = sgd ? "SGD" : "AdamW";
    CHECK(SH->n_floats == nf && nf > 1000, "%d ranks: %zu parameters read", n, SH->n_floats);
    CHECK(SH->n_collective == 0, "%d ranks, ZeRO-%d: no gradient collective (%d)", n, zero,
          SH->n_collective);
    CHECK(SH->n_shard_update > 1 && SH->n_clip == 1,
          "%d ranks, ZeRO-%d: %d shard updates, %d unsharded clip_coef", n, zero,
          SH->n_shard_update, SH->n_clip);
    CHECK((SH->n_gather > 0) == (private_params != 0), "%d ranks: parameters %s (%d all-gathers)",
          n, private_params ? "all-gathered" : "shared", SH->n_gather);
    for (int r = 0; r < n; r++)
        CHECK(memcmp(SH->params[r], want, nf * sizeof(float)) == 0,
              "%d ranks, ZeRO-%d, %s, %s parameters: rank %d's weights are one process's bit "
              "for bit",
              n, zero, what, private_params ? "private" : "shared", r);
}

int main(void) {
    SH = mmap(NULL, sizeof *SH, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (SH == MAP_FAILED) return 1;
    compare(2, 1, 0, 0);
    compare(3, 2, 0, 1);
    compare(4, 1, 1, 1);
    compare(3, 2, 1, 0);
    munmap(SH, sizeof *SH);
    return check_summary("dist_zero_summed");
}
