/* The peft pass: LoRA as a graph rewrite before autodiff (docs/peft.md).
 *
 * Every matmul whose weight operand (its second input) is a rank-2
 * parameter named by one of the target patterns gets a low-rank branch
 *
 *     y = x W' + s · (dropout(x) A^T) B^T,   s = alpha / r (or alpha / sqrt(r))
 *
 * where W' is W read as the matmul reads it (nn.Linear's [out, in] with
 * trans_b, or [in, out] without). A [r, in] starts Kaiming-uniform (a =
 * sqrt(5), as peft and nn.Linear), B [out, r] starts at zero, so the
 * branch adds exactly 0 at step 0. One A and B per weight, shared by every
 * matmul that reads it in the same orientation.
 *
 * The matmul's output value keeps its id, name and output mark: the
 * matmul is given a fresh output and the final add writes the old one, so
 * every reader (and ts_plan_read by name) sees the patched result without
 * being rewritten. The new nodes are moved right after their matmul to
 * keep the node order topological. */
#include <math.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include "passes.h"

#define MAX_PATTERNS 64

typedef struct patterns {
    regex_t re[MAX_PATTERNS];
    char text[MAX_PATTERNS][256];
    int n;
} patterns;

static void patterns_free(patterns *p) {
    for (int i = 0; i < p->n; i++) regfree(&p->re[i]);
    p->n = 0;
}

/* Split the comma-separated list and compile each pattern. */
static ts_status patterns_compile(const char *list, patterns *p) {
    p->n = 0;
    for (const char *q = list; *q;) {
        while (*q == ' ' || *q == ',') q++;
        const char *e = q;
        while (*e && *e != ',') e++;
        const char *end = e;
        while (end > q && end[-1] == ' ') end--;
        if (end > q) {
            if (p->n == MAX_PATTERNS) {
                patterns_free(p);
                return ts_fail(TS_ERR_INVALID, "peft.lora.targets: more than %d patterns",
                               MAX_PATTERNS);
            }
            if ((size_t)(end - q) >= sizeof p->text[0]) {
                patterns_free(p);
                return ts_fail(TS_ERR_INVALID, "peft.lora.targets: pattern '%.40s...' too long", q);
            }
            snprintf(p->text[p->n], sizeof p->text[0], "%.*s", (int)(end - q), q);
            int rc = regcomp(&p->re[p->n], p->text[p->n], REG_EXTENDED | REG_NOSUB);
            if (rc != 0) {
                char msg[128];
                regerror(rc, &p->re[p->n], msg, sizeof msg);
                ts_status s = ts_fail(
                    TS_ERR_INVALID, "peft.lora.targets: '%s' is not a valid regular expression: %s",
                    p->text[p->n], msg);
                patterns_free(p);
                return s;
            }
            p->n++;
        }
        q = e;
    }
    return TS_OK;
}

/* Is value v the weight operand of node n, a matmul we can patch? */
static int is_weight_of(const ts_graph *g, const ts_node *n, int32_t v) {
    return !n->dead && n->op == TS_OP_MATMUL && n->n_in == 2 && n->in[1] == v &&
           g->values[v].kind == TS_VK_PARAM && g->values[v].t.rank == 2 &&
           ts_dtype_is_float(g->values[v].t.dtype) && g->values[v].name;
}

/* The error for a pattern that names no matmul weight: the candidates. */
static ts_status no_match(const ts_graph *g, const char *pattern, const char *weight) {
    char names[1024];
    size_t k = 0;
    names[0] = 0;
    int listed = 0;
    for (int v = 0; v < g->n_values && k < sizeof names - 8; v++) {
        if (!weight[v]) continue;
        int w =
            snprintf(names + k, sizeof names - k, "%s%s", listed ? ", " : "", g->values[v].name);
        if (w < 0 || (size_t)w >= sizeof names - k) {
            snprintf(names + k, sizeof names - k, ", ...");
            break;
        }
        k += (size_t)w;
        listed++;
    }
    return ts_fail(TS_ERR_INVALID,
                   "peft.lora.targets: '%s' matches no matmul weight (the parameters LoRA can "
                   "patch: %s)",
                   pattern, listed ? names : "none");
}

/* The LoRA branch of matmul node i added to its output (see the top). */
static ts_status patch(ts_graph *g, int i, int32_t a, int32_t b, double scale, double dropout) {
    const ts_node nd = g->nodes[i];
    const int32_t y = nd.out[0];
    ts_val x = ts_mkval(nd.in[0]);
    if (dropout > 0) x = ts_dropout(g, x, dropout);
    ts_val h = ts_matmul(g, x, ts_mkval(a), (int)nd.a.matmul.trans_a, 1);
    ts_val d = ts_affine_scalar(g, ts_matmul(g, h, ts_mkval(b), 0, 1), scale, 0.0);
    ts_val z = ts_add(g, ts_mkval(y), d);
    ts_status s = ts_graph_status(g);
    if (s != TS_OK) return s;
    if (!ts_type_equal(&g->values[z.id].t, &g->values[y].t))
        return ts_fail(TS_ERR_UNSUPPORTED, "peft: the LoRA branch of '%s' has another shape",
                       g->values[nd.in[1]].name);
    /* swap: the matmul writes z's slot, the add writes y */
    const int32_t add = g->values[z.id].node;
    g->nodes[i].out[0] = z.id;
    g->values[z.id].node = i;
    g->values[z.id].out_index = 0;
    g->nodes[add].out[0] = y;
    g->nodes[add].in[0] = z.id;
    g->values[y].node = add;
    g->values[y].out_index = 0;
    return TS_OK;
}

