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
    int layer_norm; /* 1: LayerNorm after each hidden ReLU */
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

#ifdef __cplusplus
}
#endif
#endif
