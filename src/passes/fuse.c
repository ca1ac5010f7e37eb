/* fuse: fewer, larger kernels. Runs after simplify (the graph is final:
 * gradients and the optimizer are in it).
 *
 * 1. GEMM epilogues: a matmul whose only reader is an add of a bias row or
 *    or of a tensor of its own shape becomes one matmul_epi with
 *    those post-ops (in order, up to TS_EPI_MAX); the backend runs them as
 *    oneDNN post-ops while the output tile is in cache.
 * 2. Sums of slice gradients that tile an axis become one concat.
 * 0. Before those: an add of a scatter_add (read only there) to a tensor
 *    of its shape, whose sum is not kept, becomes one scatter_add_to
 *    (ops/index.c) that adds the scattered rows into that tensor in place:
 *    with optim.fused_update a tied embedding's gradient no longer holds
 *    two vocabulary-sized tensors at once.
 * 4. Before all: an activation and the layer norm reading it become
 *    act_layer_norm, and layer norm's backward with the activation's
 *    backward reading its input gradient layer_norm_act_bwd, or with the
 *    add of that gradient to another layer_norm_bwd_acc (fuse_norm.c);
 *    off with ts_fuse_options.no_norm.
 * 3. Elementwise trees: a node of a fusable elementwise op absorbs the
 *    producers of its inputs when they are fusable too, have the root's
 *    shape, and nothing else reads them; a tree of two or more nodes becomes
 *    one fused_eltwise. Inputs that broadcast stay external.
 *
 * Only f32 nodes are fused. A rewritten chain keeps its last node's slot
 * and output value (so the order stays topological and names stay valid);
 * the other members die, and control dependencies on them move to it.
 * Results: bit-identical to the unfused ops (the fused kernels run the same
 * chunk functions on the same values; a + b == b + a exactly). A relu is
 * not taken into the epilogue: oneDNN's relu post-op maps NaN to 0 (and
 * gives -0.0 where the relu op gives +0.0), hiding a diverging run. */
#include <stdlib.h>
#include <string.h>
#include "ops/fused.h"
#include "passes.h"
#include "passes/fuse_norm.h"

typedef struct fctx {
    ts_graph *g;
    int *uses;          /* per value: live nodes reading it */
    int32_t *reader;    /* per value: the last live node reading it */
    int32_t *root_of;   /* per node: the node it was fused into, or -1 */
    int grads_released; /* gradients are step temporaries (ts_fuse_options) */
    ts_fuse_stats st;
} fctx;

static int observable(const ts_value *v) {
    return v->is_output || v->grad_of >= 0;
}

/* Value v may disappear into a fused node: computed by a node, read once,
 * not observable. */
static int interior(const fctx *c, int32_t v) {
    const ts_value *val = &c->g->values[v];
    return val->kind == TS_VK_NODE && c->uses[v] == 1 && !observable(val);
}

static void count_uses(fctx *c) {
    ts_graph *g = c->g;
    memset(c->uses, 0, sizeof(int) * (size_t)g->n_values);
    for (int i = 0; i < g->n_nodes; i++) {
        const ts_node *n = &g->nodes[i];
        if (n->dead) continue;
        for (int j = 0; j < n->n_in; j++) {
            int dup = 0;
            for (int q = 0; q < j; q++) dup |= n->in[q] == n->in[j];
            if (dup) continue;
            c->uses[n->in[j]]++;
            c->reader[n->in[j]] = i;
        }
    }
}

/* Replace node `root`'s inputs; members of its chain die into it. */
static ts_status set_inputs(ts_node *n, const int32_t *in, int n_in) {
    int32_t *ni = ts_alloc(sizeof(int32_t) * (size_t)(n_in + 1), "fuse");
    if (!ni) return TS_ERR_NOMEM;
    memcpy(ni, in, sizeof(int32_t) * (size_t)n_in);
    free(n->in);
    n->in = ni;
    n->n_in = n_in;
    return TS_OK;
}

