/* Constant folding at import: a torch export computes its reshape targets,
 * slice bounds and attention mask from Shape, Gather, Unsqueeze, Concat,
 * Cast, Range, ... on values known once the dynamic dimensions have their
 * values. A node whose inputs are all constants (never a parameter) and
 * whose op is one of those below is computed here on the host; its outputs
 * are constants for the nodes after it, and become graph constants only if
 * a graph op reads them. Integer elements are kept exact (int64). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "frontend/onnx/onnx_internal.h"

typedef const Onnx__NodeProto node;

static ts_status nomem(void) {
    return ts_fail(TS_ERR_NOMEM, "onnx: out of memory folding a constant");
}

static ts_status put(onnx_ctx *x, node *n, size_t k, onnx_const *c) {
    if (!c) return nomem();
    return onnx_define(x, n->output[k], TS_NONE, c);
}

/* Folded constants are shapes, indices and masks: one over this many
 * elements is refused rather than materialised on the host. */
#define FOLD_MAX ((int64_t)1 << 26)

static int too_big(int rank, const int64_t *dims) {
    int64_t n = 1;
    for (int k = 0; k < rank; k++) {
        if (dims[k] < 0 || (dims[k] && n > FOLD_MAX / dims[k])) return 1;
        n *= dims[k];
    }
    return n > FOLD_MAX;
}

/* Copies element `from` of a into element `to` of c (same dtype family). */
static void copy_el(onnx_const *c, int64_t to, const onnx_const *a, int64_t from) {
    if (c->f)
        c->f[to] = a->f ? a->f[from] : (float)a->i[from];
    else
        c->i[to] = a->i ? a->i[from] : (int64_t)a->f[from];
}

/* Row-major strides of dims. */
static void strides_of(int rank, const int64_t *dims, int64_t *st) {
    int64_t s = 1;
    for (int k = rank - 1; k >= 0; k--) st[k] = s, s *= dims[k];
}

/* Broadcast (numpy rules) a's dims with b's into out; 0 if they do not. */
static int broadcast(const onnx_const *a, const onnx_const *b, int *rank, int64_t *out) {
    *rank = a->rank > b->rank ? a->rank : b->rank;
    for (int k = 0; k < *rank; k++) {
        const int ka = k - (*rank - a->rank), kb = k - (*rank - b->rank);
        const int64_t da = ka >= 0 ? a->dims[ka] : 1, db = kb >= 0 ? b->dims[kb] : 1;
        if (da != db && da != 1 && db != 1) return 0;
        out[k] = da == 1 ? db : da;
    }
    return 1;
}

/* The flat index into t of output element k of an out-shaped broadcast. */
static int64_t bidx(const onnx_const *t, int rank, const int64_t *out, int64_t k) {
    int64_t st[TS_MAX_RANK], idx = 0;
    strides_of(t->rank, t->dims, st);
    for (int d = rank - 1; d >= 0; d--) {
        const int64_t i = k % out[d];
        k /= out[d];
        const int td = d - (rank - t->rank);
        if (td >= 0 && t->dims[td] != 1) idx += i * st[td];
    }
    return idx;
}

static ts_dtype cast_to(int64_t onnx_type, int *ok) {
    *ok = 1;
    switch (onnx_type) {
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT:
    case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE: return TS_F32;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT64:
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT32: return TS_I64;
    case ONNX__TENSOR_PROTO__DATA_TYPE__BOOL: return TS_U8;
    default: *ok = 0; return TS_F32;
    }
}

