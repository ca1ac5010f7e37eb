#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ir/ir.h"

/* The ops layer's callbacks (see ts_ir_set_op_hooks in ir.h). Written once,
 * before the first graph exists, and only read afterwards. */
static ts_op_hooks op_hooks;

void ts_ir_set_op_hooks(const ts_op_hooks *h) {
    op_hooks = *h;
}

const char *ts_ir_op_name(int op) {
    const char *name = op_hooks.name ? op_hooks.name(op) : NULL;
    return name ? name : "?";
}

/* Arity and inference of op, or an internal error if the op is unknown or
 * the ops layer installed no hooks (a graph not made by ts_graph_new). */
static ts_status op_known(int op, int *min_in, int *max_in) {
    if (!op_hooks.name || !op_hooks.arity || !op_hooks.infer)
        return ts_fail(TS_ERR_INTERNAL, "no op hooks installed (make graphs with ts_graph_new)");
    if (!op_hooks.name(op) || !op_hooks.arity(op, min_in, max_in))
        return ts_fail(TS_ERR_INTERNAL, "unknown op id %d", op);
    return TS_OK;
}

ts_graph *ts_ir_graph_new(void) {
    ts_graph *g = ts_zalloc(sizeof *g, "graph");
    return g;
}

static void free_value(ts_value *v) {
    free(v->name);
    free(v->data);
}

void ts_graph_free(ts_graph *g) {
    if (!g) return;
    for (int i = 0; i < g->n_values; i++) free_value(&g->values[i]);
    for (int i = 0; i < g->n_nodes; i++) {
        free(g->nodes[i].in);
        free(g->nodes[i].ctrl);
    }
    free(g->values);
    free(g->nodes);
    free(g);
}

ts_status ts_graph_status(const ts_graph *g) {
    return g ? g->status : TS_ERR_INVALID;
}
const char *ts_graph_error(const ts_graph *g) {
    return g ? g->error : "no graph";
}

void ts_graph_set_error(ts_graph *g, ts_status s) {
    if (g->status != TS_OK) return;
    g->status = s;
    snprintf(g->error, sizeof g->error, "%s", ts_last_error());
}

ts_val ts_graph_fail(ts_graph *g, ts_status s, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ts_fail(s, "%s", msg);
    if (g) ts_graph_set_error(g, s);
    return TS_NONE;
}

int ts_type_equal(const ts_type *a, const ts_type *b) {
    if (a->dtype != b->dtype || a->rank != b->rank) return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return 0;
    return 1;
}

char *ts_type_str(char *buf, size_t n, const ts_type *t) {
    return ts_shape_str(buf, n, t->dtype, t->rank, t->dims);
}

int ts_axis(int axis, int rank) {
    if (axis < 0) axis += rank;
    return (axis < 0 || axis >= rank) ? -1 : axis;
}

const char *ts_value_label(const ts_graph *g, int32_t id, char *buf, size_t n) {
    if (id >= 0 && id < g->n_values && g->values[id].name) return g->values[id].name;
    snprintf(buf, n, "%%%d", id);
    return buf;
}

int32_t ts_value_new(ts_graph *g, const ts_type *t, ts_value_kind kind, const char *name) {
    if (ts_grow((void **)&g->values, &g->cap_values, g->n_values + 1, sizeof(ts_value),
                "graph values") != TS_OK) {
        ts_graph_set_error(g, TS_ERR_NOMEM);
        return -1;
    }
    ts_value *v = &g->values[g->n_values];
    memset(v, 0, sizeof *v);
    v->t = *t;
    v->kind = kind;
    v->node = -1;
    v->grad_of = -1;
    v->state_of = -1;
    if (name && !(v->name = ts_strdup(name))) {
        ts_graph_set_error(g, TS_ERR_NOMEM);
        return -1;
    }
    return g->n_values++;
}

ts_status ts_node_append_output(ts_graph *g, int32_t node, int32_t v) {
    ts_node *n = &g->nodes[node];
    if (n->n_out >= TS_MAX_OUT)
        return ts_fail(TS_ERR_INTERNAL, "node %d (%s) already has %d outputs", node,
                       ts_ir_op_name(n->op), n->n_out);
    g->values[v].node = node;
    g->values[v].out_index = n->n_out;
    n->out[n->n_out++] = v;
    return TS_OK;
}

static int valid(const ts_graph *g, ts_val v) {
    return g && v.id >= 0 && v.id < g->n_values;
}

