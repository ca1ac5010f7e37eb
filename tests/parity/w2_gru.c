/* W2 (2-layer GRU, last hidden -> Linear, BCEWithLogits, Adam) against
 * PyTorch: see tests/parity/README.md. */
#include "parity.h"

int main(void) {
    ts_rnn_config c = {4, 5, 3, 6, 2, 0, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_gru(g, &c, &m));
    parity_run("tests/parity/fixtures/w2_small.safetensors", g, m.loss, "x", "y",
               ts_adam(1e-3, 0.9, 0.999, 1e-8, 0));
    ts_graph_free(g);
    return check_summary("parity w2");
}
