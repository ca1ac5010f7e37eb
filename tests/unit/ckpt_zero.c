/* Checkpoints of sharded optimizer state (ZeRO): the loader's assembly of
 * logical tensors from flat chunks (out of order, uneven blocks, padding
 * inside a file's tensor, a range across chunks; overlaps, gaps and chunks
 * beyond their file's tensor refused; a flipped byte named by file and
 * tensor), the plan's shard layout (every parameter's state tiled by the
 * ranks' blocks, blocks cutting across parameters, padding), and N -> M:
 * a checkpoint saved by 2 ZeRO ranks after 3 AdamW steps, loaded into 3
 * and 4 ZeRO ranks and into one process and saved again without a step,
 * holds the same bytes in every logical tensor. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "ckpt/ckpt_internal.h"
#include "ckpt/safetensors.h"
#include "core/crc32c.h"
#include "tessel/ckpt.h"

static char root[256];

static const char *at(const char *rel) {
    static char buf[4][600];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", root, rel);
    return buf[k];
}

/* ---- assembly from hand-made chunks ----------------------------------------- */

/* The logical tensors: w.exp_avg f32 [3, 5] and b.exp_avg f32 [4]. Rank 0's
 * block Z0 (10 elements): w[0..7), one padding element, b[0..2). Rank 1's
 * block Z1 (12): w[7..15), two padding elements, b[2..4). */
static float W[15], Bv[4];

static void write_blocks(void) {
    for (int i = 0; i < 15; i++) W[i] = (float)i + 0.5f;
    for (int i = 0; i < 4; i++) Bv[i] = -1.0f - (float)i;
    float z0[10] = {0}, z1[12] = {0};
    memcpy(z0, W, 7 * sizeof(float));
    memcpy(z0 + 8, Bv, 2 * sizeof(float));
    memcpy(z1, W + 7, 8 * sizeof(float));
    memcpy(z1 + 10, Bv + 2, 2 * sizeof(float));
    const float *z[2] = {z0, z1};
    const int64_t len[2] = {10, 12};
    for (int r = 0; r < 2; r++) {
        ts_st_writer *w;
        CHECK_OK(ts_st_writer_new(&w));
        char name[32];
        snprintf(name, sizeof name, "zero.bucket0.r%d", r);
        CHECK_OK(ts_st_writer_add(w, name, TS_F32, 1, &len[r], z[r]));
        char file[64];
        snprintf(file, sizeof file, "ck/optim-r%d-000.safetensors", r);
        CHECK_OK(ts_st_writer_save(w, at(file)));
        ts_st_writer_free(w);
    }
}

typedef struct flat {
    int rank;
    int64_t start, count, file_start;
    const float *src; /* the chunk's data, for its CRC */
} flat;

static void chunk_json(FILE *f, const flat *c, int last) {
    fprintf(f,
            "{\"file\":\"optim-r%d-000.safetensors\",\"rank\":%d,\"tensor\":\"zero.bucket0.r%d\","
            "\"start\":%lld,\"count\":%lld,\"file_start\":%lld,\"crc32c\":\"%08x\"}%s",
            c->rank, c->rank, c->rank, (long long)c->start, (long long)c->count,
            (long long)c->file_start, ts_crc32c(0, c->src, (size_t)c->count * sizeof(float)),
            last ? "" : ",");
}