int ts_rank(const ts_graph *g, ts_val v) {
    return valid(g, v) ? g->values[v.id].t.rank : -1;
}
ts_dtype ts_dtype_of(const ts_graph *g, ts_val v) {
    return valid(g, v) ? g->values[v.id].t.dtype : TS_F32;
}
int64_t ts_dim(const ts_graph *g, ts_val v, int axis) {
    if (!valid(g, v)) return -1;
    int a = ts_axis(axis, g->values[v.id].t.rank);
    return a < 0 ? -1 : g->values[v.id].t.dims[a];
}
int64_t ts_numel(const ts_graph *g, ts_val v) {
    return valid(g, v) ? ts_type_numel(&g->values[v.id].t) : -1;
}
const char *ts_name(const ts_graph *g, ts_val v) {
    return valid(g, v) ? g->values[v.id].name : NULL;
}

ts_val ts_find(const ts_graph *g, const char *name) {
    for (int i = 0; g && i < g->n_values; i++)
        if (g->values[i].name && strcmp(g->values[i].name, name) == 0) return ts_mkval(i);
    return TS_NONE;
}

ts_status ts_set_name(ts_graph *g, ts_val v, const char *name) {
    if (!valid(g, v)) return ts_fail(TS_ERR_INVALID, "ts_set_name: invalid value handle");
    if (!name || !*name) return ts_fail(TS_ERR_INVALID, "ts_set_name: empty name");
    ts_val other = ts_find(g, name);
    if (ts_val_ok(other) && other.id != v.id)
        return ts_fail(TS_ERR_INVALID, "ts_set_name: name '%s' is already used", name);
    char *s = ts_strdup(name);
    if (!s) return TS_ERR_NOMEM;
    free(g->values[v.id].name);
    g->values[v.id].name = s;
    return TS_OK;
}

ts_status ts_mark_output(ts_graph *g, ts_val v, const char *name) {
    if (!valid(g, v)) return ts_fail(TS_ERR_INVALID, "ts_mark_output: invalid value handle");
    if (name) {
        ts_status s = ts_set_name(g, v, name);
        if (s != TS_OK) return s;
    } else if (!g->values[v.id].name) {
        return ts_fail(TS_ERR_INVALID, "ts_mark_output: an output needs a name");
    }
    g->values[v.id].is_output = 1;
    return TS_OK;
}

/* ---- leaves ------------------------------------------------------------ */

static int check_leaf(ts_graph *g, const char *what, const char *name, ts_dtype dt, int rank,
                      const int64_t *dims, int need_name) {
    if (!g) return 0;
    if (g->status != TS_OK) return 0;
    if (need_name && (!name || !*name)) {
        ts_graph_fail(g, TS_ERR_INVALID, "%s: a name is required", what);
        return 0;
    }
    if (name && ts_val_ok(ts_find(g, name))) {
        ts_graph_fail(g, TS_ERR_INVALID, "%s '%s': name already used", what, name);
        return 0;
    }
    if ((unsigned)dt >= TS_DTYPE_COUNT) {
        ts_graph_fail(g, TS_ERR_INVALID, "%s '%s': unknown dtype %d", what, name ? name : "", dt);
        return 0;
    }
    if (rank < 0 || rank > TS_MAX_RANK || (rank > 0 && !dims)) {
        ts_graph_fail(g, TS_ERR_SHAPE, "%s '%s': rank %d out of range [0, %d]", what,
                      name ? name : "", rank, TS_MAX_RANK);
        return 0;
    }
    for (int i = 0; i < rank; i++)
        if (dims[i] <= 0) {
            ts_graph_fail(g, TS_ERR_SHAPE, "%s '%s': dimension %d is %lld (must be > 0)", what,
                          name ? name : "", i, (long long)dims[i]);
            return 0;
        }
    return 1;
}

static ts_type mktype(ts_dtype dt, int rank, const int64_t *dims) {
    ts_type t = {dt, rank, {0}};
    for (int i = 0; i < rank; i++) t.dims[i] = dims[i];
    return t;
}

ts_val ts_input(ts_graph *g, const char *name, ts_dtype dt, int rank, const int64_t *dims) {
    if (!check_leaf(g, "input", name, dt, rank, dims, 1)) return TS_NONE;
    ts_type t = mktype(dt, rank, dims);
    int32_t id = ts_value_new(g, &t, TS_VK_INPUT, name);
    return ts_mkval(id);
}

