/* The `lstm` model (2-layer LSTM, last hidden -> Linear, BCEWithLogits,
 * Adam) against PyTorch: see tests/parity/README.md. */
#include "parity.h"

int main(void) {
    ts_rnn_config c = {4, 5, 3, 6, 2, 0, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_lstm(g, &c, &m));
    parity_run("tests/parity/fixtures/lstm_small.safetensors", g, m.loss, "x", "y",
               ts_adam(1e-3, 0.9, 0.999, 1e-8, 0));
    ts_graph_free(g);
    return check_summary("parity lstm");
}