/* Member `m` dies into `root`: its control dependencies join root's. */
static ts_status absorb(fctx *c, int32_t m, int32_t root) {
    ts_node *dm = &c->g->nodes[m], *r = &c->g->nodes[root];
    dm->dead = 1;
    c->root_of[m] = root;
    if (dm->n_ctrl) {
        int32_t *nc = realloc(r->ctrl, sizeof(int32_t) * (size_t)(r->n_ctrl + dm->n_ctrl));
        if (!nc) return ts_fail(TS_ERR_NOMEM, "fuse: out of memory");
        memcpy(nc + r->n_ctrl, dm->ctrl, sizeof(int32_t) * (size_t)dm->n_ctrl);
        r->ctrl = nc;
        r->n_ctrl += dm->n_ctrl;
    }
    return TS_OK;
}

static int is_f32(const ts_graph *g, int32_t v) {
    return g->values[v].t.dtype == TS_F32;
}

/* ---- 0. scatter into a sum ------------------------------------------------ */

static ts_status fuse_scatter_to(fctx *c, int32_t ai) {
    ts_graph *g = c->g;
    const ts_node *a = &g->nodes[ai];
    /* Only where the sum may take the base's memory: a kept sum (a
     * parameter's gradient in its persistent region) gains nothing, and
     * the GEMM epilogue then writes it directly. Where gradients are
     * temporaries (ZeRO-3) a gradient sum is taken too: as an epilogue
     * the LM head's weight-gradient GEMM of a tied embedding would wait
     * for the embedding's scatter at the end of the backward, keeping the
     * logits' gradient (batch x vocabulary) alive through all of it; as
     * base + scatter the GEMM runs at the head and only its
     * vocabulary x d result waits. */
    const ts_value *sum = &g->values[a->out[0]];
    const int kept =
        observable(sum) && !(c->grads_released && !sum->is_output && sum->grad_of >= 0);
    if (a->in[0] == a->in[1] || kept) return TS_OK;
    for (int side = 0; side < 2; side++) {
        const int32_t sv = a->in[side], base = a->in[1 - side];
        const int32_t si = g->values[sv].node;
        if (si < 0 || !interior(c, sv)) continue;
        const ts_node *sn = &g->nodes[si];
        if (sn->dead || sn->op != TS_OP_SCATTER_ADD || sn->a.index.axis != 0) continue;
        const ts_type *ot = &g->values[a->out[0]].t;
        if (!is_f32(g, sv) || !ts_type_equal(&g->values[base].t, ot) ||
            !ts_type_equal(&g->values[sv].t, ot))
            continue;
        if (ts_type_numel(&g->values[sn->in[1]].t) > INT32_MAX || ot->dims[0] > INT32_MAX) continue;
        const int32_t in[3] = {base, sn->in[0], sn->in[1]};
        const ts_attrs at = sn->a;
        ts_status s = set_inputs(&g->nodes[ai], in, 3);
        if (s != TS_OK) return s;
        ts_node *an = &g->nodes[ai];
        an->op = TS_OP_SCATTER_ADD_TO;
        an->a = at;
        if ((s = absorb(c, si, ai)) != TS_OK) return s;
        c->uses[sv] = 0;
        c->st.nodes_fused++;
        return TS_OK;
    }
    return TS_OK;
}

/* ---- 1. GEMM epilogues ------------------------------------------------------ */

static ts_status fuse_epilogue(fctx *c, int32_t mi) {
    ts_graph *g = c->g;
    const ts_node *m = &g->nodes[mi];
    if (!is_f32(g, m->in[0]) || !is_f32(g, m->in[1]) || !is_f32(g, m->out[0])) return TS_OK;
    int32_t cur = m->out[0], last = mi, chain[TS_EPI_MAX + 1];
    int32_t in[2 + TS_EPI_MAX] = {m->in[0], m->in[1]};
    int kinds[TS_EPI_MAX], n_post = 0, n_in = 2;
    const ts_type *ot = &g->values[cur].t;
    while (n_post < TS_EPI_MAX && interior(c, cur)) {
        const ts_node *r = &g->nodes[c->reader[cur]];
        if (r->dead || !ts_type_equal(&g->values[r->out[0]].t, ot)) break;
        /* Not relu: oneDNN's relu post-op (a max) turns NaN into 0, which
         * would hide a diverging run from the non-finite checks. */
        if (r->op == TS_OP_ADD && (r->in[0] == cur) != (r->in[1] == cur)) {
            int32_t x = r->in[0] == cur ? r->in[1] : r->in[0];
            if (!ts_mm_epi_operand_ok(&g->values[x].t, ot)) break;
            kinds[n_post] = TS_EPI_ADD;
            in[n_in++] = x;
        } else {
            break;
        }
        chain[n_post++] = last;
        last = c->reader[cur];
        cur = g->nodes[last].out[0];
    }
    if (!n_post) return TS_OK;
    ts_node *ln = &g->nodes[last];
    ts_attrs a = ts_attrs_zero();
    a.matmul_epi.trans_a = m->a.matmul.trans_a;
    a.matmul_epi.trans_b = m->a.matmul.trans_b;
    a.matmul_epi.n_post = n_post;
    for (int p = 0; p < n_post; p++) a.matmul_epi.post[p] = kinds[p];
    ts_status s = set_inputs(ln, in, n_in);
    if (s != TS_OK) return s;
    ln->op = TS_OP_MATMUL_EPI;
    ln->a = a;
    for (int p = 0; p < n_post; p++)
        if ((s = absorb(c, chain[p], last)) != TS_OK) return s;
    c->st.epilogues++;
    c->st.nodes_fused += n_post;
    return TS_OK;
}

