/* ZeRO-3 on a language model with a tied embedding (the token embedding
 * is the LM head's weight), on 2 and 3 ranks: the weights and losses equal
 * ZeRO-0's bit for bit, and the plan keeps the embedding's parameters and
 * gradient from living through the whole step:
 *
 *  - the embedding has a bucket of its own (it is larger than a bucket),
 *    so no small parameter read at the other end of the step drags it
 *    into another gather;
 *  - it is gathered twice in the forward (the token lookup at its start,
 *    the LM head at its end) and once in the backward (the head), not held
 *    through the gaps;
 *  - its gradient is the head's weight-gradient GEMM plus the lookup's
 *    scatter as one scatter_add_to (the GEMM runs at the head) instead of
 *    a GEMM whose epilogue adds the scatter (which would wait for the end
 *    of the backward, keeping the logits' gradient alive until then).
 *
 * The model: GPT, vocab 512, ctx 16, d 32, 2 layers, 2 heads, batch 2
 * per rank, AdamW with weight decay, 8 KiB buckets (the embedding: 64 KiB). */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "check.h"
#include "plan/plan.h"

enum { PER = 2, CTX = 16, VOCAB = 512, STEPS = 3, MAXR = 3, MAX_FLOATS = 60000 };

typedef struct shared {
    float params[MAX_FLOATS];
    size_t n_floats;
    double loss[STEPS];
    ts_plan_stats st;
    /* rank 0's plan */
    int wte_fwd_gathers, wte_bwd_gathers, wte_alone, scatter_to, epilogue_grad;
    char err[MAXR][512];
} shared;

static shared *SH;

