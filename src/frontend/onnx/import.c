/* ts_onnx_import: the graph's inputs and initialisers first, then every node
 * in file order (ONNX graphs are topologically sorted), each through ops.c.
 * A refused node leaves its outputs undefined, so the nodes after it that
 * read them are skipped quietly and only the root causes are listed. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "frontend/onnx/onnx_internal.h"

onnx_value *onnx_find(onnx_ctx *x, const char *name) {
    for (int i = x->n_vals - 1; name && i >= 0; i--)
        if (!strcmp(x->vals[i].name, name)) return &x->vals[i];
    return NULL;
}

ts_status onnx_define(onnx_ctx *x, const char *name, ts_val v, onnx_const *c) {
    if (x->n_vals == x->cap_vals) {
        const int cap = x->cap_vals ? 2 * x->cap_vals : 64;
        onnx_value *nv = realloc(x->vals, (size_t)cap * sizeof *nv);
        if (!nv) {
            onnx_const_free(c);
            return ts_fail(TS_ERR_NOMEM, "onnx: out of memory for value '%s'", name);
        }
        x->vals = nv, x->cap_vals = cap;
    }
    char *dup = strdup(name ? name : "");
    if (!dup) {
        onnx_const_free(c);
        return ts_fail(TS_ERR_NOMEM, "onnx: out of memory for value '%s'", name);
    }
    x->vals[x->n_vals++] = (onnx_value){dup, v, c, 0};
    return TS_OK;
}

ts_val onnx_get(onnx_ctx *x, const char *name) {
    onnx_value *e = onnx_find(x, name);
    if (!e) return TS_NONE;
    if (ts_val_ok(e->v) || !e->c) return e->v;
    const onnx_const *c = e->c;
    if (e->param) {
        e->v = ts_param(x->g, e->name, TS_F32, c->rank, c->dims, ts_init_buffer(c->f));
        x->info->n_params++, x->info->param_elems += c->n;
    } else if (c->dtype == TS_U8) {
        uint8_t *b = malloc((size_t)(c->n ? c->n : 1));
        if (!b) return ts_graph_fail(x->g, TS_ERR_NOMEM, "onnx: out of memory for '%s'", name);
        for (int64_t k = 0; k < c->n; k++) b[k] = c->i[k] != 0;
        e->v = ts_constant(x->g, NULL, TS_U8, c->rank, c->dims, b);
        free(b);
    } else {
        e->v = ts_constant(x->g, NULL, c->dtype, c->rank, c->dims,
                           c->dtype == TS_F32 ? (const void *)c->f : (const void *)c->i);
    }
    return e->v;
}

const onnx_const *onnx_const_of(onnx_ctx *x, const char *name) {
    const onnx_value *e = onnx_find(x, name);
    return e && !e->param ? e->c : NULL;
}

onnx_const *onnx_const_new(ts_dtype dt, int rank, const int64_t *dims) {
    onnx_const *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->dtype = dt, c->rank = rank, c->n = 1;
    for (int k = 0; k < rank; k++) c->dims[k] = dims[k], c->n *= dims[k];
    const size_t cnt = (size_t)(c->n > 0 ? c->n : 1);
    if (dt == TS_F32)
        c->f = calloc(cnt, sizeof(float));
    else
        c->i = calloc(cnt, sizeof(int64_t));
    if (!c->f && !c->i) {
        free(c);
        return NULL;
    }
    return c;
}

double onnx_const_at(const onnx_const *c, int64_t k) {
    return c->f ? (double)c->f[k] : (double)c->i[k];
}

long onnx_producer(const onnx_ctx *x, const char *name) {
    for (long i = (long)x->at; name && i >= 0; i--) {
        const Onnx__NodeProto *n = x->gp->node[i];
        for (size_t k = 0; k < n->n_output; k++)
            if (!strcmp(n->output[k], name)) return i;
    }
    return -1;
}

int onnx_consumers(const onnx_ctx *x, const char *name, long *first) {
    int cnt = 0;
    *first = -1;
    for (size_t i = x->at + 1; i < x->gp->n_node; i++) {
        const Onnx__NodeProto *n = x->gp->node[i];
        int reads = 0;
        for (size_t k = 0; k < n->n_input; k++) reads |= !strcmp(n->input[k], name);
        if (reads && !cnt++) *first = (long)i;
    }
    for (size_t i = 0; i < x->gp->n_output; i++) cnt += !strcmp(x->gp->output[i]->name, name);
    return cnt;
}

ts_status onnx_refuse(onnx_ctx *x, const Onnx__NodeProto *n, const char *fmt, ...) {
    ts_onnx_info *info = x->info;
    if (info->n_refused < TS_ONNX_MAX_REFUSED) {
        char why[200];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof why, fmt, ap);
        va_end(ap);
        snprintf(info->refused[info->n_refused], sizeof info->refused[0],
                 "node '%s' (%s, opset %lld): %s", n->name && n->name[0] ? n->name : "?",
                 n->op_type ? n->op_type : "?", (long long)x->opset, why);
    }
    info->n_refused++;
    return TS_ERR_UNSUPPORTED;
}

static void count_op(ts_onnx_info *info, const char *op) {
    char *p = info->ops;
    const size_t len = strlen(op);
    while ((p = strstr(p, op))) {
        const int starts = p == info->ops || (p - info->ops >= 2 && p[-2] == ',');
        if (starts && !strncmp(p + len, " x", 2)) {
            char *end;
            const long k = strtol(p + len + 2, &end, 10);
            char rest[sizeof info->ops];
            snprintf(rest, sizeof rest, "%s", end);
            snprintf(p + len + 2, sizeof info->ops - (size_t)(p + len + 2 - info->ops), "%ld%s",
                     k + 1, rest);
            return;
        }
        p += len;
    }
    const size_t used = strlen(info->ops);
    snprintf(info->ops + used, sizeof info->ops - used, "%s%s x1", used ? ", " : "", op);
}

/* A graph input's dims; symbolic or missing ones take opts->batch. */
static ts_status input_dims(onnx_ctx *x, const Onnx__ValueInfoProto *vi, ts_dtype *dt, int *rank,
                            int64_t *dims) {
    const char *name = vi->name ? vi->name : "?";
    const Onnx__TypeProto *tp = vi->type;
    if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
        return ts_fail(TS_ERR_UNSUPPORTED, "onnx: graph input '%s' is not a tensor", name);
    const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
    if (tt->elem_type == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
        *dt = TS_F32;
    else if (tt->elem_type == ONNX__TENSOR_PROTO__DATA_TYPE__INT64)
        *dt = TS_I64;
    else
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "onnx: graph input '%s' has element type %d (float32 or int64 only)", name,
                       tt->elem_type);
    if (!tt->shape || tt->shape->n_dim > TS_MAX_RANK)
        return ts_fail(TS_ERR_UNSUPPORTED, "onnx: graph input '%s' has no shape of rank <= %d",
                       name, TS_MAX_RANK);
    *rank = (int)tt->shape->n_dim;
    for (int k = 0; k < *rank; k++) {
        const Onnx__TensorShapeProto__Dimension *d = tt->shape->dim[k];
        if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE &&
            d->dim_value > 0) {
            dims[k] = d->dim_value;
            continue;
        }
        const char *sym =
            d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM && d->dim_param
                ? d->dim_param
                : "?";
        /* The first axis is the batch; another takes its value from dims[k]
         * (a language model's sequence axis: model.ctx). */
        const int64_t v = !x->opts               ? 0
                          : x->opts->dims[k] > 0 ? x->opts->dims[k]
                          : k == 0               ? x->opts->batch
                                                 : 0;
        if (v <= 0)
            return ts_fail(TS_ERR_INVALID,
                           "onnx: graph input '%s' dimension %d ('%s') is dynamic and no value "
                           "was given (%s)",
                           name, k, sym,
                           k ? "set model.ctx for a language model's sequence axis"
                             : "set model.batch");
        dims[k] = v;
    }
    return TS_OK;
}

