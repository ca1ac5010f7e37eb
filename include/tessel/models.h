/* tessel/models.h — the model zoo: ready-made graphs built with the public
 * builder API, with PyTorch-compatible parameter names and initialisation.
 *
 *     ts_graph *g = ts_graph_new();
 *     ts_gpt_config c = ts_gpt_w3();          // the W3 benchmark shape
 *     c.batch = 4;
 *     ts_model m;
 *     if (ts_build_gpt(g, &c, &m) != TS_OK) puts(ts_last_error());
 *     // inputs "tokens" [batch, ctx] i64 and "targets" [batch, ctx] i64
 *     ts_train_spec spec = ts_train_spec_default(m.loss);
 *
 * Every builder names its inputs ("x"/"tokens" and "y"/"targets"), marks
 * the model output ("logits" or "pred") and returns the loss.
 */
#ifndef TESSEL_MODELS_H
#define TESSEL_MODELS_H

#include "tessel/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_model {
    ts_val input;  /* "x" or "tokens" */
    ts_val target; /* "y" or "targets" */
    ts_val output; /* "pred" or "logits" */
    ts_val loss;   /* scalar */
} ts_model;

/* Multi-layer perceptron: [Linear -> ReLU -> LayerNorm] per hidden layer,
 * then Linear to out_dim; MSE loss against y [batch, out_dim] (or, with
 * classes > 0, cross-entropy over `classes` logits). The input x
 * has shape [batch, window, features] (flattened inside) when window > 0,
 * else [batch, in_dim]. Parameter names follow nn.Sequential: net.0.weight,
 * net.2.weight (LayerNorm), ... */
typedef struct ts_mlp_config {
    int64_t batch;
    int64_t window, features; /* in_dim = window * features when window > 0 */
    int64_t in_dim;
    int64_t hidden;
    int n_hidden; /* hidden layers */
    int64_t out_dim;
    int layer_norm;  /* 1: LayerNorm after each hidden ReLU */
    int64_t classes; /* > 0: a classifier: logits [batch, classes] and
                        cross-entropy against class ids y [batch] (i64);
                        0: regression, MSE against y [batch, out_dim] */
} ts_mlp_config;

/* W1: window 64 x 32 features, 2 hidden layers of 1024, out 1, batch 256. */
ts_mlp_config ts_mlp_w1(void);
ts_status ts_build_mlp(ts_graph *g, const ts_mlp_config *c, ts_model *m);

/* GPT-2 style decoder: learned positions, pre-LayerNorm blocks with causal
 * self-attention and a GELU(tanh) MLP of 4x width, final LayerNorm, LM head
 * tied to the token embedding; mean cross-entropy over all positions.
 * Names follow the reference module: wte.weight, wpe.weight,
 * blocks.N.ln_1.weight, blocks.N.attn.c_attn.weight, ..., ln_f.bias. */
typedef struct ts_gpt_config {
    int64_t batch, ctx, vocab, d_model;
    int n_layers, n_heads;
    double dropout; /* on attention output, MLP output and embeddings (0: none) */
} ts_gpt_config;

/* W3: vocab 8192, ctx 256, 6 layers, 8 heads, d 512, batch 8. */
ts_gpt_config ts_gpt_w3(void);
/* GPT-2 124M: vocab 50257, ctx 1024, 12 layers, 12 heads, d 768, batch 1. */
ts_gpt_config ts_gpt2_124m(void);
ts_status ts_build_gpt(ts_graph *g, const ts_gpt_config *c, ts_model *m);

/* Small image classifier (Fashion-MNIST style): two blocks of
 * Conv2d 3x3 pad 1 (no bias) -> BatchNorm2d -> ReLU -> MaxPool2d 2, then
 * Linear(c2 * (H/4) * (W/4), classes); cross-entropy against class ids
 * y [batch] (i64). Input x [batch, channels, height, width], or with
 * flat_input [batch, channels * height * width] (reshaped inside). Names
 * follow nn.Sequential: features.0.weight (conv), features.1.{weight,bias,
 * running_mean,running_var} (BatchNorm), features.4.weight, features.5.*,
 * classifier.{weight,bias}. Height and width must be multiples of 4. */
typedef struct ts_cnn_config {
    int64_t batch, channels, height, width;
    int64_t c1, c2; /* conv widths */
    int64_t classes;
    int flat_input;
} ts_cnn_config;

/* Fashion-MNIST: batch 64, 1 x 28 x 28, widths 32 and 64, 10 classes. */
ts_cnn_config ts_cnn_fashion(void);
ts_status ts_build_cnn(ts_graph *g, const ts_cnn_config *c, ts_model *m);