/* ---- 2. sums of slice gradients ------------------------------------------------- */

/* add(add(slice_bwd(a), slice_bwd(b)), slice_bwd(c)) with ranges that tile
 * the axis is concat(a, b, c): no zero-filled copies and no adds (the
 * q, k, v split of attention). Equal values; only the sign of a zero can
 * differ (x + 0 gives +0 for x = -0, the concat keeps -0). */
enum { MAX_PIECES = 16 };

static ts_status fuse_concat(fctx *c, int32_t root) {
    ts_graph *g = c->g;
    int32_t adds[MAX_PIECES] = {root}, leaf[MAX_PIECES];
    int n_adds = 1, n_leaves = 0;
    for (int k = 0; k < n_adds; k++) {
        const ts_node *n = &g->nodes[adds[k]];
        for (int j = 0; j < 2; j++) {
            int32_t v = n->in[j];
            if (n->in[0] == n->in[1] || !interior(c, v)) return TS_OK;
            int32_t p = g->values[v].node;
            const ts_node *pn = &g->nodes[p];
            if (pn->dead || c->root_of[p] >= 0) return TS_OK;
            if (pn->op == TS_OP_ADD && n_adds < MAX_PIECES)
                adds[n_adds++] = p;
            else if (pn->op == TS_OP_SLICE_BWD && n_leaves < MAX_PIECES)
                leaf[n_leaves++] = p;
            else
                return TS_OK;
        }
    }
    /* by start; the ranges must tile [0, extent) of one axis */
    for (int i = 1; i < n_leaves; i++)
        for (int j = i;
             j > 0 && g->nodes[leaf[j]].a.slice.start < g->nodes[leaf[j - 1]].a.slice.start; j--) {
            int32_t t = leaf[j];
            leaf[j] = leaf[j - 1];
            leaf[j - 1] = t;
        }
    const ts_attrs *a0 = &g->nodes[leaf[0]].a;
    int64_t at = 0;
    for (int i = 0; i < n_leaves; i++) {
        const ts_attrs *a = &g->nodes[leaf[i]].a;
        if (a->slice.axis != a0->slice.axis || a->slice.extent != a0->slice.extent ||
            a->slice.start != at)
            return TS_OK;
        at = a->slice.end;
    }
    if (at != a0->slice.extent) return TS_OK;
    int32_t in[MAX_PIECES];
    for (int i = 0; i < n_leaves; i++) in[i] = g->nodes[leaf[i]].in[0];
    ts_node *rn = &g->nodes[root];
    ts_status s = set_inputs(rn, in, n_leaves);
    if (s != TS_OK) return s;
    rn->op = TS_OP_CONCAT;
    rn->a = ts_attrs_zero();
    rn->a.concat.axis = a0->slice.axis;
    for (int k = 1; k < n_adds && s == TS_OK; k++) s = absorb(c, adds[k], root);
    for (int i = 0; i < n_leaves && s == TS_OK; i++) s = absorb(c, leaf[i], root);
    c->st.concats++;
    c->st.nodes_fused += n_adds + n_leaves - 1;
    return s;
}

/* ---- 3. elementwise trees ----------------------------------------------------- */