/* The manifest with w's chunks as given (b's always right). */
static void write_manifest(const flat *wc, int nw) {
    FILE *f = fopen(at("ck/manifest.json"), "w");
    CHECK(f != NULL, "manifest");
    if (!f) return;
    fprintf(f, "{\"format\":\"tessel-checkpoint\",\"format_version\":2,\"id\":\"x\",\"step\":3,"
               "\"time\":\"t\",\"tessel_version\":\"v\",\"config_sha256\":\"\","
               "\"rng\":{\"seed\":\"7\"},\"data\":{\"files\":[],\"position\":0,\"epoch\":0},"
               "\"world\":{\"size\":2,\"layout\":\"zero\"},\"files\":[");
    for (int r = 0; r < 2; r++) {
        char file[64], sha[65];
        snprintf(file, sizeof file, "ck/optim-r%d-000.safetensors", r);
        CHECK_OK(ts_sha256_file(at(file), sha));
        struct stat st;
        long len = stat(at(file), &st) == 0 ? (long)st.st_size : -1;
        fprintf(f,
                "{\"name\":\"optim-r%d-000.safetensors\",\"rank\":%d,\"bytes\":%ld,"
                "\"sha256\":\"%s\"}%s",
                r, r, len, sha, r ? "" : ",");
    }
    fprintf(f, "],\"tensors\":[{\"name\":\"w.exp_avg\",\"kind\":\"state\",\"dtype\":\"f32\","
               "\"shape\":[3,5],\"chunks\":[");
    for (int i = 0; i < nw; i++) chunk_json(f, &wc[i], i == nw - 1);
    fprintf(f, "]},{\"name\":\"b.exp_avg\",\"kind\":\"state\",\"dtype\":\"f32\",\"shape\":[4],"
               "\"chunks\":[");
    flat b0 = {0, 0, 2, 8, Bv}, b1 = {1, 2, 2, 10, Bv + 2};
    chunk_json(f, &b0, 0);
    chunk_json(f, &b1, 1);
    fprintf(f, "]}]}\n");
    fclose(f);
}

static void expect_refused(const flat *wc, int nw, const char *what, const char *want) {
    write_manifest(wc, nw);
    ts_ckpt *c = NULL;
    ts_status s = ts_ckpt_open(at("ck"), NULL, NULL, &c);
    CHECK(s != TS_OK && strstr(ts_last_error(), want), "%s: %s (want '%s')", what,
          s == TS_OK ? "accepted" : ts_last_error(), want);
    ts_ckpt_close(c);
}

static void test_assembly(void) {
    CHECK(mkdir(at("ck"), 0755) == 0, "mkdir");
    write_blocks();
    /* rank 1's chunk listed first: the order in the manifest is free */
    flat good[2] = {{1, 7, 8, 0, W + 7}, {0, 0, 7, 0, W}};
    write_manifest(good, 2);
    ts_ckpt *c = NULL;
    CHECK_OK(ts_ckpt_open(at("ck"), NULL, NULL, &c));
    if (c) {
        float w[15], b[4], part[6];
        CHECK_OK(ts_ckpt_read(c, "w.exp_avg", w, sizeof w));
        CHECK(!memcmp(w, W, sizeof w), "w assembled from two ranks' blocks");
        CHECK_OK(ts_ckpt_read(c, "b.exp_avg", b, sizeof b));
        CHECK(!memcmp(b, Bv, sizeof b), "b assembled past the padding");
        CHECK_OK(ts_ckpt_read_range(c, "w.exp_avg", 5, 6, part));
        CHECK(!memcmp(part, W + 5, sizeof part), "a range across the two chunks");
        CHECK(ts_ckpt_read_range(c, "w.exp_avg", 10, 6, part) == TS_ERR_INVALID,
              "a range past the end is refused");
        ts_ckpt_info in;
        ts_ckpt_tensor ti;
        ts_ckpt_chunk ch;
        CHECK_OK(ts_ckpt_get_info(c, &in));
        CHECK(in.world_size == 2 && !strcmp(in.layout, "zero"), "world %d layout %s", in.world_size,
              in.layout);
        CHECK_OK(ts_ckpt_tensor_info(c, 0, &ti));
        CHECK_OK(ts_ckpt_chunk_info(c, 0, 1, &ch));
        CHECK(ti.n_chunks == 2 && ch.start == 7 && ch.count == 8 &&
                  !strcmp(ch.file, "optim-r1-000.safetensors") &&
                  !strcmp(ch.tensor, "zero.bucket0.r1"),
              "chunk info: %d chunks, [%lld, +%lld) in %s", ti.n_chunks, (long long)ch.start,
              (long long)ch.count, ch.file);
        ts_ckpt_close(c);
    }
    flat overlap[2] = {{0, 0, 7, 0, W}, {1, 6, 9, 0, W + 6}};
    expect_refused(overlap, 2, "overlapping chunks", "chunks overlap at element 6");
    flat gap[2] = {{0, 0, 7, 0, W}, {1, 8, 7, 0, W + 8}};
    expect_refused(gap, 2, "a gap", "no chunk holds elements [7, 8)");
    flat beyond[2] = {{0, 0, 7, 0, W}, {1, 7, 8, 5, W + 7}};
    expect_refused(beyond, 2, "a chunk beyond its file's tensor", "different dtype or shape");
    /* A flipped byte in rank 1's block: the file and the logical tensor. */
    write_manifest(good, 2);
    FILE *f = fopen(at("ck/optim-r1-000.safetensors"), "r+b");
    CHECK(f != NULL, "open shard");
    if (f) {
        fseek(f, -30, SEEK_END);
        int ch = fgetc(f);
        fseek(f, -30, SEEK_END);
        fputc(ch ^ 0x10, f);
        fclose(f);
    }
    ts_ckpt *bad = NULL;
    ts_status s = ts_ckpt_open(at("ck"), NULL, NULL, &bad);
    CHECK(s != TS_OK && strstr(ts_last_error(), "optim-r1-000.safetensors: tensor 'w.exp_avg' "
                                                "fails its CRC-32C"),
          "flipped byte: %s", s == TS_OK ? "accepted" : ts_last_error());
    ts_ckpt_close(bad);
}

