/* stages.c — pipeline stages train to the same bits as one process: a
 * small GPT (tied LM head: a parameter two stages share) and an MLP, on 2
 * and 4 stages, GPipe and 1F1B, 1..8 micro-batches, against one process
 * that sums the same micro-batches' gradients in dist.reproducible's fixed
 * tree (and, for one micro-batch, against a plain step); and a stage that
 * dies is named by the stage waiting for it. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "dist/repro_sum.h"
#include "plan/micro.h"
#include "plan/plan.h"
#include "plan/stages.h"
#include "session/stages.h"

enum { STEPS = 3, B = 8 };

static const char *const GPT = "model:\n  name: gpt\n  batch: 8\n  ctx: 8\n  vocab: 32\n"
                               "  d_model: 16\n  n_layers: 4\n  n_heads: 2\n"
                               "train:\n  optimizer: adamw\n  lr: 0.01\n  weight_decay: 0.1\n"
                               "  seed: 3\n  threads: 1\n";
static const char *const DROP = "model:\n  name: gpt\n  batch: 8\n  ctx: 8\n  vocab: 32\n"
                                "  d_model: 16\n  n_layers: 2\n  n_heads: 2\n  dropout: 0.2\n"
                                "train:\n  optimizer: adam\n  lr: 0.01\n  seed: 4\n  threads: 1\n";
static const char *const MLP =
    "model:\n  name: mlp\n  batch: 8\n  window: 0\n  in_dim: 12\n  hidden: 16\n"
    "  n_hidden: 3\n  out_dim: 4\n"
    "train:\n  optimizer: sgd\n  lr: 0.05\n  momentum: 0.9\n  seed: 5\n  threads: 1\n";

typedef struct job {
    const char *yaml;
    int S, M, gpipe, die; /* die: the rank that exits at step 2 (-1: none) */
    const char *ckpt;     /* kill and resume: steps 0..1, save, exit; then load, step 2 */
    int phase;            /* 1: the run that saves, 2: the one that resumes */
} job;

static char devfile[96];

static ts_status config(ts_config *c, const job *j, int stages) {
    ts_config_init(c);
    char set[3][64];
    snprintf(set[0], sizeof set[0], "dist.pipeline_stages=%d", stages);
    snprintf(set[1], sizeof set[1], "dist.microbatches=%d", j->M);
    snprintf(set[2], sizeof set[2], "dist.pipeline_schedule=%s", j->gpipe ? "gpipe" : "1f1b");
    ts_status s = ts_config_load_string(c, j->yaml, strlen(j->yaml), "t.yaml");
    for (int i = 0; i < 3 && s == TS_OK; i++) s = ts_config_set(c, set[i]);
    /* resuming needs the same cuts: speeds from a file, not measured */
    if (s == TS_OK && j->ckpt) {
        char set_dev[160];
        snprintf(set_dev, sizeof set_dev, "dist.devices=%s", devfile);
        s = ts_config_set(c, set_dev);
    }
    if (s == TS_OK) s = ts_config_finish(c);
    return s;
}

/* The batch of step t: tokens/targets (GPT) or x/y (MLP), whole batch. */
typedef struct batch {
    const char *names[2];
    const void *data[2];
    int64_t ti[B * 8], yi[B * 8];
    float x[B * 12], y[B * 4];
} batch;

static void make_batch(batch *b, int gpt, int t) {
    uint64_t r = 0x12345u + 977u * (uint64_t)t;
    for (int i = 0; i < B * 8; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        b->ti[i] = (int64_t)(r >> 33) % 32;
        b->yi[i] = (int64_t)(r >> 41) % (gpt ? 32 : 4);
    }
    for (int i = 0; i < B * 12; i++) b->x[i] = (float)((i * 37 + t * 11) % 23) / 23.0f - 0.5f;
    for (int i = 0; i < B * 4; i++) b->y[i] = (float)((i * 13 + t * 5) % 7) / 7.0f;
    b->names[0] = gpt ? "tokens" : "x";
    b->names[1] = gpt ? "targets" : "y";
    b->data[0] = gpt ? (const void *)b->ti : (const void *)b->x;
    b->data[1] = gpt ? (const void *)b->yi : (const void *)b->y;
}

/* One process: the full model at B/M rows, the update after the M-th
 * micro-batch, gradients summed in the fixed tree. */
typedef struct ref_gate {
    float *g;
    size_t n;
    ts_tree_sum t;
    int i, M;
} ref_gate;