typedef struct tree {
    int32_t node[TS_FUSE_MAX_INSTR];
    int reg[TS_FUSE_MAX_INSTR]; /* register of each member once emitted, else -1 */
    int n;
    int32_t ext[TS_FUSE_MAX_EXT + TS_FUSE_MAX_INSTR * 3];
    int n_ext;
} tree;

static int member(const tree *t, int32_t node) {
    for (int i = 0; i < t->n; i++)
        if (t->node[i] == node) return i;
    return -1;
}
static int in_tree(const tree *t, int32_t node) {
    return member(t, node) >= 0;
}

static int fusable_node(const ts_graph *g, const ts_node *n) {
    if (n->dead || n->n_out != 1 || !ts_fuse_op_ok(n->op) || !is_f32(g, n->out[0])) return 0;
    for (int j = 0; j < n->n_in; j++)
        if (!is_f32(g, n->in[j]) && !(n->op == TS_OP_WHERE && j == 0)) return 0;
    return 1;
}

/* Producer node of v if it can join the tree rooted at t->node[0]. */
static int32_t joinable(const fctx *c, const tree *t, int32_t v) {
    const ts_graph *g = c->g;
    if (!interior(c, v)) return -1;
    int32_t p = g->values[v].node;
    if (c->root_of[p] >= 0 || in_tree(t, p) || !fusable_node(g, &g->nodes[p])) return -1;
    if (!ts_type_equal(&g->values[v].t, &g->values[g->nodes[t->node[0]].out[0]].t)) return -1;
    return p;
}

/* External inputs of the tree, in first-use order of a post-order walk. */
static int add_ext(tree *t, int32_t v) {
    for (int i = 0; i < t->n_ext; i++)
        if (t->ext[i] == v) return i;
    t->ext[t->n_ext] = v;
    return t->n_ext++;
}

static void collect_ext(const ts_graph *g, tree *t, int32_t node) {
    const ts_node *n = &g->nodes[node];
    for (int j = 0; j < n->n_in; j++) {
        int32_t p = g->values[n->in[j]].kind == TS_VK_NODE ? g->values[n->in[j]].node : -1;
        if (p >= 0 && in_tree(t, p))
            collect_ext(g, t, p);
        else
            add_ext(t, n->in[j]);
    }
}

/* Emit node's instruction after its operands'; returns its register. */
static int emit(const ts_graph *g, tree *t, int32_t node, int64_t *prog, int *n_instr) {
    const ts_node *n = &g->nodes[node];
    int me = member(t, node);
    if (t->reg[me] >= 0) return t->reg[me]; /* read twice by one node: mul(x, x) */
    int src[3] = {0, 0, 0};
    for (int j = 0; j < n->n_in && j < 3; j++) {
        int32_t p = g->values[n->in[j]].kind == TS_VK_NODE ? g->values[n->in[j]].node : -1;
        src[j] = p >= 0 && in_tree(t, p) ? emit(g, t, p, prog, n_instr) : add_ext(t, n->in[j]);
    }
    ts_fuse_encode(prog + (size_t)*n_instr * TS_FUSE_REC, n->op, src, n->n_in, &n->a);
    return t->reg[me] = t->n_ext + (*n_instr)++;
}

