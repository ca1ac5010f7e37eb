/* ZeRO-2 (gradients sharded too): on 2, 3 and 4 ranks, with many small
 * buckets and sizes that do not divide by the rank count, the weights
 * equal ZeRO-1's bit for bit and ZeRO-0's (bit for bit without clipping,
 * within float rounding with it); the plan releases each bucket right
 * after its reduce-scatter (waits early, no persistent gradient region, a
 * smaller arena); monitors still see every gradient; reading a released
 * gradient is refused. Also: a shm reduce-scatter lets the caller
 * overwrite its input as soon as it returns, which the early release
 * relies on.
 *
 * Shared parameters (the default on shm): one copy of the parameters for
 * all ranks, updated in place between two barriers, gives the bits of a
 * copy per rank with an all-gather (zero_private_params), for ZeRO-1 (the
 * update averaging the ranks' gradients itself when there is no clipping)
 * and ZeRO-2; the parameters leave the per-process arena.
 *
 * The model: [Linear -> ReLU -> LayerNorm] x 6 -> Linear, MSE, with odd
 * sizes (input 35, hidden 37), AdamW with weight decay, or SGD with
 * Nesterov momentum. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "check.h"
#include "plan/plan.h"

enum { PER = 4, WIN = 5, FEAT = 7, IN = WIN * FEAT, HID = 37, LAYERS = 6, STEPS = 4, MAXR = 4 };
enum { MAX_FLOATS = 12000, MAX_MON = 32 };

typedef struct shared {
    float params[MAXR][MAX_FLOATS];
    size_t n_floats;
    double mon[MAXR][MAX_MON]; /* per rank: every monitor's sum of squares, last step */
    int n_mon;
    ts_plan_stats st; /* rank 0's plan */
    int n_start, n_wait, waits_before_last_start, first_update;
    int n_sync, n_gather;           /* zero_sync and all_gather_start instructions */
    int n_overlapped;               /* waits with compute between them and their start */
    int n_ar_wait, n_ar_overlapped; /* the same for ZeRO-0's all-reduces */
    int read_refused, norm_ok;
    char err[MAXR][512];
    int rs_bad[MAXR]; /* reduce-scatter reuse check: wrong elements per rank */
} shared;

static shared *SH;

typedef struct run_cfg {
    int zero, no_clip, sgd, private_params;
    double bucket_mb, first_mb;
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

/* Counts the collectives in rank 0's plan dump and where they are. */
static void check_dump(ts_plan *p) {
    char path[] = "/tmp/tessel-zero2-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return;
    FILE *f = fdopen(fd, "w+");
    ts_plan_dump(p, TS_DUMP_PLAN, f);
    rewind(f);
    char line[1024], prev[1024] = "";
    int i = 0, last_start = -1, waits_seen = 0;
    SH->first_update = -1;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        if (strstr(line, " reduce_scatter_start ")) {
            SH->n_start++;
            last_start = i;
            SH->waits_before_last_start = waits_seen;
        } else if (strstr(line, " reduce_scatter_wait ")) {
            SH->n_wait++;
            waits_seen++;
            SH->n_overlapped += !strstr(prev, " reduce_scatter_start ");
        } else if (strstr(line, " allreduce_wait ")) {
            SH->n_ar_wait++;
            SH->n_ar_overlapped += !strstr(prev, " allreduce_start ");
        } else if (strstr(line, " zero_sync ")) {
            SH->n_sync++;
        } else if (strstr(line, " all_gather_start ")) {
            SH->n_gather++;
        } else if (strstr(line, " shard_update ") && SH->first_update < 0) {
            SH->first_update = i;
        }
        i++;
        snprintf(prev, sizeof prev, "%s", line);
    }
    (void)last_start;
    fclose(f);
    unlink(path);
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
    opt.bucket_mb = rc->bucket_mb;
    opt.first_bucket_mb = rc->first_mb;
    opt.dist_algo = TS_ALGO_NATIVE;
    opt.zero = rc->zero;
    opt.zero_private_params = rc->private_params;
    opt.monitors = 1;
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
        /* Temporaries carry nothing from one step to the next: NaN them
         * all, so a bucket that relied on what its memory held before (its
         * padding, say) poisons the weights. */
        memset(ts_plan_at(p, p->prog.layout.temp_off), 0xff, p->prog.layout.temp_bytes);
        batch(s, n, x, y);
        if (ts_plan_set_input(p, "x", x + (size_t)r * PER * IN, sizeof(float) * PER * IN) !=
                TS_OK ||
            ts_plan_set_input(p, "y", y + (size_t)r * PER, sizeof(float) * PER) != TS_OK ||
            ts_plan_step(p) != TS_OK) {
            snprintf(SH->err[r], sizeof SH->err[r], "step %d: %s", s, ts_last_error());
            break;
        }
        ok++;
    }
    SH->n_mon = ts_plan_monitor_count(p);
    for (int i = 0; i < SH->n_mon && i < MAX_MON; i++) {
        ts_grad_monitor m;
        if (ts_plan_monitor(p, i, &m) == TS_OK) SH->mon[r][i] = m.sumsq;
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
        if (r == 0 && i == 0) {
            /* A released gradient cannot be read; the norm comes from the
             * monitors. */
            char gname[256];
            snprintf(gname, sizeof gname, "grad:%s", name);
            static float gbuf[MAX_FLOATS];
            ts_status s = ts_plan_read(p, gname, gbuf, e * sizeof(float));
            SH->read_refused = s == TS_ERR_UNSUPPORTED && strstr(ts_last_error(), "ZeRO-2");
            double norm = 0;
            SH->norm_ok = ts_plan_grad_norm(p, &norm) == TS_OK && norm > 0;
        }
        k += e;
    }
    if (r == 0) SH->n_floats = k;
    ts_plan_free(p);
    ts_graph_free(g);
    return ok == STEPS ? 0 : 1;
}