static ts_status gate(ts_plan *p, void *user, ts_gate_decision *out) {
    (void)p;
    ref_gate *r = user;
    ts_status s = TS_OK;
    if (r->M > 1) s = ts_tree_sum_add(&r->t, r->g);
    if (s == TS_OK && ++r->i == r->M) {
        if (r->M > 1) s = ts_tree_sum_result(&r->t, r->g, (float)r->M);
        r->i = 0;
        *out = TS_GATE_APPLY;
    } else {
        *out = TS_GATE_SKIP;
    }
    return s;
}

static ts_status reference(const job *j, ts_plan **out) {
    ts_config c;
    ts_status s = config(&c, j, 1);
    if (s != TS_OK) return s;
    const int gpt = j->yaml != MLP;
    c.model.batch = B / j->M;
    ts_graph *g = NULL;
    ts_model m;
    ts_train_spec spec;
    ts_compile_options opt;
    if ((s = ts_session_build_model(&c, &g, &m, &spec, &opt)) != TS_OK) return s;
    s = ts_compile(g, &spec, &opt, out);
    ts_graph_free(g);
    if (s != TS_OK) return s;
    static ref_gate r;
    memset(&r, 0, sizeof r);
    r.M = j->M;
    if ((s = ts_plan_grad_region(*out, &r.g, &r.n)) != TS_OK) return s;
    if ((s = ts_tree_sum_init(&r.t, r.n)) != TS_OK) return s;
    ts_plan_set_update_gate(*out, gate, &r);
    const uint64_t seed = ts_plan_seed(*out);
    for (int t = 0; t < STEPS && s == TS_OK; t++) {
        batch b;
        make_batch(&b, gpt, t);
        const int64_t done = ts_plan_step_count(*out), applied = ts_plan_updates_applied(*out);
        for (int i = 0; i < j->M && s == TS_OK; i++) {
            /* as dist.reproducible: a micro-batch is not a step (the step
             * count stays the batch's), dropout's stream is the
             * micro-batch's */
            ts_plan_set_step(*out, done);
            ts_plan_set_updates_applied(*out, applied);
            ts_plan_set_seed(*out, seed + (uint64_t)i * 0x9E3779B97F4A7C15ULL);
            for (int k = 0; k < 2 && s == TS_OK; k++) {
                const size_t row = gpt ? 8 * sizeof(int64_t) : (k ? 4 : 12) * sizeof(float);
                const size_t rows = (size_t)(B / j->M);
                s = ts_plan_set_input(*out, b.names[k],
                                      (const char *)b.data[k] + (size_t)i * rows * row, rows * row);
            }
            if (s == TS_OK) s = ts_plan_step(*out);
        }
        ts_plan_set_seed(*out, seed);
    }
    return s;
}

/* Every parameter of this stage equals the reference's, bit for bit. */
static int compare(ts_plan *stage, ts_plan *ref, int rank) {
    int bad = 0;
    for (int i = 0; i < ts_plan_param_count(stage); i++) {
        const char *name = ts_plan_param_name(stage, i);
        if (!strcmp(name, "pipe.in")) continue;
        ts_dtype dt;
        int r;
        int64_t d[8];
        if (ts_plan_value_info(stage, name, &dt, &r, d) != TS_OK) return 1;
        size_t count = 1;
        for (int k = 0; k < r; k++) count *= (size_t)d[k];
        float *a = malloc(count * 4), *b = malloc(count * 4);
        if (!a || !b || ts_plan_read(stage, name, a, count * 4) != TS_OK ||
            ts_plan_read(ref, name, b, count * 4) != TS_OK) {
            fprintf(stderr, "rank %d: cannot read %s: %s\n", rank, name, ts_last_error());
            bad++;
        } else if (memcmp(a, b, count * 4)) {
            size_t k = 0;
            while (a[k] == b[k]) k++;
            fprintf(stderr, "rank %d: %s differs at %zu: %.9g vs %.9g\n", rank, name, k,
                    (double)a[k], (double)b[k]);
            bad++;
        }

        free(a), free(b);
    }
    /* a stage may hold no parameter (the cost model may give a cheap
     * activation a stage of its own); the others are compared */
    return bad != 0;
}

/* The bytes a stage saves between a micro-batch's forward and backward
 * (ts_plan_read_ranges over the backward) are exactly those of the inputs
 * and temporaries its instructions read before any of them writes them
 * (pipe.grad, received, left out), worked out byte by byte: no more (a
 * backward's temporaries where the forward's values lay need no saving)
 * and no fewer (the weights' bits check that too). 0 when they are. */
