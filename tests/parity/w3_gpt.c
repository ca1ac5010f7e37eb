/* W3 (GPT, tied head, causal attention, AdamW) against PyTorch. */
#include "parity.h"

int main(void) {
    ts_gpt_config c = {2, 16, 64, 32, 2, 2, 0.0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_gpt(g, &c, &m));
    parity_run("tests/parity/fixtures/w3_small.safetensors", g, m.loss, "tokens", "targets",
               ts_adamw(3e-4, 0.9, 0.999, 1e-8, 0.1));
    ts_graph_free(g);
    return check_summary("parity w3");
}
