/* Graph data for node classification: an edge-list text file, node
 * features and labels as .npy (see data.h for the formats and errors).
 *
 * Duplicates and self loops are errors rather than silently dropped: the
 * GCN normalisation (ts_gcn_norm_adjacency) counts each undirected edge
 * once and adds every self loop itself, so a repeated line or a listed self
 * loop would be ignored anyway, and a file holding them was most likely
 * produced by a bug (a join that doubled rows, 1-based ids shifted by one)
 * that the person should see. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "data/data_internal.h"

typedef struct edge_at {
    int64_t s, d, line;
} edge_at;

static int by_pair(const void *a, const void *b) {
    const edge_at *x = a, *y = b;
    if (x->s != y->s) return x->s < y->s ? -1 : 1;
    if (x->d != y->d) return x->d < y->d ? -1 : 1;
    return (x->line > y->line) - (x->line < y->line);
}

static int is_sep(char c) {
    return c == ',' || c == ' ' || c == '\t';
}

/* Splits [p, e) into at most 3 cells at separators (runs of spaces/tabs
 * count once, a comma may have spaces around it). Returns the cell count. */
static int cells_of(const char *p, const char *e, const char **cs, const char **ce) {
    int n = 0;
    while (p < e) {
        while (p < e && (*p == ' ' || *p == '\t')) p++;
        if (p == e) break;
        const char *s = p;
        while (p < e && !is_sep(*p)) p++;
        if (n < 3) cs[n] = s, ce[n] = p;
        n++;
        while (p < e && (*p == ' ' || *p == '\t')) p++;
        if (p < e && *p == ',') {
            p++;
            if (p == e) { /* a trailing comma: an empty cell */
                if (n < 3) cs[n] = ce[n] = p;
                n++;
            }
        }
    }
    return n;
}

static int parse_id(const char *s, const char *e, int64_t *v) {
    char buf[32];
    size_t len = (size_t)(e - s);
    if (len == 0 || len >= sizeof buf) return 0;
    memcpy(buf, s, len);
    buf[len] = 0;
    char *end = NULL;
    errno = 0;
    long long x = strtoll(buf, &end, 10);
    if (errno || *end || end == buf) return 0;
    *v = (int64_t)x;
    return 1;
}

void ts_edge_list_free(ts_edge_list *e) {
    if (!e) return;
    free(e->src);
    free(e->dst);
    ts_lineage_clear(&e->lineage);
    memset(e, 0, sizeof *e);
}

static ts_status parse_edges(const char *path, const char *p, const char *end, int64_t nodes,
                             edge_at **out, int64_t *n_out) {
    edge_at *v = NULL;
    int64_t n = 0, cap = 0, line = 0;
    int seen_content = 0;
    ts_status s = TS_OK;
    for (const char *nl; p < end; p = nl ? nl + 1 : end) {
        line++;
        nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        const char *hash = memchr(p, '#', (size_t)(le - p));
        if (hash) le = hash;
        while (le > p && (le[-1] == '\r' || le[-1] == ' ' || le[-1] == '\t')) le--;
        const char *cs[3], *ce[3];
        int k = cells_of(p, le, cs, ce);
        if (k == 0) continue;
        int64_t a = 0, b = 0;
        int ok = k == 2 && parse_id(cs[0], ce[0], &a) && parse_id(cs[1], ce[1], &b);
        if (!ok && !seen_content && k == 2 && !parse_id(cs[0], ce[0], &a) &&
            !parse_id(cs[1], ce[1], &b)) {
            seen_content = 1; /* a header such as "src,dst" */
            continue;
        }
        seen_content = 1;
        if (k != 2) {
            s = ts_fail(TS_ERR_FORMAT, "%s:%lld: %d cells; an edge is two node ids (src,dst)", path,
                        (long long)line, k);
            break;
        }
        if (!ok) {
            int bad = parse_id(cs[0], ce[0], &a) ? 1 : 0;
            int len = (int)(ce[bad] - cs[bad]);
            s = ts_fail(TS_ERR_FORMAT, "%s:%lld: '%.*s%s' is not an integer node id", path,
                        (long long)line, len > 30 ? 30 : len, cs[bad], len > 30 ? "..." : "");
            break;
        }
        if (a < 0 || a >= nodes || b < 0 || b >= nodes) {
            s = ts_fail(TS_ERR_INVALID,
                        "%s:%lld: node id %lld is outside [0, %lld) (the features have %lld "
                        "rows)",
                        path, (long long)line, (long long)(a < 0 || a >= nodes ? a : b),
                        (long long)nodes, (long long)nodes);
            break;
        }
        if (a == b) {
            s = ts_fail(TS_ERR_INVALID,
                        "%s:%lld: node %lld joined to itself; self loops are added by the "
                        "normalisation, remove the line",
                        path, (long long)line, (long long)a);
            break;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 1024;
            edge_at *nv = ts_realloc(v, (size_t)cap * sizeof *nv, "edge list");
            if (!nv) {
                s = TS_ERR_NOMEM;
                break;
            }
            v = nv;
        }
        v[n++] = (edge_at){a, b, line};
    }
    if (s != TS_OK) {
        free(v);
        return s;
    }
    *out = v;
    *n_out = n;
    return TS_OK;
}

