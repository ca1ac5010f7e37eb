/* ZeRO-3 (parameters sharded too, gathered per bucket before use): on 2,
 * 3 and 4 ranks, with many small buckets and sizes that do not divide by
 * the rank count, the weights (assembled from every rank's blocks through
 * ts_plan_shard_layout) equal ZeRO-0's bit for bit without clipping (the
 * same reduce-scatter sums and update arithmetic as ZeRO-2) and within
 * float rounding with it, with and without prefetch; every temporary
 * (where the gathered parameters live) is NaN before each step. The plan
 * gathers each bucket once or twice per step (forward, backward), the parameters
 * leave the persistent region, at most a few buckets' parameters are alive
 * at once, and the arena shrinks below ZeRO-2's by most of the parameters.
 * Reading a gathered parameter directly is refused naming ZeRO-3.
 *
 * The model: [Linear -> ReLU -> LayerNorm] x 6 -> Linear, MSE, input 35,
 * hidden 37 (8 880 parameters), AdamW with weight decay, or SGD with
 * Nesterov momentum. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "check.h"
#include "plan/plan.h"

enum { PER = 4, WIN = 5, FEAT = 7, IN = WIN * FEAT, HID = 37, LAYERS = 6, STEPS = 4, MAXR = 4 };
enum { MAX_FLOATS = 12000 };

typedef struct shared {
    float params[MAX_FLOATS]; /* ZeRO-0: rank 0's; ZeRO-3: every rank's pieces */
    size_t n_floats;
    ts_plan_stats st; /* rank 0's plan */
    int n_gather, n_gather_wait, n_prefetched, n_rs;
    int read_refused;
    double loss[STEPS];
    char err[MAXR][512];
} shared;

static shared *SH;

typedef struct run_cfg {
    int zero, no_clip, sgd, no_prefetch;
} run_cfg;

static ts_graph *mlp(int rows, ts_val *loss) {
    ts_mlp_config mc = {rows, WIN, FEAT, 0, HID, LAYERS, 1, 1, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    if (ts_build_mlp(g, &mc, &m) != TS_OK) {
        ts_graph_free(g);
        return NULL;
    }
    *loss = m.loss;
    return g;
}

static void batch(int step, int n, float *x, float *y) {
    unsigned seed = 77u + (unsigned)step;
    for (int i = 0; i < n * PER * IN; i++) x[i] = (float)rand_r(&seed) / (float)RAND_MAX - 0.5f;
    for (int i = 0; i < n * PER; i++) y[i] = (float)rand_r(&seed) / (float)RAND_MAX;
}

/* Counts the gathers in rank 0's plan dump: starts, waits, and starts
 * issued while another bucket's gather is still in flight (prefetch). */
static void check_dump(ts_plan *p) {
    char path[] = "/tmp/tessel-zero3-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return;
    FILE *f = fdopen(fd, "w+");
    ts_plan_dump(p, TS_DUMP_PLAN, f);
    rewind(f);
    char line[1024];
    int in_flight = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        if (strstr(line, " all_gather_start ")) {
            SH->n_gather++;
            SH->n_prefetched += in_flight > 0;
            in_flight++;
        } else if (strstr(line, " all_gather_wait ")) {
            SH->n_gather_wait++;
            in_flight--;
        } else if (strstr(line, " reduce_scatter_start ")) {
            SH->n_rs++;
        }
    }
    fclose(f);
    unlink(path);
}

/* This rank's weights: ZeRO-0 reads them, ZeRO-3 copies the pieces of its
 * blocks into their places (params in ts_plan_param_name order). */
static int collect(ts_plan *p, int r) {
    ts_shard_piece *pc = NULL;
    int npc = 0;
    if (ts_plan_shard_layout(p, &pc, &npc) != TS_OK) return 0;
    size_t k = 0;
    static float blk[MAX_FLOATS];
    int ok = 1;
    for (int i = 0; i < ts_plan_param_count(p) && ok; i++) {
        const char *name = ts_plan_param_name(p, i);
        int rank;
        int64_t dims[8];
        ts_plan_value_info(p, name, NULL, &rank, dims);
        size_t e = 1;
        for (int d = 0; d < rank; d++) e *= (size_t)dims[d];
        if (k + e > MAX_FLOATS) return 0;
        if (npc == 0 && r > 0) { /* ZeRO-0: every rank holds the same; rank 0 reads */
            k += e;
            continue;
        }
        ts_status s = ts_plan_read(p, name, SH->params + k, e * sizeof(float));
        if (s != TS_OK) {
            if (i == 0 && r == 0) SH->read_refused = strstr(ts_last_error(), "ZeRO-3") != NULL;
            for (int q = 0; q < npc; q++) {
                if (pc[q].what[0] || strcmp(pc[q].param, name)) continue;
                int64_t sd[8];
                int sr;
                ts_plan_value_info(p, pc[q].state, NULL, &sr, sd);
                if (sr != 1 || sd[0] > MAX_FLOATS ||
                    ts_plan_read(p, pc[q].state, blk, (size_t)sd[0] * sizeof(float)) != TS_OK) {
                    ok = 0;
                    break;
                }
                memcpy(SH->params + k + pc[q].param_off, blk + pc[q].state_off,
                       (size_t)pc[q].count * sizeof(float));
            }
        }
        k += e;
    }
    if (r == 0) SH->n_floats = k;
    free(pc);
    return ok;
}