ts_val ts_param(ts_graph *g, const char *name, ts_dtype dt, int rank, const int64_t *dims,
                ts_init init) {
    if (!check_leaf(g, "param", name, dt, rank, dims, 1)) return TS_NONE;
    if (!ts_dtype_is_float(dt))
        return ts_graph_fail(g, TS_ERR_INVALID, "param '%s': dtype %s is not a float type", name,
                             ts_dtype_name(dt));
    if ((unsigned)init.kind > TS_INIT_BUFFER)
        return ts_graph_fail(g, TS_ERR_INVALID, "param '%s': unknown initialiser %d", name,
                             init.kind);
    if (init.kind == TS_INIT_BUFFER && !init.data)
        return ts_graph_fail(g, TS_ERR_INVALID, "param '%s': buffer initialiser without data",
                             name);
    ts_type t = mktype(dt, rank, dims);
    int32_t id = ts_value_new(g, &t, TS_VK_PARAM, name);
    if (id < 0) return TS_NONE;
    ts_value *v = &g->values[id];
    v->init = init;
    if (init.kind == TS_INIT_BUFFER) {
        size_t n = ts_type_bytes(&t);
        if (!(v->data = ts_alloc(n, "param init buffer"))) {
            ts_graph_set_error(g, TS_ERR_NOMEM);
            return TS_NONE;
        }
        memcpy(v->data, init.data, n);
        v->init.data = NULL;
    }
    return ts_mkval(id);
}

ts_val ts_constant(ts_graph *g, const char *name, ts_dtype dt, int rank, const int64_t *dims,
                   const void *data) {
    if (!check_leaf(g, "constant", name, dt, rank, dims, 0)) return TS_NONE;
    if (!data) return ts_graph_fail(g, TS_ERR_INVALID, "constant: data is NULL");
    ts_type t = mktype(dt, rank, dims);
    int32_t id = ts_value_new(g, &t, TS_VK_CONST, name);
    if (id < 0) return TS_NONE;
    size_t n = ts_type_bytes(&t);
    if (!(g->values[id].data = ts_alloc(n, "constant data"))) {
        ts_graph_set_error(g, TS_ERR_NOMEM);
        return TS_NONE;
    }
    memcpy(g->values[id].data, data, n);
    return ts_mkval(id);
}

ts_val ts_scalar(ts_graph *g, double value, ts_dtype dt) {
    unsigned char buf[8];
    switch (dt) {
    case TS_F32: *(float *)buf = (float)value; break;
    case TS_F64: *(double *)buf = value; break;
    case TS_I32: *(int32_t *)buf = (int32_t)value; break;
    case TS_I64: *(int64_t *)buf = (int64_t)value; break;
    case TS_U8: buf[0] = (unsigned char)value; break;
    default:
        return ts_graph_fail(g, TS_ERR_UNSUPPORTED, "scalar: dtype %s not supported",
                             ts_dtype_name(dt));
    }
    return ts_constant(g, NULL, dt, 0, NULL, buf);
}

/* ---- nodes ------------------------------------------------------------- */