ts_status ts_data_read_edges(const char *path, int64_t nodes, ts_edge_list *out) {
    if (!path || !out) return ts_fail(TS_ERR_INVALID, "edge list: NULL argument");
    memset(out, 0, sizeof *out);
    if (nodes < 1) return ts_fail(TS_ERR_INVALID, "%s: the graph needs at least one node", path);
    uint8_t *buf = NULL;
    size_t len = 0;
    ts_status s = ts_data_slurp(path, &buf, &len, &out->lineage);
    if (s != TS_OK) return s;
    edge_at *v = NULL;
    int64_t n = 0;
    s = parse_edges(path, (const char *)buf, (const char *)buf + len, nodes, &v, &n);
    free(buf);
    if (s == TS_OK && n > 0) {
        /* Repeats of an ordered pair, found by sorting a copy; the file
         * order is what the model sees. */
        edge_at *sorted = ts_alloc((size_t)n * sizeof *sorted, "edge list");
        if (!sorted) {
            s = TS_ERR_NOMEM;
        } else {
            memcpy(sorted, v, (size_t)n * sizeof *sorted);
            qsort(sorted, (size_t)n, sizeof *sorted, by_pair);
            for (int64_t i = 1; i < n && s == TS_OK; i++)
                if (sorted[i].s == sorted[i - 1].s && sorted[i].d == sorted[i - 1].d)
                    s = ts_fail(TS_ERR_INVALID,
                                "%s:%lld: edge %lld,%lld is listed again (first on "
                                "line %lld)",
                                path, (long long)sorted[i].line, (long long)sorted[i].s,
                                (long long)sorted[i].d, (long long)sorted[i - 1].line);
            free(sorted);
        }
    }
    if (s == TS_OK) {
        out->src = ts_alloc((size_t)(n ? n : 1) * sizeof(int64_t), "edge list");
        out->dst = ts_alloc((size_t)(n ? n : 1) * sizeof(int64_t), "edge list");
        if (!out->src || !out->dst) s = TS_ERR_NOMEM;
        for (int64_t i = 0; s == TS_OK && i < n; i++) out->src[i] = v[i].s, out->dst[i] = v[i].d;
        out->n = n;
    }
    free(v);
    if (s != TS_OK) ts_edge_list_free(out);
    return s;
}

void ts_graph_data_free(ts_graph_data *g) {
    if (!g) return;
    free(g->x);
    free(g->y);
    ts_edge_list_free(&g->edges);
    ts_lineage_clear(&g->x_lineage);
    ts_lineage_clear(&g->y_lineage);
    memset(g, 0, sizeof *g);
}

ts_status ts_data_load_graph(const char *edges, const char *features, const char *labels,
                             int64_t classes, ts_graph_data *out) {
    if (!edges || !features || !labels || !out)
        return ts_fail(TS_ERR_INVALID, "graph: NULL argument");
    memset(out, 0, sizeof *out);
    if (classes < 0)
        return ts_fail(TS_ERR_INVALID, "graph: classes %lld is negative", (long long)classes);
    ts_array x = {0}, y = {0};
    ts_status s = ts_data_read_npy(features, TS_F32, &x);
    if (s == TS_OK && x.rank != 2)
        s = ts_fail(TS_ERR_SHAPE, "%s: node features must be [nodes, features], got rank %d",
                    features, x.rank);
    if (s == TS_OK) s = ts_data_read_npy(labels, TS_I64, &y);
    /* Nodes with no features would let a tiny file claim any node count. */
    if (s == TS_OK) s = ts_data_check_examples(features, x.rank, x.dims);
    if (s == TS_OK && (y.rank != 1 || y.dims[0] != x.dims[0]))
        s = ts_fail(TS_ERR_SHAPE,
                    "%s: labels must be [%lld] (one per row of %s), got rank %d with %lld "
                    "entries",
                    labels, (long long)x.dims[0], features, y.rank,
                    (long long)(y.rank ? y.dims[0] : 1));
    if (s == TS_OK) {
        const int64_t *lab = y.data;
        int64_t mx = -1;
        for (int64_t i = 0; i < y.dims[0] && s == TS_OK; i++) {
            if (lab[i] < 0 || (classes > 0 && lab[i] >= classes))
                s = ts_fail(TS_ERR_INVALID, "%s: node %lld has label %lld, outside [0, %lld)",
                            labels, (long long)i, (long long)lab[i],
                            (long long)(classes > 0 ? classes : 0));
            if (s == TS_OK && classes == 0 && lab[i] >= TS_DATA_MAX_CLASSES) {
                char where[48];
                snprintf(where, sizeof where, "node %lld", (long long)i);
                s = ts_data_check_class_count(labels, where, lab[i]);
            }
            if (lab[i] > mx) mx = lab[i];
        }
        if (s == TS_OK) out->classes = classes > 0 ? classes : mx + 1;
    }
    if (s == TS_OK) s = ts_data_read_edges(edges, x.dims[0], &out->edges);
    if (s != TS_OK) {
        ts_array_free(&x);
        ts_array_free(&y);
        ts_graph_data_free(out);
        return s;
    }
    out->nodes = x.dims[0];
    out->features = x.dims[1];
    out->x = x.data;
    out->y = y.data;
    out->x_lineage = x.lineage;
    out->y_lineage = y.lineage;
    return TS_OK;
}