static int worker(ts_comm *comm, void *user) {
    const run_cfg *rc = user;
    const int r = ts_comm_rank(comm), n = ts_comm_size(comm);
    ts_val loss;
    ts_graph *g = mlp(PER, &loss);
    if (!g) return 1;
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = rc->sgd ? ts_sgd(0.05, 0.9, 0, 1, 1e-4) : ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
    spec.clip_grad_norm = rc->no_clip ? 0.0 : 1.0;
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 11;
    opt.threads = 1;
    opt.comm = comm;
    opt.bucket_mb = 2.0 / 1024; /* 2 KiB buckets, the first 1 KiB: 7 of them */
    opt.first_bucket_mb = 1.0 / 1024;
    opt.dist_algo = TS_ALGO_NATIVE;
    opt.zero = rc->zero;
    opt.zero_no_prefetch = rc->no_prefetch;
    ts_plan *p = NULL;
    int ok = 0;
    if (ts_compile(g, &spec, &opt, &p) != TS_OK) {
        snprintf(SH->err[r], sizeof SH->err[r], "compile: %s", ts_last_error());
        ts_graph_free(g);
        return 1;
    }
    if (r == 0) {
        ts_plan_get_stats(p, &SH->st);
        check_dump(p);
    }
    static float x[MAXR * PER * IN], y[MAXR * PER];
    for (int s = 0; s < STEPS; s++) {
        /* The gathered parameters live in the temporaries: NaN them all,
         * so a parameter read before its gather poisons the weights. */
        memset(ts_plan_at(p, p->prog.layout.temp_off), 0xff, p->prog.layout.temp_bytes);
        batch(s, n, x, y);
        float l = 0;
        if (ts_plan_set_input(p, "x", x + (size_t)r * PER * IN, sizeof(float) * PER * IN) !=
                TS_OK ||
            ts_plan_set_input(p, "y", y + (size_t)r * PER, sizeof(float) * PER) != TS_OK ||
            ts_plan_step(p) != TS_OK || ts_plan_read(p, "loss", &l, sizeof l) != TS_OK) {
            snprintf(SH->err[r], sizeof SH->err[r], "step %d: %s", s, ts_last_error());
            break;
        }
        if (r == 0) SH->loss[s] = l;
        ok++;
    }
    /* every rank has stepped before any reads its blocks into SH */
    if (ok == STEPS && !collect(p, r)) {
        snprintf(SH->err[r], sizeof SH->err[r], "collect: %s", ts_last_error());
        ok = 0;
    }
    ts_plan_free(p);
    ts_graph_free(g);
    return ok == STEPS ? 0 : 1;
}

static ts_status launch(int n, run_cfg *rc) {
    memset(SH, 0, sizeof *SH);
    for (size_t i = 0; i < MAX_FLOATS; i++) SH->params[i] = NAN; /* a piece nobody wrote shows */
    ts_shm_options o = {0};
    o.timeout_s = 10;
    o.heap_bytes = (size_t)32 << 20;
    o.grace_s = 2;
    return ts_shm_launch(n, &o, worker, rc, NULL);
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d; /* NaN sticks */
    }
    return m;
}