static ts_status elementwise(onnx_ctx *x, node *n, const onnx_const *a, const onnx_const *b,
                             const onnx_const *c3) {
    const char *op = n->op_type;
    int rank;
    int64_t dims[TS_MAX_RANK] = {0};
    if (!broadcast(a, b, &rank, dims))
        return onnx_refuse(x, n, "constant operands do not broadcast");
    if (c3) { /* Where(cond=a, b, c3): dims of all three */
        onnx_const t = {.rank = rank};
        memcpy(t.dims, dims, sizeof dims);
        if (!broadcast(&t, c3, &rank, dims))
            return onnx_refuse(x, n, "constant operands do not broadcast");
    }
    if (c3 && !a->i) return onnx_refuse(x, n, "the condition must be a bool tensor");
    const int cmp = !strcmp(op, "Equal") || !strcmp(op, "Less") || !strcmp(op, "Greater") ||
                    !strcmp(op, "And") || !strcmp(op, "Or");
    const ts_dtype dt = cmp  ? TS_U8
                        : c3 ? (b->f || c3->f ? TS_F32 : b->dtype)
                             : (a->f || b->f ? TS_F32 : a->dtype);
    onnx_const *c = onnx_const_new(dt, rank, dims);
    if (!c) return nomem();
    const int ints = !a->f && !b->f;
    for (int64_t k = 0; k < c->n; k++) {
        const int64_t ia = bidx(a, rank, dims, k), ib = bidx(b, rank, dims, k);
        if (c3) {
            const int64_t ic = bidx(c3, rank, dims, k);
            if (a->i[ia])
                copy_el(c, k, b, ib);
            else
                copy_el(c, k, c3, ic);
            continue;
        }
        if (ints) {
            const int64_t u = a->i[ia], v = b->i[ib];
            int64_t r = 0;
            /* wrapping (unsigned) arithmetic: no undefined overflow */
            switch (op[0]) {
            case 'A':
                r = op[1] == 'd' ? (int64_t)((uint64_t)u + (uint64_t)v) : (u && v);
                break; /* Add, And */
            case 'S': r = (int64_t)((uint64_t)u - (uint64_t)v); break;
            case 'M': r = (int64_t)((uint64_t)u * (uint64_t)v); break;
            case 'D':
                if (!v) {
                    onnx_const_free(c);
                    return onnx_refuse(x, n, "integer division by zero in a constant");
                }
                r = u == INT64_MIN && v == -1 ? u : u / v;
                break;
            case 'E': r = u == v; break;
            case 'L': r = u < v; break;
            case 'G': r = u > v; break;
            case 'O': r = u || v; break;
            }
            c->i[k] = r;
            continue;
        }
        const double u = onnx_const_at(a, ia), v = onnx_const_at(b, ib);
        double r = 0;
        switch (op[0]) {
        case 'A': r = op[1] == 'd' ? u + v : (u != 0 && v != 0); break;
        case 'S': r = u - v; break;
        case 'M': r = u * v; break;
        case 'D': r = u / v; break;
        case 'E': r = u == v; break;
        case 'L': r = u < v; break;
        case 'G': r = u > v; break;
        case 'O': r = u != 0 || v != 0; break;
        }
        if (c->f)
            c->f[k] = (float)r;
        else
            c->i[k] = (int64_t)r;
    }
    return put(x, n, 0, c);
}

/* Axes (attribute before opset 13, input 1 from it) normalised to rank r. */
static int axes_of(onnx_ctx *x, node *n, int r, int64_t *ax) {
    int m = onnx_attr_ints(n, "axes", ax, TS_MAX_RANK);
    const onnx_const *c = n->n_input > 1 && n->input[1][0] ? onnx_const_of(x, n->input[1]) : NULL;
    if (c && c->i && c->n <= TS_MAX_RANK) {
        m = (int)c->n;
        for (int k = 0; k < m; k++) ax[k] = c->i[k];
    }
    for (int k = 0; k < m; k++) {
        if (ax[k] < 0) ax[k] += r;
        if (ax[k] < 0 || ax[k] >= r) return -1;
    }
    return m;
}