/* Optional proto2 strings a decoded file may lack; the importer reads them
 * as C strings, so a model without them is refused here. */
static ts_status check_names(const Onnx__GraphProto *gp) {
    const char *what = NULL;
    size_t at = 0;
    for (size_t i = 0; !what && i < gp->n_initializer; i++)
        if (!gp->initializer[i]->name) what = "an initialiser", at = i;
    for (size_t i = 0; !what && i < gp->n_input; i++)
        if (!gp->input[i]->name) what = "a graph input", at = i;
    for (size_t i = 0; !what && i < gp->n_output; i++)
        if (!gp->output[i]->name) what = "a graph output", at = i;
    for (size_t i = 0; !what && i < gp->n_node; i++) {
        if (!gp->node[i]->op_type) what = "a node's op type", at = i;
        for (size_t k = 0; !what && k < gp->node[i]->n_attribute; k++)
            if (!gp->node[i]->attribute[k]->name) what = "a node's attribute", at = i;
    }
    if (what)
        return ts_fail(TS_ERR_FORMAT, "onnx: malformed model: %s (number %zu) has no name", what,
                       at);
    return TS_OK;
}

static ts_status import_graph(onnx_ctx *x, const Onnx__GraphProto *gp) {
    ts_onnx_info *info = x->info;
    ts_status s = check_names(gp);
    if (s != TS_OK) return s;
    for (size_t i = 0; i < gp->n_initializer; i++) {
        const Onnx__TensorProto *t = gp->initializer[i];
        onnx_const *c = calloc(1, sizeof *c);
        if (!c) return ts_fail(TS_ERR_NOMEM, "onnx: out of memory");
        if ((s = onnx_tensor_read(t, x->dir, c)) != TS_OK) {
            onnx_const_free(c);
            return s;
        }
        /* A float initialiser becomes a parameter when an op first reads it
         * as a tensor (onnx_get); the host copy stays for the import, for a
         * node that reads the value as data (Dropout's ratio, Pad's pads,
         * BatchNormalization's running statistics). */
        if ((s = onnx_define(x, t->name, TS_NONE, c)) != TS_OK) return s;
        x->vals[x->n_vals - 1].param = c->dtype == TS_F32;
    }
    for (size_t i = 0; i < gp->n_input; i++) {
        const Onnx__ValueInfoProto *vi = gp->input[i];
        if (onnx_find(x, vi->name)) continue; /* an initialiser listed as input (IR < 4) */
        ts_dtype dt = TS_F32;
        int rank = 0;
        int64_t dims[TS_MAX_RANK];
        if ((s = input_dims(x, vi, &dt, &rank, dims)) != TS_OK) return s;
        ts_val v = ts_input(x->g, vi->name, dt, rank, dims);
        if (info->n_inputs < TS_ONNX_MAX_IO) {
            snprintf(info->input_names[info->n_inputs], sizeof info->input_names[0], "%s",
                     vi->name);
            info->inputs[info->n_inputs++] = v;
        }
        if ((s = onnx_define(x, vi->name, v, NULL)) != TS_OK) return s;
    }
    info->n_nodes = (int)gp->n_node;
    x->gp = gp;
    x->skip = calloc(gp->n_node ? gp->n_node : 1, 1);
    if (!x->skip) return ts_fail(TS_ERR_NOMEM, "onnx: out of memory");
    for (size_t i = 0; i < gp->n_node; i++) {
        const Onnx__NodeProto *n = gp->node[i];
        count_op(info, n->op_type);
        x->at = i;
        if (x->skip[i]) continue; /* imported as part of a pattern */
        int missing = 0;          /* an input of a refused node: skip quietly */
        for (size_t k = 0; k < n->n_input; k++) {
            if (!n->input[k][0]) continue; /* an omitted optional input */
            const onnx_value *e = onnx_find(x, n->input[k]);
            missing |= !e || (!ts_val_ok(e->v) && !e->c);
        }
        if (missing) {
            for (size_t k = 0; k < n->n_output; k++)
                if ((s = onnx_define(x, n->output[k], TS_NONE, NULL)) != TS_OK) return s;
            continue;
        }
        s = onnx_import_node(x, n);
        if (ts_graph_status(x->g) != TS_OK)
            return ts_fail(ts_graph_status(x->g), "onnx: node '%s' (%s): %s",
                           n->name ? n->name : "?", n->op_type, ts_graph_error(x->g));
        if (s == TS_ERR_UNSUPPORTED) {
            for (size_t k = 0; k < n->n_output; k++)
                if ((s = onnx_define(x, n->output[k], TS_NONE, NULL)) != TS_OK) return s;
            continue;
        }
        if (s != TS_OK) return s;
    }
    for (size_t i = 0; i < gp->n_output; i++) {
        const char *name = gp->output[i]->name;
        ts_val v = onnx_get(x, name);
        if (info->n_outputs < TS_ONNX_MAX_IO) {
            snprintf(info->output_names[info->n_outputs], sizeof info->output_names[0], "%s", name);
            info->outputs[info->n_outputs++] = v;
        }
        if (ts_val_ok(v)) ts_mark_output(x->g, v, name);
    }
    if (info->n_refused)
        return ts_fail(TS_ERR_UNSUPPORTED, "onnx: %d node%s cannot be imported; the first: %s",
                       info->n_refused, info->n_refused == 1 ? "" : "s", info->refused[0]);
    return ts_graph_status(x->g);
}

