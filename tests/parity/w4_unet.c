/* W4 (3D U-Net with BatchNorm, CE + soft Dice, Adam) against PyTorch,
 * including the BatchNorm running statistics after the two steps: see
 * tests/parity/README.md. */
#include "parity.h"

int main(void) {
    ts_unet3d_config c = {2, 1, 8, 2, 4, 8, 2};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_unet3d(g, &c, &m));
    parity_run_buffers("tests/parity/fixtures/w4_small.safetensors", g, m.loss, "x", "y",
                       ts_adam(1e-3, 0.9, 0.999, 1e-8, 0));
    ts_graph_free(g);
    return check_summary("parity w4");
}