/* ---- the rank-K.json handshake ---------------------------------------------- */

/* Rank 0 takes only this save's files (group and step), and names the
 * ranks it still misses when it gives up. */
static void test_handshake(void) {
    const char *d = at("hs");
    CHECK(mkdir(d, 0755) == 0, "mkdir");
    ck_zset own = {0}, got = {0};
    CHECK_OK(ck_zset_add_file(&own, "optim-r1-000.safetensors", 128,
                              "0000000000000000000000000000000000000000000000000000000000000000",
                              1));
    ck_zchunk c = {0};
    c.name = "w.exp_avg";
    c.dtype = TS_F32;
    c.ndim = 1;
    c.dims[0] = 15;
    c.file = "optim-r1-000.safetensors";
    c.tensor = "zero.bucket0.exp_avg";
    c.start = 7;
    c.count = 8;
    c.crc = 0x1234abcd;
    c.rank = 1;
    CHECK_OK(ck_zset_add_chunk(&own, &c));
    /* an earlier launch's leftover for the same step */
    CHECK_OK(ck_rank_publish(d, 1, 3, 111, 4, &own));
    ts_status s = ck_rank_collect(d, 3, 222, 4, 0.2, NULL, &got);
    CHECK(s != TS_OK && strstr(ts_last_error(), "ranks 1, 2 of 3 did not publish"),
          "stale rank-1.json: %s", s == TS_OK ? "taken" : ts_last_error());
    ck_zset_free(&got);
    CHECK_OK(ck_rank_publish(d, 1, 3, 222, 4, &own));
    s = ck_rank_collect(d, 3, 222, 4, 0.2, NULL, &got);
    CHECK(s != TS_OK && strstr(ts_last_error(), "rank 2 of 3 did not publish its shards"),
          "rank 2 missing: %s", s == TS_OK ? "taken" : ts_last_error());
    CHECK(got.nc == 1 && got.c[0].start == 7 && got.c[0].count == 8 && got.c[0].crc == 0x1234abcd &&
              !strcmp(got.c[0].tensor, "zero.bucket0.exp_avg") && got.nf == 1 && got.f[0].rank == 1,
          "rank 1's chunk read back: %d chunks", got.nc);
    ck_zset_free(&got);
    /* a run that failed stops waiting at once */
    atomic_int cancel = 1;
    double t0 = ts_now();
    s = ck_rank_collect(d, 3, 222, 4, 30, &cancel, &got);
    CHECK(s != TS_OK && strstr(ts_last_error(), "abandoned") && ts_now() - t0 < 5,
          "cancelled: %s after %.1f s", s == TS_OK ? "taken" : ts_last_error(), ts_now() - t0);
    ck_zset_free(&got);
    ck_zset_free(&own);
}

