/* Model presets: the benchmark shapes (w1, w3, gpt2-124m, fashion, w2, w4,
 * w5) that fill every model key a config leaves unset, and which model
 * family each belongs to (presets.h). */
#include "frontend/presets.h"

#include "core/core.h"

void cfg_preset_values(int preset, ts_config *p) {
    if (preset == TS_CFG_W1) {
        ts_mlp_config m = ts_mlp_w1();
        p->model.batch = m.batch, p->model.window = m.window, p->model.features = m.features;
        p->model.in_dim = m.in_dim, p->model.hidden = m.hidden, p->model.n_hidden = m.n_hidden;
        p->model.out_dim = m.out_dim, p->model.layer_norm = m.layer_norm;
    } else if (preset == TS_CFG_W2) {
        ts_rnn_config m = ts_gru_w2();
        p->model.batch = m.batch, p->model.window = m.seq_len, p->model.features = m.features;
        p->model.hidden = m.hidden, p->model.n_layers = m.layers;
        p->model.classes = 1, p->model.out_dim = 1; /* W2 is a binary classifier */
    } else if (preset == TS_CFG_W4) {
        ts_unet3d_config m = ts_unet3d_w4();
        p->model.batch = m.batch, p->model.channels = m.in_channels, p->model.size = m.size;
        p->model.c1 = m.c1, p->model.c2 = m.c2, p->model.c3 = m.c3, p->model.classes = m.classes;
    } else if (preset == TS_CFG_W5) {
        /* nodes and features come from the graph; batch 1: the whole graph */
        ts_gcn_config m = ts_gcn_w5();
        p->model.batch = 1, p->model.features = m.in_features, p->model.hidden = m.hidden;
        p->model.classes = m.classes, p->model.nodes = m.nodes;
    } else if (preset == TS_CFG_FASHION) {
        ts_cnn_config m = ts_cnn_fashion();
        p->model.batch = m.batch, p->model.channels = m.channels, p->model.height = m.height;
        p->model.width = m.width, p->model.c1 = m.c1, p->model.c2 = m.c2;
    } else {
        ts_gpt_config g = preset == TS_CFG_W3 ? ts_gpt_w3() : ts_gpt2_124m();
        p->model.batch = g.batch, p->model.ctx = g.ctx, p->model.vocab = g.vocab;
        p->model.d_model = g.d_model, p->model.n_layers = g.n_layers;
        p->model.n_heads = g.n_heads, p->model.dropout = g.dropout;
    }
}

int cfg_preset_family(int preset) {
    switch ((ts_cfg_preset)preset) {
    case TS_CFG_W1: return TS_CFG_MLP;
    case TS_CFG_FASHION: return TS_CFG_CNN;
    case TS_CFG_W2: return TS_CFG_GRU; /* and lstm */
    case TS_CFG_W4: return TS_CFG_UNET3D;
    case TS_CFG_W5: return TS_CFG_GCN;
    default: return TS_CFG_GPT;
    }
}
int cfg_family_preset(int name) {
    switch ((ts_cfg_model_name)name) {
    case TS_CFG_MLP: return TS_CFG_W1;
    case TS_CFG_CNN: return TS_CFG_FASHION;
    case TS_CFG_GRU:
    case TS_CFG_LSTM: return TS_CFG_W2;
    case TS_CFG_UNET3D: return TS_CFG_W4;
    case TS_CFG_GCN: return TS_CFG_W5;
    default: return TS_CFG_W3;
    }
}