static ts_status launch(int n, int (*fn)(ts_comm *, void *), void *rc) {
    memset(SH, 0, sizeof *SH);
    ts_shm_options o = {0};
    o.timeout_s = 10;
    o.heap_bytes = (size_t)32 << 20;
    o.grace_s = 2;
    return ts_shm_launch(n, &o, fn, rc, NULL);
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d; /* NaN sticks */
    }
    return m;
}

/* ZeRO-1 and ZeRO-2 with a copy of the parameters per rank (all-gather)
 * against the shared copy: the same bits (w1: ZeRO-1 shared, which ZeRO-2
 * shared equals), the parameters back in the arena. */
static void shared_vs_private(int n, run_cfg rc, const char *what, const float *w1,
                              const ts_plan_stats *shared_st) {
    rc.private_params = 1;
    for (int z = 1; z <= 2; z++) {
        rc.zero = z;
        ts_status s = launch(n, worker, &rc);
        CHECK(s == TS_OK, "%d ranks, %s, zero %d, private parameters: %s (rank 0: %s)", n, what, z,
              ts_last_error(), SH->err[0]);
        if (s != TS_OK) return;
        CHECK(!memcmp(SH->params[0], w1, sizeof(float) * SH->n_floats),
              "%d ranks, %s, zero %d: private vs shared parameters: max |dw| %.3g (want the "
              "same bits)",
              n, what, z, max_abs_diff(SH->params[0], w1, SH->n_floats));
        CHECK(SH->n_sync == 0 && SH->n_gather == SH->n_start && SH->n_start > 0,
              "zero %d, private: %d zero_sync, %d all-gathers, %d reduce-scatters", z, SH->n_sync,
              SH->n_gather, SH->n_start);
        /* the fused ZeRO-1 update also needs no gradient shards */
        CHECK(SH->st.shared_param_bytes == 0 &&
                  SH->st.arena_bytes >= shared_st[z].arena_bytes + shared_st[z].param_bytes &&
                  (z == 1 ||
                   SH->st.arena_bytes == shared_st[z].arena_bytes + shared_st[z].param_bytes),
              "zero %d: arena %zu private, %zu + %zu shared", z, SH->st.arena_bytes,
              shared_st[z].arena_bytes, shared_st[z].param_bytes);
    }
}