/* ---- plans: layout and N -> M ---------------------------------------------- */

enum { B = 12, WIN = 4, FEAT = 5, HID = 21, STEPS = 3, MAXPC = 256 };

typedef struct piece {
    int param; /* index among the plan's parameters */
    char what[16];
    int64_t param_off, count, state_off, state_len;
    int bucket;
} piece;

typedef struct shared {
    piece pc[4][MAXPC];
    int npc[4];
    int64_t numel[64]; /* per parameter */
    int nparams;
    char err[4][512];
} shared;

static shared *SH;

typedef struct job {
    int n;
    const char *load, *save; /* checkpoint to restore (NULL: none); run directory to save into */
    int steps;
    uint64_t group;
} job;

static ts_graph *mlp(int rows, ts_val *loss) {
    ts_mlp_config mc = {rows, WIN, FEAT, 0, HID, 2, 1, 1, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_mlp(g, &mc, &m));
    *loss = m.loss;
    return g;
}

static void batch(int step, float *x, float *y) {
    unsigned seed = 50u + (unsigned)step;
    for (int i = 0; i < B * WIN * FEAT; i++) x[i] = (float)rand_r(&seed) / (float)RAND_MAX - 0.5f;
    for (int i = 0; i < B; i++) y[i] = (float)rand_r(&seed) / (float)RAND_MAX;
}

static int param_index(const ts_plan *p, const char *name) {
    for (int i = 0; i < ts_plan_param_count(p); i++)
        if (!strcmp(ts_plan_param_name(p, i), name)) return i;
    return -1;
}

/* One rank (comm NULL: one process, no ZeRO): compile, restore, train,
 * record the layout, save. */
static int run(ts_comm *comm, const job *jb) {
    const int r = comm ? ts_comm_rank(comm) : 0, n = comm ? ts_comm_size(comm) : 1;
    ts_val loss;
    ts_graph *g = mlp(B / n, &loss);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_adamw(1e-2, 0.9, 0.999, 1e-8, 0.01);
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 7;
    opt.threads = 1;
    opt.comm = comm;
    opt.dist_algo = TS_ALGO_NATIVE;
    opt.zero = comm != NULL;
    /* Several buckets (the first about 1 KiB): blocks cut across parameters. */
    opt.bucket_mb = 2.0 / 1024;
    opt.first_bucket_mb = 1.0 / 1024;
    ts_plan *p = NULL;
    ts_status s = ts_compile(g, &spec, &opt, &p);
    if (s == TS_OK && jb->load) s = ts_ckpt_load(p, jb->load, NULL, NULL);
    static float x[B * WIN * FEAT], y[B];
    const int per = B / n;
    for (int k = 0; k < jb->steps && s == TS_OK; k++) {
        batch(k, x, y);
        s = ts_plan_set_input(p, "x", x + (size_t)r * per * WIN * FEAT,
                              sizeof(float) * (size_t)per * WIN * FEAT);
        if (s == TS_OK) s = ts_plan_set_input(p, "y", y + (size_t)r * per, sizeof(float) * per);
        if (s == TS_OK) s = ts_plan_step(p);
    }
    ts_shard_piece *pc = NULL;
    int npc = 0;
    if (s == TS_OK) s = ts_plan_shard_layout(p, &pc, &npc);
    for (int i = 0; s == TS_OK && i < npc && i < MAXPC; i++) {
        piece *q = &SH->pc[r][i];
        int64_t dims[8];
        int rank;
        ts_dtype dt;
        q->param = param_index(p, pc[i].param);
        snprintf(q->what, sizeof q->what, "%s", pc[i].what);
        q->param_off = pc[i].param_off;
        q->count = pc[i].count;
        q->state_off = pc[i].state_off;
        q->bucket = atoi(pc[i].state + strlen("zero.bucket"));
        s = ts_plan_value_info(p, pc[i].state, &dt, &rank, dims);
        q->state_len = dims[0];
    }
    SH->npc[r] = npc;
    free(pc);
    if (s == TS_OK && r == 0) {
        SH->nparams = ts_plan_param_count(p);
        for (int i = 0; i < SH->nparams && i < 64; i++) {
            int64_t dims[8];
            int rank;
            ts_dtype dt;
            ts_plan_value_info(p, ts_plan_param_name(p, i), &dt, &rank, dims);
            SH->numel[i] = 1;
            for (int d = 0; d < rank; d++) SH->numel[i] *= dims[d];
        }
    }
    if (s == TS_OK && jb->save) {
        ts_ckpt_options o = ts_ckpt_options_default();
        o.rank = r;
        o.world = n;
        o.group = jb->group;
        o.rank_timeout_s = 20;
        ts_ckpt_saver *sv = NULL;
        s = ts_ckpt_saver_new(jb->save, p, &o, &sv);
        if (s == TS_OK) s = ts_ckpt_saver_begin(sv, p, NULL);
        if (s == TS_OK) s = ts_ckpt_saver_wait(sv);
        ts_ckpt_saver_free(sv);
    }
    if (s != TS_OK) snprintf(SH->err[r], sizeof SH->err[r], "%s", ts_last_error());
    ts_plan_free(p);
    ts_graph_free(g);
    return s == TS_OK ? 0 : 1;
}

