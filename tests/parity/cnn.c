/* The `cnn` model (Conv2d -> BatchNorm2d -> ReLU -> MaxPool2d twice, then
 * Linear; cross-entropy; Adam) against PyTorch, including the BatchNorm
 * running statistics after the two steps: see tests/parity/README.md. */
#include "parity.h"

int main(void) {
    ts_cnn_config c = {4, 1, 8, 8, 3, 4, 3, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_cnn(g, &c, &m));
    parity_run_buffers("tests/parity/fixtures/cnn_small.safetensors", g, m.loss, "x", "y",
                       ts_adam(1e-3, 0.9, 0.999, 1e-8, 0));
    ts_graph_free(g);
    return check_summary("parity cnn");
}