static int saved_bytes_exact(ts_plan *p) {
    const int k = ts_plan_first_reader(p, "pipe.grad"), gate = ts_plan_gate_ins(p);
    const ts_arena_layout *L = &p->prog.layout;
    const ts_named *ex = ts_plan_find(p, "pipe.grad");
    unsigned char *first = calloc(L->arena_bytes + 1, 1); /* 1: read first, 2: written first */
    int n = 0, rc = 0;
    if (!first || k < 0 || !ex || ts_plan_read_ranges(p, k, gate, "pipe.grad", NULL, 0, &n)) {
        free(first);
        return 30;
    }
    for (int i = k; i < gate; i++) {
        const ts_instr *in = &p->prog.ins[i];
        for (int j = 0; j < in->n_in; j++)
            if (in->in[j].off != ex->v.off)
                for (size_t b = 0; b < ts_operand_bytes(&in->in[j]); b++)
                    if (!first[in->in[j].off + b]) first[in->in[j].off + b] = 1;
        for (int j = 0; j < in->n_out; j++)
            for (size_t b = 0; b < ts_operand_bytes(&in->out[j]); b++)
                if (!first[in->out[j].off + b]) first[in->out[j].off + b] = 2;
    }
    ts_plan_range *r = malloc(sizeof *r * (size_t)(n + 1));
    unsigned char *saved = calloc(L->arena_bytes + 1, 1);
    if (!r || !saved || ts_plan_read_ranges(p, k, gate, "pipe.grad", r, n, &n)) rc = 31;
    for (int i = 0; i < n && !rc; i++) memset(saved + (r[i].at - ts_plan_at(p, 0)), 1, r[i].bytes);
    for (size_t b = 0; b < L->arena_bytes && !rc; b++) {
        const int movable = (b >= L->io_off && b < L->io_off + L->io_bytes) ||
                            (b >= L->temp_off && b < L->temp_off + L->temp_bytes);
        if (saved[b] != (movable && first[b] == 1)) {
            fprintf(stderr, "arena byte %zu: saved %d, first %s\n", b, saved[b],
                    first[b] == 1   ? "read"
                    : first[b] == 2 ? "written"
                                    : "untouched");
            rc = 32;
        }
    }
    free(first), free(saved), free(r);
    return rc;
}

static int worker(ts_comm *comm, void *user) {
    const job *j = user;
    const int gpt = j->yaml != MLP;
    ts_config c;
    ts_stage *st = NULL;
    if (config(&c, j, j->S) != TS_OK || ts_stage_new(&c, comm, &st) != TS_OK) {
        fprintf(stderr, "rank %d: %s\n", ts_comm_rank(comm), ts_last_error());
        return 2;
    }
    int t0 = 0;
    if (ts_comm_rank(comm) < j->S - 1) {
        const int rc = saved_bytes_exact(ts_stage_plan(st));
        if (rc) {
            ts_stage_free(st);
            return rc;
        }
    }
    if (j->phase == 2) {
        if (ts_stage_load(st, j->ckpt) != TS_OK) {
            fprintf(stderr, "%s\n", ts_last_error());
            return 8;
        }
        t0 = (int)ts_plan_step_count(ts_stage_plan(st));
    }
    for (int t = t0; t < STEPS; t++) {
        if (t == 1 && ts_comm_rank(comm) == j->die) _exit(7);
        if (j->phase == 1 && t == 2) { /* checkpoint after two steps, then die */
            const int rc = ts_stage_save(st, j->ckpt) != TS_OK;
            if (rc) fprintf(stderr, "%s\n", ts_last_error());
            _exit(rc ? 9 : 0);
        }
        batch b;
        make_batch(&b, gpt, t);
        if (ts_stage_step(st, 2, b.names, b.data) != TS_OK) {
            fprintf(stderr, "%s\n", ts_last_error());
            /* the message names who died: exit 3 when it names the stage
             * and rank that exited with status 7 */
            const int named = strstr(ts_last_error(), "exited with status 7") &&
                              strstr(ts_last_error(), "pipeline stage ");
            ts_stage_free(st);
            return named ? 3 : 4;
        }
    }
    ts_plan *ref = NULL;
    int rc = 0;
    if (reference(j, &ref) != TS_OK) {
        fprintf(stderr, "reference: %s\n", ts_last_error());
        rc = 5;
    } else {
        rc = compare(ts_stage_plan(st), ref, ts_comm_rank(comm));
    }
    if (ts_comm_rank(comm) == j->S - 1 && !(ts_stage_loss(st) > 0)) rc = 6;
    ts_plan_free(ref);
    ts_stage_free(st);
    return rc;
}