static ts_status unsqueeze_squeeze(onnx_ctx *x, node *n, const onnx_const *a, int un) {
    int64_t ax[TS_MAX_RANK], dims[TS_MAX_RANK];
    int m0 = onnx_attr_ints(n, "axes", ax, TS_MAX_RANK);
    const onnx_const *ac = n->n_input > 1 ? onnx_const_of(x, n->input[1]) : NULL;
    const int m = ac && ac->i ? (int)ac->n : m0;
    const int r = un ? a->rank + m : a->rank;
    if (m < 0 || r > TS_MAX_RANK) return onnx_refuse(x, n, "too many axes");
    if (axes_of(x, n, r, ax) != m) return onnx_refuse(x, n, "axes out of range");
    int mark[TS_MAX_RANK] = {0};
    for (int k = 0; k < m; k++) mark[ax[k]] = 1;
    int o = 0;
    if (un) {
        for (int k = 0, j = 0; k < r; k++) dims[o++] = mark[k] ? 1 : a->dims[j++];
    } else {
        for (int k = 0; k < r; k++) {
            const int drop = m ? mark[k] : a->dims[k] == 1;
            if (drop && a->dims[k] != 1) return onnx_refuse(x, n, "axis %d is not 1", k);
            if (!drop) dims[o++] = a->dims[k];
        }
    }
    onnx_const *c = onnx_const_new(a->dtype, o, dims);
    if (!c) return nomem();
    for (int64_t k = 0; k < a->n; k++) copy_el(c, k, a, k);
    return put(x, n, 0, c);
}

static ts_status gather(onnx_ctx *x, node *n, const onnx_const *a, const onnx_const *ix) {
    int64_t axis = onnx_attr_i(n, "axis", 0);
    if (axis < 0) axis += a->rank;
    if (axis < 0 || axis >= a->rank || a->rank - 1 + ix->rank > TS_MAX_RANK || !ix->i)
        return onnx_refuse(x, n, "axis or indices out of range");
    int64_t dims[TS_MAX_RANK];
    int r = 0;
    for (int k = 0; k < axis; k++) dims[r++] = a->dims[k];
    for (int k = 0; k < ix->rank; k++) dims[r++] = ix->dims[k];
    for (int k = (int)axis + 1; k < a->rank; k++) dims[r++] = a->dims[k];
    int64_t outer = 1, inner = 1;
    for (int k = 0; k < axis; k++) outer *= a->dims[k];
    for (int k = (int)axis + 1; k < a->rank; k++) inner *= a->dims[k];
    const int64_t len = a->dims[axis];
    onnx_const *c = onnx_const_new(a->dtype, r, dims);
    if (!c) return nomem();
    int64_t k = 0;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < ix->n; j++) {
            int64_t i = ix->i[j] < 0 ? ix->i[j] + len : ix->i[j];
            if (i < 0 || i >= len) {
                onnx_const_free(c);
                return onnx_refuse(x, n, "index %lld out of range [0, %lld)", (long long)ix->i[j],
                                   (long long)len);
            }
            for (int64_t e = 0; e < inner; e++) copy_el(c, k++, a, (o * len + i) * inner + e);
        }
    return put(x, n, 0, c);
}

/* Slice's starts / ends / axes / steps resolved against dims into per-axis
 * [lo, lo + step * cnt). Shared with the graph op (ops_more.c) through
 * onnx_slice_bounds. */
