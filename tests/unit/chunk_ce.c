/* The chunk_ce pass (src/passes/chunk_ce.c): the cross-entropy backward and
 * the head's input gradient in row chunks where the logits are kept.
 * Against the same plan without it (compile.no_fuse, which turns it off):
 * the same loss, logits and trained input bits, on W3's head shape (2048 x
 * 8192, d 512) through oneDNN and on the reference kernels, and on a shape
 * whose last chunk is short with ignored rows and class weights; where it
 * applies the arena shrinks; with a trainable head, or with the logits
 * not kept, it leaves the plan alone. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "backends/cpu/dnnl_matmul.h"
#include "plan/plan.h"

static unsigned g_seed = 5;

typedef struct head {
    ts_graph *g;
    ts_val h, w, loss;
    int64_t n, v, d;
    float *hx, *wx;
    int64_t *tg;
} head;

/* h [n, d] (trainable) -> logits = h W^T [n, v] (kept) -> cross-entropy. */
static void head_build(head *m, int64_t n, int64_t v, int64_t d, int weighted) {
    memset(m, 0, sizeof *m);
    m->n = n, m->v = v, m->d = d;
    m->g = ts_graph_new();
    int64_t dh[2] = {n, d}, dw[2] = {v, d}, dt[1] = {n}, dc[1] = {v};
    m->h = ts_param(m->g, "h", TS_F32, 2, dh, ts_init_normal(0, 1));
    m->w = ts_param(m->g, "w", TS_F32, 2, dw, ts_init_normal(0, 0.02));
    ts_val t = ts_input(m->g, "targets", TS_I64, 1, dt);
    ts_val logits = ts_matmul(m->g, m->h, m->w, 0, 1);
    CHECK_OK(ts_mark_output(m->g, logits, "logits"));
    if (weighted) {
        float *cw = malloc(sizeof(float) * (size_t)v);
        for (int64_t i = 0; i < v; i++) cw[i] = 0.5f + (float)(i % 7) * 0.25f;
        ts_val wv = ts_constant(m->g, "class_w", TS_F32, 1, dc, cw);
        free(cw);
        m->loss = ts_cross_entropy_weighted(m->g, logits, t, wv, -100);
    } else {
        m->loss = ts_cross_entropy(m->g, logits, t, -100);
    }
    m->tg = malloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) m->tg[i] = rand_r(&g_seed) % v;
    if (weighted)
        for (int64_t i = 0; i < n; i += 5) m->tg[i] = -100; /* ignored rows */
}

static void head_free(head *m) {
    ts_graph_free(m->g);
    free(m->tg);
}

typedef struct result {
    float *h, *logits;
    double loss;
    size_t arena;
    int chunks; /* cross_entropy_bwd nodes of one chunk each */
} result;

/* Two SGD steps; h and the logits afterwards. */
static result train(head *m, int no_fuse, int reference, int head_trainable, int discard) {
    result r = {0};
    ts_train_spec spec = ts_train_spec_default(m->loss);
    spec.opt = ts_sgd(0.5, 0, 0, 0, 0);
    ts_val tr[2] = {m->h, m->w};
    spec.trainable = tr;
    spec.n_trainable = head_trainable ? 2 : 1;
    ts_compile_options o = ts_compile_options_default();
    o.no_fuse = no_fuse;
    o.reference_kernels = reference;
    o.discard_outputs = discard;
    o.threads = 2;
    ts_plan *p = NULL;
    ts_compiled_graph k;
    ts_status s = ts_compile_keep(m->g, &spec, &o, &p, &k);
    CHECK(s == TS_OK, "compile: %s", ts_last_error());
    if (s != TS_OK) {
        ts_compiled_graph_free(&k);
        return r;
    }
    for (int i = 0; i < k.n_order; i++) {
        const ts_node *n = &k.graph->nodes[k.order[i]];
        r.chunks += n->op == TS_OP_CROSS_ENTROPY_BWD && n->a.cross_entropy.row_count > 0;
    }
    ts_compiled_graph_free(&k);
    const size_t hb = sizeof(float) * (size_t)(m->n * m->d);
    const size_t lb = sizeof(float) * (size_t)(m->n * m->v);
    for (int step = 0; step < 2; step++) {
        CHECK_OK(ts_plan_set_input(p, "targets", m->tg, sizeof(int64_t) * (size_t)m->n));
        CHECK_OK(ts_plan_step(p));
    }
    r.h = malloc(hb);
    CHECK_OK(ts_plan_read(p, "h", r.h, hb));
    if (!discard) {
        r.logits = malloc(lb);
        CHECK_OK(ts_plan_read(p, "logits", r.logits, lb));
    }
    r.loss = ts_plan_loss(p);
    ts_plan_stats st;
    ts_plan_get_stats(p, &st);
    r.arena = st.arena_bytes;
    ts_plan_free(p);
    return r;
}

static void result_free(result *r) {
    free(r->h);
    free(r->logits);
}

static void compare(const char *label, head *m, int reference, int head_trainable, int discard,
                    int want_chunks) {
    result a = train(m, 1, reference, head_trainable, discard);
    result b = train(m, 0, reference, head_trainable, discard);
    const size_t hb = sizeof(float) * (size_t)(m->n * m->d);
    const size_t lb = sizeof(float) * (size_t)(m->n * m->v);
    CHECK(a.h && b.h && !memcmp(a.h, b.h, hb), "%s: trained h differs with chunks", label);
    CHECK(discard || (a.logits && b.logits && !memcmp(a.logits, b.logits, lb)),
          "%s: logits differ with chunks", label);
    CHECK(a.loss == b.loss, "%s: loss %.9g with chunks vs %.9g", label, b.loss, a.loss);
    if (want_chunks) {
        CHECK(b.chunks == want_chunks && a.chunks == 0, "%s: %d chunks (want %d), %d unchunked",
              label, b.chunks, want_chunks, a.chunks);
        CHECK(b.arena < a.arena, "%s: arena %zu with chunks vs %zu", label, b.arena, a.arena);
    } else {
        CHECK(b.chunks == 0, "%s: %d chunks where none belong", label, b.chunks);
    }
    result_free(&a);
    result_free(&b);
}

int main(void) {
    head m;
    /* W3's head: 2048 rows of 8192 logits (32 KiB) -> chunks of 128 rows */
    head_build(&m, 2048, 8192, 512, 0);
    /* oneDNN's kernels keep row chunks' bits only with AVX-512 (ts_mm_row_chunks_exact): without,
     * the pass stays off there and the plans must be the same unchunked ones */
    const int exact = ts_mm_row_chunks_exact();
    compare("W3 head, oneDNN", &m, 0, 0, 0, exact ? 16 : 0);
    head_free(&m);
    /* 300 rows of 4096 (16 KiB): chunks of 256 rows, the last of 44 */
    head_build(&m, 300, 4096, 48, 1);
    compare("weighted, ignored rows", &m, 0, 0, 0, exact ? 2 : 0);
    compare("weighted, reference kernels", &m, 1, 0, 0, 2);
    compare("trainable head", &m, 0, 1, 0, 0);
    compare("logits not kept", &m, 0, 0, 1, 0);
    head_free(&m);
    return check_summary("chunk_ce");
}