static int worker(ts_comm *comm, void *user) {
    return run(comm, user);
}

static ts_status launch(job *jb) {
    memset(SH, 0, sizeof *SH);
    jb->group = (uint64_t)rand() << 20 | (uint64_t)jb->n;
    /* Rank 0 makes the run directory before training, as tessel train
     * does; ranks > 0 never create it. */
    if (jb->save) CHECK(mkdir(jb->save, 0755) == 0, "mkdir %s", jb->save);
    if (jb->n == 1) return run(NULL, jb) ? TS_ERR_INTERNAL : TS_OK;
    ts_shm_options o = {0};
    o.timeout_s = 20;
    o.heap_bytes = (size_t)64 << 20;
    o.grace_s = 2;
    return ts_shm_launch(jb->n, &o, worker, jb, NULL);
}

/* Over all ranks, every (parameter, what) is tiled by the pieces; some
 * block holds pieces of two parameters, some holds padding, and blocks of
 * one bucket differ in length (uneven split). */
static void check_layout(int n) {
    int crosses = 0, padding = 0, uneven = 0;
    for (int pi = 0; pi < SH->nparams; pi++) {
        static const char *const whats[2] = {"exp_avg", "exp_avg_sq"};
        for (int w = 0; w < 2; w++) {
            int64_t covered = 0;
            char *mark = calloc((size_t)SH->numel[pi], 1);
            for (int r = 0; r < n; r++)
                for (int i = 0; i < SH->npc[r]; i++) {
                    const piece *q = &SH->pc[r][i];
                    if (q->param != pi || strcmp(q->what, whats[w])) continue;
                    for (int64_t e = q->param_off; e < q->param_off + q->count; e++) {
                        CHECK(!mark[e], "%d ranks: element %lld of parameter %d held twice", n,
                              (long long)e, pi);
                        mark[e] = 1;
                    }
                    covered += q->count;
                }
            free(mark);
            CHECK(covered == SH->numel[pi], "%d ranks: parameter %d %s: %lld of %lld elements", n,
                  pi, whats[w], (long long)covered, (long long)SH->numel[pi]);
        }
    }
    for (int r = 0; r < n; r++)
        for (int i = 0; i < SH->npc[r]; i++) {
            const piece *q = &SH->pc[r][i];
            int64_t held = 0, params = 0;
            for (int j = 0; j < SH->npc[r]; j++) {
                const piece *o = &SH->pc[r][j];
                if (o->bucket != q->bucket || strcmp(o->what, q->what)) continue;
                held += o->count;
                params++;
            }
            crosses |= params > 1;
            padding |= held < q->state_len;
            for (int r2 = 0; r2 < n; r2++)
                for (int j = 0; j < SH->npc[r2]; j++)
                    uneven |= SH->pc[r2][j].bucket == q->bucket &&
                              SH->pc[r2][j].state_len != q->state_len;
        }
    CHECK(crosses && padding, "%d ranks: a block across parameters (%d), padding (%d)", n, crosses,
          padding);
    if (n == 3) CHECK(uneven, "3 ranks: no bucket split unevenly");
}