int onnx_slice_bounds(onnx_ctx *x, node *n, int rank, const int64_t *dims, int64_t *lo,
                      int64_t *step, int64_t *cnt) {
    const onnx_const *st = onnx_const_of(x, n->input[1]), *en = onnx_const_of(x, n->input[2]);
    const onnx_const *ax = n->n_input > 3 && n->input[3][0] ? onnx_const_of(x, n->input[3]) : NULL;
    const onnx_const *sp = n->n_input > 4 && n->input[4][0] ? onnx_const_of(x, n->input[4]) : NULL;
    if (!st || !en || !st->i || !en->i || st->n != en->n ||
        (n->n_input > 3 && n->input[3][0] && (!ax || !ax->i || ax->n != st->n)) ||
        (n->n_input > 4 && n->input[4][0] && (!sp || !sp->i || sp->n != st->n)))
        return -1;
    for (int k = 0; k < rank; k++) lo[k] = 0, step[k] = 1, cnt[k] = dims[k];
    for (int64_t j = 0; j < st->n; j++) {
        int64_t a = ax ? ax->i[j] : j;
        if (a < 0) a += rank;
        if (a < 0 || a >= rank) return -1;
        const int64_t d = dims[a], s = sp ? sp->i[j] : 1;
        if (s == 0) return -1;
        int64_t b = st->i[j], e = en->i[j];
        if (b < 0) b += d;
        if (e < 0) e += d;
        if (s > 0) {
            b = b < 0 ? 0 : b > d ? d : b;
            e = e < 0 ? 0 : e > d ? d : e;
            cnt[a] = e > b ? (e - b + s - 1) / s : 0;
        } else {
            b = b < 0 ? -1 : b > d - 1 ? d - 1 : b;
            e = e < -1 ? -1 : e > d - 1 ? d - 1 : e;
            cnt[a] = b > e ? (b - e - s - 1) / -s : 0;
        }
        lo[a] = b, step[a] = s;
    }
    return 0;
}

static ts_status slice(onnx_ctx *x, node *n, const onnx_const *a) {
    int64_t lo[TS_MAX_RANK], step[TS_MAX_RANK], cnt[TS_MAX_RANK], st[TS_MAX_RANK];
    if (n->n_input < 3 || onnx_slice_bounds(x, n, a->rank, a->dims, lo, step, cnt))
        return onnx_refuse(x, n, "starts / ends / axes / steps must be constant and in range");
    onnx_const *c = onnx_const_new(a->dtype, a->rank, cnt);
    if (!c) return nomem();
    strides_of(a->rank, a->dims, st);
    for (int64_t k = 0; k < c->n; k++) {
        int64_t rem = k, from = 0;
        for (int d = a->rank - 1; d >= 0; d--) {
            from += (lo[d] + step[d] * (rem % cnt[d])) * st[d];
            rem /= cnt[d];
        }
        copy_el(c, k, a, from);
    }
    return put(x, n, 0, c);
}

static ts_status concat(onnx_ctx *x, node *n) {
    const onnx_const *a = onnx_const_of(x, n->input[0]);
    int64_t axis = onnx_attr_i(n, "axis", 0);
    if (axis < 0) axis += a->rank;
    if (axis < 0 || axis >= a->rank) return onnx_refuse(x, n, "axis out of range");
    int64_t dims[TS_MAX_RANK], total = 0;
    int fl = 0;
    for (size_t j = 0; j < n->n_input; j++) {
        const onnx_const *b = onnx_const_of(x, n->input[j]);
        if (!b) return onnx_refuse(x, n, "an empty input");
        if (b->rank != a->rank) return onnx_refuse(x, n, "inputs of different ranks");
        total += b->dims[axis], fl |= b->f != NULL;
    }
    memcpy(dims, a->dims, sizeof dims);
    dims[axis] = total;
    onnx_const *c = onnx_const_new(fl ? TS_F32 : a->dtype, a->rank, dims);
    if (!c) return nomem();
    int64_t outer = 1, inner = 1, off = 0;
    for (int k = 0; k < axis; k++) outer *= a->dims[k];
    for (int k = (int)axis + 1; k < a->rank; k++) inner *= a->dims[k];
    for (size_t j = 0; j < n->n_input; j++) {
        const onnx_const *b = onnx_const_of(x, n->input[j]);
        for (int k = 0; k < a->rank; k++)
            if (k != axis && b->dims[k] != a->dims[k]) {
                onnx_const_free(c);
                return onnx_refuse(x, n, "inputs differ off the concatenation axis");
            }
        const int64_t w = b->dims[axis] * inner;
        for (int64_t o = 0; o < outer; o++)
            for (int64_t e = 0; e < w; e++) copy_el(c, o * total * inner + off + e, b, o * w + e);
        off += w;
    }
    return put(x, n, 0, c);
}