static int32_t new_param(ts_graph *g, int32_t w, const char *suffix, int64_t d0, int64_t d1,
                         ts_init init) {
    char name[512];
    snprintf(name, sizeof name, "%s.%s", g->values[w].name, suffix);
    if (ts_val_ok(ts_find(g, name))) {
        ts_fail(TS_ERR_INVALID, "peft: the graph already has a value named '%s'", name);
        return -1;
    }
    int64_t dims[2] = {d0, d1};
    ts_val p = ts_param(g, name, g->values[w].t.dtype, 2, dims, init);
    return ts_val_ok(p) ? p.id : -1;
}

ts_status ts_pass_peft(ts_graph *g, const ts_peft_options *o, int32_t **lora, int *n_lora) {
    *lora = NULL;
    *n_lora = 0;
    if (!o || !o->targets || !o->targets[0]) return TS_OK;
    if (o->r < 1) return ts_fail(TS_ERR_INVALID, "peft.lora.r: %d must be >= 1", o->r);
    if (!(o->dropout >= 0 && o->dropout < 1))
        return ts_fail(TS_ERR_INVALID, "peft.lora.dropout: %g must be in [0, 1)", o->dropout);
    if (!isfinite(o->alpha))
        return ts_fail(TS_ERR_INVALID, "peft.lora.alpha: %g is not finite", o->alpha);
    const double scale = o->use_rslora ? o->alpha / sqrt((double)o->r) : o->alpha / o->r;
    patterns pt;
    ts_status s = patterns_compile(o->targets, &pt);
    if (s != TS_OK) return s;
    const int nv0 = g->n_values, n0 = g->n_nodes;
    char *weight = ts_zalloc((size_t)nv0 + 1, "peft"); /* a matmul's weight operand */
    int32_t *ab = ts_alloc(sizeof(int32_t) * 2 * ((size_t)nv0 + 1), "peft"); /* its A, B */
    int *trans = ts_alloc(sizeof(int) * ((size_t)nv0 + 1), "peft");
    int32_t *perm = NULL, *out = NULL;
    if (!weight || !ab || !trans) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    for (int i = 0; i < n0; i++)
        if (g->nodes[i].n_in == 2 && is_weight_of(g, &g->nodes[i], g->nodes[i].in[1]))
            weight[g->nodes[i].in[1]] = 1;
    /* which weights each pattern names */
    int n_target = 0;
    for (int v = 0; v < nv0; v++) ab[2 * v] = ab[2 * v + 1] = -1, trans[v] = -1;
    for (int k = 0; k < pt.n && s == TS_OK; k++) {
        int hit = 0;
        for (int v = 0; v < nv0; v++) {
            if (!weight[v] || regexec(&pt.re[k], g->values[v].name, 0, NULL, 0) != 0) continue;
            hit = 1;
            if (ab[2 * v] == -1) ab[2 * v] = -2, n_target++; /* chosen, made below */
        }
        if (!hit) s = no_match(g, pt.text[k], weight);
    }
    if (s != TS_OK) goto done;
    perm = ts_alloc(sizeof(int32_t) * ((size_t)n0 * 6 + 1), "peft");
    out = ts_alloc(sizeof(int32_t) * (2 * (size_t)n_target + 1), "peft");
    if (!perm || !out) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    int np = 0, nl = 0;
    for (int i = 0; i < n0 && s == TS_OK; i++) {
        perm[np++] = i;
        const ts_node *nd = &g->nodes[i];
        if (nd->n_in != 2 || !is_weight_of(g, nd, nd->in[1])) continue;
        const int32_t w = nd->in[1];
        if (w >= nv0 || ab[2 * w] == -1) continue;
        const int tb = (int)nd->a.matmul.trans_b;
        const int64_t *wd = g->values[w].t.dims;
        const int64_t in = tb ? wd[1] : wd[0], outd = tb ? wd[0] : wd[1];
        if (ab[2 * w] == -2) {
            /* first reader: make A [r, in] and B [out, r] */
            int32_t a = new_param(g, w, "lora_A", o->r, in, ts_init_kaiming_uniform(sqrt(5.0)));
            int32_t b = a < 0 ? -1 : new_param(g, w, "lora_B", outd, o->r, ts_init_zeros());
            if (a < 0 || b < 0) {
                s = g->status != TS_OK ? g->status : TS_ERR_INVALID;
                break;
            }
            ab[2 * w] = a, ab[2 * w + 1] = b, trans[w] = tb;
            out[nl++] = a, out[nl++] = b;
        } else if (trans[w] != tb) {
            s = ts_fail(TS_ERR_UNSUPPORTED,
                        "peft: '%s' is read by matmuls both as [out, in] and as [in, out]; LoRA "
                        "patches a weight in one orientation",
                        g->values[w].name);
            break;
        }
        const int before = g->n_nodes;
        if ((s = patch(g, i, ab[2 * w], ab[2 * w + 1], scale, o->dropout)) != TS_OK) break;
        for (int k = before; k < g->n_nodes; k++) perm[np++] = k;
    }
    if (s == TS_OK && np != g->n_nodes)
        s = ts_fail(TS_ERR_INTERNAL, "peft pass: %d of %d nodes ordered", np, g->n_nodes);
    if (s == TS_OK) s = ts_graph_permute_nodes(g, perm, np);
    if (s == TS_OK) {
        *lora = out, *n_lora = nl;
        out = NULL;
    }
done:
    patterns_free(&pt);
    free(weight);
    free(ab);
    free(trans);
    free(perm);
    free(out);
    return s;
}
