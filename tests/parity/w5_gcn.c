/* W5 (2-layer GCN over the normalised adjacency, CE, Adam) against PyTorch;
 * the adjacency is rebuilt here from the fixture's raw edge list
 * (input.src / input.dst): see tests/parity/README.md. */
#include "parity.h"
#include "ckpt/safetensors.h"

int main(void) {
    const char *fixture = "tests/parity/fixtures/w5_small.safetensors";
    ts_st_file *f = NULL;
    CHECK_OK(ts_st_open(fixture, &f));
    if (!f) return check_summary("parity w5");
    ts_st_tensor src, dst;
    CHECK_OK(ts_st_find(f, "input.src", &src));
    CHECK_OK(ts_st_find(f, "input.dst", &dst));
    CHECK(src.bytes == dst.bytes && src.bytes > 0, "edge list sizes %zu / %zu", src.bytes,
          dst.bytes);
    ts_gcn_config c = {30, 5, 4, 3, (int64_t)(src.bytes / 8), src.data, dst.data};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_gcn(g, &c, &m));
    ts_st_close(f);
    parity_run(fixture, g, m.loss, "x", "y", ts_adam(0.01, 0.9, 0.999, 1e-8, 0));
    ts_graph_free(g);
    return check_summary("parity w5");
}