static void same_tensors(const char *a, const char *b) {
    ts_ckpt *ca = NULL, *cb = NULL;
    CHECK_OK(ts_ckpt_open(a, NULL, NULL, &ca));
    CHECK_OK(ts_ckpt_open(b, NULL, NULL, &cb));
    if (!ca || !cb) {
        ts_ckpt_close(ca);
        ts_ckpt_close(cb);
        return;
    }
    CHECK(ts_ckpt_tensor_count(ca) == ts_ckpt_tensor_count(cb), "%s: %d tensors, %s: %d", a,
          ts_ckpt_tensor_count(ca), b, ts_ckpt_tensor_count(cb));
    int same = 0;
    for (int i = 0; i < ts_ckpt_tensor_count(ca); i++) {
        ts_ckpt_tensor t;
        CHECK_OK(ts_ckpt_tensor_info(ca, i, &t));
        void *x = malloc(t.bytes), *y = malloc(t.bytes);
        CHECK_OK(ts_ckpt_read(ca, t.name, x, t.bytes));
        ts_status s = ts_ckpt_read(cb, t.name, y, t.bytes);
        CHECK(s == TS_OK && !memcmp(x, y, t.bytes), "%s vs %s: tensor '%s' differs", a, b, t.name);
        same += s == TS_OK && !memcmp(x, y, t.bytes);
        free(x);
        free(y);
    }
    printf("%s = %s: %d logical tensors identical\n", a, b, same);
    ts_ckpt_close(ca);
    ts_ckpt_close(cb);
}

static void test_n_to_m(void) {
    job save2 = {2, NULL, at("r2"), STEPS, 0};
    ts_status s = launch(&save2);
    CHECK(s == TS_OK, "save on 2 ranks: %s (%s / %s)", ts_last_error(), SH->err[0], SH->err[1]);
    check_layout(2);
    ts_ckpt *c = NULL;
    CHECK_OK(ts_ckpt_open(at("r2"), NULL, NULL, &c));
    if (c) {
        ts_ckpt_info in;
        ts_ckpt_get_info(c, &in);
        CHECK(in.world_size == 2 && !strcmp(in.layout, "zero") && in.step == STEPS,
              "2 ranks: world %d, layout %s, step %lld", in.world_size, in.layout,
              (long long)in.step);
        ts_ckpt_close(c);
    }
    const int ms[3] = {3, 4, 1};
    for (int k = 0; k < 3; k++) {
        char dir[32];
        snprintf(dir, sizeof dir, "m%d", ms[k]);
        job j = {ms[k], at("r2"), at(dir), 0, 0};
        s = launch(&j);
        CHECK(s == TS_OK, "load on %d: %s (%s)", ms[k], ts_last_error(), SH->err[0]);
        if (ms[k] > 1) check_layout(ms[k]);
        same_tensors(at("r2"), at(dir));
    }
    /* And back: the single process's checkpoint onto 2 ZeRO ranks. */
    job back = {2, at("m1"), at("b2"), 0, 0};
    s = launch(&back);
    CHECK(s == TS_OK, "1 -> 2: %s (%s)", ts_last_error(), SH->err[0]);
    same_tensors(at("m1"), at("b2"));
}

int main(void) {
    SH = mmap(NULL, sizeof *SH, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (SH == MAP_FAILED) return 1;
    snprintf(root, sizeof root, "/tmp/tessel-ckpt-zero-XXXXXX");
    CHECK(mkdtemp(root) != NULL, "temporary directory");
    srand((unsigned)getpid());
    test_assembly();
    test_handshake();
    test_n_to_m();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (!check_failed && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    munmap(SH, sizeof *SH);
    return check_summary("unit/ckpt_zero");
}