/* ZeRO-2 against ZeRO-1 and ZeRO-0 on n ranks for one optimizer setting. */
static void compare(int n, int no_clip, int sgd) {
    static float w0[MAX_FLOATS], w1[MAX_FLOATS];
    static double m1[MAX_MON];
    run_cfg rc = {0, no_clip, sgd, 0, 2.0 / 1024, 1.0 / 1024}; /* 2 KiB buckets, the first 1 KiB */
    const char *what = sgd ? "sgd" : no_clip ? "adamw" : "adamw+clip";
    ts_plan_stats st[3];
    int ar_wait = 0, ar_overlapped = 0;
    for (int z = 0; z <= 2; z++) {
        rc.zero = z;
        ts_status s = launch(n, worker, &rc);
        CHECK(s == TS_OK, "%d ranks, %s, zero %d: %s (rank 0: %s)", n, what, z, ts_last_error(),
              SH->err[0]);
        if (s != TS_OK) return;
        st[z] = SH->st;
        for (int r = 1; r < n; r++)
            CHECK(!memcmp(SH->params[0], SH->params[r], sizeof(float) * SH->n_floats),
                  "%d ranks, %s, zero %d: rank %d's weights differ from rank 0's", n, what, z, r);
        if (z == 0) {
            memcpy(w0, SH->params[0], sizeof(float) * SH->n_floats);
            ar_wait = SH->n_ar_wait, ar_overlapped = SH->n_ar_overlapped;
        }
        if (z == 1) {
            memcpy(w1, SH->params[0], sizeof(float) * SH->n_floats);
            memcpy(m1, SH->mon[0], sizeof m1);
            /* shared parameters without clipping: no reduce-scatter, the
             * update reads every rank's gradients */
            CHECK(SH->n_sync == 2 && SH->n_gather == 0 && (SH->n_start == 0) == no_clip,
                  "zero 1, shared, %s: %d zero_sync, %d all-gathers, %d reduce-scatters", what,
                  SH->n_sync, SH->n_gather, SH->n_start);
        }
    }
    const size_t nf = SH->n_floats;
    CHECK(nf > 8000, "%d ranks: %zu parameters", n, nf);
    /* Against ZeRO-1: the same shards, reduced the same way, the same
     * update: the same bits, with or without clipping. */
    CHECK(!memcmp(SH->params[0], w1, sizeof(float) * nf),
          "%d ranks, %s: zero 2 vs zero 1: max |dw| %.3g (want the same bits)", n, what,
          max_abs_diff(SH->params[0], w1, nf));
    double d0 = max_abs_diff(SH->params[0], w0, nf);
    if (no_clip)
        CHECK(d0 == 0, "%d ranks, %s: zero 2 vs zero 0: max |dw| %.3g (want 0)", n, what, d0);
    else
        CHECK(d0 <= 1e-6, "%d ranks, %s: zero 2 vs zero 0: max |dw| %.3g", n, what, d0);
    /* Monitors run before their bucket is released: they read the same
     * (local) gradients as under ZeRO-1. */
    CHECK(SH->n_mon >= 6 && SH->n_mon <= MAX_MON, "%d monitors", SH->n_mon);
    CHECK(!memcmp(SH->mon[0], m1, sizeof(double) * (size_t)SH->n_mon),
          "%d ranks, %s: the gradient monitors differ from ZeRO-1's", n, what);
    CHECK(SH->read_refused, "reading a ZeRO-2 gradient is refused naming ZeRO-2");
    CHECK(SH->norm_ok, "the gradient norm comes from the monitors");
    /* Many buckets; each wait but the last before the last bucket's start
     * (released early), all before the update. */
    CHECK(SH->n_start >= 6 && SH->n_wait == SH->n_start, "%d starts, %d waits (want >= 6)",
          SH->n_start, SH->n_wait);
    CHECK(SH->waits_before_last_start == SH->n_start - 1,
          "%d waits before the last start, want %d (each before the next bucket)",
          SH->waits_before_last_start, SH->n_start - 1);
    CHECK(SH->n_overlapped * 2 >= SH->n_wait, "%d of %d waits right after their start",
          SH->n_wait - SH->n_overlapped, SH->n_wait);
    /* ZeRO-0 with monitors: they run before their bucket's all-reduce
     * starts, so most waits still have compute between them and it. */
    CHECK(ar_wait >= 6 && ar_overlapped * 2 >= ar_wait,
          "zero 0 with monitors: %d of %d all-reduce waits right after their start",
          ar_wait - ar_overlapped, ar_wait);
    /* Memory: no persistent gradient region; the buckets (the same bytes
     * as ZeRO-1's gradient region) are never all alive at once, and the
     * arena shrinks. */
    CHECK(st[2].grad_bytes == 0 && st[1].grad_bytes > 0, "gradient region %zu (zero 1 %zu)",
          st[2].grad_bytes, st[1].grad_bytes);
    CHECK(st[2].zero_grad_bytes == st[1].grad_bytes, "buckets %zu bytes, zero 1 gradients %zu",
          st[2].zero_grad_bytes, st[1].grad_bytes);
    CHECK(st[2].zero_grad_peak * 4 <= st[2].zero_grad_bytes, "at most %zu of %zu bucket bytes live",
          st[2].zero_grad_peak, st[2].zero_grad_bytes);
    CHECK(st[2].arena_bytes + st[1].grad_bytes / 2 <= st[1].arena_bytes,
          "%d ranks: arena zero 2 %zu bytes, zero 1 %zu (gradients %zu)", n, st[2].arena_bytes,
          st[1].arena_bytes, st[1].grad_bytes);
    CHECK(st[0].zero_grad_bytes == 0 && st[1].zero_grad_bytes == 0, "no buckets released below 2");
    /* Shared parameters: outside the arena, updated between two barriers,
     * no all-gather. */
    CHECK(st[0].shared_param_bytes == 0 && st[1].shared_param_bytes == st[1].param_bytes &&
              st[2].shared_param_bytes == st[2].param_bytes && st[2].param_bytes > 0,
          "shared parameters %zu / %zu / %zu bytes (zero 0/1/2)", st[0].shared_param_bytes,
          st[1].shared_param_bytes, st[2].shared_param_bytes);
    CHECK(SH->n_sync == 2 && SH->n_gather == 0, "zero 2, shared: %d zero_sync, %d all-gathers",
          SH->n_sync, SH->n_gather);
    shared_vs_private(n, rc, what, w1, st);
    printf("%d ranks, %s, %d buckets (%d waits overlapped): zero 2 = zero 1 bits, vs zero 0 max "
           "|dw| %.3g; arena "
           "%zu / %zu / %zu bytes (zero 0/1/2), gradients %zu -> 0 persistent (%zu in "
           "buckets, at most %zu live, shards %zu)\n",
           n, what, SH->n_start, SH->n_overlapped, d0, st[0].arena_bytes, st[1].arena_bytes,
           st[2].arena_bytes, st[1].grad_bytes, st[2].zero_grad_bytes, st[2].zero_grad_peak,
           st[2].zero_shard_bytes);
}