ts_val ts_node_add(ts_graph *g, int op, int n_in, const ts_val *in, const ts_attrs *attrs,
                   ts_val *outs) {
    if (!g || g->status != TS_OK) return TS_NONE;
    int min_in, max_in;
    if (op_known(op, &min_in, &max_in) != TS_OK)
        return ts_graph_fail(g, TS_ERR_INTERNAL, "%s", ts_last_error());
    const char *op_name = ts_ir_op_name(op);
    for (int i = 0; i < n_in; i++) {
        if (!ts_val_ok(in[i])) return TS_NONE; /* earlier error stands */
        if (in[i].id >= g->n_values)
            return ts_graph_fail(g, TS_ERR_INVALID, "%s: input %d is not a value of this graph",
                                 op_name, i);
    }
    if (n_in < min_in || (max_in >= 0 && n_in > max_in))
        return ts_graph_fail(g, TS_ERR_INVALID, "%s: takes %d..%d inputs, got %d", op_name, min_in,
                             max_in, n_in);
    ts_node n = {0};
    n.op = op;
    n.n_in = n_in;
    n.a = attrs ? *attrs : ts_attrs_zero();
    n.in = ts_alloc(sizeof(int32_t) * (size_t)(n_in ? n_in : 1), "node inputs");
    if (!n.in) {
        ts_graph_set_error(g, TS_ERR_NOMEM);
        return TS_NONE;
    }
    for (int i = 0; i < n_in; i++) n.in[i] = in[i].id;
    ts_type ot[TS_MAX_OUT];
    int n_out = 1;
    memset(ot, 0, sizeof ot);
    ts_status s = op_hooks.infer(g, &n, ot, &n_out);
    if (s != TS_OK) {
        char msg[1024], operands[600];
        size_t k = 0;
        operands[0] = 0;
        for (int i = 0; i < n_in && k < sizeof operands; i++) {
            char tb[128], lb[32];
            k += (size_t)snprintf(operands + k, sizeof operands - k, "%s%s=%s", i ? ", " : "",
                                  ts_value_label(g, in[i].id, lb, sizeof lb),
                                  ts_type_str(tb, sizeof tb, &g->values[in[i].id].t));
        }
        snprintf(msg, sizeof msg, "%s", ts_last_error());
        free(n.in);
        return ts_graph_fail(g, s, "%s(%s): %s", op_name, operands, msg);
    }
    if (ts_grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof(ts_node),
                "graph nodes") != TS_OK) {
        free(n.in);
        ts_graph_set_error(g, TS_ERR_NOMEM);
        return TS_NONE;
    }
    int32_t nid = g->n_nodes;
    n.n_out = n_out;
    for (int i = 0; i < n_out; i++) {
        int32_t vid = ts_value_new(g, &ot[i], TS_VK_NODE, NULL);
        if (vid < 0) {
            free(n.in);
            return TS_NONE;
        }
        g->values[vid].node = nid;
        g->values[vid].out_index = i;
        n.out[i] = vid;
        if (outs) outs[i] = ts_mkval(vid);
    }
    g->nodes[g->n_nodes++] = n;
    return n_out > 0 ? ts_mkval(n.out[0]) : ts_mkval(TS_NO_OUTPUT);
}

ts_status ts_node_add_ctrl(ts_graph *g, int32_t after, int32_t before) {
    ts_node *n = &g->nodes[after];
    for (int i = 0; i < n->n_ctrl; i++)
        if (n->ctrl[i] == before) return TS_OK;
    int32_t *c = ts_realloc(n->ctrl, sizeof(int32_t) * (size_t)(n->n_ctrl + 1), "control deps");
    if (!c) return TS_ERR_NOMEM;
    n->ctrl = c;
    n->ctrl[n->n_ctrl++] = before;
    return TS_OK;
}

/* ---- whole-graph utilities ------------------------------------------- */

ts_graph *ts_graph_clone(const ts_graph *src) {
    ts_graph *g = ts_ir_graph_new();
    if (!g) return NULL;
    g->status = src->status;
    memcpy(g->error, src->error, sizeof g->error);
    g->next_stream = src->next_stream;
    g->values = ts_zalloc(sizeof(ts_value) * (size_t)(src->n_values + 1), "graph values");
    g->nodes = ts_zalloc(sizeof(ts_node) * (size_t)(src->n_nodes + 1), "graph nodes");
    if (!g->values || !g->nodes) goto fail;
    g->cap_values = src->n_values + 1;
    g->cap_nodes = src->n_nodes + 1;
    for (int i = 0; i < src->n_values; i++) {
        const ts_value *sv = &src->values[i];
        ts_value *v = &g->values[i];
        *v = *sv;
        v->name = NULL;
        v->data = NULL;
        g->n_values = i + 1;
        if (sv->name && !(v->name = ts_strdup(sv->name))) goto fail;
        if (sv->data) {
            size_t n = ts_type_bytes(&sv->t);
            if (!(v->data = ts_alloc(n, "value data"))) goto fail;
            memcpy(v->data, sv->data, n);
        }
    }
    for (int i = 0; i < src->n_nodes; i++) {
        const ts_node *sn = &src->nodes[i];
        ts_node *n = &g->nodes[i];
        *n = *sn;
        n->in = NULL;
        n->ctrl = NULL;
        g->n_nodes = i + 1;
        if (!(n->in = ts_alloc(sizeof(int32_t) * (size_t)(sn->n_in ? sn->n_in : 1), "node")))
            goto fail;
        memcpy(n->in, sn->in, sizeof(int32_t) * (size_t)sn->n_in);
        if (sn->n_ctrl) {
            if (!(n->ctrl = ts_alloc(sizeof(int32_t) * (size_t)sn->n_ctrl, "node"))) goto fail;
            memcpy(n->ctrl, sn->ctrl, sizeof(int32_t) * (size_t)sn->n_ctrl);
        }
    }
    return g;
fail:
    ts_graph_free(g);
    return NULL;
}