static void compare(int n, int no_clip, int sgd, int no_prefetch) {
    static float w0[MAX_FLOATS];
    static double l0[STEPS];
    run_cfg rc = {0, no_clip, sgd, no_prefetch};
    const char *what = sgd ? "sgd" : no_clip ? "adamw" : "adamw+clip";
    ts_plan_stats st[4];
    int zs[3] = {0, 2, 3};
    for (int zi = 0; zi < 3; zi++) {
        rc.zero = zs[zi];
        ts_status s = launch(n, &rc);
        CHECK(s == TS_OK, "%d ranks, %s, zero %d: %s (rank 0: %s)", n, what, rc.zero,
              ts_last_error(), SH->err[0]);
        if (s != TS_OK) return;
        st[rc.zero] = SH->st;
        if (rc.zero == 0) {
            memcpy(w0, SH->params, sizeof(float) * SH->n_floats);
            memcpy(l0, SH->loss, sizeof l0);
        }
    }
    const size_t nf = SH->n_floats;
    CHECK(nf > 8000, "%d ranks: %zu parameters", n, nf);
    double d0 = max_abs_diff(SH->params, w0, nf);
    if (no_clip)
        CHECK(d0 == 0 && !memcmp(SH->params, w0, sizeof(float) * nf),
              "%d ranks, %s%s: zero 3 vs zero 0: max |dw| %.3g (want the same bits)", n, what,
              no_prefetch ? ", no prefetch" : "", d0);
    else
        CHECK(d0 <= 1e-6, "%d ranks, %s: zero 3 vs zero 0: max |dw| %.3g", n, what, d0);
    /* With clipping the global norm is summed bucket by bucket, and ZeRO-3
     * gives a large tensor a bucket of its own (distribute.c): the
     * coefficient may differ in its last bit, and so the later losses. */
    double dl = 0;
    for (int s = 0; s < STEPS; s++)
        if (fabs(SH->loss[s] - l0[s]) > dl) dl = fabs(SH->loss[s] - l0[s]);
    if (no_clip)
        CHECK(!memcmp(SH->loss, l0, sizeof l0), "%d ranks, %s: zero 3 losses differ from zero 0's",
              n, what);
    else
        CHECK(dl <= 1e-6 && SH->loss[0] == l0[0],
              "%d ranks, %s: zero 3 losses vs zero 0's: max |dl| %.3g", n, what, dl);
    CHECK(SH->read_refused, "reading a gathered parameter is refused naming ZeRO-3");
    /* One or two gathers per bucket and step: ZeRO-3 gives each weight
     * (larger than a bucket) a bucket of its own, and the buckets of the
     * biases are not read by the backward, nor the first layer's weight
     * (no gradient of the input); no bucket is read again after a long gap
     * here. With prefetch most start while the previous one is in flight,
     * without only those of buckets first read by one node together. */
    CHECK(SH->n_rs >= 12 && SH->n_gather >= SH->n_rs + 6 && SH->n_gather <= 2 * SH->n_rs &&
              SH->n_gather_wait == SH->n_gather,
          "%d reduce-scatters, %d gathers, %d gather waits", SH->n_rs, SH->n_gather,
          SH->n_gather_wait);
    if (no_prefetch)
        CHECK(SH->n_prefetched <= 1, "no prefetch: %d gathers started early", SH->n_prefetched);
    else
        CHECK(SH->n_prefetched >= SH->n_gather - 4, "prefetch: %d of %d gathers started early",
              SH->n_prefetched, SH->n_gather);
    /* Memory: the parameters leave the persistent region for the
     * temporaries (all buckets' bytes: ZeRO-0's parameters), of which only
     * a few buckets are alive at once; the blocks are 1/N of them. */
    CHECK(st[3].param_bytes == 0 && st[3].zero_param_bytes == st[0].param_bytes,
          "zero 3: parameter region %zu, gathered buckets %zu (zero 0: %zu)", st[3].param_bytes,
          st[3].zero_param_bytes, st[0].param_bytes);
    /* 13 buckets, each weight alone: with prefetch a weight and the next
     * one's gather in flight at most, without around the loss two */
    CHECK(st[3].zero_param_peak * 4 <= st[3].zero_param_bytes,
          "zero 3: at most %zu of %zu gathered parameter bytes alive", st[3].zero_param_peak,
          st[3].zero_param_bytes);
    /* (ZeRO-2 has fewer buckets: up to 64 bytes of padding per bucket and
     * state tensor apart) */
    CHECK(st[3].state_bytes > st[2].state_bytes &&
              st[3].state_bytes - st[2].state_bytes <=
                  st[0].param_bytes / (size_t)n + 64 * 3 * (size_t)SH->n_rs,
          "zero 3: state %zu, zero 2 %zu: the blocks %zu bytes of %zu parameters on %d ranks",
          st[3].state_bytes, st[2].state_bytes, st[3].state_bytes - st[2].state_bytes,
          st[0].param_bytes, n);
    /* ZeRO-2's arena (its parameters outside it, shared) plus the blocks
     * plus the gathered buckets alive at once, up to the planner's packing
     * of the temporaries around them (1/8 of the parameters). */
    const size_t blocks = st[3].state_bytes - st[2].state_bytes;
    CHECK(st[3].arena_bytes <=
              st[2].arena_bytes + blocks + st[3].zero_param_peak + st[0].param_bytes / 8,
          "%d ranks: arena zero 3 %zu bytes, zero 2 %zu + blocks %zu + gathered %zu", n,
          st[3].arena_bytes, st[2].arena_bytes, blocks, st[3].zero_param_peak);
    CHECK(st[3].arena_bytes < st[0].arena_bytes, "arena zero 3 %zu, zero 0 %zu", st[3].arena_bytes,
          st[0].arena_bytes);
    printf("%d ranks, %s%s: zero 3 = zero 0 %s (max |dw| %.3g); arena %zu / %zu+%zu / %zu "
           "bytes (zero 0/2/3), gathered parameters %zu, at most %zu alive; %d gathers (%d "
           "early)\n",
           n, what, no_prefetch ? ", no prefetch" : "", d0 == 0 ? "bits" : "within rounding", d0,
           st[0].arena_bytes, st[2].arena_bytes, st[2].param_bytes, st[3].arena_bytes,
           st[3].zero_param_bytes, st[3].zero_param_peak, SH->n_gather, SH->n_prefetched);
}

int main(void) {
    SH = mmap(NULL, sizeof *SH, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (SH == MAP_FAILED) return 1;
    for (int n = 2; n <= 4; n++) {
        compare(n, 1, 0, 0);
        compare(n, 0, 0, 0);
        if (n == 3) compare(n, 1, 1, 0);
    }
    compare(2, 1, 0, 1);
    munmap(SH, sizeof *SH);
    return check_summary("dist_zero3");
}
