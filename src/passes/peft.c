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
#include <stdlib.h>
#include <string.h>

#include "peft_internal.h"

void ts_peft_patterns_free(ts_peft_patterns *p) {
    for (int i = 0; i < p->n; i++) regfree(&p->re[i]);
    p->n = 0;
}

ts_status ts_peft_patterns_compile(const char *key, const char *list, ts_peft_patterns *p) {
    p->n = 0;
    for (const char *q = list; *q;) {
        while (*q == ' ' || *q == ',') q++;
        const char *e = q;
        while (*e && *e != ',') e++;
        const char *end = e;
        while (end > q && end[-1] == ' ') end--;
        if (end > q) {
            if (p->n == TS_PEFT_MAX_PATTERNS) {
                ts_peft_patterns_free(p);
                return ts_fail(TS_ERR_INVALID, "%s: more than %d patterns", key,
                               TS_PEFT_MAX_PATTERNS);
            }
            if ((size_t)(end - q) >= sizeof p->text[0]) {
                ts_peft_patterns_free(p);
                return ts_fail(TS_ERR_INVALID, "%s: pattern '%.40s...' too long", key, q);
            }
            snprintf(p->text[p->n], sizeof p->text[0], "%.*s", (int)(end - q), q);
            int rc = regcomp(&p->re[p->n], p->text[p->n], REG_EXTENDED | REG_NOSUB);
            if (rc != 0) {
                char msg[128];
                regerror(rc, &p->re[p->n], msg, sizeof msg);
                ts_status s =
                    ts_fail(TS_ERR_INVALID, "%s: '%s' is not a valid regular expression: %s", key,
                            p->text[p->n], msg);
                ts_peft_patterns_free(p);
                return s;
            }
            p->n++;
        }
        q = e;
    }
    return TS_OK;
}

int ts_peft_is_weight_of(const ts_graph *g, const ts_node *n, int32_t v) {
    return !n->dead && !(g->values[v].name && ts_peft_param_kind(g->values[v].name) == 2) &&
           n->op == TS_OP_MATMUL && n->n_in == 2 && n->in[1] == v &&
           g->values[v].kind == TS_VK_PARAM && g->values[v].t.rank == 2 &&
           ts_dtype_is_float(g->values[v].t.dtype) && g->values[v].name;
}

ts_status ts_peft_no_match(const ts_graph *g, const char *key, const char *pattern,
                           const char *what, const char *weight) {
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
    return ts_fail(TS_ERR_INVALID, "%s: '%s' matches no %s (%s: %s)", key, pattern, what,
                   !strcmp(key, "peft.lora.targets") ? "the parameters LoRA can patch"
                                                     : "the layers' weights",
                   listed ? names : "none");
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

static ts_status lora_pass(ts_graph *g, const ts_peft_options *o, int32_t **lora, int *n_lora) {
    if (o->r < 1) return ts_fail(TS_ERR_INVALID, "peft.lora.r: %d must be >= 1", o->r);
    if (!(o->dropout >= 0 && o->dropout < 1))
        return ts_fail(TS_ERR_INVALID, "peft.lora.dropout: %g must be in [0, 1)", o->dropout);
    if (!isfinite(o->alpha))
        return ts_fail(TS_ERR_INVALID, "peft.lora.alpha: %g is not finite", o->alpha);
    const double scale = o->use_rslora ? o->alpha / sqrt((double)o->r) : o->alpha / o->r;
    ts_peft_patterns pt;
    ts_status s = ts_peft_patterns_compile("peft.lora.targets", o->targets, &pt);
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
        if (g->nodes[i].n_in == 2 && ts_peft_is_weight_of(g, &g->nodes[i], g->nodes[i].in[1]))
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
        if (!hit) s = ts_peft_no_match(g, "peft.lora.targets", pt.text[k], "matmul weight", weight);
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
        if (nd->n_in != 2 || !ts_peft_is_weight_of(g, nd, nd->in[1])) continue;
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
    ts_peft_patterns_free(&pt);
    free(weight);
    free(ab);
    free(trans);
    free(perm);
    free(out);
    return s;
}

ts_status ts_pass_peft(ts_graph *g, const ts_peft_options *o, int32_t **added, int *n_added) {
    *added = NULL;
    *n_added = 0;
    if (!o) return TS_OK;
    /* Adapters first: a layer's output is then still its matmul's (plus
     * bias), and LoRA's branch, added to the matmul's output afterwards,
     * lands inside the layer, before the adapter. */
    int32_t *ad = NULL, *lo = NULL;
    int n_ad = 0, n_lo = 0;
    ts_status s = TS_OK;
    if (o->adapter_after && o->adapter_after[0]) s = ts_pass_peft_adapters(g, o, &ad, &n_ad);
    if (s == TS_OK && o->targets && o->targets[0]) s = lora_pass(g, o, &lo, &n_lo);
    /* LoRA's parameters first, so a LoRA-only run is as before */
    int32_t *all = NULL;
    if (s == TS_OK && n_ad + n_lo > 0) {
        all = ts_alloc(sizeof(int32_t) * ((size_t)(n_ad + n_lo) + 1), "peft");
        if (!all) s = TS_ERR_NOMEM;
    }
    if (all) {
        if (n_lo) memcpy(all, lo, sizeof(int32_t) * (size_t)n_lo);
        if (n_ad) memcpy(all + n_lo, ad, sizeof(int32_t) * (size_t)n_ad);
        *added = all, *n_added = n_ad + n_lo;
    }
    free(ad);
    free(lo);
    return s;
}
