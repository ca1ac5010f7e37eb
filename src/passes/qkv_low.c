/* qkv_low: in bf16 plans the qkv projection writes bf16 where only the bf16 attention reads it.
 *
 * After attention_qkv, the precision pass and attn_bwd_low, a layer's qkv projection is
 *
 *     x f32 [B, T, 3*H*hd] = matmul_epi(a bf16, w bf16, bias)      low=1
 *     qkv = reshape(x) [B, T, 3, H, hd]
 *     (o, lse) = attention(qkv)                                     low=1
 *     dqkv = attention_bwd(do, qkv, o, lse)                         low=1 (out_low or not)
 *
 * and the attention kernels read q, k and v only rounded to bf16 (the packs of
 * ops/attention_low.c round each f32 value to nearest even). Where every reader of x is such a
 * view read only by such ops (the packed attention's input 0, the packed attention_bwd's
 * input 1), the GEMM writes x in bf16 itself (matmul_epi.out_low: oneDNN rounds accumulator +
 * bias to nearest even, ops/fused.c the same) and the kernels pack the bf16 halves as they are
 * (ts_attn_pack_*_bf16): the values they multiply have the same bits, while the GEMM writes and
 * each attention kernel reads half the bytes, and the arena holds x at half its size until the
 * layer's backward.
 *
 * Only value types and attributes change: no node is added or removed. Runs after
 * attn_bwd_low, on bf16 plans of backends that run the op table's kernels
 * (ts_pass_ctx.low_kernels_ok; compile.no_qkv_low keeps f32). */
#include "passes.h"

#define MAX_VIEWS 4 /* reshapes of reshapes followed (a view chain is one or two long) */

/* Whether node n reads value v only where a bf16 q, k, v may go (or as a view read so). */
static int reads_as_bf16_qkv(const ts_graph *g, const ts_node *n, int32_t v, int depth);

/* Every live reader of v reads it as a bf16 qkv, and v is neither kept nor a gradient. */
static int only_bf16_qkv(const ts_graph *g, int32_t v, int depth) {
    const ts_value *val = &g->values[v];
    if (val->is_output || val->grad_of >= 0 || depth > MAX_VIEWS) return 0;
    int any = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const ts_node *n = &g->nodes[i];
        int reads = 0;
        for (int j = 0; j < n->n_in && !n->dead; j++) reads |= n->in[j] == v;
        if (!reads) continue;
        if (!reads_as_bf16_qkv(g, n, v, depth)) return 0;
        any = 1;
    }
    return any;
}

static int reads_as_bf16_qkv(const ts_graph *g, const ts_node *n, int32_t v, int depth) {
    if (n->op == TS_OP_RESHAPE) return n->in[0] == v && only_bf16_qkv(g, n->out[0], depth + 1);
    /* the packed forms: (qkv) and (do, qkv, o, lse); their other inputs are f32 */
    const int at = n->op == TS_OP_ATTENTION && n->n_in == 1       ? 0
                   : n->op == TS_OP_ATTENTION_BWD && n->n_in == 4 ? 1
                                                                  : -1;
    if (at < 0 || !n->a.attention.low) return 0;
    for (int j = 0; j < n->n_in; j++)
        if (n->in[j] == v && j != at) return 0;
    return g->values[v].t.rank == 5;
}

/* v and the reshapes of it (only_bf16_qkv checked them) become bf16. */
static void make_bf16(ts_graph *g, int32_t v) {
    g->values[v].t.dtype = TS_BF16;
    for (int i = 0; i < g->n_nodes; i++) {
        const ts_node *n = &g->nodes[i];
        if (!n->dead && n->op == TS_OP_RESHAPE && n->in[0] == v) make_bf16(g, n->out[0]);
    }
}

ts_status ts_pass_qkv_low(ts_graph *g, int *n_rewritten) {
    int done = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        ts_node *m = &g->nodes[i];
        if (m->dead || m->op != TS_OP_MATMUL_EPI || !m->a.matmul_epi.low ||
            m->a.matmul_epi.out_low || m->a.matmul_epi.trans_a)
            continue;
        const ts_type *a = &g->values[m->in[0]].t, *w = &g->values[m->in[1]].t;
        const int32_t x = m->out[0];
        if (a->dtype != TS_BF16 || w->dtype != TS_BF16 || w->rank != 2 ||
            g->values[x].t.dtype != TS_F32 || !only_bf16_qkv(g, x, 0))
            continue;
        m->a.matmul_epi.out_low = 1;
        make_bf16(g, x);
        done++;
    }
    if (n_rewritten) *n_rewritten = done;
    return TS_OK;
}