/* The guarantee the release needs: once a rank's reduce-scatter returned,
 * it may overwrite its input at once without changing any peer's result.
 * Each round every rank fills its input, reduce-scatters it, and scribbles
 * over it right away; without the final barrier of the direct algorithm a
 * fast rank's scribbles would reach a slower peer's sums. */
static int rs_reuse_worker(ts_comm *c, void *user) {
    (void)user;
    const int r = ts_comm_rank(c), n = ts_comm_size(c);
    enum { COUNT = 300007, ROUNDS = 12 };
    float *send = ts_comm_alloc(c, sizeof(float) * COUNT);
    float *recv = ts_comm_alloc(c, sizeof(float) * (COUNT / 2 + 1));
    if (!send || !recv) return 1;
    int bad = 0;
    for (int k = 0; k < ROUNDS && !bad; k++) {
        for (size_t i = 0; i < COUNT; i++)
            send[i] = (float)((i + (size_t)k) % 1000) * (float)(r + 1);
        if (ts_reduce_scatter(c, send, recv, COUNT, TS_F32, TS_RED_SUM, TS_ALGO_NATIVE) != TS_OK) {
            snprintf(SH->err[r], sizeof SH->err[r], "%s", ts_last_error());
            return 1;
        }
        for (size_t i = 0; i < COUNT; i++) send[i] = 1e30f; /* reused at once */
        size_t off, len;
        ts_comm_block(COUNT, n, r, &off, &len);
        const float ranks = (float)(n * (n + 1) / 2);
        for (size_t i = 0; i < len; i++)
            if (recv[i] != (float)((off + i + (size_t)k) % 1000) * ranks) bad++;
    }
    SH->rs_bad[r] = bad;
    ts_comm_free(c, send);
    ts_comm_free(c, recv);
    return bad ? 1 : 0;
}

int main(void) {
    SH = mmap(NULL, sizeof *SH, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (SH == MAP_FAILED) return 1;
    for (int n = 2; n <= 4; n++) {
        ts_status s = launch(n, rs_reuse_worker, NULL);
        CHECK(s == TS_OK, "%d ranks: reduce-scatter then overwrite: %s (%s)", n, ts_last_error(),
              SH->err[0]);
        for (int r = 0; r < n; r++)
            CHECK(SH->rs_bad[r] == 0, "%d ranks: rank %d got %d wrong sums", n, r, SH->rs_bad[r]);
    }
    for (int n = 2; n <= 4; n++) {
        compare(n, 1, 0);
        compare(n, 0, 0);
        if (n == 3) compare(n, 1, 1);
    }
    munmap(SH, sizeof *SH);
    return check_summary("dist_zero2");
}