ts_status ts_graph_permute_nodes(ts_graph *g, const int32_t *perm, int n) {
    if (n != g->n_nodes)
        return ts_fail(TS_ERR_INTERNAL, "permuting nodes: %d of %d nodes ordered", n, g->n_nodes);
    ts_node *nodes = ts_alloc(sizeof(ts_node) * (size_t)(g->cap_nodes + 1), "graph nodes");
    int32_t *newid = ts_alloc(sizeof(int32_t) * (size_t)(n + 1), "graph nodes");
    if (!nodes || !newid) {
        free(nodes);
        free(newid);
        return TS_ERR_NOMEM;
    }
    for (int k = 0; k < n; k++) {
        nodes[k] = g->nodes[perm[k]];
        newid[perm[k]] = k;
    }
    for (int k = 0; k < n; k++)
        for (int c = 0; c < nodes[k].n_ctrl; c++) nodes[k].ctrl[c] = newid[nodes[k].ctrl[c]];
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].kind == TS_VK_NODE && g->values[v].node >= 0)
            g->values[v].node = newid[g->values[v].node];
    free(g->nodes);
    g->nodes = nodes;
    free(newid);
    return TS_OK;
}

ts_status ts_graph_compact(ts_graph *g, int32_t *remap_out) {
    /* A value survives if it is a leaf that is named/output/param/state, or
     * the output of a live node. Inputs survive always (the user feeds them). */
    int32_t *nmap = ts_alloc(sizeof(int32_t) * (size_t)(g->n_nodes + 1), "compact");
    int32_t *vmap =
        remap_out ? remap_out : ts_alloc(sizeof(int32_t) * (size_t)(g->n_values + 1), "compact");
    char *used = ts_zalloc((size_t)g->n_values + 1, "compact");
    if (!nmap || !vmap || !used) {
        free(nmap);
        if (!remap_out) free(vmap);
        free(used);
        return TS_ERR_NOMEM;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        ts_node *n = &g->nodes[i];
        if (n->dead) continue;
        for (int j = 0; j < n->n_in; j++) used[n->in[j]] = 1;
        for (int j = 0; j < n->n_out; j++) used[n->out[j]] = 1;
    }
    for (int i = 0; i < g->n_values; i++) {
        ts_value *v = &g->values[i];
        if (v->kind == TS_VK_INPUT || v->kind == TS_VK_PARAM || v->kind == TS_VK_STATE ||
            v->is_output)
            used[i] = 1;
        if (v->kind == TS_VK_NODE && g->nodes[v->node].dead) used[i] = 0;
    }
    int nv = 0;
    for (int i = 0; i < g->n_values; i++) {
        if (used[i]) {
            vmap[i] = nv;
            if (nv != i) g->values[nv] = g->values[i];
            nv++;
        } else {
            vmap[i] = -1;
            free_value(&g->values[i]);
        }
    }
    int nn = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i].dead) {
            nmap[i] = -1;
            free(g->nodes[i].in);
            free(g->nodes[i].ctrl);
            continue;
        }
        nmap[i] = nn;
        if (nn != i) g->nodes[nn] = g->nodes[i];
        nn++;
    }
    g->n_values = nv;
    g->n_nodes = nn;
    for (int i = 0; i < nv; i++) {
        ts_value *v = &g->values[i];
        if (v->node >= 0) v->node = nmap[v->node];
        if (v->grad_of >= 0) v->grad_of = vmap[v->grad_of];
        if (v->state_of >= 0) v->state_of = vmap[v->state_of];
    }
    for (int i = 0; i < nn; i++) {
        ts_node *n = &g->nodes[i];
        for (int j = 0; j < n->n_in; j++) n->in[j] = vmap[n->in[j]];
        for (int j = 0; j < n->n_out; j++) n->out[j] = vmap[n->out[j]];
        int k = 0;
        for (int j = 0; j < n->n_ctrl; j++)
            if (nmap[n->ctrl[j]] >= 0) n->ctrl[k++] = nmap[n->ctrl[j]];
        n->n_ctrl = k;
    }
    free(nmap);
    free(used);
    if (!remap_out) free(vmap);
    return TS_OK;
}

