/* Gradient compression (dist.compress, docs/distributed.md "Gradient
 * compression"): top-k selection against a sort (ties included), the
 * encoding of the sent values and the error-feedback invariant (sent +
 * residual == accumulated gradient, bit for bit) for every value format,
 * the warm-up schedule, PowerSGD's orthonormalisation, the config errors,
 * and the compressed distributed step on 2 and 4 ranks (the sparse
 * all-gather: ranks bit-identical; ratio 1 with f32 values equal to the
 * dense all-reduce; the plan's nodes and their overlap), PowerSGD against
 * the dense run on low-rank gradients, residuals saved on 2 ranks (each
 * its own row) and restored on 2 and 4, and the state's memory (1x the
 * gradients per rank). */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "check.h"
#include "dist/compress.h"
#include "frontend/config.h"

/* ---- selection ---------------------------------------------------------- */

typedef struct ent {
    float mag;
    uint32_t i;
} ent;

static int cmp_ent(const void *a, const void *b) {
    const ent *x = a, *y = b;
    if (x->mag != y->mag) return x->mag > y->mag ? -1 : 1; /* larger first */
    return (x->i > y->i) - (x->i < y->i);                  /* then the lower index */
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The k indices by sorting (magnitude descending, index ascending). */
static void topk_by_sort(const float *x, int64_t n, int64_t k, uint32_t *out) {
    ent *e = malloc(sizeof(ent) * (size_t)n);
    for (int64_t i = 0; i < n; i++) e[i] = (ent){fabsf(x[i]), (uint32_t)i};
    qsort(e, (size_t)n, sizeof *e, cmp_ent);
    for (int64_t j = 0; j < k; j++) out[j] = e[j].i;
    qsort(out, (size_t)k, sizeof *out, cmp_u32);
    free(e);
}

static void check_select(void) {
    static uint32_t hist[2 * TS_TOPK_HIST];
    unsigned seed = 5;
    const int64_t sizes[] = {1, 7, 1000, 70001};
    for (int si = 0; si < 4; si++) {
        const int64_t n = sizes[si];
        float *x = malloc(sizeof(float) * (size_t)n);
        uint32_t *a = malloc(sizeof(uint32_t) * (size_t)n),
                 *b = malloc(sizeof(uint32_t) * (size_t)n);
        for (int trial = 0; trial < 3; trial++) {
            for (int64_t i = 0; i < n; i++) {
                float r = (float)rand_r(&seed) / (float)RAND_MAX - 0.5f;
                /* trial 1: few distinct values (many ties, both signs);
                 * trial 2: values sharing their top 16 bits */
                if (trial == 1) r = (float)(rand_r(&seed) % 7 - 3) * 0.25f;
                if (trial == 2) r = 1.0f + (float)(rand_r(&seed) % 50) * 1e-6f;
                x[i] = r;
            }
            const int64_t ks[] = {1, n / 3 + 1, n};
            for (int ki = 0; ki < 3; ki++) {
                const int64_t k = ks[ki] < 1 ? 1 : ks[ki];
                ts_topk_select(x, n, k, hist, a);
                topk_by_sort(x, n, k, b);
                CHECK(!memcmp(a, b, sizeof(uint32_t) * (size_t)k),
                      "top-%lld of %lld (trial %d) differs from the sort", (long long)k,
                      (long long)n, trial);
            }
        }
        free(x);
        free(a);
        free(b);
    }
}

/* ---- values and the error-feedback invariant ----------------------------- */

static void check_encode(void) {
    enum { N = 5000, K = 400 };
    static float g[N], old[N], acc[N], res[N];
    static uint32_t idx[K], hist[2 * TS_TOPK_HIST];
    static unsigned char payload[8 + K * 8];
    unsigned seed = 11;
    for (int vf = TS_CVAL_E4M3; vf <= TS_CVAL_F32; vf++) {
        for (int i = 0; i < N; i++) {
            /* magnitudes over many binades, so the small sent values fall
             * in E4M3's subnormals (and to zero) against the largest */
            float e = (float)(rand_r(&seed) % 40) - 30.0f;
            g[i] = ((float)rand_r(&seed) / (float)RAND_MAX - 0.5f) * ldexpf(1.0f, (int)e);
            old[i] = ((float)rand_r(&seed) / (float)RAND_MAX - 0.5f) * 1e-3f;
            acc[i] = res[i] = old[i] + g[i];
        }
        ts_topk_select(res, N, K, hist, idx);
        ts_topk_encode(res, idx, K, vf, payload);
        CHECK(ts_topk_payload_k(payload) == K, "payload k");
        static float sent[N];
        memset(sent, 0, sizeof sent);
        int exact = 1, nonzero = 0, close = 1;
        for (int j = 0; j < K; j++) {
            uint32_t i;
            float q;
            ts_topk_decode_at(payload, vf, j, &i, &q);
            CHECK(i == idx[j], "index %d: %u, selected %u", j, i, idx[j]);
            sent[i] = q;
            nonzero += q != 0;
            /* the value's own precision, relative to the bucket's largest */
            const double tol = vf == TS_CVAL_E4M3   ? 0.0625
                               : vf == TS_CVAL_E5M2 ? 0.125
                               : vf == TS_CVAL_BF16 ? 0.004
                                                    : 0;
            if (fabs((double)q - (double)acc[i]) > tol * fabs((double)acc[i]) + 1e-30 && q != 0)
                close = 0;
        }
        for (int i = 0; i < N; i++) {
            float back = sent[i] + res[i];
            if (memcmp(&back, &acc[i], 4)) exact = 0;
        }
        CHECK(exact, "values %d: sent + residual != gradient + old residual somewhere", vf);
        CHECK(close, "values %d: a decoded value is further from its input than the format's step",
              vf);
        CHECK(nonzero > K / 2, "values %d: only %d of %d sent values are non-zero", vf, nonzero, K);
        if (vf == TS_CVAL_F32)
            for (int j = 0; j < K; j++)
                CHECK(res[idx[j]] == 0, "f32 values: the residual keeps nothing that was sent");
    }
    /* E4M3 round trip of exactly representable values with a scale: exact */
    float v[4] = {448.0f, -0.5f, 3.0f, 0.001953125f}; /* 2^-9: E4M3's least subnormal */
    uint32_t id[4] = {0, 1, 2, 3};
    unsigned char p[64];
    float keep[4];
    memcpy(keep, v, sizeof v);
    ts_topk_encode(v, id, 4, TS_CVAL_E4M3, p);
    for (int j = 0; j < 4; j++) {
        uint32_t i;
        float q;
        ts_topk_decode_at(p, TS_CVAL_E4M3, j, &i, &q);
        CHECK(q == keep[j] && v[j] == 0, "e4m3 value %g came back as %g (residual %g)",
              (double)keep[j], (double)q, (double)v[j]);
    }
}

static void check_schedule(void) {
    CHECK(ts_topk_ratio_at(0.001, 0, 1) == 0.001, "no warm-up");
    CHECK(ts_topk_ratio_at(0.001, 100, 1) > 0.2, "warm-up starts near 0.25");
    double prev = 1;
    for (int s = 1; s <= 100; s++) {
        double r = ts_topk_ratio_at(0.001, 100, s);
        CHECK(r <= prev && r >= 0.001, "warm-up falls monotonically");
        prev = r;
    }
    CHECK(fabs(ts_topk_ratio_at(0.001, 100, 100) - 0.001) < 1e-12, "warm-up ends at the ratio");
    CHECK(ts_topk_k(1000000, 0.001) == 1000 && ts_topk_k(10, 0.001) == 1 &&
              ts_topk_k(10, 1.0) == 10,
          "k");
    /* 0.001 with E4M3: 5 bytes per value plus the header, < 1/500 of 4 bytes per element */
    CHECK(ts_topk_payload_bytes(ts_topk_k(3000000, 0.001), TS_CVAL_E4M3) * 500 < 3000000 * 4,
          "bytes at 0.001");
}

static void check_orthonormal(void) {
    enum { N = 50, R = 3 };
    float p[N * R];
    unsigned seed = 3;
    for (int i = 0; i < N * R; i++) p[i] = (float)rand_r(&seed) / (float)RAND_MAX - 0.5f;
    ts_psgd_orthonormalise(p, N, R);
    for (int a = 0; a < R; a++)
        for (int b = 0; b < R; b++) {
            double d = 0;
            for (int i = 0; i < N; i++) d += (double)p[i * R + a] * p[i * R + b];
            CHECK(fabs(d - (a == b)) < 1e-5, "P^T P [%d][%d] = %g", a, b, d);
        }
}

/* ---- config errors -------------------------------------------------------- */

static void expect_config(const char *what, const char **sets, int n, int nranks,
                          const char *frag) {
    ts_config c;
    ts_config_init(&c);
    ts_status s = ts_config_set(&c, "model.preset=w1");
    for (int i = 0; s == TS_OK && i < n; i++) s = ts_config_set(&c, sets[i]);
    if (s == TS_OK) s = ts_config_finish(&c);
    if (s == TS_OK) s = ts_config_check_run(&c, 0, nranks);
    CHECK(s != TS_OK, "%s: accepted", what);
    CHECK(strstr(ts_last_error(), frag), "%s: message '%s' lacks '%s'", what, ts_last_error(),
          frag);
}

static void check_config(void) {
    const char *one[] = {"dist.compress=topk"};
    expect_config("one process", one, 1, 1, "dist.compress");
    const char *r0[] = {"dist.compress=topk", "dist.compress_ratio=0"};
    expect_config("ratio 0", r0, 2, 2, "dist.compress_ratio");
    const char *r2[] = {"dist.compress=topk", "dist.compress_ratio=1.5"};
    expect_config("ratio 1.5", r2, 2, 2, "dist.compress_ratio");
    const char *rk[] = {"dist.compress=powersgd", "dist.compress_rank=0"};
    expect_config("rank 0", rk, 2, 2, "dist.compress_rank");
    const char *bad[] = {"dist.compress=gzip"};
    expect_config("unknown method", bad, 1, 2, "dist.compress");
    const char *z[] = {"dist.compress=topk", "dist.zero=1"};
    expect_config("with ZeRO", z, 2, 2, "dist.zero");
    const char *m[] = {"dist.compress=topk", "dist.compress_momentum=true"};
    expect_config("momentum without sgd", m, 2, 2, "dist.compress_momentum");
    const char *ds[] = {"dist.compress_dense_steps=10"};
    expect_config("dense steps without compression", ds, 1, 2, "dist.compress_dense_steps");
    const char *dn[] = {"dist.compress=powersgd", "dist.compress_dense_steps=-1"};
    expect_config("negative dense steps", dn, 2, 2, "dist.compress_dense_steps");
    const char *mx[] = {"dist.compress=powersgd", "dist.compress_max_elems=-1"};
    expect_config("negative max_elems", mx, 2, 2, "dist.compress_max_elems");
    const char *mk[] = {"dist.compress=topk", "dist.compress_max_elems=1000"};
    expect_config("max_elems with topk", mk, 2, 2, "dist.compress_max_elems");
    const char *pi[] = {"dist.compress=topk", "dist.compress_power_iters=2"};
    expect_config("power iterations with topk", pi, 2, 2, "dist.compress_power_iters");
    const char *p0[] = {"dist.compress=powersgd", "dist.compress_power_iters=0"};
    expect_config("no power iteration", p0, 2, 2, "dist.compress_power_iters");
    const char *p17[] = {"dist.compress=powersgd", "dist.compress_power_iters=17"};
    expect_config("17 power iterations", p17, 2, 2, "dist.compress_power_iters");
    const char *ml[] = {"dist.compress=powersgd", "dist.compress_max_elems=1000"};
    expect_config("max_elems below min_elems", ml, 2, 2, "dist.compress_max_elems");
    ts_config c;
    ts_config_init(&c);
    CHECK_OK(ts_config_set(&c, "model.preset=w1"));
    CHECK_OK(ts_config_set(&c, "dist.compress=topk"));
    CHECK_OK(ts_config_finish(&c));
    CHECK_OK(ts_config_check_run(&c, 0, 2));
    ts_compress_options co;
    ts_config_compress_options(&c, &co);
    CHECK(co.method == TS_COMPRESS_TOPK && co.ratio == 0.001 && co.values == TS_CVAL_E4M3 &&
              co.rank == 4,
          "compile options from the config's defaults");
}

/* ---- the compressed step on 2 and 4 ranks -------------------------------- */

enum { B = 16, WIN = 8, FEAT = 8, IN = WIN * FEAT, HID = 64, STEPS = 4, MAX_FLOATS = 40000 };

typedef struct shared {
    float params[4][MAX_FLOATS];
    float resid[4][4 * MAX_FLOATS]; /* each rank's "compress.bucket0.residual" (save / load) */
    int64_t resid_n;
    size_t state_bytes[4], compress_bytes[4]; /* the plan's state region, the compress.* values */
    size_t param_bytes[4];
    size_t n_floats;
    int steps_ok[4], n_start, n_wait, n_allreduce, overlap_ok;
    ts_compress_stats st[4];
    char err[4][512];
} shared;
static shared *SH;

typedef struct run_cfg {
    ts_graph *g;
    ts_val loss;
    ts_compress_options c;
    int sgd;          /* 1: SGD with momentum 0.9, 2: without; 0: AdamW */
    int rows;         /* global batch (0: B) */
    int steps;        /* 0: STEPS */
    double clip;      /* train.clip_grad_norm (the global clip; 0: none) */
    const char *save; /* run directory: rank 0 saves a checkpoint after the steps */
    const char *load; /* checkpoint to load before the steps (then no steps) */
} run_cfg;

static void batch(int step, float *x, float *y) {
    unsigned seed = 1000u + (unsigned)step;
    for (int i = 0; i < B * IN; i++) x[i] = (float)rand_r(&seed) / (float)RAND_MAX - 0.5f;
    for (int i = 0; i < B; i++) y[i] = (float)rand_r(&seed) / (float)RAND_MAX;
}

static void check_dump(ts_plan *p) {
    char path[] = "/tmp/tessel-compress-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return;
    FILE *f = fdopen(fd, "w+");
    ts_plan_dump(p, TS_DUMP_PLAN, f);
    rewind(f);
    char line[1024];
    int first_start = -1, first_wait = -1, between = 0;
    for (int i = 0; fgets(line, sizeof line, f); i++) {
        if (strstr(line, " compress_start ")) {
            SH->n_start++;
            if (first_start < 0) first_start = i;
        } else if (strstr(line, " compress_wait ")) {
            SH->n_wait++;
            if (first_wait < 0) first_wait = i;
        } else if (strstr(line, " allreduce_")) {
            SH->n_allreduce++;
        } else if (strstr(line, " matmul") && first_start >= 0 && first_wait < 0) {
            between++;
        }
    }
    fclose(f);
    unlink(path);
    SH->overlap_ok = between > 0;
}

static int worker(ts_comm *comm, void *user) {
    const run_cfg *rc = user;
    const int r = ts_comm_rank(comm), n = ts_comm_size(comm);
    const int per = (rc->rows ? rc->rows : B) / n, steps = rc->steps ? rc->steps : STEPS;
    ts_train_spec spec = ts_train_spec_default(rc->loss);
    spec.opt = rc->sgd ? ts_sgd(0.05, rc->sgd == 2 ? 0 : 0.9, 0, 0, 0)
                       : ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01); /* sgd 2: no momentum */
    spec.clip_grad_norm = rc->clip;
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 7;
    opt.threads = 1;
    opt.comm = comm;
    opt.bucket_mb = 16.0 / 1024;
    opt.first_bucket_mb = 4.0 / 1024;
    opt.dist_algo = TS_ALGO_NATIVE;
    opt.compress = rc->c;
    ts_plan *p = NULL;
    if (ts_compile(rc->g, &spec, &opt, &p) != TS_OK) {
        snprintf(SH->err[r], sizeof SH->err[r], "compile: %s", ts_last_error());
        return 1;
    }
    if (r == 0) check_dump(p);
    if (rc->load) {
        int rank;
        int64_t dims[8];
        ts_status ls = ts_ckpt_load(p, rc->load, NULL, NULL);
        if (ls == TS_OK) ls = ts_plan_value_info(p, "compress.bucket0.residual", NULL, &rank, dims);
        if (ls == TS_OK && dims[0] <= 4 * MAX_FLOATS)
            ls = ts_plan_read(p, "compress.bucket0.residual", SH->resid[r],
                              sizeof(float) * (size_t)dims[0]);
        if (ls != TS_OK) snprintf(SH->err[r], sizeof SH->err[r], "load: %s", ts_last_error());
        SH->resid_n = dims[0];
        ts_plan_free(p);
        return ls == TS_OK ? 0 : 1;
    }
    ts_plan_stats pst;
    if (ts_plan_get_stats(p, &pst) == TS_OK) SH->state_bytes[r] = pst.state_bytes;
    for (int i = 0; i < ts_plan_persistent_count(p); i++) {
        ts_persistent pv;
        if (ts_plan_persistent(p, i, &pv) == TS_OK && !strncmp(pv.name, "compress.", 9))
            SH->compress_bytes[r] += pv.bytes;
        else if (ts_plan_persistent(p, i, &pv) == TS_OK && !pv.is_state)
            SH->param_bytes[r] += pv.bytes;
    }
    static float x[B * IN], y[B];
    int ok = 0;
    for (int s = 0; s < steps; s++) {
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
    ts_plan_compress_stats(p, &SH->st[r]);
    if (rc->save && ok == steps) {
        int rank;
        int64_t dims[8];
        ts_status ss = ts_plan_value_info(p, "compress.bucket0.residual", NULL, &rank, dims);
        if (ss == TS_OK && dims[0] <= 4 * MAX_FLOATS)
            ss = ts_plan_read(p, "compress.bucket0.residual", SH->resid[r],
                              sizeof(float) * (size_t)dims[0]);
        SH->resid_n = dims[0];
        /* every rank saves its own rows, as with ZeRO's blocks */
        ts_ckpt_options co = ts_ckpt_options_default();
        co.rank = r;
        co.world = n;
        co.group = 4242;
        co.rank_timeout_s = 60;
        ts_ckpt_saver *sv = NULL;
        ts_ckpt_meta meta = {"x", 1, NULL, 0, 0, 0};
        if (ss == TS_OK) ss = ts_ckpt_saver_new(rc->save, p, &co, &sv);
        if (ss == TS_OK) ss = ts_ckpt_saver_begin(sv, p, &meta);
        if (ss == TS_OK) ss = ts_ckpt_saver_wait(sv);
        ts_ckpt_saver_free(sv);
        if (ss != TS_OK) {
            snprintf(SH->err[r], sizeof SH->err[r], "save: %s", ts_last_error());
            ok = 0;
        }
    }
    size_t k = 0;
    for (int i = 0; i < ts_plan_param_count(p); i++) {
        const char *name = ts_plan_param_name(p, i);
        int rank;
        int64_t dims[8];
        ts_plan_value_info(p, name, NULL, &rank, dims);
        size_t m = 1;
        for (int d = 0; d < rank; d++) m *= (size_t)dims[d];
        if (k + m > MAX_FLOATS) break;
        ts_plan_read(p, name, SH->params[r] + k, m * sizeof(float));
        k += m;
    }
    if (r == 0) SH->n_floats = k;
    ts_plan_free(p);
    return ok == steps ? 0 : 1;
}

static ts_status launch(int n, run_cfg *rc) {
    memset(SH, 0, sizeof *SH);
    ts_shm_options o = {0};
    o.timeout_s = 10;
    o.heap_bytes = (size_t)64 << 20;
    o.grace_s = 2;
    return ts_shm_launch(n, &o, worker, rc, NULL);
}

static ts_graph *mlp(int rows, ts_val *loss) {
    ts_mlp_config mc = {rows, WIN, FEAT, 0, HID, 2, 1, 1, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_mlp(g, &mc, &m));
    *loss = m.loss;
    return g;
}

static void check_step(int n) {
    static float dense[MAX_FLOATS];
    run_cfg rc = {0};
    rc.g = mlp(B / n, &rc.loss);
    /* the dense all-reduce */
    CHECK(launch(n, &rc) == TS_OK, "dense, %d ranks: %s (%s)", n, ts_last_error(), SH->err[0]);
    const size_t nf = SH->n_floats;
    memcpy(dense, SH->params[0], sizeof(float) * nf);
    CHECK(SH->n_start == 0 && SH->n_allreduce > 0, "none: the plan has no compression nodes");
    CHECK(SH->st[0].step == 0, "none: no compression figures");
    /* ratio 1, f32 values: every value sent, summed in rank order as the
     * direct all-reduce does: the same bits */
    rc.c.method = TS_COMPRESS_TOPK;
    rc.c.ratio = 1.0;
    rc.c.values = TS_CVAL_F32;
    CHECK(launch(n, &rc) == TS_OK, "topk 1.0, %d ranks: %s (%s)", n, ts_last_error(), SH->err[0]);
    CHECK(SH->n_floats == nf, "parameter count");
    double d = 0;
    for (size_t i = 0; i < nf; i++) d = fmax(d, fabs((double)SH->params[0][i] - dense[i]));
    CHECK(d == 0, "topk ratio 1 with f32 values vs the dense all-reduce, %d ranks: max |dw| %g", n,
          d);
    CHECK(SH->n_start > 1 && SH->n_start == SH->n_wait && SH->n_allreduce == 0,
          "%d compress_start, %d compress_wait, %d allreduce nodes", SH->n_start, SH->n_wait,
          SH->n_allreduce);
    CHECK(SH->overlap_ok, "backward matmuls run while the first bucket is exchanged");
    /* ratio 0.01, E4M3: ranks bit-identical, the weights moved, bytes counted */
    rc.c.ratio = 0.01;
    rc.c.values = TS_CVAL_E4M3;
    CHECK(launch(n, &rc) == TS_OK, "topk 0.01, %d ranks: %s (%s)", n, ts_last_error(), SH->err[0]);
    for (int r = 1; r < n; r++)
        CHECK(!memcmp(SH->params[0], SH->params[r], sizeof(float) * nf),
              "topk 0.01, %d ranks: rank %d's weights differ from rank 0's", n, r);
    d = 0;
    for (size_t i = 0; i < nf; i++) d = fmax(d, fabs((double)SH->params[0][i] - dense[i]));
    CHECK(d > 0 && d < 0.05, "topk 0.01 moved the weights differently from dense, but not far (%g)",
          d);
    const ts_compress_stats *st = &SH->st[0];
    CHECK(st->step == STEPS && st->dense_bytes > 0 && st->sent_bytes > 0 &&
              st->dense_bytes / st->sent_bytes > 15 && st->recv_bytes == st->sent_bytes * (n - 1) &&
              st->residual_sq > 0,
          "stats: step %lld, dense %g, sent %g, received %g, residual %g", (long long)st->step,
          st->dense_bytes, st->sent_bytes, st->recv_bytes, st->residual_sq);
    /* the dense start: every value in f32 for all the steps, the dense run's bits;
     * for 2 of them, then ratio 0.01 again: not those bits, the ranks alike */
    rc.c.dense_steps = STEPS;
    CHECK(launch(n, &rc) == TS_OK, "topk dense start, %d ranks: %s (%s)", n, ts_last_error(),
          SH->err[0]);
    CHECK(!memcmp(SH->params[0], dense, sizeof(float) * nf),
          "topk with dist.compress_dense_steps %d, %d ranks: the dense run's weights", STEPS, n);
    rc.c.dense_steps = 2;
    CHECK(launch(n, &rc) == TS_OK, "topk 2 dense steps, %d ranks: %s (%s)", n, ts_last_error(),
          SH->err[0]);
    CHECK(memcmp(SH->params[0], dense, sizeof(float) * nf) &&
              !memcmp(SH->params[0], SH->params[n - 1], sizeof(float) * nf),
          "topk after 2 dense steps, %d ranks: compressed, ranks bit-identical", n);
    rc.c.dense_steps = 0;
    /* momentum correction, local clipping and warm-up with SGD */
    rc.sgd = 1;
    rc.c.momentum = 1;
    rc.c.clip = 1.0;
    rc.c.warmup_steps = 3;
    CHECK(launch(n, &rc) == TS_OK, "topk + momentum, %d ranks: %s (%s)", n, ts_last_error(),
          SH->err[0]);
    for (int r = 1; r < n; r++)
        CHECK(!memcmp(SH->params[0], SH->params[r], sizeof(float) * nf),
              "momentum correction, %d ranks: rank %d differs", n, r);
    rc.c.dense_steps = 2; /* the velocity kept through the dense start */
    CHECK(launch(n, &rc) == TS_OK, "topk + momentum, dense start, %d ranks: %s (%s)", n,
          ts_last_error(), SH->err[0]);
    for (int r = 1; r < n; r++)
        CHECK(!memcmp(SH->params[0], SH->params[r], sizeof(float) * nf),
              "momentum correction after a dense start, %d ranks: rank %d differs", n, r);
    rc.c.dense_steps = 0;
    ts_graph_free(rc.g);
}

/* PowerSGD clips locally, before the error feedback (src/passes/compress.c):
 * on rank-4 gradients at rank 4 (exact), each rank's bucket scaled to
 * clip / sqrt(2), so one SGD step moves the weights in proportion to the
 * clip: w(4t) - w(2t) == 2 (w(2t) - w(t)) up to rounding, and not 0 (with
 * the global clip after the exchange, or none, the three runs would
 * agree). train.clip_grad_norm alone gives the same bits as
 * dist.compress_clip: it becomes the local clip. */
static void check_powersgd_clip(run_cfg *rc, const float *dense, size_t nf) {
    static float w[3][MAX_FLOATS];
    const double t = 1e-2;
    for (int i = 0; i < 3; i++) {
        rc->c.clip = t * (double)(1 << i);
        CHECK(launch(2, rc) == TS_OK, "powersgd clip %g: %s (%s)", rc->c.clip, ts_last_error(),
              SH->err[0]);
        memcpy(w[i], SH->params[0], sizeof(float) * nf);
    }
    double d1 = 0, off = 0, far = 0;
    for (size_t j = 0; j < nf; j++) {
        const double a = (double)w[1][j] - w[0][j], b = (double)w[2][j] - w[1][j];
        d1 = fmax(d1, fabs(a));
        off = fmax(off, fabs(b - 2 * a));
        far = fmax(far, fabs((double)w[0][j] - dense[j]));
    }
    CHECK(d1 > 0 && off <= 1e-2 * d1 + 4e-7 && far > 0,
          "powersgd local clip: the step grows with the clip (max |dw| %g, off linear by %g; %g "
          "from the unclipped run)",
          d1, off, far);
    rc->c.clip = 0;
    rc->clip = 2 * t;
    CHECK(launch(2, rc) == TS_OK, "powersgd clip_grad_norm: %s (%s)", ts_last_error(), SH->err[0]);
    CHECK(!memcmp(SH->params[0], w[1], sizeof(float) * nf),
          "powersgd: train.clip_grad_norm %g clips locally, as dist.compress_clip %g does", 2 * t,
          2 * t);
    /* a dense step clips globally, as the uncompressed run: the same bits */
    const ts_compress_method method = rc->c.method;
    rc->c.method = TS_COMPRESS_NONE;
    CHECK(launch(2, rc) == TS_OK, "dense, clip: %s (%s)", ts_last_error(), SH->err[0]);
    memcpy(w[0], SH->params[0], sizeof(float) * nf);
    rc->c.method = method;
    rc->c.dense_steps = 1;
    CHECK(launch(2, rc) == TS_OK, "powersgd dense start, clip: %s (%s)", ts_last_error(),
          SH->err[0]);
    CHECK(!memcmp(SH->params[0], w[0], sizeof(float) * nf) &&
              memcmp(w[0], w[1], sizeof(float) * nf),
          "powersgd's dense step with train.clip_grad_norm %g: the uncompressed run's weights",
          2 * t);
    rc->c.dense_steps = 0;
    rc->clip = 0;
}

/* PowerSGD with momentum correction (each rank's velocity before the
 * compression, the SGD update without momentum): with every gradient
 * below dist.compress_min_elems (sent as it is), the mean of the ranks'
 * velocities is the velocity of the mean gradient, so the run is the dense
 * run with momentum up to rounding, and far from plain SGD (a check that
 * fails if the velocity is dropped or applied twice). Compressed, with a
 * dense start and 4 ranks, the ranks stay bit-identical. */
static void check_powersgd_momentum(void) {
    static float dense[MAX_FLOATS], plain[MAX_FLOATS];
    run_cfg rc = {0};
    rc.g = mlp(B / 2, &rc.loss);
    rc.sgd = 1;
    CHECK(launch(2, &rc) == TS_OK, "dense sgd: %s (%s)", ts_last_error(), SH->err[0]);
    const size_t nf = SH->n_floats;
    memcpy(dense, SH->params[0], sizeof(float) * nf);
    rc.sgd = 2; /* no momentum */
    CHECK(launch(2, &rc) == TS_OK, "plain sgd: %s (%s)", ts_last_error(), SH->err[0]);
    memcpy(plain, SH->params[0], sizeof(float) * nf);
    rc.sgd = 1;
    rc.c.method = TS_COMPRESS_POWERSGD;
    rc.c.rank = 2;
    rc.c.momentum = 1;
    rc.c.min_elems = (int64_t)1 << 40;
    CHECK(launch(2, &rc) == TS_OK, "powersgd + momentum, dense: %s (%s)", ts_last_error(),
          SH->err[0]);
    double d = 0, p = 0;
    for (size_t i = 0; i < nf; i++) {
        d = fmax(d, fabs((double)SH->params[0][i] - dense[i]));
        p = fmax(p, fabs((double)plain[i] - dense[i]));
    }
    CHECK(d < 1e-5 && p > 1e3 * d,
          "powersgd momentum correction, every gradient dense: %g from momentum SGD, which is %g "
          "from plain SGD",
          d, p);
    CHECK(!memcmp(SH->params[0], SH->params[1], sizeof(float) * nf), "ranks bit-identical");
    /* every gradient above dist.compress_max_elems instead: the same dense run, bit for bit */
    static float by_min[MAX_FLOATS];
    memcpy(by_min, SH->params[0], sizeof(float) * nf);
    rc.c.min_elems = 0;
    rc.c.max_elems = 1;
    CHECK(launch(2, &rc) == TS_OK, "powersgd + momentum, max_elems 1: %s (%s)", ts_last_error(),
          SH->err[0]);
    CHECK(!memcmp(SH->params[0], by_min, sizeof(float) * nf),
          "powersgd: every gradient over max_elems is sent dense, as under min_elems");
    rc.c.max_elems = 0;
    ts_graph_free(rc.g);
    rc.g = mlp(B / 4, &rc.loss);
    rc.c.min_elems = 0;
    rc.c.dense_steps = 2;
    CHECK(launch(4, &rc) == TS_OK, "powersgd + momentum, 4 ranks: %s (%s)", ts_last_error(),
          SH->err[0]);
    for (int r = 1; r < 4; r++)
        CHECK(!memcmp(SH->params[0], SH->params[r], sizeof(float) * SH->n_floats),
              "powersgd + momentum, 4 ranks: rank %d differs", r);
    CHECK(SH->st[0].sent_bytes < SH->st[0].dense_bytes, "compressed after the dense start");
    ts_graph_free(rc.g);
}

/* Which shapes PowerSGD compresses: matrices within [min_elems, max_elems] (max 0: no limit)
 * whose view has both sides above r; vectors never. W3's tied embedding [8192, 512] is the one
 * tensor over a max_elems of 2M. */
static void check_psgd_matrix(void) {
    const int64_t emb[2] = {8192, 512}, mlp_w[2] = {2048, 512}, vec[1] = {1 << 20},
                  thin[2] = {4, 512};
    int64_t n, m;
    CHECK(ts_psgd_matrix(2, emb, 65536, 0, 4, &n, &m) && n == 8192 && m == 512, "embedding");
    CHECK(!ts_psgd_matrix(2, emb, 65536, 2 << 20, 4, &n, &m), "embedding over max_elems");
    CHECK(ts_psgd_matrix(2, mlp_w, 65536, 2 << 20, 4, &n, &m), "[2048, 512] under max_elems");
    CHECK(ts_psgd_matrix(2, mlp_w, 0, 2048 * 512, 4, &n, &m), "max_elems is inclusive");
    CHECK(!ts_psgd_matrix(2, mlp_w, 2048 * 512 + 1, 0, 4, &n, &m), "under min_elems");
    CHECK(!ts_psgd_matrix(1, vec, 0, 0, 4, &n, &m), "a vector");
    CHECK(!ts_psgd_matrix(2, thin, 0, 0, 4, &n, &m), "a side not above r");
}

/* PowerSGD on 2 ranks against the dense all-reduce: with 2 rows per rank
 * every weight gradient has rank <= 4 over both ranks, so rank-4 factors
 * reproduce the mean up to rounding (P = M Q spans M's columns, P P^T M =
 * M); rank 1 does not (a check that
 * the comparison can fail). Vectors (biases, norms) go dense. */
static void check_powersgd(void) {
    static float dense[MAX_FLOATS];
    run_cfg rc = {0};
    rc.rows = 4;
    rc.steps = 1;
    rc.sgd = 1;
    rc.g = mlp(2, &rc.loss);
    CHECK(launch(2, &rc) == TS_OK, "dense: %s (%s)", ts_last_error(), SH->err[0]);
    const size_t nf = SH->n_floats;
    memcpy(dense, SH->params[0], sizeof(float) * nf);
    rc.c.method = TS_COMPRESS_POWERSGD;
    rc.c.rank = 4;
    rc.c.min_elems = 0;
    CHECK(launch(2, &rc) == TS_OK, "powersgd: %s (%s)", ts_last_error(), SH->err[0]);
    double d = 0;
    for (size_t i = 0; i < nf; i++) d = fmax(d, fabs((double)SH->params[0][i] - dense[i]));
    CHECK(d < 1e-6, "powersgd rank 4 on rank-4 gradients vs dense: max |dw| %g", d);
    CHECK(!memcmp(SH->params[0], SH->params[1], sizeof(float) * nf), "ranks bit-identical");
    const ts_compress_stats *st = &SH->st[0];
    /* each rank keeps its gradient minus the mean's approximation (not ~0) */
    CHECK(st->step == 1 && st->sent_bytes < st->dense_bytes && st->residual_sq > 0 &&
              isfinite(st->residual_sq),
          "powersgd stats: dense %g, sent %g, residual %g", st->dense_bytes, st->sent_bytes,
          st->residual_sq);
    rc.c.rank = 1;
    CHECK(launch(2, &rc) == TS_OK, "powersgd rank 1: %s (%s)", ts_last_error(), SH->err[0]);
    d = 0;
    for (size_t i = 0; i < nf; i++) d = fmax(d, fabs((double)SH->params[0][i] - dense[i]));
    CHECK(d > 1e-5 && SH->st[0].residual_sq > 1e-6,
          "powersgd rank 1 misses part of rank-4 gradients: max |dw| %g, residual %g", d,
          SH->st[0].residual_sq);
    /* more power iterations a step fit the mean gradient closer to its best rank 1: the
     * energy a rank-1 projection keeps is the power iteration's Rayleigh quotient of M M^T,
     * which never falls from one iteration to the next (a rank-4 M: it still misses) */
    double prev = 0;
    for (int it = 1; it <= 8; it *= 2) {
        rc.c.power_iters = it;
        CHECK(launch(2, &rc) == TS_OK, "powersgd rank 1, %d power iterations: %s (%s)", it,
              ts_last_error(), SH->err[0]);
        double e2 = 0;
        for (size_t i = 0; i < nf; i++) {
            const double dw = (double)SH->params[0][i] - dense[i];
            e2 += dw * dw;
        }
        CHECK(!memcmp(SH->params[0], SH->params[1], sizeof(float) * nf),
              "powersgd, %d power iterations: ranks bit-identical", it);
        CHECK(e2 > 1e-12 && (it == 1 || e2 < prev * (1 - 1e-6)),
              "powersgd rank 1, %d power iterations: |w - dense|^2 %g (%d: %g), falling", it, e2,
              it / 2, prev);
        CHECK(SH->st[0].sent_bytes < SH->st[0].dense_bytes,
              "powersgd, %d power iterations: %g of %g bytes", it, SH->st[0].sent_bytes,
              SH->st[0].dense_bytes);
        prev = e2;
    }
    rc.c.power_iters = 0;
    /* the dense start: step 1 all-reduces dense, the dense run's bits even at rank 1 */
    rc.c.dense_steps = 1;
    CHECK(launch(2, &rc) == TS_OK, "powersgd dense start: %s (%s)", ts_last_error(), SH->err[0]);
    CHECK(!memcmp(SH->params[0], dense, sizeof(float) * nf) &&
              !memcmp(SH->params[1], dense, sizeof(float) * nf),
          "powersgd rank 1 with dist.compress_dense_steps 1: the dense run's weights");
    CHECK(SH->st[0].sent_bytes == SH->st[0].dense_bytes && SH->st[0].residual_sq == 0,
          "a dense step sends every gradient (%g of %g bytes) and keeps no error (%g)",
          SH->st[0].sent_bytes, SH->st[0].dense_bytes, SH->st[0].residual_sq);
    rc.c.dense_steps = 0;
    check_powersgd_clip(&rc, dense, nf);
    check_powersgd_momentum();
    /* several steps, 4 ranks, defaults: ranks stay bit-identical */
    ts_graph_free(rc.g);
    rc.g = mlp(B / 4, &rc.loss);
    rc.rows = 0;
    rc.steps = 0;
    rc.c.rank = 2;
    CHECK(launch(4, &rc) == TS_OK, "powersgd 4 ranks: %s (%s)", ts_last_error(), SH->err[0]);
    for (int r = 1; r < 4; r++)
        CHECK(!memcmp(SH->params[0], SH->params[r], sizeof(float) * SH->n_floats),
              "powersgd 4 ranks: rank %d differs", r);
    rc.c.dense_steps = 2; /* dense, then compressed from step 3 */
    CHECK(launch(4, &rc) == TS_OK, "powersgd 4 ranks, 2 dense steps: %s (%s)", ts_last_error(),
          SH->err[0]);
    for (int r = 1; r < 4; r++)
        CHECK(!memcmp(SH->params[0], SH->params[r], sizeof(float) * SH->n_floats),
              "powersgd 4 ranks after 2 dense steps: rank %d differs", r);
    CHECK(SH->st[0].step == STEPS && SH->st[0].sent_bytes < SH->st[0].dense_bytes,
          "compressed again after the dense steps: %g of %g bytes", SH->st[0].sent_bytes,
          SH->st[0].dense_bytes);
    ts_graph_free(rc.g);
}

/* Residuals saved by 2 ranks (each writes its own row) and restored on
 * 4: every rank's row is the mean of the saved rows ((0 + row 0 + row 1)
 * / 2, as ts_ckpt_restore adds them); restored on 2, each rank gets its
 * own row back, bit for bit. */
static void check_reshard(void) {
    char dir[] = "/tmp/tessel-compress-ckpt-XXXXXX";
    if (!mkdtemp(dir)) return;
    static float saved[2 * 4 * MAX_FLOATS];
    run_cfg rc = {0};
    rc.g = mlp(B / 2, &rc.loss);
    rc.c.method = TS_COMPRESS_TOPK;
    rc.c.ratio = 0.01;
    rc.save = dir;
    CHECK(launch(2, &rc) == TS_OK, "save on 2: %s (%s | %s)", ts_last_error(), SH->err[0],
          SH->err[1]);
    const int64_t n = SH->resid_n;
    CHECK(n > 0 && n <= 4 * MAX_FLOATS, "residual of %lld elements", (long long)n);
    if (!(n > 0 && n <= 4 * MAX_FLOATS)) return;
    memcpy(saved, SH->resid[0], sizeof(float) * (size_t)n);
    memcpy(saved + n, SH->resid[1], sizeof(float) * (size_t)n);
    CHECK(memcmp(saved, saved + n, sizeof(float) * (size_t)n),
          "the two ranks' residuals differ (their data does)");
    char path[128];
    snprintf(path, sizeof path, "%s/step-%08d", dir, STEPS);
    rc.save = NULL;
    rc.load = path;
    CHECK(launch(2, &rc) == TS_OK, "load on 2: %s (%s)", ts_last_error(), SH->err[0]);
    for (int r = 0; r < 2; r++)
        CHECK(SH->resid_n == n && !memcmp(SH->resid[r], saved + r * n, sizeof(float) * (size_t)n),
              "2 -> 2: rank %d gets its own row back", r);
    ts_graph_free(rc.g);
    rc.g = mlp(B / 4, &rc.loss);
    CHECK(launch(4, &rc) == TS_OK, "load on 4: %s (%s)", ts_last_error(), SH->err[0]);
    int same = SH->resid_n == n, nonzero = 0;
    for (int64_t i = 0; i < n && same; i++) {
        float want = 0.0f;
        want += saved[i];
        want += saved[n + i];
        want = want / 2.0f;
        nonzero += want != 0;
        for (int r = 0; r < 4; r++) same &= !memcmp(&SH->resid[r][i], &want, 4);
    }
    CHECK(same && nonzero > 0, "2 -> 4: every rank's row is the mean of the saved rows");
    ts_graph_free(rc.g);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* Memory: each rank holds only its own residual, 1x the gradients (2x
 * with momentum correction's velocity), whatever the rank count; the
 * state region grows by that and no more than alignment. */
static void check_memory(void) {
    run_cfg rc = {0};
    rc.g = mlp(B / 4, &rc.loss);
    rc.steps = 1;
    size_t base = 0;
    CHECK(launch(4, &rc) == TS_OK, "dense on 4: %s (%s)", ts_last_error(), SH->err[0]);
    base = SH->state_bytes[0];
    for (int mom = 0; mom < 2; mom++) {
        rc.sgd = mom;
        if (mom) {
            CHECK(launch(4, &rc) == TS_OK, "dense sgd on 4: %s (%s)", ts_last_error(), SH->err[0]);
            base = SH->state_bytes[0];
        }
        rc.c.method = TS_COMPRESS_TOPK;
        rc.c.ratio = 0.01;
        rc.c.momentum = mom;
        CHECK(launch(4, &rc) == TS_OK, "topk on 4: %s (%s)", ts_last_error(), SH->err[0]);
        for (int r = 0; r < 4; r++) {
            const size_t want = (size_t)(1 + mom) * SH->param_bytes[r];
            CHECK(SH->param_bytes[r] > 0 && SH->compress_bytes[r] == want,
                  "momentum %d, rank %d: compression state %zu bytes, %d x the gradients' %zu", mom,
                  r, SH->compress_bytes[r], 1 + mom, SH->param_bytes[r]);
            CHECK(SH->state_bytes[r] >= base + want && SH->state_bytes[r] <= base + want + 4096,
                  "momentum %d, rank %d: state region %zu bytes, dense %zu + compression %zu", mom,
                  r, SH->state_bytes[r], base, want);
        }
        rc.c.method = TS_COMPRESS_NONE;
        rc.c.momentum = 0;
    }
    ts_graph_free(rc.g);
}

int main(void) {
    check_select();
    check_encode();
    check_schedule();
    check_orthonormal();
    check_config();
    check_psgd_matrix();
    SH = mmap(NULL, sizeof *SH, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (SH == MAP_FAILED) return 1;
    check_step(2);
    check_step(4);
    check_powersgd();
    check_reshard();
    check_memory();
    return check_summary("compress");
}
