/* tessel/sparse.h — sparse (CSR) matrices for graph models.
 *
 * A graph convolution multiplies node features by a fixed normalised
 * adjacency matrix. The matrix is part of the graph's static structure:
 * build it on the host, then hand it to the graph as constants:
 *
 *     ts_csr adj;
 *     if (ts_gcn_norm_adjacency(n_nodes, n_edges, src, dst, &adj) != TS_OK)
 *         fprintf(stderr, "%s\n", ts_last_error());
 *     ts_val h = ts_spmm_csr(g, &adj, ts_matmul(g, x, w, 0, 0));  // A_hat (X W)
 *     ts_csr_free(&adj);
 *
 * ts_spmm (graph.h) takes the three CSR arrays as constants directly.
 */
#ifndef TESSEL_SPARSE_H
#define TESSEL_SPARSE_H

#include <stdint.h>
#include "tessel/graph.h"
#include "tessel/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A rows x cols matrix in compressed sparse row form: the entries of row r
 * are indices/values[indptr[r] .. indptr[r + 1]), columns ascending. */
typedef struct ts_csr {
    int64_t rows, cols, nnz;
    int64_t *indptr;  /* [rows + 1] */
    int64_t *indices; /* [nnz] */
    double *values;   /* [nnz] */
} ts_csr;

/* Release the arrays of a ts_csr filled by this library; zeroes *m. */
void ts_csr_free(ts_csr *m);

/* The symmetric-normalised adjacency with self loops of an undirected
 * graph, A_hat = D^-1/2 (A + I) D^-1/2 (Kipf & Welling), as an
 * n_nodes x n_nodes CSR matrix: entry (i, j) = 1 / sqrt(d_i d_j), d_i = 1 +
 * the number of distinct neighbours of i.
 *
 * Edge e joins src[e] and dst[e] in both directions. Duplicate edges
 * (either direction) count once and self pairs (src[e] == dst[e]) are
 * dropped before the identity is added, so every node has exactly one self
 * loop of weight 1 / d_i. A node id outside [0, n_nodes) is an error naming
 * the edge index. On success *out holds new arrays (ts_csr_free them). */
ts_status ts_gcn_norm_adjacency(int64_t n_nodes, int64_t n_edges, const int64_t *src,
                                const int64_t *dst, ts_csr *out);

/* a (rows x cols) @ dense [cols, F] -> [rows, F] with a's arrays copied
 * into the graph as constants in dense's dtype (see ts_spmm). */
ts_val ts_spmm_csr(ts_graph *g, const ts_csr *a, ts_val dense);

#ifdef __cplusplus
}
#endif
#endif