/* What ts_stage_new refuses, each named. */
static int refusals(ts_comm *comm, void *user) {
    (void)user;
    const char *sets[][2] = {{"dist.zero=2", "dist.zero inside a stage"},
                             {"dist.compress=topk", "dist.compress inside a stage"},
                             {"dist.pipeline_stages=4", "2 processes for dist.pipeline_stages 4"}};
    for (int i = 0; i < 3; i++) {
        ts_config c;
        ts_stage *st = NULL;
        ts_config_init(&c);
        if (ts_config_load_string(&c, GPT, strlen(GPT), "t.yaml") != TS_OK ||
            ts_config_set(&c, "dist.pipeline_stages=2") != TS_OK ||
            ts_config_set(&c, sets[i][0]) != TS_OK || ts_config_finish(&c) != TS_OK)
            return 10 + i;
        if (ts_stage_new(&c, comm, &st) == TS_OK || !strstr(ts_last_error(), sets[i][1])) {
            fprintf(stderr, "%s: %s\n", sets[i][0], ts_last_error());
            ts_stage_free(st);
            return 20 + i;
        }
    }
    return 0;
}

static void run(const char *yaml, int S, int M, int gpipe) {
    job j = {yaml, S, M, gpipe, -1, NULL, 0};
    int codes[4] = {0};
    ts_status s = ts_shm_launch(S, NULL, worker, &j, codes);
    CHECK(s == TS_OK, "%s S=%d M=%d %s: %s (exit codes %d %d %d %d)",
          yaml == MLP   ? "mlp"
          : yaml == GPT ? "gpt"
                        : "gpt+dropout",
          S, M, gpipe ? "gpipe" : "1f1b", ts_last_error(), codes[0], codes[1], codes[2], codes[3]);
}

int main(void) {
    const int Ms[] = {1, 2, 4, 8};
    for (int gp = 0; gp < 2; gp++)
        for (int i = 0; i < 4; i++) {
            run(GPT, 2, Ms[i], gp);
            run(GPT, 4, Ms[i], gp);
        }
    run(MLP, 1, 1, 0); /* one stage, one micro-batch: the plain step */
    run(MLP, 2, 4, 0);
    run(MLP, 4, 2, 1);
    run(GPT, 1, 4, 0);
    run(DROP, 2, 4, 0); /* dropout: each micro-batch's own mask, as dist.reproducible's */
    run(DROP, 2, 2, 1);
    /* stage 1 of 2 dies at its second step: stage 0 names it */
    job j = {GPT, 2, 4, 0, 1, NULL, 0};
    int codes[2] = {0};
    ts_shm_options o = {0};
    ts_shm_launch(2, &o, worker, &j, codes);
    CHECK(codes[1] == 7 && codes[0] == 3, "dead stage: exit codes %d %d (3: the message named it)",
          codes[0], codes[1]);
    CHECK(ts_shm_launch(2, NULL, refusals, NULL, NULL) == TS_OK, "refusals: %s", ts_last_error());
    /* kill and resume: two steps, a checkpoint per stage, the processes
     * end; new ones resume and take the third step: the weights of three
     * uninterrupted steps, bit for bit */
    char dir[] = "/tmp/tessel-stages-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(devfile, sizeof devfile, "%s/devices.txt", dir);
    FILE *f = fopen(devfile, "w");
    CHECK(f && fputs("a 50 10 5\nb 50 10 5\nc 50 10 5\nd 50 10 5\n", f) >= 0, "devices file");
    if (f) fclose(f);
    for (int S = 2; S <= 4; S += 2) {
        char run[64];
        snprintf(run, sizeof run, "%s/run%d", dir, S);
        job a = {GPT, S, 4, 0, -1, run, 1}, b = {GPT, S, 4, 0, -1, run, 2};
        CHECK(ts_shm_launch(S, NULL, worker, &a, NULL) == TS_OK, "save: %s", ts_last_error());
        CHECK(ts_shm_launch(S, NULL, worker, &b, NULL) == TS_OK, "resume: %s", ts_last_error());
    }
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    if (check_failed == 0 && system(rm) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("stages");
}
