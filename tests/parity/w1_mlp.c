/* W1 (MLP + LayerNorm, MSE, AdamW) against PyTorch: see tests/parity/README.md. */
#include "parity.h"

int main(void) {
    ts_mlp_config c = {16, 8, 8, 0, 32, 2, 1, 1, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_mlp(g, &c, &m));
    parity_run("tests/parity/fixtures/w1_small.safetensors", g, m.loss, "x", "y",
               ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01));
    ts_graph_free(g);
    return check_summary("parity w1");
}