static ts_graph *gpt(ts_val *loss) {
    ts_gpt_config c = {PER, CTX, VOCAB, 32, 2, 2, 0.0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    if (ts_build_gpt(g, &c, &m) != TS_OK) {
        ts_graph_free(g);
        return NULL;
    }
    *loss = m.loss;
    return g;
}

/* Counts the inputs of a plan line ("<- @a @b ... ;"). */
static int n_inputs(const char *line) {
    const char *p = strstr(line, "<-"), *e = strchr(line, ';');
    int n = 0;
    for (; p && *p && (!e || p < e); p++) n += *p == '@';
    return n;
}

/* What rank 0's plan does with the embedding: its bucket's gathers (the
 * bucket whose gathers read the block and wte.weight only) by phase, and
 * how its gradient is made. */
static void check_dump(ts_plan *p) {
    char path[] = "/tmp/tessel-zero3-tied-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return;
    FILE *f = fdopen(fd, "w+");
    ts_plan_dump(p, TS_DUMP_PLAN, f);
    rewind(f);
    char line[4096];
    int wte_bucket = -1;
    /* The embedding's bucket: the first gather, which feeds the token lookup. */
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        const char *b = strstr(line, "; bucket");
        if (strstr(line, " all_gather_start ") && b && wte_bucket < 0) {
            wte_bucket = atoi(b + 8);
            SH->wte_alone = n_inputs(line) == 2;
        }
        if (strstr(line, " all_gather_start ") && b && atoi(b + 8) == wte_bucket) {
            if (strstr(b, ".gather_fwd")) SH->wte_fwd_gathers++;
            if (strstr(b, ".gather_bwd")) SH->wte_bwd_gathers++;
        }
        if (strstr(line, "grad:wte.weight")) {
            SH->scatter_to += strstr(line, " scatter_add_to ") != NULL;
            SH->epilogue_grad += strstr(line, " matmul_epi ") != NULL;
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
    static float blk[MAX_FLOATS];
    size_t k = 0;
    int ok = 1;
    for (int i = 0; i < ts_plan_param_count(p) && ok; i++) {
        const char *name = ts_plan_param_name(p, i);
        int rank;
        int64_t dims[8];
        ts_plan_value_info(p, name, NULL, &rank, dims);
        size_t e = 1;
        for (int d = 0; d < rank; d++) e *= (size_t)dims[d];
        if (k + e > MAX_FLOATS) return 0;
        if (npc == 0) { /* ZeRO-0: every rank holds the same; rank 0 reads */
            if (r == 0 && ts_plan_read(p, name, SH->params + k, e * sizeof(float)) != TS_OK) ok = 0;
            k += e;
            continue;
        }
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
        k += e;
    }
    if (r == 0) SH->n_floats = k;
    free(pc);
    return ok;
}

static int worker(ts_comm *comm, void *user) {
    const int zero = *(const int *)user;
    const int r = ts_comm_rank(comm), n = ts_comm_size(comm);
    ts_val loss;
    ts_graph *g = gpt(&loss);
    if (!g) return 1;
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 5;
    opt.threads = 1;
    opt.comm = comm;
    opt.bucket_mb = 8.0 / 1024;
    opt.first_bucket_mb = 4.0 / 1024;
    opt.dist_algo = TS_ALGO_NATIVE;
    opt.zero = zero;
    ts_plan *p = NULL;
    if (ts_compile(g, &spec, &opt, &p) != TS_OK) {
        snprintf(SH->err[r], sizeof SH->err[r], "compile: %s", ts_last_error());
        ts_graph_free(g);
        return 1;
    }
    if (r == 0) {
        ts_plan_get_stats(p, &SH->st);
        check_dump(p);
    }
    static int64_t tok[MAXR * PER * CTX], tgt[MAXR * PER * CTX];
    int ok = 0;
    for (int s = 0; s < STEPS; s++) {
        /* the gathered parameters live in the temporaries: NaN them */
        memset(ts_plan_at(p, p->prog.layout.temp_off), 0xff, p->prog.layout.temp_bytes);
        unsigned seed = 31u + (unsigned)s;
        for (int i = 0; i < n * PER * CTX; i++) {
            tok[i] = rand_r(&seed) % VOCAB;
            tgt[i] = rand_r(&seed) % VOCAB;
        }
        const size_t rows = sizeof(int64_t) * PER * CTX;
        float l = 0;
        if (ts_plan_set_input(p, "tokens", tok + (size_t)r * PER * CTX, rows) != TS_OK ||
            ts_plan_set_input(p, "targets", tgt + (size_t)r * PER * CTX, rows) != TS_OK ||
            ts_plan_step(p) != TS_OK || ts_plan_read(p, "loss", &l, sizeof l) != TS_OK) {
            snprintf(SH->err[r], sizeof SH->err[r], "step %d: %s", s, ts_last_error());
            break;
        }
        if (r == 0) SH->loss[s] = l;
        ok++;
    }
    if (ok == STEPS && !collect(p, r)) {
        snprintf(SH->err[r], sizeof SH->err[r], "collect: %s", ts_last_error());
        ok = 0;
    }
    ts_plan_free(p);
    ts_graph_free(g);
    return ok == STEPS ? 0 : 1;
}

static ts_status launch(int n, int zero) {
    memset(SH, 0, sizeof *SH);
    for (size_t i = 0; i < MAX_FLOATS; i++) SH->params[i] = NAN;
    ts_shm_options o = {0};
    o.timeout_s = 20;
    o.heap_bytes = (size_t)64 << 20;
    o.grace_s = 2;
    return ts_shm_launch(n, &o, worker, &zero, NULL);
}

static void compare(int n) {
    static float w0[MAX_FLOATS];
    static double l0[STEPS];
    ts_status s = launch(n, 0);
    CHECK(s == TS_OK, "%d ranks, zero 0: %s (rank 0: %s)", n, ts_last_error(), SH->err[0]);
    if (s != TS_OK) return;
    const size_t nf = SH->n_floats;
    memcpy(w0, SH->params, sizeof(float) * nf);
    memcpy(l0, SH->loss, sizeof l0);
    const int epi0 = SH->epilogue_grad;
    s = launch(n, 3);
    CHECK(s == TS_OK, "%d ranks, zero 3: %s (rank 0: %s)", n, ts_last_error(), SH->err[0]);
    if (s != TS_OK) return;
    CHECK(nf > 20000 && SH->n_floats == nf, "%d ranks: %zu and %zu parameters", n, nf,
          SH->n_floats);
    CHECK(!memcmp(SH->params, w0, sizeof(float) * nf),
          "%d ranks: zero 3 weights differ from zero 0's", n);
    CHECK(!memcmp(SH->loss, l0, sizeof l0), "%d ranks: zero 3 losses differ from zero 0's", n);
    CHECK(SH->wte_alone, "%d ranks: the embedding shares its bucket", n);
    CHECK(SH->wte_fwd_gathers == 2 && SH->wte_bwd_gathers == 1,
          "%d ranks: the embedding gathered %d times in the forward, %d in the backward (want 2, "
          "1)",
          n, SH->wte_fwd_gathers, SH->wte_bwd_gathers);
    /* ZeRO-0 keeps the epilogue (its gradient is persistent); ZeRO-3 does not */
    CHECK(epi0 == 1 && SH->scatter_to == 1 && SH->epilogue_grad == 0,
          "%d ranks: grad:wte.weight: zero 0 %d GEMM epilogue(s), zero 3 %d scatter_add_to, %d "
          "epilogue(s)",
          n, epi0, SH->scatter_to, SH->epilogue_grad);
    printf("%d ranks: zero 3 = zero 0 bits; embedding gathered %d + %d times, alone in its "
           "bucket; arena %zu bytes, gathered parameters at most %zu of %zu\n",
           n, SH->wte_fwd_gathers, SH->wte_bwd_gathers, SH->st.arena_bytes, SH->st.zero_param_peak,
           SH->st.zero_param_bytes);
}

int main(void) {
    SH = mmap(NULL, sizeof *SH, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (SH == MAP_FAILED) return 1;
    compare(2);
    compare(3);
    munmap(SH, sizeof *SH);
    return check_summary("dist_zero3_tied");
}