static ts_status with_dims(onnx_ctx *x, node *n, const onnx_const *a, int rank, const int64_t *dims,
                           ts_dtype dt) {
    onnx_const *c = onnx_const_new(dt, rank, dims);
    if (!c) return nomem();
    for (int64_t k = 0; k < c->n; k++) copy_el(c, k, a, a->n == c->n ? k : k % (a->n ? a->n : 1));
    return put(x, n, 0, c);
}

ts_status onnx_fold(onnx_ctx *x, node *n, int *done) {
    static const char *const folded =
        " Identity Cast Unsqueeze Squeeze Concat Gather Slice Add Sub Mul Div Equal Less Greater "
        "And Or Not Neg Where Range ConstantOfShape Expand Reshape Shape Sqrt ";
    char key[64];
    snprintf(key, sizeof key, " %s ", n->op_type);
    *done = 0;
    if (!strstr(folded, key) || n->n_input < 1 || n->n_output < 1) return TS_OK;
    for (size_t k = 0; k < n->n_input; k++)
        if (n->input[k][0] && !onnx_const_of(x, n->input[k])) return TS_OK;
    if (!strcmp(n->op_type, "Shape") || !n->input[0][0]) return TS_OK; /* ops.c reads the dims */
    *done = 1;
    const char *op = n->op_type;
    const onnx_const *a = onnx_const_of(x, n->input[0]);
    const onnx_const *b = n->n_input > 1 && n->input[1][0] ? onnx_const_of(x, n->input[1]) : NULL;
    if (!strcmp(op, "Identity")) return with_dims(x, n, a, a->rank, a->dims, a->dtype);
    if (!strcmp(op, "Cast")) {
        int ok;
        const ts_dtype to = cast_to(onnx_attr_i(n, "to", 1), &ok);
        if (!ok)
            return onnx_refuse(x, n, "cast to element type %lld",
                               (long long)onnx_attr_i(n, "to", 0));
        onnx_const *c = onnx_const_new(to, a->rank, a->dims);
        if (!c) return nomem();
        for (int64_t k = 0; k < a->n; k++) {
            if (to == TS_U8)
                c->i[k] = onnx_const_at(a, k) != 0;
            else
                copy_el(c, k, a, k);
        }
        return put(x, n, 0, c);
    }
    if (!strcmp(op, "Unsqueeze") || !strcmp(op, "Squeeze"))
        return unsqueeze_squeeze(x, n, a, op[0] == 'U');
    if (!strcmp(op, "Concat")) return concat(x, n);
    if (!strcmp(op, "Gather") && b) return gather(x, n, a, b);
    if (!strcmp(op, "Slice")) return slice(x, n, a);
    if (!strcmp(op, "Where") && n->n_input == 3)
        return elementwise(x, n, a, b, onnx_const_of(x, n->input[2]));
    if (b && n->n_input == 2 && strcmp(op, "Expand") && strcmp(op, "Reshape"))
        return elementwise(x, n, a, b, NULL);
    if (!strcmp(op, "Not") || !strcmp(op, "Neg") || !strcmp(op, "Sqrt")) {
        onnx_const *c =
            onnx_const_new(op[0] == 'N' && op[1] == 'o' ? TS_U8 : a->dtype, a->rank, a->dims);
        if (!c) return nomem();
        for (int64_t k = 0; k < a->n; k++) {
            if (op[1] == 'o')
                c->i[k] = !a->i[k];
            else if (op[0] == 'N' && c->f)
                c->f[k] = -a->f[k];
            else if (op[0] == 'N')
                c->i[k] = -a->i[k];
            else if (c->f)
                c->f[k] = sqrtf(a->f[k]);
            else
                c->i[k] = (int64_t)sqrt((double)a->i[k]);
        }
        return put(x, n, 0, c);
    }
    if (!strcmp(op, "Range") && n->n_input == 3) {
        const onnx_const *d = onnx_const_of(x, n->input[2]);
        const double lo = onnx_const_at(a, 0), hi = onnx_const_at(b, 0), st = onnx_const_at(d, 0);
        if (st == 0) return onnx_refuse(x, n, "delta 0");
        const double span = ceil((hi - lo) / st);
        if (!(span < (double)FOLD_MAX)) return onnx_refuse(x, n, "a range of %g elements", span);
        int64_t len = span > 0 ? (int64_t)span : 0;
        onnx_const *c = onnx_const_new(a->f ? TS_F32 : TS_I64, 1, &len);
        if (!c) return nomem();
        for (int64_t k = 0; k < len; k++) {
            if (c->f)
                c->f[k] = (float)(lo + st * (double)k);
            else
                c->i[k] = a->i[0] + d->i[0] * k;
        }
        return put(x, n, 0, c);
    }
    if (!strcmp(op, "ConstantOfShape")) {
        if (!a->i || a->rank != 1 || a->n > TS_MAX_RANK)
            return onnx_refuse(x, n, "the shape must be an int64 vector of rank <= %d",
                               TS_MAX_RANK);
        if (too_big((int)a->n, a->i))
            return onnx_refuse(x, n, "a shape of more than %lld elements (or negative)",
                               (long long)FOLD_MAX);
        const Onnx__AttributeProto *v = onnx_attr(n, "value");
        onnx_const val = {0};
        float zero = 0;
        if (v && v->t) {
            ts_status s = onnx_tensor_read(v->t, x->dir, &val);
            if (s != TS_OK)
                return s == TS_ERR_UNSUPPORTED ? onnx_refuse(x, n, "%s", ts_last_error()) : s;
        } else {
            val.dtype = TS_F32, val.n = 1, val.f = &zero;
        }
        ts_status s = val.n == 1 ? with_dims(x, n, &val, (int)a->n, a->i, val.dtype)
                                 : onnx_refuse(x, n, "value must hold one element");
        if (val.f != &zero) {
            free(val.f);
            free(val.i);
        }
        return s;
    }
    if (!strcmp(op, "Expand") && b) {
        if (!b->i || b->rank != 1 || b->n > TS_MAX_RANK)
            return onnx_refuse(x, n, "the shape must be an int64 vector");
        onnx_const sh = {.rank = (int)b->n};
        for (int k = 0; k < sh.rank; k++) sh.dims[k] = b->i[k];
        int rank;
        int64_t dims[TS_MAX_RANK];
        if (!broadcast(a, &sh, &rank, dims) || too_big(rank, dims))
            return onnx_refuse(x, n, "shapes do not broadcast (or the result is too large)");
        onnx_const *c = onnx_const_new(a->dtype, rank, dims);
        if (!c) return nomem();
        for (int64_t k = 0; k < c->n; k++) copy_el(c, k, a, bidx(a, rank, dims, k));
        return put(x, n, 0, c);
    }
    if (!strcmp(op, "Reshape") && b && b->i && b->rank == 1 && b->n <= TS_MAX_RANK) {
        int64_t dims[TS_MAX_RANK], known = 1;
        int infer = -1;
        for (int k = 0; k < b->n; k++) {
            dims[k] = b->i[k] == 0 && k < a->rank ? a->dims[k] : b->i[k];
            if (dims[k] == -1)
                infer = k;
            else
                known *= dims[k];
        }
        if (infer >= 0 && known) dims[infer] = a->n / known;
        int64_t total = 1;
        for (int k = 0; k < b->n; k++) total *= dims[k];
        if (total != a->n)
            return onnx_refuse(x, n, "the shape does not hold %lld elements", (long long)a->n);
        return with_dims(x, n, a, (int)b->n, dims, a->dtype);
    }
    *done = 0;
    return TS_OK;
}