/* Recurrent sequence model (W2): nn.GRU / nn.LSTM(features, hidden,
 * layers, batch_first=True) over x [batch, seq_len, features], the last
 * layer's final hidden state h_n[-1] -> Linear(hidden, outputs) as "head".
 * The head and loss follow classes and out_dim:
 *   both 0 (W2): a binary classifier, "pred" [batch, 1], BCEWithLogits
 *     (mean) against y [batch, 1] (f32, 0/1);
 *   classes >= 2: "logits" [batch, classes], cross-entropy against class
 *     ids y [batch] (i64);
 *   out_dim > 0 (classes 0): regression, "pred" [batch, out_dim], MSE
 *     against y [batch, out_dim] (f32).
 * Names: gru.weight_ih_l0, gru.weight_hh_l0, gru.bias_ih_l0, gru.bias_hh_l0,
 * ... (lstm.* for the LSTM), head.weight, head.bias. */
typedef struct ts_rnn_config {
    int64_t batch, seq_len, features, hidden;
    int layers;
    int64_t classes, out_dim; /* 0, 0: binary (see above) */
} ts_rnn_config;

/* W2: 32 features, sequence 64, hidden 256, 2 layers, batch 128. */
ts_rnn_config ts_gru_w2(void);
ts_status ts_build_gru(ts_graph *g, const ts_rnn_config *c, ts_model *m);
ts_status ts_build_lstm(ts_graph *g, const ts_rnn_config *c, ts_model *m);

/* 3D U-Net (W4) as torch_bench.py's UNet3D: per level a double conv
 * [Conv3d 3^3 pad 1 (no bias) -> BatchNorm3d -> ReLU] x 2, MaxPool3d 2
 * between levels, ConvTranspose3d 2^3 stride 2 (with bias) + skip concat
 * [up, skip] on the way up, head Conv3d 1^3 -> classes. x [batch,
 * in_channels, size, size, size] f32, y [batch, size, size, size] i64
 * class ids; "logits" [batch, classes, size^3]; loss = cross-entropy (mean
 * over voxels) + soft Dice (softmax probabilities, all classes, sums over
 * batch and space, eps 1e-5, 1 - mean over classes). Names: enc1.0.weight,
 * enc1.1.{weight,bias,running_mean,running_var}, enc1.3.weight, enc1.4.*,
 * enc2.*, bott.*, up2.{weight,bias}, dec2.*, up1.*, dec1.*, head.{weight,
 * bias}. size must be a multiple of 4. */
typedef struct ts_unet3d_config {
    int64_t batch, in_channels, size;
    int64_t c1, c2, c3; /* channels per level */
    int64_t classes;
} ts_unet3d_config;

/* W4: batch 4, 1 x 32^3, channels 16-32-64, 2 classes. */
ts_unet3d_config ts_unet3d_w4(void);
ts_status ts_build_unet3d(ts_graph *g, const ts_unet3d_config *c, ts_model *m);

/* Two-layer graph convolutional network (W5), full batch, as
 * torch_bench.py's GCN: h = ReLU(A_hat (X W1^T) + b1), out = A_hat (h W2^T)
 * + b2, with A_hat = ts_gcn_norm_adjacency(nodes, n_edges, src, dst) built
 * here and held in the graph as CSR constants (the edge arrays are only
 * read during the call). x [nodes, in_features] f32, y [nodes] i64;
 * "logits" [nodes, classes]; cross-entropy over all nodes. Names:
 * lin1.weight [hidden, in_features] (Glorot uniform), b1 (zeros),
 * lin2.weight, b2. */
typedef struct ts_gcn_config {
    int64_t nodes, in_features, hidden, classes;
    int64_t n_edges;
    const int64_t *src, *dst; /* [n_edges] each */
} ts_gcn_config;

/* W5: 20 000 nodes, 128 -> 64 -> 16 (no edges: set n_edges/src/dst, e.g.
 * from ts_gcn_random_edges). */
ts_gcn_config ts_gcn_w5(void);
ts_status ts_build_gcn(ts_graph *g, const ts_gcn_config *c, ts_model *m);
/* W5's random graph shape: nodes * avg_degree / 2 uniform (src, dst) pairs
 * from a seeded generator (self pairs and duplicates are left in; the
 * adjacency builder drops them). Fills malloc'ed *src and *dst (free them)
 * and returns the pair count, or -1 on allocation failure. */
int64_t ts_gcn_random_edges(int64_t nodes, int64_t avg_degree, uint64_t seed, int64_t **src,
                            int64_t **dst);

#ifdef __cplusplus
}
#endif
#endif