static ts_status fuse_tree(fctx *c, int32_t root) {
    ts_graph *g = c->g;
    tree t = {.node = {root}, .n = 1};
    /* Grow breadth-first over the members' inputs. */
    for (int k = 0; k < t.n && t.n < TS_FUSE_MAX_INSTR; k++) {
        const ts_node *n = &g->nodes[t.node[k]];
        for (int j = 0; j < n->n_in && t.n < TS_FUSE_MAX_INSTR; j++) {
            int32_t p = joinable(c, &t, n->in[j]);
            if (p < 0) continue;
            t.node[t.n++] = p;
            t.n_ext = 0;
            collect_ext(g, &t, root);
            if (t.n_ext > TS_FUSE_MAX_EXT) t.n--;
        }
    }
    if (t.n < 2) return TS_OK;
    t.n_ext = 0;
    collect_ext(g, &t, root);
    int64_t prog[TS_FUSE_MAX_INSTR * TS_FUSE_REC];
    int n_instr = 0;
    for (int k = 0; k < t.n; k++) t.reg[k] = -1;
    emit(g, &t, root, prog, &n_instr);
    ts_type pt = {.dtype = TS_I64, .rank = 2, .dims = {n_instr, TS_FUSE_REC}};
    int32_t pv = ts_value_new(g, &pt, TS_VK_CONST, NULL);
    if (pv < 0) return TS_ERR_NOMEM;
    if (!(g->values[pv].data = ts_alloc(sizeof prog[0] * (size_t)n_instr * TS_FUSE_REC, "fuse")))
        return TS_ERR_NOMEM;
    memcpy(g->values[pv].data, prog, sizeof prog[0] * (size_t)n_instr * TS_FUSE_REC);
    int32_t in[TS_FUSE_MAX_EXT + 1];
    memcpy(in, t.ext, sizeof(int32_t) * (size_t)t.n_ext);
    in[t.n_ext] = pv;
    ts_node *rn = &g->nodes[root];
    ts_status s = set_inputs(rn, in, t.n_ext + 1);
    if (s != TS_OK) return s;
    rn->op = TS_OP_FUSED_ELTWISE;
    rn->a = ts_attrs_zero();
    rn->a.fused.n_instr = n_instr;
    rn->a.fused.n_ext = t.n_ext;
    for (int k = 1; k < t.n; k++)
        if ((s = absorb(c, t.node[k], root)) != TS_OK) return s;
    c->st.groups++;
    c->st.nodes_fused += t.n;
    return TS_OK;
}

ts_status ts_pass_fuse(ts_graph *g, ts_fuse_stats *stats) {
    return ts_pass_fuse_ex(g, NULL, stats);
}

ts_status ts_pass_fuse_ex(ts_graph *g, const ts_fuse_options *o, ts_fuse_stats *stats) {
    fctx c = {.g = g, .grads_released = o && o->grads_released};
    ts_status s = TS_OK;
    c.uses = ts_alloc(sizeof(int) * (size_t)(g->n_values + 1), "fuse");
    c.reader = ts_alloc(sizeof(int32_t) * (size_t)(g->n_values + 1), "fuse");
    c.root_of = ts_alloc(sizeof(int32_t) * (size_t)(g->n_nodes + 1), "fuse");
    if (!c.uses || !c.reader || !c.root_of) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    for (int i = 0; i < g->n_nodes; i++) c.root_of[i] = -1;
    if (!(o && o->no_norm) && (s = ts_fuse_norm(g, c.root_of, &c.st.norms)) != TS_OK) goto done;
    c.st.nodes_fused += c.st.norms;
    count_uses(&c);
    int nn = g->n_nodes;
    for (int i = 0; i < nn && s == TS_OK; i++)
        if (!g->nodes[i].dead && g->nodes[i].op == TS_OP_ADD) s = fuse_scatter_to(&c, i);
    if (s == TS_OK) count_uses(&c);
    for (int i = 0; i < nn && s == TS_OK; i++)
        if (!g->nodes[i].dead && g->nodes[i].op == TS_OP_MATMUL) s = fuse_epilogue(&c, i);
    for (int i = nn - 1; i >= 0 && s == TS_OK; i--)
        if (!g->nodes[i].dead && g->nodes[i].op == TS_OP_ADD) s = fuse_concat(&c, i);
    /* Roots from the end, so a tree takes the longest chain ending at it. */
    for (int i = nn - 1; i >= 0 && s == TS_OK; i--)
        if (c.root_of[i] < 0 && fusable_node(g, &g->nodes[i])) s = fuse_tree(&c, i);
    if (s != TS_OK) goto done;
    /* Control dependencies on members now point at their fused node. */
    for (int i = 0; i < g->n_nodes; i++) {
        ts_node *n = &g->nodes[i];
        for (int j = 0; j < n->n_ctrl; j++) {
            int32_t r = n->ctrl[j];
            while (c.root_of[r] >= 0) r = c.root_of[r];
            n->ctrl[j] = r;
        }
        /* a fused node must not wait for itself */
        int k = 0;
        for (int j = 0; j < n->n_ctrl; j++)
            if (n->ctrl[j] != i) n->ctrl[k++] = n->ctrl[j];
        n->n_ctrl = k;
    }
    if (stats) *stats = c.st;
done:
    free(c.uses);
    free(c.reader);
    free(c.root_of);
    return s;
}