ts_status ts_onnx_import(ts_graph *g, const char *path, const ts_onnx_options *opts,
                         ts_onnx_info *info) {
    memset(info, 0, sizeof *info);
    for (int i = 0; i < TS_ONNX_MAX_IO; i++) info->inputs[i] = info->outputs[i] = TS_NONE;
    if (!g || !path) return ts_fail(TS_ERR_INVALID, "onnx: import needs a graph and a path");
    onnx_ctx x = {.g = g, .info = info, .opts = opts};
    Onnx__ModelProto *m;
    ts_status s = onnx_load(
        path, &m, &x.opset, x.dir, sizeof x.dir, info->sha256,
        opts && opts->expect_sha256 && opts->expect_sha256[0] ? opts->expect_sha256 : NULL);
    if (s != TS_OK) return s;
    info->opset = x.opset, info->ir_version = m->ir_version;
    s = import_graph(&x, m->graph);
    if (s != TS_OK && s != TS_ERR_NOMEM) ts_error_prefix("%s", path);
    for (int i = 0; i < x.n_vals; i++) {
        free(x.vals[i].name);
        onnx_const_free(x.vals[i].c);
    }
    free(x.vals);
    free(x.skip);
    onnx__model_proto__free_unpacked(m, NULL);
    return s;
}