ts_status ts_graph_verify(const ts_graph *g) {
    char *defined = ts_zalloc((size_t)g->n_values + 1, "verify");
    if (!defined) return TS_ERR_NOMEM;
    ts_status s = TS_OK;
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i].kind != TS_VK_NODE) defined[i] = 1;
    for (int i = 0; i < g->n_nodes && s == TS_OK; i++) {
        const ts_node *n = &g->nodes[i];
        if (n->dead) continue;
        int min_in, max_in;
        if (op_known(n->op, &min_in, &max_in) != TS_OK) {
            s = op_hooks.name
                    ? ts_fail(TS_ERR_INTERNAL, "verify: node %d has unknown op %d", i, n->op)
                    : ts_fail(TS_ERR_INTERNAL, "verify: node %d: %s", i, ts_last_error());
            break;
        }
        const char *op_name = ts_ir_op_name(n->op);
        for (int j = 0; j < n->n_in; j++)
            if (n->in[j] < 0 || n->in[j] >= g->n_values || !defined[n->in[j]]) {
                s = ts_fail(TS_ERR_INTERNAL,
                            "verify: node %d (%s) reads value %d before it is "
                            "defined",
                            i, op_name, n->in[j]);
                break;
            }
        if (s != TS_OK) break;
        ts_type ot[TS_MAX_OUT];
        int n_out = 1;
        if (op_hooks.infer(g, n, ot, &n_out) != TS_OK || n_out != n->n_out) {
            s = ts_fail(TS_ERR_INTERNAL, "verify: node %d (%s) no longer type-checks: %s", i,
                        op_name, ts_last_error());
            break;
        }
        for (int j = 0; j < n_out; j++) {
            if (!ts_type_equal(&ot[j], &g->values[n->out[j]].t)) {
                s = ts_fail(TS_ERR_INTERNAL, "verify: node %d (%s) output %d type changed", i,
                            op_name, j);
                break;
            }
            defined[n->out[j]] = 1;
        }
    }
    free(defined);
    return s;
}

static void print_value_ref(const ts_graph *g, int32_t id, FILE *out) {
    char lb[32];
    fprintf(out, "%s", ts_value_label(g, id, lb, sizeof lb));
}

void ts_graph_print(const ts_graph *g, const int32_t *order, FILE *out) {
    static const char *kinds[] = {"", "input", "param", "const", "state"};
    for (int i = 0; i < g->n_values; i++) {
        const ts_value *v = &g->values[i];
        if (v->kind == TS_VK_NODE) continue;
        char tb[128];
        fprintf(out, "%-6s %%%d ", kinds[v->kind], i);
        if (v->name) fprintf(out, "\"%s\" ", v->name);
        fprintf(out, ": %s\n", ts_type_str(tb, sizeof tb, &v->t));
    }
    for (int k = 0; k < g->n_nodes; k++) {
        int i = order ? order[k] : k;
        const ts_node *n = &g->nodes[i];
        if (n->dead) continue;
        for (int j = 0; j < n->n_out; j++) {
            char tb[128];
            fprintf(out, "%s%%%d", j ? ", " : "", n->out[j]);
            if (g->values[n->out[j]].name) fprintf(out, " \"%s\"", g->values[n->out[j]].name);
            fprintf(out, ": %s", ts_type_str(tb, sizeof tb, &g->values[n->out[j]].t));
        }
        fprintf(out, "%s%s(", n->n_out ? " = " : "", ts_ir_op_name(n->op));
        for (int j = 0; j < n->n_in; j++) {
            if (j) fprintf(out, ", ");
            if (g->values[n->in[j]].name)
                print_value_ref(g, n->in[j], out);
            else
                fprintf(out, "%%%d", n->in[j]);
        }
        fprintf(out, ")");
        if (op_hooks.print_attrs) op_hooks.print_attrs(n, out);
        if (n->recompute) fprintf(out, " recompute");
        fprintf(out, "\n");
    }
}

int ts_value_reads(const ts_graph *g, int32_t v, int *last) {
    int k = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const ts_node *n = &g->nodes[i];
        if (n->dead) continue;
        for (int j = 0; j < n->n_in; j++)
            if (n->in[j] == v) k++, *last = i;
    }
    return k;
}
