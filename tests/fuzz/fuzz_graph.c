/* Graph files. The first byte picks the mode and a node count (1-64): with
 * its top bit clear the rest is the edge list (ts_data_read_edges), set it
 * is the node labels .npy of a whole graph (ts_data_load_graph, class
 * count from the labels or 3) whose features are zeros [nodes, 2] and
 * whose edges join node 0 to every other. */
#include <stdio.h>
#include <string.h>
#include "data/data.h"
#include "fuzz.h"

/* A version-1.0 .npy of zeros f32 [nodes, 2]. */
static const char *features(int64_t nodes) {
    static unsigned char buf[128 + 64 * 2 * 4];
    char dict[128];
    snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld, 2), }",
             (long long)nodes);
    size_t hl = strlen(dict) + 1;
    while ((10 + hl) % 64) hl++;
    memset(buf, 0, sizeof buf);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)hl, buf[9] = 0;
    memset(buf + 10, ' ', hl);
    memcpy(buf + 10, dict, strlen(dict));
    buf[10 + hl - 1] = '\n';
    return fuzz_file("x.npy", buf, 10 + hl + (size_t)nodes * 8);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int64_t nodes = 1 + (data[0] & 63);
    if (!(data[0] & 0x80)) {
        const char *p = fuzz_file("edges.txt", data + 1, size - 1);
        ts_edge_list e;
        if (p && ts_data_read_edges(p, nodes, &e) == TS_OK) ts_edge_list_free(&e);
        return 0;
    }
    char edges[64 * 8] = "";
    size_t k = 0;
    for (int64_t i = 1; i < nodes; i++)
        k += (size_t)snprintf(edges + k, sizeof edges - k, "0,%lld\n", (long long)i);
    const char *ep = fuzz_file("edges.txt", edges, k);
    const char *xp = features(nodes);
    const char *yp = fuzz_file("y.npy", data + 1, size - 1);
    if (!ep || !xp || !yp) return 0;
    ts_graph_data g;
    if (ts_data_load_graph(ep, xp, yp, data[0] & 0x40 ? 3 : 0, &g) == TS_OK) ts_graph_data_free(&g);
    return 0;
}
