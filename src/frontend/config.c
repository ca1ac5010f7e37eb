/* The YAML run configuration: one key table drives parsing, overrides,
 * validation, the resolved dump and the documentation check. */
#include "frontend/config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>
#include "core/core.h"
#include "frontend/config_internal.h"
#include "passes/passes.h"

/* Which values of the choosing key (model.name, train.optimizer) use a key. */
#define FOR_ZOO   (TS_CFG_FOR_RNN | TS_CFG_FOR_UNET3D | TS_CFG_FOR_GCN)
#define FOR_MODEL (TS_CFG_FOR_MLP | TS_CFG_FOR_GPT | TS_CFG_FOR_CNN | FOR_ZOO)
#define FOR_SGD   8
#define FOR_ADAM  16 /* adam and adamw */
/* Which values of data.source use a key. */
#define FOR_IDX    32
#define FOR_NPY    64
#define FOR_CSV    128
#define FOR_TOKENS 256
#define FOR_GRAPH  (1 << 16)
#define FOR_FILES  (FOR_IDX | FOR_NPY | FOR_CSV | FOR_TOKENS | FOR_GRAPH)

#define FIELD(sec, f) offsetof(ts_config, sec.f), sizeof(((ts_config *)0)->sec.f)
#define SIZE_RANGE    "[1, 1e9]"

static const ts_config_key keys[] = {
    /* model */
    {"model.name", TS_CFG_ENUM, FIELD(model, name), TS_CFG_DERIVED,
     "mlp|gpt|cnn|gru|lstm|unet3d|gcn", NULL, "the preset's",
     "model family: an MLP, a GPT decoder, a small image classifier (CNN), a GRU or LSTM "
     "sequence model, a 3D U-Net or a graph convolutional network (GCN)"},
    {"model.preset", TS_CFG_ENUM, FIELD(model, preset), TS_CFG_DERIVED,
     "w1|w3|gpt2-124m|fashion|w2|w4|w5", NULL,
     "w1 (mlp), w3 (gpt), fashion (cnn), w2 (gru, lstm), w4 (unet3d), w5 (gcn)",
     "benchmark shape giving every model key not set: w1 (mlp), w3 or gpt2-124m (gpt), fashion "
     "(cnn), w2 (gru, lstm), w4 (unet3d), w5 (gcn)"},
    {"model.batch", TS_CFG_I64, FIELD(model, batch),
     TS_CFG_FOR_MLP | TS_CFG_FOR_GPT | TS_CFG_FOR_CNN | TS_CFG_FOR_RNN | TS_CFG_FOR_UNET3D |
         TS_CFG_DERIVED,
     NULL, SIZE_RANGE, "preset",
     "samples (mlp, cnn), sequences (gpt, gru, lstm) or volumes (unet3d) per step; a gcn takes "
     "the whole graph"},
    {"model.window", TS_CFG_I64, FIELD(model, window),
     TS_CFG_FOR_MLP | TS_CFG_FOR_RNN | TS_CFG_DERIVED, NULL, "[0, 1e9]", "preset",
     "time steps per sample; 0 for a flat input of in_dim features (gru, lstm: the sequence "
     "length, >= 1; from the data when it has sequences)"},
    {"model.features", TS_CFG_I64, FIELD(model, features),
     TS_CFG_FOR_MLP | TS_CFG_FOR_RNN | TS_CFG_FOR_GCN | TS_CFG_DERIVED, NULL, SIZE_RANGE, "preset",
     "features per time step (input x is [batch, window, features]); gcn: per node (from the "
     "data)"},
    {"model.in_dim", TS_CFG_I64, FIELD(model, in_dim), TS_CFG_FOR_MLP | TS_CFG_DERIVED, NULL,
     SIZE_RANGE, "window * features", "input width; set it with window: 0 for x [batch, in_dim]"},
    {"model.hidden", TS_CFG_I64, FIELD(model, hidden),
     TS_CFG_FOR_MLP | TS_CFG_FOR_RNN | TS_CFG_FOR_GCN | TS_CFG_DERIVED, NULL, SIZE_RANGE, "preset",
     "width of each hidden layer (gru, lstm: the hidden state)"},
    {"model.n_hidden", TS_CFG_INT, FIELD(model, n_hidden), TS_CFG_FOR_MLP | TS_CFG_DERIVED, NULL,
     "[0, 1000]", "preset", "hidden layers, each Linear -> ReLU (-> LayerNorm)"},
    {"model.out_dim", TS_CFG_I64, FIELD(model, out_dim),
     TS_CFG_FOR_MLP | TS_CFG_FOR_RNN | TS_CFG_DERIVED, NULL, SIZE_RANGE, "preset",
     "outputs per sample (MSE loss against y [batch, out_dim])"},
    {"model.layer_norm", TS_CFG_BOOL, FIELD(model, layer_norm), TS_CFG_FOR_MLP | TS_CFG_DERIVED,
     NULL, NULL, "preset", "LayerNorm after each hidden ReLU"},
    {"model.classes", TS_CFG_I64, FIELD(model, classes),
     TS_CFG_FOR_MLP | TS_CFG_FOR_CNN | TS_CFG_FOR_RNN | TS_CFG_FOR_UNET3D | TS_CFG_FOR_GCN |
         TS_CFG_DERIVED,
     NULL, "[0, 1e9]", "from integer labels, else 0",
     "> 0: a classifier (logits, cross-entropy against class ids); 0: regression (MSE); gru, "
     "lstm: 1 is a binary classifier (one logit, BCE with logits against 0/1 targets); unet3d "
     "and gcn: >= 2 classes of voxels or nodes"},
    {"model.ctx", TS_CFG_I64, FIELD(model, ctx), TS_CFG_FOR_GPT | TS_CFG_DERIVED, NULL, SIZE_RANGE,
     "preset", "context length (tokens per sequence)"},
    {"model.vocab", TS_CFG_I64, FIELD(model, vocab), TS_CFG_FOR_GPT | TS_CFG_DERIVED, NULL,
     SIZE_RANGE, "preset", "vocabulary size"},
    {"model.d_model", TS_CFG_I64, FIELD(model, d_model), TS_CFG_FOR_GPT | TS_CFG_DERIVED, NULL,
     SIZE_RANGE, "preset", "embedding width; a multiple of n_heads"},
    {"model.n_layers", TS_CFG_INT, FIELD(model, n_layers),
     TS_CFG_FOR_GPT | TS_CFG_FOR_RNN | TS_CFG_DERIVED, NULL, "[0, 1000]", "preset",
     "transformer blocks (gpt) or stacked recurrent layers (gru, lstm)"},
    {"model.n_heads", TS_CFG_INT, FIELD(model, n_heads), TS_CFG_FOR_GPT | TS_CFG_DERIVED, NULL,
     "[1, 1e6]", "preset", "attention heads per block"},
    {"model.dropout", TS_CFG_F64, FIELD(model, dropout), TS_CFG_FOR_GPT | TS_CFG_DERIVED, NULL,
     "[0, 1)", "preset", "dropout probability on embeddings, attention and MLP outputs"},
    {"model.channels", TS_CFG_I64, FIELD(model, channels),
     TS_CFG_FOR_CNN | TS_CFG_FOR_UNET3D | TS_CFG_DERIVED, NULL, SIZE_RANGE, "preset",
     "image channels (x is [batch, channels * height * width]; unet3d: [batch, channels, size, "
     "size, size])"},
    {"model.height", TS_CFG_I64, FIELD(model, height), TS_CFG_FOR_CNN | TS_CFG_DERIVED, NULL,
     SIZE_RANGE, "preset", "image height; a multiple of 4"},
    {"model.width", TS_CFG_I64, FIELD(model, width), TS_CFG_FOR_CNN | TS_CFG_DERIVED, NULL,
     SIZE_RANGE, "preset", "image width; a multiple of 4"},
    {"model.c1", TS_CFG_I64, FIELD(model, c1), TS_CFG_FOR_CNN | TS_CFG_FOR_UNET3D | TS_CFG_DERIVED,
     NULL, SIZE_RANGE, "preset",
     "channels of the first Conv3x3 -> BatchNorm -> ReLU -> MaxPool block (unet3d: of the first "
     "level)"},
    {"model.c2", TS_CFG_I64, FIELD(model, c2), TS_CFG_FOR_CNN | TS_CFG_FOR_UNET3D | TS_CFG_DERIVED,
     NULL, SIZE_RANGE, "preset", "channels of the second block (unet3d: level)"},
    {"model.c3", TS_CFG_I64, FIELD(model, c3), TS_CFG_FOR_UNET3D | TS_CFG_DERIVED, NULL, SIZE_RANGE,
     "preset", "channels of the unet3d's bottom level"},
    {"model.nodes", TS_CFG_I64, FIELD(model, nodes), TS_CFG_FOR_GCN | TS_CFG_DERIVED, NULL,
     "[2, 1e9]", "preset",
     "nodes of the synthetic graph (data.source synthetic); a graph file has its own"},
    {"model.size", TS_CFG_I64, FIELD(model, size), TS_CFG_FOR_UNET3D | TS_CFG_DERIVED, NULL,
     "[4, 4096]", "preset", "edge of the unet3d's cubic volumes; a multiple of 4"},
    /* train */
    {"train.optimizer", TS_CFG_ENUM, FIELD(train, optimizer), 0, "sgd|adam|adamw", NULL, "adamw",
     "update rule, as torch.optim.SGD, Adam, AdamW"},
    {"train.lr", TS_CFG_F64, FIELD(train, lr), 0, NULL, "[0, inf)", "1e-3",
     "peak learning rate (after warm-up)"},
    {"train.momentum", TS_CFG_F64, FIELD(train, momentum), FOR_SGD, NULL, "[0, inf)", "0",
     "SGD momentum factor"},
    {"train.dampening", TS_CFG_F64, FIELD(train, dampening), FOR_SGD, NULL, "[0, 1]", "0",
     "SGD dampening of the momentum"},
    {"train.nesterov", TS_CFG_BOOL, FIELD(train, nesterov), FOR_SGD, NULL, NULL, "false",
     "SGD Nesterov momentum (needs momentum > 0 and dampening 0)"},
    {"train.beta1", TS_CFG_F64, FIELD(train, beta1), FOR_ADAM, NULL, "[0, 1)", "0.9",
     "Adam/AdamW decay of the first moment"},
    {"train.beta2", TS_CFG_F64, FIELD(train, beta2), FOR_ADAM, NULL, "[0, 1)", "0.999",
     "Adam/AdamW decay of the second moment"},
    {"train.eps", TS_CFG_F64, FIELD(train, eps), FOR_ADAM, NULL, "[0, inf)", "1e-8",
     "Adam/AdamW term added to the denominator"},
    {"train.weight_decay", TS_CFG_F64, FIELD(train, weight_decay), TS_CFG_DERIVED, NULL, "[0, inf)",
     "0.01 (adamw), 0 (sgd, adam)",
     "AdamW: decoupled decay; SGD and Adam: L2 term added to the gradient"},
    {"train.clip_grad_norm", TS_CFG_F64, FIELD(train, clip_grad_norm), 0, NULL, "[0, inf)", "0",
     "scale gradients to at most this global L2 norm (0: off)"},
    {"train.schedule", TS_CFG_ENUM, FIELD(train, schedule), 0, "constant|linear|cosine", NULL,
     "constant", "learning rate after warm-up: constant, or decaying to min_lr at total_steps"},
    {"train.warmup_steps", TS_CFG_I64, FIELD(train, warmup_steps), 0, NULL, "[0, 1e15]", "0",
     "steps of linear ramp from lr / warmup_steps up to lr"},
    {"train.total_steps", TS_CFG_I64, FIELD(train, total_steps), TS_CFG_DERIVED, NULL, "[1, 1e15]",
     "train.steps", "step at which linear and cosine schedules reach min_lr"},
    {"train.min_lr", TS_CFG_F64, FIELD(train, min_lr), 0, NULL, "[0, inf)", "0",
     "learning rate reached at total_steps (linear, cosine)"},
    {"train.steps", TS_CFG_I64, FIELD(train, steps), 0, NULL, "[1, 1e15]", "100",
     "optimizer steps to run"},
    {"train.seed", TS_CFG_U64, FIELD(train, seed), 0, NULL, NULL, "0",
     "seed of parameter init, dropout and synthetic data"},
    {"train.threads", TS_CFG_INT, FIELD(train, threads), 0, NULL, "[0, 4096]", "0",
     "worker threads (0: all cores, or OMP_NUM_THREADS)"},
    {"train.epochs", TS_CFG_I64, FIELD(train, epochs), 0, NULL, "[0, 1e9]", "0",
     "> 0: passes over the training split, instead of train.steps"},
    {"train.eval_every", TS_CFG_I64, FIELD(train, eval_every), 0, NULL, "[0, 1e15]", "0",
     "steps between evaluations on the validation split (0: at each epoch's end)"},
    {"train.metrics", TS_CFG_STR, FIELD(train, metrics), TS_CFG_DERIVED | TS_CFG_LIST, NULL, NULL,
     "accuracy (classifiers), mse (regression)",
     "what evaluation reports besides the loss: accuracy, auc, dice, miou, mse"},
    {"train.log_every", TS_CFG_I64, FIELD(train, log_every), 0, NULL, "[0, 1e15]", "0",
     "steps between log lines when not on a terminal (0: about 100 lines)"},
    /* compile */
    {"compile.debug_nan", TS_CFG_BOOL, FIELD(compile, debug_nan), 0, NULL, NULL, "false",
     "check every value for NaN/Inf as it is computed"},
    {"compile.no_simplify", TS_CFG_BOOL, FIELD(compile, no_simplify), 0, NULL, NULL, "false",
     "skip dead-code elimination, CSE and constant folding"},
    {"compile.naive_schedule", TS_CFG_BOOL, FIELD(compile, naive_schedule), 0, NULL, NULL, "false",
     "keep build order instead of the memory-aware schedule"},
    {"compile.no_inplace", TS_CFG_BOOL, FIELD(compile, no_inplace), 0, NULL, NULL, "false",
     "never let an output share its input's memory"},
    {"compile.no_fuse", TS_CFG_BOOL, FIELD(compile, no_fuse), 0, NULL, NULL, "false",
     "run every op as its own kernel (no GEMM epilogues or fused elementwise groups)"},
    {"compile.no_recompute", TS_CFG_BOOL, FIELD(compile, no_recompute), 0, NULL, NULL, "false",
     "keep large GELU/LayerNorm outputs for the backward instead of recomputing them"},
    {"compile.discard_outputs", TS_CFG_BOOL, FIELD(compile, discard_outputs), 0, NULL, NULL,
     "false",
     "training: do not keep marked outputs (the logits) readable after the step, so "
     "their memory is reused"},
    /* precision (docs/precision.md) */
    {"precision.default", TS_CFG_ENUM, FIELD(precision, dflt), 0, "fp32|bf16|fp16", NULL, "fp32",
     "type matmuls and convolutions compute in (f32 accumulation; weights, optimizer and the "
     "rest stay f32)"},
    {"precision.keep_fp32", TS_CFG_STR, FIELD(precision, keep_fp32), TS_CFG_DERIVED | TS_CFG_LIST,
     NULL, NULL, "none",
     "op names left in f32 (matmul, conv, conv_bwd_data, conv_bwd_weight, conv_transpose)"},
    {"precision.loss_scale", TS_CFG_STR, FIELD(precision, loss_scale), 0, NULL, NULL, "auto",
     "dynamic (GradScaler), none, or a fixed number; auto: dynamic with fp16, else none"},
    {"precision.init_scale", TS_CFG_F64, FIELD(precision, init_scale), 0, NULL, "(0, 3.4e38]",
     "65536", "initial scale of dynamic loss scaling"},
    {"precision.growth_factor", TS_CFG_F64, FIELD(precision, growth_factor), 0, NULL, "(1, inf)",
     "2", "scale multiplier after growth_interval steps with finite gradients"},
    {"precision.backoff_factor", TS_CFG_F64, FIELD(precision, backoff_factor), 0, NULL, "(0, 1)",
     "0.5", "scale multiplier after a step with non-finite gradients (the update is skipped)"},
    {"precision.growth_interval", TS_CFG_I64, FIELD(precision, growth_interval), 0, NULL,
     "[1, 2147483647]", "2000", "consecutive finite steps before the scale grows"},
    /* data */
    {"data.source", TS_CFG_ENUM, FIELD(data, source), 0, "synthetic|idx|npy|csv|tokens|graph", NULL,
     "synthetic", "where the examples come from (see Data sources)"},
    {"data.train_images", TS_CFG_STR, FIELD(data, train_images), FOR_IDX | TS_CFG_DERIVED, NULL,
     NULL, "required (idx)", "IDX image file of the training set (plain or .gz)"},
    {"data.train_labels", TS_CFG_STR, FIELD(data, train_labels), FOR_IDX | TS_CFG_DERIVED, NULL,
     NULL, "required (idx)", "IDX label file of the training set"},
    {"data.test_images", TS_CFG_STR, FIELD(data, test_images), FOR_IDX | TS_CFG_DERIVED, NULL, NULL,
     "none", "IDX images of a test set, evaluated at the end"},
    {"data.test_labels", TS_CFG_STR, FIELD(data, test_labels), FOR_IDX | TS_CFG_DERIVED, NULL, NULL,
     "none", "IDX labels of the test set"},
    {"data.x", TS_CFG_STR, FIELD(data, x), FOR_NPY | FOR_GRAPH | TS_CFG_DERIVED, NULL, NULL,
     "required (npy, graph)", ".npy array of inputs [n, ...] (graph: node features [nodes, F])"},
    {"data.y", TS_CFG_STR, FIELD(data, y), FOR_NPY | FOR_GRAPH | TS_CFG_DERIVED, NULL, NULL,
     "required (npy, graph)",
     ".npy array of targets [n, ...] (integers: class ids; graph: node labels [nodes])"},
    {"data.edges", TS_CFG_STR, FIELD(data, edges), FOR_GRAPH | TS_CFG_DERIVED, NULL, NULL,
     "required (graph)", "edge list: a line \"src,dst\" (or tab/space separated) per edge"},
    {"data.node_split", TS_CFG_STR, FIELD(data, node_split), FOR_GRAPH | TS_CFG_DERIVED, NULL, NULL,
     "by fraction",
     ".npy of integers [nodes]: 0 train, 1 val, 2 test, -1 unused (instead of the fractions)"},
    {"data.test_fraction", TS_CFG_F64, FIELD(data, test_fraction), FOR_GRAPH, NULL, "[0, 1)", "0",
     "share of the nodes held out for the test split (evaluated at the end)"},
    {"data.path", TS_CFG_STR, FIELD(data, path), FOR_CSV | FOR_TOKENS | TS_CFG_DERIVED, NULL, NULL,
     "required (csv, tokens)", "the CSV file, or the raw token file"},
    {"data.features", TS_CFG_STR, FIELD(data, features), FOR_CSV | TS_CFG_DERIVED | TS_CFG_LIST,
     NULL, NULL, "every column but the label", "CSV columns used as features"},
    {"data.label", TS_CFG_STR, FIELD(data, label), FOR_CSV | TS_CFG_DERIVED, NULL, NULL,
     "required (csv)", "CSV column predicted"},
    {"data.window", TS_CFG_I64, FIELD(data, window), FOR_CSV, NULL, SIZE_RANGE, "16",
     "CSV rows per example"},
    {"data.horizon", TS_CFG_I64, FIELD(data, horizon), FOR_CSV, NULL, "[0, 1e9]", "1",
     "rows from a window's last row to the row of its label"},
    {"data.normalise", TS_CFG_BOOL, FIELD(data, normalise), FOR_CSV, NULL, NULL, "true",
     "standardise each feature (window 1: statistics of the training split; windows: of all "
     "rows)"},
    {"data.bits", TS_CFG_INT, FIELD(data, bits), FOR_TOKENS, NULL, "[16, 32]", "16",
     "token width of the token file: 16 or 32 (little-endian)"},
    {"data.val_fraction", TS_CFG_F64, FIELD(data, val_fraction), FOR_FILES, NULL, "[0, 1)", "0.1",
     "share of the examples (graph: nodes) held out for validation"},
    {"data.shuffle", TS_CFG_BOOL, FIELD(data, shuffle), FOR_IDX | FOR_NPY | FOR_CSV | FOR_TOKENS,
     NULL, NULL, "true",
     "visit the training split in a new order each epoch (fixed by train.seed)"},
    {"data.skip_rows", TS_CFG_I64, FIELD(data, skip_rows), FOR_CSV, NULL, "[0, 1e9]", "0",
     "CSV lines skipped before the header (e.g. a line of counts)"},
    {"data.header", TS_CFG_BOOL, FIELD(data, header), FOR_CSV, NULL, NULL, "true",
     "the CSV has a header line; false names the columns 0, 1, 2, ..."},
    /* output */
    {"output.dir", TS_CFG_STR, FIELD(output, dir), TS_CFG_DERIVED, NULL, NULL, "none",
     "run directory (must not exist or be empty; tessel train --out overrides)"},
    /* ckpt */
    {"ckpt.every", TS_CFG_I64, FIELD(ckpt, every), 0, NULL, "[0, 1e15]", "0",
     "steps between checkpoints in the run directory (0: none)"},
    {"ckpt.keep_last", TS_CFG_INT, FIELD(ckpt, keep_last), 0, NULL, "[0, 1e6]", "3",
     "keep the newest K checkpoints (0: keep all)"},
    {"ckpt.keep_every", TS_CFG_INT, FIELD(ckpt, keep_every), 0, NULL, "[0, 1e9]", "0",
     "also keep checkpoints whose step is a multiple of M (0: none)"},
    {"ckpt.sign_key", TS_CFG_STR, FIELD(ckpt, sign_key), TS_CFG_DERIVED, NULL, NULL, "none",
     "private key from tessel keygen: signs manifests and the audit log (none: unsigned)"},
    {"ckpt.verify_key", TS_CFG_STR, FIELD(ckpt, verify_key), TS_CFG_DERIVED, NULL, NULL, "none",
     "public key a checkpoint must be signed with to resume (none: checksums only)"},
    {"ckpt.async", TS_CFG_BOOL, FIELD(ckpt, async), 0, NULL, NULL, "true",
     "write checkpoints in a background thread while training goes on"},
    /* observe */
    {"observe.metrics_port", TS_CFG_INT, FIELD(observe, metrics_port), 0, NULL, "[0, 65535]", "0",
     "port of the Prometheus /metrics endpoint served while training (0: none)"},
    {"observe.metrics_addr", TS_CFG_STR, FIELD(observe, metrics_addr), 0, NULL, NULL, "127.0.0.1",
     "numeric address the endpoint listens on (0.0.0.0: every interface)"},
    {"observe.tensorboard", TS_CFG_BOOL, FIELD(observe, tensorboard), 0, NULL, NULL, "true",
     "write TensorBoard event files under RUN_DIR/tb/ (needs a run directory)"},
    {"observe.histogram_every", TS_CFG_I64, FIELD(observe, histogram_every), 0, NULL, "[0, 1e15]",
     "100", "steps between TensorBoard histograms of every parameter and gradient (0: none)"},
    /* alerts (docs/observability.md) */
    {"alerts.rules", TS_CFG_STR, FIELD(alerts, rules), TS_CFG_DERIVED | TS_CFG_LIST, NULL, NULL,
     "none",
     "alert rules, each {metric, above|below|ratio_to_baseline|non_finite, for_steps, "
     "action} as a mapping or as text \"metric=grad_norm above=150 action=pause\""},
    {"alerts.defaults", TS_CFG_BOOL, FIELD(alerts, defaults), 0, NULL, NULL, "true",
     "without alerts.rules, use the default rules (false: no alerts at all)"},
    {"alerts.webhook_url", TS_CFG_STR, FIELD(alerts, webhook_url), TS_CFG_DERIVED, NULL, NULL,
     "none", "where action webhook POSTs its JSON (a rule's url= overrides it)"},
    {"alerts.baseline_window", TS_CFG_INT, FIELD(alerts, baseline_window), 0, NULL, "[1, 1e6]",
     "50", "steps whose values form a metric's baseline (mean, std, z-score)"},
    {"alerts.baseline_warmup", TS_CFG_INT, FIELD(alerts, baseline_warmup), 0, NULL, "[0, 1e6]",
     "20", "steps before a baseline is used (ratio_to_baseline never fires earlier)"},
    {"alerts.update_ratio_every", TS_CFG_INT, FIELD(alerts, update_ratio_every), 0, NULL,
     "[0, 1e9]", "10",
     "steps between measurements of ||update|| / ||parameters|| (each copies the parameters; 0: "
     "never)"},
    /* debug: corrupting data on purpose, to test alerts */
    {"debug.inject", TS_CFG_ENUM, FIELD(debug, inject), 0, "none|nan|scale", NULL, "none",
     "corrupt training batches: nan puts a NaN in x, scale multiplies x by inject_scale"},
    {"debug.inject_step", TS_CFG_I64, FIELD(debug, inject_step), 0, NULL, "[0, 1e15]", "0",
     "first step whose batch is corrupted"},
    {"debug.inject_count", TS_CFG_INT, FIELD(debug, inject_count), 0, NULL, "[1, 1e9]", "1",
     "consecutive steps corrupted"},
    {"debug.inject_scale", TS_CFG_F64, FIELD(debug, inject_scale), 0, NULL, NULL, "1000",
     "factor applied to x by inject: scale"},
    /* dist */
    {"dist.procs", TS_CFG_INT, FIELD(dist, procs), 0, NULL, "[1, 1024]", "1",
     "data-parallel worker processes on this host (tessel train --procs overrides)"},
    {"dist.bucket_mb", TS_CFG_F64, FIELD(dist, bucket_mb), 0, NULL, "(0, 1e6]", "25",
     "gradient bucket size in MiB (the first bucket is 1 MiB)"},
    {"dist.algo", TS_CFG_ENUM, FIELD(dist, algo), 0, "auto|native|ring|rhd|rd|hier", NULL, "auto",
     "all-reduce algorithm of the gradient buckets (auto: measured per size)"},
    {"dist.zero", TS_CFG_INT, FIELD(dist, zero), 0, NULL, "[0, 2]", "0",
     "ZeRO stage: 1 shards the optimizer state over the processes, 2 the gradients too (0: "
     "replicated)"},
    {"dist.share_params", TS_CFG_BOOL, FIELD(dist, share_params), 0, NULL, NULL, "true",
     "ZeRO with --procs (processes of one host): one copy of the parameters in shared memory, "
     "each process updating its block in place (false: a copy per process, all-gathered after "
     "the update, as across hosts under mpirun)"},
    {"dist.timeout_s", TS_CFG_F64, FIELD(dist, timeout_s), 0, NULL, "[0, inf)", "0",
     "seconds a collective may wait for a peer (0: TESSEL_DIST_TIMEOUT, else 1800)"},
    {"dist.max_restarts", TS_CFG_INT, FIELD(dist, max_restarts), 0, NULL, "[0, 1000]", "0",
     "times the --procs launcher restarts failed workers from the latest checkpoint "
     "(tessel train --max-restarts overrides)"},
};

#define N_KEYS ((int)(sizeof keys / sizeof keys[0]))
_Static_assert(sizeof keys / sizeof keys[0] <= TS_CFG_MAX_KEYS, "raise TS_CFG_MAX_KEYS");

enum { ORIGIN_DEFAULT = 0, ORIGIN_FILE = 1, ORIGIN_SET = 2 };

int ts_config_key_count(void) {
    return N_KEYS;
}

const ts_config_key *ts_config_key_at(int i) {
    return i >= 0 && i < N_KEYS ? &keys[i] : NULL;
}

int ts_config_key_find(const char *path) {
    for (int i = 0; path && i < N_KEYS; i++)
        if (!strcmp(keys[i].path, path)) return i;
    return -1;
}

/* The i-th entry of "a|b|c" into buf; 0 if there is none. */
static int choice_at(const char *choices, int i, char *buf, size_t n) {
    const char *p = choices;
    for (int k = 0; k < i; k++) {
        p = strchr(p, '|');
        if (!p) return 0;
        p++;
    }
    size_t len = strcspn(p, "|");
    if (len >= n) len = n - 1;
    memcpy(buf, p, len);
    buf[len] = 0;
    return 1;
}

const char *ts_config_type_name(const ts_config_key *k, char *buf, size_t n) {
    switch (k->type) {
    case TS_CFG_INT:
    case TS_CFG_I64:
    case TS_CFG_U64: snprintf(buf, n, "integer"); break;
    case TS_CFG_F64: snprintf(buf, n, "number"); break;
    case TS_CFG_BOOL: snprintf(buf, n, "bool"); break;
    case TS_CFG_STR: snprintf(buf, n, (k->flags & TS_CFG_LIST) ? "list of names" : "string"); break;
    case TS_CFG_ENUM: {
        size_t k2 = 0;
        char c[64];
        buf[0] = 0;
        for (int i = 0; choice_at(k->choices, i, c, sizeof c) && k2 < n; i++)
            k2 += (size_t)snprintf(buf + k2, n - k2, i ? ", %s" : "%s", c);
        break;
    }
    }
    return buf;
}

/* ---- edit distance and suggestions ------------------------------------- */

/* Optimal string alignment distance: Levenshtein plus adjacent swaps, so
 * "trian" is one edit from "train". Names are short; longer inputs are cut. */
static int osa(const char *a, const char *b) {
    enum { M = 64 };
    int n = (int)strlen(a), m = (int)strlen(b);
    if (n > M) n = M;
    if (m > M) m = M;
    static _Thread_local int d[M + 1][M + 1];
    for (int i = 0; i <= n; i++) d[i][0] = i;
    for (int j = 0; j <= m; j++) d[0][j] = j;
    for (int i = 1; i <= n; i++)
        for (int j = 1; j <= m; j++) {
            int cost = a[i - 1] != b[j - 1];
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[n][m];
}

static const char *leaf(const char *path) {
    const char *dot = strrchr(path, '.');
    return dot ? dot + 1 : path;
}

/* How far `cand` is from what the user wrote: a misspelt name, or the
 * right name in the wrong section ("model.lr" -> "train.lr"). */
static int suggest_score(const char *got, const char *cand) {
    int s = osa(got, cand);
    const char *gl = leaf(got), *cl = leaf(cand);
    if (gl != got || cl != cand) {
        int t = osa(gl, cl) + 1;
        if (t < s) s = t;
        size_t ng = strlen(gl), nc = strlen(cl), mn = ng < nc ? ng : nc;
        /* "batch_size" for "batch", "warmup" for "warmup_steps" */
        if (mn >= 3 && !strncmp(gl, cl, mn) && 2 < s) s = 2;
    }
    return s;
}

/* Whether cand (at distance s) beats the best so far; on a tie the one
 * closer in length wins, so "adamx" suggests adamw rather than adam. */
static int closer(int s, int best_s, const char *got, const char *cand, const char *best) {
    if (s != best_s) return s < best_s;
    long g = (long)strlen(got), dc = labs((long)strlen(cand) - g),
         db = labs((long)strlen(best) - g);
    return dc < db;
}

/* Candidate names: every key path and every section (path prefix). */
static int candidate(int i, char *buf, size_t n) {
    if (i < N_KEYS) {
        snprintf(buf, n, "%s", keys[i].path);
        return 1;
    }
    i -= N_KEYS;
    if (i >= N_KEYS) return 0;
    size_t len = strcspn(keys[i].path, ".");
    if (len >= n) len = n - 1;
    memcpy(buf, keys[i].path, len);
    buf[len] = 0;
    return 1;
}

/* " (did you mean 'train.lr'?)", else the names valid where the user was.
 * A name outside every section also gets the list of sections, since a
 * near miss there ("dataset" for "data") may still be the wrong guess. */
static void suggestion(const char *got, char *out, size_t n) {
    char best[128] = "", c[128];
    int best_s = INT_MAX;
    for (int i = 0; candidate(i, c, sizeof c); i++) {
        int s = suggest_score(got, c);
        if (closer(s, best_s, got, c, best)) best_s = s, snprintf(best, sizeof best, "%s", c);
    }
    size_t sec = strcspn(got, "."), k = 0;
    const int close = best_s <= 1 + (int)strlen(leaf(got)) / 3;
    if (close) {
        k = (size_t)snprintf(out, n, " (did you mean '%s'?", best);
        if (got[sec] == '.' || k >= n) {
            if (k < n) snprintf(out + k, n - k, ")");
            return;
        }
    }
    /* Inside a known section list its keys; otherwise list the sections. */
    int known = 0;
    for (int i = 0; i < N_KEYS; i++)
        known |= got[sec] == '.' && !strncmp(keys[i].path, got, sec + 1);
    if (!close) out[0] = 0;
    const size_t start = k;
    for (int i = 0; i < N_KEYS && k < n; i++) {
        const char *p = keys[i].path;
        size_t ps = strcspn(p, ".");
        const char *open = k == start ? (close ? " sections: " : " (sections: ") : ", ";
        if (known) {
            if (strncmp(p, got, sec + 1)) continue;
            k += (size_t)snprintf(out + k, n - k, "%s%s", k ? ", " : " (valid here: ", p + sec + 1);
        } else if (i == 0 || strncmp(keys[i - 1].path, p, ps + 1)) {
            /* the table is grouped by section, so a section starts where the prefix changes */
            k += (size_t)snprintf(out + k, n - k, "%s%.*s", open, (int)ps, p);
        }
    }
    if (k && k < n) snprintf(out + k, n - k, ")");
}

/* ---- values ------------------------------------------------------------- */

static int is_section(const char *path) {
    size_t n = strlen(path);
    for (int i = 0; i < N_KEYS; i++)
        if (!strncmp(keys[i].path, path, n) && keys[i].path[n] == '.') return 1;
    return 0;
}

/* 'text' shortened for a message. */
static const char *shown(const char *text, char *buf, size_t n) {
    size_t len = strlen(text);
    if (len < 48) {
        snprintf(buf, n, "'%s'", text);
    } else {
        snprintf(buf, n, "'%.44s...'", text);
    }
    return buf;
}

static int parse_i64(const char *s, int64_t *v) {
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (end != s && !*end && !errno) {
        *v = x;
        return 1;
    }
    /* 1e6 is a fine way to write a step count; 1.5 is not an integer. */
    double d = strtod(s, &end);
    if (end == s || *end || !isfinite(d) || d != floor(d) || fabs(d) >= 9.2e18) return 0;
    *v = (int64_t)d;
    return 1;
}

static int parse_f64(const char *s, double *v) {
    char *end;
    double d = strtod(s, &end);
    if (end == s || *end || !isfinite(d)) return 0;
    *v = d;
    return 1;
}

static int parse_bool(const char *s, int *v) {
    static const char *yes[] = {"true", "yes", "on", "1"}, *no[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, yes[i])) return *v = 1, 1;
        if (!strcasecmp(s, no[i])) return *v = 0, 1;
    }
    return 0;
}

/* Checks v against a range written "[lo, hi)", "(0, inf)" and the like. */
static int in_range(const char *range, double v) {
    if (!range) return 1;
    char *p;
    double lo = strtod(range + 1, &p);
    while (*p == ',' || *p == ' ') p++;
    double hi = strtod(p, &p);
    int lo_ok = range[0] == '[' ? v >= lo : v > lo;
    int hi_ok = *p == ']' ? v <= hi : v < hi;
    return lo_ok && hi_ok;
}

/* "a number", "one of sgd | adam | adamw", ... for messages. */
static const char *expected(const ts_config_key *k, char *buf, size_t n) {
    char tb[96];
    switch (k->type) {
    case TS_CFG_INT:
    case TS_CFG_I64:
    case TS_CFG_U64: return "an integer";
    case TS_CFG_F64: return "a number";
    case TS_CFG_BOOL: return "true or false";
    case TS_CFG_STR: return (k->flags & TS_CFG_LIST) ? "a name or a list of names" : "a string";
    case TS_CFG_ENUM: snprintf(buf, n, "one of %s", ts_config_type_name(k, tb, sizeof tb)); break;
    }
    return buf;
}

/* Parse `text` for key k and store it in c. The message names the key but
 * not the place; the caller adds that. */
static ts_status store(ts_config *c, const ts_config_key *k, const char *text) {
    char eb[128], vb[64];
    char *dst = (char *)c + k->offset;
    if (!*text)
        return ts_fail(TS_ERR_INVALID, "%s: expected %s, got nothing", k->path,
                       expected(k, eb, sizeof eb));
    switch (k->type) {
    case TS_CFG_INT:
    case TS_CFG_I64: {
        int64_t v;
        if (!parse_i64(text, &v)) {
            double d;
            /* a whole number too large for int64 is out of range, not malformed */
            if (parse_f64(text, &d) && d == floor(d)) break;
            return ts_fail(TS_ERR_INVALID, "%s: expected an integer, got %s", k->path,
                           shown(text, vb, sizeof vb));
        }
        if (!in_range(k->range, (double)v) ||
            (k->type == TS_CFG_INT && (v < INT_MIN || v > INT_MAX)))
            break;
        if (k->type == TS_CFG_INT) {
            int iv = (int)v;
            memcpy(dst, &iv, sizeof iv);
        } else {
            memcpy(dst, &v, sizeof v);
        }
        return TS_OK;
    }
    case TS_CFG_U64: {
        char *end;
        errno = 0;
        const char *p = text;
        while (isspace((unsigned char)*p)) p++;
        unsigned long long v = strtoull(p, &end, 10);
        if (*p == '-' || end == p || *end || errno)
            return ts_fail(TS_ERR_INVALID, "%s: expected an integer in [0, 2^64), got %s", k->path,
                           shown(text, vb, sizeof vb));
        uint64_t u = v;
        if (!in_range(k->range, (double)u)) break;
        memcpy(dst, &u, sizeof u);
        return TS_OK;
    }
    case TS_CFG_F64: {
        double v;
        if (!parse_f64(text, &v))
            return ts_fail(TS_ERR_INVALID, "%s: expected a number, got %s", k->path,
                           shown(text, vb, sizeof vb));
        if (!in_range(k->range, v)) break;
        memcpy(dst, &v, sizeof v);
        return TS_OK;
    }
    case TS_CFG_BOOL: {
        int v;
        if (!parse_bool(text, &v))
            return ts_fail(TS_ERR_INVALID, "%s: expected true or false, got %s", k->path,
                           shown(text, vb, sizeof vb));
        memcpy(dst, &v, sizeof v);
        return TS_OK;
    }
    case TS_CFG_ENUM: {
        char ch[64], best[64] = "";
        int best_s = INT_MAX;
        for (int i = 0; choice_at(k->choices, i, ch, sizeof ch); i++) {
            /* Case does not matter: "AdamW" means adamw. */
            if (!strcasecmp(ch, text)) {
                memcpy(dst, &i, sizeof i);
                return TS_OK;
            }
            int s = osa(text, ch);
            if (closer(s, best_s, text, ch, best))
                best_s = s, snprintf(best, sizeof best, "%s", ch);
        }
        char hint[96] = "";
        if (best_s <= 1 + (int)strlen(text) / 3)
            snprintf(hint, sizeof hint, " (did you mean '%s'?)", best);
        return ts_fail(TS_ERR_INVALID, "%s: expected %s, got %s%s", k->path,
                       expected(k, eb, sizeof eb), shown(text, vb, sizeof vb), hint);
    }
    case TS_CFG_STR:
        if (strlen(text) >= k->size)
            return ts_fail(TS_ERR_INVALID, "%s: longer than %zu characters", k->path, k->size - 1);
        memcpy(dst, text, strlen(text) + 1);
        return TS_OK;
    }
    /* Every break above lands here: a well-formed value outside the range. */
    if (!k->range)
        return ts_fail(TS_ERR_INVALID, "%s: %s is out of range", k->path,
                       shown(text, vb, sizeof vb));
    return ts_fail(TS_ERR_INVALID, "%s: must be in %s, got %s", k->path, k->range,
                   shown(text, vb, sizeof vb));
}

/* "file:line:col: " or "--set: " for where key i got its value; "" for a default. */
static const char *origin(const ts_config *c, int i, char *buf, size_t n) {
    if (i < 0 || c->set[i] == ORIGIN_DEFAULT)
        snprintf(buf, n, "%s", c->file[0] ? c->file : "config");
    else if (c->set[i] == ORIGIN_FILE)
        snprintf(buf, n, "%s:%d:%d", c->file, c->line[i], c->col[i]);
    else
        snprintf(buf, n, "--set");
    return buf;
}

void ts_config_init(ts_config *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < N_KEYS; i++)
        if (!(keys[i].flags & TS_CFG_DERIVED)) store(c, &keys[i], keys[i].dflt);
}

/* ---- YAML --------------------------------------------------------------- */

typedef struct walk_ctx {
    ts_config *c;
    yaml_document_t *doc;
    const char *name;
    unsigned char seen[TS_CFG_MAX_KEYS];
} walk_ctx;

static ts_status at(const walk_ctx *w, const yaml_node_t *node, ts_status s) {
    ts_error_prefix("%s:%zu:%zu", w->name, node->start_mark.line + 1, node->start_mark.column + 1);
    return s;
}

static const char *node_kind(const yaml_node_t *n) {
    return n->type == YAML_MAPPING_NODE ? "a mapping" : "a list";
}

/* A YAML null: an empty plain scalar, "~" or "null". */
static int is_null(const yaml_node_t *n) {
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return 0;
    const char *v = (const char *)n->data.scalar.value;
    return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL");
}

/* A mapping of scalars as "key=value key=value". */
static ts_status flatten_map(const walk_ctx *w, const yaml_node_t *map, const ts_config_key *k,
                             char *buf, size_t n) {
    size_t len = 0;
    buf[0] = 0;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *kn = yaml_document_get_node(w->doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(w->doc, p->value);
        if (!kn || !vn) return ts_fail(TS_ERR_INTERNAL, "%s: YAML node missing", w->name);
        if (kn->type != YAML_SCALAR_NODE || vn->type != YAML_SCALAR_NODE || !vn->data.scalar.length)
            return at(
                w, vn,
                ts_fail(TS_ERR_INVALID, "%s: a mapping in the list needs plain values", k->path));
        const char *kv = (const char *)kn->data.scalar.value,
                   *vv = (const char *)vn->data.scalar.value;
        if (strpbrk(vv, ", \t") || strpbrk(kv, ", \t="))
            return at(w, vn,
                      ts_fail(TS_ERR_INVALID, "%s: '%s: %s': no ',' or spaces in these values",
                              k->path, kv, vv));
        int m = snprintf(buf + len, n - len, "%s%s=%s", len ? " " : "", kv, vv);
        if (m < 0 || (size_t)m >= n - len)
            return at(w, map, ts_fail(TS_ERR_INVALID, "%s: item too long", k->path));
        len += (size_t)m;
    }
    return TS_OK;
}

/* A YAML list of names as the comma-separated text the key stores. */
static ts_status join_list(const walk_ctx *w, const yaml_node_t *seq, const ts_config_key *k,
                           char *buf, size_t n) {
    size_t len = 0;
    buf[0] = 0;
    for (yaml_node_item_t *it = seq->data.sequence.items.start; it < seq->data.sequence.items.top;
         it++) {
        yaml_node_t *item = yaml_document_get_node(w->doc, *it);
        if (!item) return ts_fail(TS_ERR_INTERNAL, "%s: YAML node missing", w->name);
        char flat[1024];
        if (item->type == YAML_MAPPING_NODE) {
            /* A mapping item ({metric: loss, non_finite: true}) becomes the
             * text "metric=loss non_finite=true" (alerts.rules). */
            ts_status s = flatten_map(w, item, k, flat, sizeof flat);
            if (s != TS_OK) return s;
            int m = snprintf(buf + len, n - len, "%s%s", len ? ", " : "", flat);
            if (m < 0 || (size_t)m >= n - len)
                return at(w, seq, ts_fail(TS_ERR_INVALID, "%s: list too long", k->path));
            len += (size_t)m;
            continue;
        }
        if (item->type != YAML_SCALAR_NODE || !item->data.scalar.length)
            return at(w, item,
                      ts_fail(TS_ERR_INVALID, "%s: expected a list of names, got %s in it", k->path,
                              item->type == YAML_SCALAR_NODE ? "an empty one" : node_kind(item)));
        const char *v = (const char *)item->data.scalar.value;
        if (strchr(v, ','))
            return at(
                w, item,
                ts_fail(TS_ERR_INVALID, "%s: a name may not contain ',', got '%s'", k->path, v));
        int m = snprintf(buf + len, n - len, "%s%s", len ? ", " : "", v);
        if (m < 0 || (size_t)m >= n - len)
            return at(w, seq, ts_fail(TS_ERR_INVALID, "%s: list too long", k->path));
        len += (size_t)m;
    }
    return TS_OK;
}

static ts_status walk(walk_ctx *w, const yaml_node_t *map, const char *prefix) {
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *kn = yaml_document_get_node(w->doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(w->doc, p->value);
        if (!kn || !vn) return ts_fail(TS_ERR_INTERNAL, "%s: YAML node missing", w->name);
        if (kn->type != YAML_SCALAR_NODE)
            return at(w, kn,
                      ts_fail(TS_ERR_FORMAT, "a key must be a plain name, got %s", node_kind(kn)));
        char path[256];
        int n = snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "",
                         (const char *)kn->data.scalar.value);
        if (n < 0 || (size_t)n >= sizeof path)
            return at(w, kn, ts_fail(TS_ERR_FORMAT, "key name too long"));
        int idx = ts_config_key_find(path);
        if (vn->type == YAML_MAPPING_NODE && idx < 0 && is_section(path)) {
            ts_status s = walk(w, vn, path);
            if (s != TS_OK) return s;
            continue;
        }
        if (idx < 0 && is_section(path) && is_null(vn)) continue; /* "compile:" alone */
        if (idx < 0) {
            char hint[512];
            if (is_section(path))
                return at(w, vn,
                          ts_fail(TS_ERR_FORMAT,
                                  "%s: expected a mapping of keys, got "
                                  "a value",
                                  path));
            suggestion(path, hint, sizeof hint);
            return at(w, kn, ts_fail(TS_ERR_INVALID, "unknown key '%s'%s", path, hint));
        }
        char joined[2048];
        const char *text = NULL;
        if (vn->type == YAML_SEQUENCE_NODE && (keys[idx].flags & TS_CFG_LIST)) {
            ts_status s = join_list(w, vn, &keys[idx], joined, sizeof joined);
            if (s != TS_OK) return s;
            text = joined;
        } else if (vn->type != YAML_SCALAR_NODE) {
            char eb[128];
            return at(w, vn,
                      ts_fail(TS_ERR_INVALID, "%s: expected %s, got %s", path,
                              expected(&keys[idx], eb, sizeof eb), node_kind(vn)));
        }
        if (w->seen[idx])
            return at(w, kn,
                      ts_fail(TS_ERR_INVALID, "duplicate key '%s' (first set on line %d)", path,
                              w->c->line[idx]));
        if (!text) text = (const char *)vn->data.scalar.value;
        ts_status s = store(w->c, &keys[idx], text);
        if (s != TS_OK) return at(w, vn, s);
        w->seen[idx] = 1;
        w->c->set[idx] = ORIGIN_FILE;
        w->c->line[idx] = (int)kn->start_mark.line + 1;
        w->c->col[idx] = (int)kn->start_mark.column + 1;
    }
    return TS_OK;
}

static ts_status parse_error(const yaml_parser_t *ps, const char *name) {
    const char *problem = ps->problem ? ps->problem : "cannot parse";
    if (ps->error == YAML_READER_ERROR)
        return ts_fail(TS_ERR_FORMAT, "%s: malformed YAML at byte %zu: %s", name,
                       ps->problem_offset, problem);
    if (ps->error == YAML_MEMORY_ERROR)
        return ts_fail(TS_ERR_NOMEM, "%s: out of memory while parsing YAML", name);
    char ctx[160] = "";
    if (ps->context)
        snprintf(ctx, sizeof ctx, " (%s at line %zu)", ps->context, ps->context_mark.line + 1);
    return ts_fail(TS_ERR_FORMAT, "%s:%zu:%zu: malformed YAML: %s%s", name,
                   ps->problem_mark.line + 1, ps->problem_mark.column + 1, problem, ctx);
}

static ts_status load(ts_config *c, yaml_parser_t *ps, const char *name) {
    if (c->finished)
        return ts_fail(TS_ERR_INVALID,
                       "%s: config already finished; load files before "
                       "ts_config_finish",
                       name);
    snprintf(c->file, sizeof c->file, "%s", name);
    yaml_document_t doc;
    if (!yaml_parser_load(ps, &doc)) return parse_error(ps, name);
    ts_status s = TS_OK;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    walk_ctx w;
    memset(&w, 0, sizeof w);
    w.c = c, w.doc = &doc, w.name = name;
    if (root && root->type == YAML_MAPPING_NODE) {
        s = walk(&w, root, "");
    } else if (root && !(root->type == YAML_SCALAR_NODE && !root->data.scalar.length)) {
        s = at(&w, root,
               ts_fail(TS_ERR_FORMAT,
                       "expected a mapping of sections (model, train, compile, data, output, ckpt, "
                       "observe), "
                       "got %s",
                       root->type == YAML_SCALAR_NODE ? "a value" : "a list"));
    }
    yaml_document_delete(&doc);
    if (s != TS_OK) return s;
    /* A second document would be silently ignored; say so instead. */
    if (!yaml_parser_load(ps, &doc)) return parse_error(ps, name);
    if (yaml_document_get_root_node(&doc))
        s = ts_fail(TS_ERR_FORMAT, "%s:%zu: only one YAML document is allowed", name,
                    doc.start_mark.line + 1);
    yaml_document_delete(&doc);
    return s;
}

ts_status ts_config_load_string(ts_config *c, const char *text, size_t len, const char *name) {
    if (!c || !text) return ts_fail(TS_ERR_INVALID, "config: NULL argument");
    yaml_parser_t ps;
    if (!yaml_parser_initialize(&ps)) return ts_fail(TS_ERR_NOMEM, "config: YAML parser");
    yaml_parser_set_input_string(&ps, (const unsigned char *)text, len);
    ts_status s = load(c, &ps, name ? name : "config");
    yaml_parser_delete(&ps);
    return s;
}

ts_status ts_config_load_file(ts_config *c, const char *path) {
    if (!c || !path) return ts_fail(TS_ERR_INVALID, "config: NULL argument");
    struct stat st;
    if (stat(path, &st) != 0)
        return ts_fail(errno == ENOENT ? TS_ERR_NOT_FOUND : TS_ERR_IO,
                       "cannot open config '%s': %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return ts_fail(TS_ERR_IO, "cannot read config '%s': it is a directory", path);
    FILE *f = fopen(path, "rb");
    if (!f) return ts_fail(TS_ERR_IO, "cannot open config '%s': %s", path, strerror(errno));
    yaml_parser_t ps;
    if (!yaml_parser_initialize(&ps)) {
        fclose(f);
        return ts_fail(TS_ERR_NOMEM, "config: YAML parser");
    }
    yaml_parser_set_input_file(&ps, f);
    ts_status s = load(c, &ps, path);
    yaml_parser_delete(&ps);
    fclose(f);
    return s;
}

ts_status ts_config_set(ts_config *c, const char *assignment) {
    if (!c || !assignment) return ts_fail(TS_ERR_INVALID, "config: NULL argument");
    if (c->finished)
        return ts_fail(TS_ERR_INVALID, "--set: config already finished; apply overrides "
                                       "before ts_config_finish");
    while (isspace((unsigned char)*assignment)) assignment++;
    const char *eq = strchr(assignment, '=');
    char vb[64];
    if (!eq || eq == assignment)
        return ts_fail(TS_ERR_INVALID, "--set: expected key=value (e.g. train.lr=3e-4), got %s",
                       shown(assignment, vb, sizeof vb));
    char path[256], value[1024];
    size_t kl = (size_t)(eq - assignment);
    while (kl && isspace((unsigned char)assignment[kl - 1])) kl--;
    const char *vs = eq + 1;
    while (isspace((unsigned char)*vs)) vs++;
    size_t vl = strlen(vs);
    while (vl && isspace((unsigned char)vs[vl - 1])) vl--;
    if (kl >= sizeof path || vl >= sizeof value)
        return ts_fail(TS_ERR_INVALID, "--set: key or value too long");
    memcpy(path, assignment, kl);
    path[kl] = 0;
    memcpy(value, vs, vl);
    value[vl] = 0;
    /* Quotes protect a value from the shell's view, not ours. */
    if (vl >= 2 && (value[0] == '"' || value[0] == '\'') && value[vl - 1] == value[0]) {
        memmove(value, value + 1, vl - 2);
        value[vl - 2] = 0;
    }
    int idx = ts_config_key_find(path);
    if (idx < 0) {
        char hint[512];
        if (is_section(path))
            return ts_fail(TS_ERR_INVALID, "--set: '%s' is a section; set one of its keys", path);
        suggestion(path, hint, sizeof hint);
        return ts_fail(TS_ERR_INVALID, "--set: unknown key '%s'%s", path, hint);
    }
    ts_status s = store(c, &keys[idx], value);
    if (s != TS_OK) {
        ts_error_prefix("--set");
        return s;
    }
    c->set[idx] = ORIGIN_SET;
    return TS_OK;
}

/* ---- finishing ---------------------------------------------------------- */

static void preset_values(int preset, ts_config *p) {
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

/* The key flag of a model family, its name and its family's default preset. */
static int model_flag(int name) {
    static const int flags[] = {TS_CFG_FOR_MLP, TS_CFG_FOR_GPT,    TS_CFG_FOR_CNN, TS_CFG_FOR_RNN,
                                TS_CFG_FOR_RNN, TS_CFG_FOR_UNET3D, TS_CFG_FOR_GCN};
    return name >= 0 && name <= TS_CFG_GCN ? flags[name] : 0;
}
static const char *model_word(int name) {
    static const char *const words[] = {"mlp", "gpt", "cnn", "gru", "lstm", "unet3d", "gcn"};
    return name >= 0 && name <= TS_CFG_GCN ? words[name] : "?";
}
const char *ts_config_model_word(int name) {
    return model_word(name);
}
static int preset_family(int preset) {
    switch ((ts_cfg_preset)preset) {
    case TS_CFG_W1: return TS_CFG_MLP;
    case TS_CFG_FASHION: return TS_CFG_CNN;
    case TS_CFG_W2: return TS_CFG_GRU; /* and lstm */
    case TS_CFG_W4: return TS_CFG_UNET3D;
    case TS_CFG_W5: return TS_CFG_GCN;
    default: return TS_CFG_GPT;
    }
}
static int family_preset(int name) {
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
static int is_rnn(int name) {
    return name == TS_CFG_GRU || name == TS_CFG_LSTM;
}

/* a * b * ... without overflow; 0 when the product exceeds `limit`. */
static int64_t product(int64_t limit, int n, const int64_t *f) {
    int64_t p = 1;
    for (int i = 0; i < n; i++) {
        if (f[i] <= 0) return f[i] == 0 ? 0 : -1;
        if (p > limit / f[i]) return -1;
        p *= f[i];
    }
    return p;
}

/* For config_zoo.c (config_internal.h). */
const char *ts_config_origin(const ts_config *c, int i, char *buf, size_t n) {
    return origin(c, i, buf, n);
}
int64_t ts_config_product(int64_t limit, int n, const int64_t *f) {
    return product(limit, n, f);
}
int ts_config_is_rnn(int name) {
    return is_rnn(name);
}

static ts_status check_sizes(const ts_config *c) {
    /* Far beyond any machine, but keeps shape arithmetic inside int64. */
    const int64_t limit = (int64_t)1 << 40;
    const ts_cfg_model_name kind = (ts_cfg_model_name)c->model.name;
    int64_t B = c->model.batch, D = c->model.d_model, T = c->model.ctx, V = c->model.vocab;
    int64_t H = c->model.n_heads, in = c->model.in_dim, hid = c->model.hidden;
    const int64_t HW[2] = {c->model.height, c->model.width};
    const int64_t hw = product(limit, 2, HW);
    const int64_t S3[3] = {c->model.size, c->model.size, c->model.size};
    const int64_t vol = product(limit, 3, S3);
    struct {
        int kind;
        const char *what;
        int n;
        int64_t f[4];
    } t[] = {
        {TS_CFG_MLP, "input x", 2, {B, in}},
        {TS_CFG_MLP, "first weight", 2, {hid, in}},
        {TS_CFG_MLP, "activations", 2, {B, hid}},
        {TS_CFG_MLP, "output", 2, {B, c->model.out_dim}},
        {TS_CFG_GPT, "logits", 3, {B, T, V}},
        {TS_CFG_GPT, "attention scores", 4, {B, H, T, T}},
        {TS_CFG_GPT, "MLP activations", 4, {B, T, D, 4}},
        {TS_CFG_GPT, "token embedding", 2, {V, D}},
        {TS_CFG_CNN, "input x", 3, {B, c->model.channels, hw}},
        {TS_CFG_CNN, "first block", 3, {B, c->model.c1, hw}},
        {TS_CFG_CNN, "second block", 3, {B, c->model.c2, hw}},
        {TS_CFG_CNN,
         "classifier weight",
         3,
         {c->model.classes > 0 ? c->model.classes : 1, c->model.c2, hw}},
        {TS_CFG_GRU, "input x", 3, {B, c->model.window, c->model.features}},
        {TS_CFG_GRU, "hidden states", 4, {B, c->model.window, hid, 4}},
        {TS_CFG_GRU, "weights", 3, {hid, 4, hid + c->model.features}},
        {TS_CFG_UNET3D, "input x", 3, {B, c->model.channels, vol}},
        {TS_CFG_UNET3D,
         "first level",
         3,
         {B, c->model.c1 > c->model.c2 ? c->model.c1 : c->model.c2, vol}},
        {TS_CFG_UNET3D, "logits", 3, {B, c->model.classes, vol}},
        {TS_CFG_UNET3D, "bottom weights", 3, {c->model.c3, c->model.c3, 27}},
        {TS_CFG_GCN, "first weight", 2, {hid, c->model.features}},
    };
    for (int i = 0; i < (int)(sizeof t / sizeof t[0]); i++) {
        if (t[i].kind != (int)kind && !(t[i].kind == TS_CFG_GRU && kind == TS_CFG_LSTM)) continue;
        if (product(limit, t[i].n, t[i].f) < 0)
            return ts_fail(TS_ERR_INVALID, "%s: model too large: its %s would exceed 2^40 elements",
                           c->file[0] ? c->file : "config", t[i].what);
    }
    return TS_OK;
}

static int source_flag(int source) {
    static const int flags[] = {0, FOR_IDX, FOR_NPY, FOR_CSV, FOR_TOKENS, FOR_GRAPH};
    return source >= 0 && source < 6 ? flags[source] : 0;
}

/* "csv and tokens" for the sources whose flags are set. */
static void source_names(int flags, char *buf, size_t n) {
    static const char *names[] = {"synthetic", "idx", "npy", "csv", "tokens", "graph"};
    int count = 0, total = 0;
    for (int s = 1; s < 6; s++) total += (flags & source_flag(s)) != 0;
    size_t k = 0;
    for (int s = 1; s < 6 && k < n; s++) {
        if (!(flags & source_flag(s))) continue;
        count++;
        const char *sep = count == 1 ? "" : count == total ? " and " : ", ";
        k += (size_t)snprintf(buf + k, n - k, "%s%s", sep, names[s]);
    }
}

/* Parses the metric names of train.metrics into TS_METRIC_* flags. */
static ts_status parse_metric_flags(const char *text, unsigned *flags) {
    static const struct {
        const char *name;
        unsigned flag;
    } known[] = {{"accuracy", TS_METRIC_ACCURACY},
                 {"mse", TS_METRIC_MSE},
                 {"auc", TS_METRIC_AUC},
                 {"dice", TS_METRIC_DICE},
                 {"miou", TS_METRIC_MIOU}};
    *flags = 0;
    const char *p = text;
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        size_t len = strcspn(p, ", ");
        if (!len) break;
        size_t k = 0;
        while (k < sizeof known / sizeof known[0] &&
               !(strlen(known[k].name) == len && !strncasecmp(p, known[k].name, len)))
            k++;
        if (k == sizeof known / sizeof known[0])
            return ts_fail(TS_ERR_INVALID,
                           "train.metrics: unknown metric '%.*s' (accuracy, auc, dice, miou, mse)",
                           (int)len, p);
        *flags |= known[k].flag;
        p += len;
    }
    return TS_OK;
}

static ts_status parse_metrics(const char *text, int *accuracy, int *mse) {
    unsigned f = 0;
    ts_status s = parse_metric_flags(text, &f);
    *accuracy = (f & TS_METRIC_ACCURACY) != 0;
    *mse = (f & TS_METRIC_MSE) != 0;
    return s;
}

ts_status ts_config_metrics(const ts_config *c, int *accuracy, int *mse) {
    if (!c || !accuracy || !mse) return ts_fail(TS_ERR_INVALID, "config: NULL argument");
    return parse_metrics(c->train.metrics, accuracy, mse);
}

ts_status ts_config_metric_flags(const ts_config *c, unsigned *flags) {
    if (!c || !flags) return ts_fail(TS_ERR_INVALID, "config: NULL argument");
    return parse_metric_flags(c->train.metrics, flags);
}

/* The data section against itself and the model. */
static ts_status check_data(const ts_config *c) {
    char where[600], where2[600];
    const int i_source = ts_config_key_find("data.source"),
              i_ep = ts_config_key_find("train.epochs"),
              i_steps = ts_config_key_find("train.steps"),
              i_metrics = ts_config_key_find("train.metrics");
    const int src = c->data.source;
    const char *names[] = {"synthetic", "idx", "npy", "csv", "tokens", "graph"};
    const int name = c->model.name;
    if (c->set[i_ep] && c->train.epochs > 0) {
        if (src == TS_CFG_SYNTHETIC)
            return ts_fail(TS_ERR_INVALID,
                           "%s: train.epochs needs a dataset (set data.source); synthetic data "
                           "runs train.steps",
                           origin(c, i_ep, where, sizeof where));
        if (c->set[i_steps])
            return ts_fail(TS_ERR_INVALID,
                           "%s: set train.epochs or train.steps, not both (train.steps is set "
                           "at %s)",
                           origin(c, i_ep, where, sizeof where),
                           origin(c, i_steps, where2, sizeof where2));
    }
    if (c->set[i_metrics]) {
        int acc, mse;
        ts_status s = parse_metrics(c->train.metrics, &acc, &mse);
        if (s != TS_OK) {
            ts_error_prefix("%s", origin(c, i_metrics, where, sizeof where));
            return s;
        }
    }
    if (src == TS_CFG_SYNTHETIC) {
        if (c->model.name == TS_CFG_CNN)
            return ts_fail(TS_ERR_INVALID,
                           "%s: a cnn needs labelled images: set data.source (idx or npy)",
                           origin(c, ts_config_key_find("model.name"), where, sizeof where));
        if (is_rnn(name) && c->model.classes >= 2)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.classes %lld needs labelled data (set data.source); "
                           "synthetic %s data is W2's binary task (classes 1) or a regression "
                           "(classes 0)",
                           origin(c, ts_config_key_find("model.classes"), where, sizeof where),
                           (long long)c->model.classes, model_word(name));
        if (name == TS_CFG_MLP && c->model.classes > 0)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.classes needs labelled data (set data.source); synthetic "
                           "mlp data is a regression task",
                           origin(c, ts_config_key_find("model.classes"), where, sizeof where));
        return TS_OK;
    }
    /* The newer models name the sources they read; the older keep their messages. */
    static const int takes[] = {0,
                                0,
                                0,
                                1 << TS_CFG_CSV | 1 << TS_CFG_NPY,
                                1 << TS_CFG_CSV | 1 << TS_CFG_NPY,
                                1 << TS_CFG_NPY,
                                1 << TS_CFG_GRAPH | 1 << TS_CFG_SYNTHETIC};
    if (name >= TS_CFG_GRU && name <= TS_CFG_GCN && !(takes[name] & (1 << src)))
        return ts_fail(TS_ERR_INVALID, "%s: data.source %s cannot feed a %s model (it reads %s)",
                       origin(c, i_source, where, sizeof where), names[src], model_word(name),
                       name == TS_CFG_GCN      ? "a synthetic graph or a graph file"
                       : name == TS_CFG_UNET3D ? "synthetic or npy volumes"
                                               : "synthetic, csv or npy sequences");
    if (src == TS_CFG_GRAPH && name != TS_CFG_GCN)
        return ts_fail(TS_ERR_INVALID,
                       "%s: data.source graph needs a gcn model, but model.name is %s",
                       origin(c, i_source, where, sizeof where), model_word(name));
    const int gpt = c->model.name == TS_CFG_GPT;
    if (gpt != (src == TS_CFG_TOKENS))
        return ts_fail(TS_ERR_INVALID, "%s: data.source %s needs %s model, but model.name is %s",
                       origin(c, i_source, where, sizeof where), names[src],
                       src == TS_CFG_TOKENS ? "a gpt" : "an mlp or cnn", model_word(c->model.name));
    if (c->model.name == TS_CFG_CNN && src == TS_CFG_CSV)
        return ts_fail(TS_ERR_INVALID,
                       "%s: data.source csv has numeric targets, but a cnn is a classifier; use "
                       "idx or npy",
                       origin(c, i_source, where, sizeof where));
    /* Files each source needs, as (key, value) pairs. */
    struct {
        int source;
        const char *key, *value;
    } need[] = {
        {TS_CFG_IDX, "data.train_images", c->data.train_images},
        {TS_CFG_IDX, "data.train_labels", c->data.train_labels},
        {TS_CFG_NPY, "data.x", c->data.x},
        {TS_CFG_NPY, "data.y", c->data.y},
        {TS_CFG_CSV, "data.path", c->data.path},
        {TS_CFG_CSV, "data.label", c->data.label},
        {TS_CFG_TOKENS, "data.path", c->data.path},
        {TS_CFG_GRAPH, "data.edges", c->data.edges},
        {TS_CFG_GRAPH, "data.x", c->data.x},
        {TS_CFG_GRAPH, "data.y", c->data.y},
    };
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (need[i].source == src && !need[i].value[0])
            return ts_fail(TS_ERR_INVALID, "%s: data.source %s needs %s",
                           origin(c, i_source, where, sizeof where), names[src], need[i].key);
    if (src == TS_CFG_IDX && !c->data.test_images[0] != !c->data.test_labels[0])
        return ts_fail(TS_ERR_INVALID, "%s: set data.test_images and data.test_labels together",
                       origin(c,
                              ts_config_key_find(c->data.test_images[0] ? "data.test_images"
                                                                        : "data.test_labels"),
                              where, sizeof where));
    if (src == TS_CFG_TOKENS && c->data.bits != 16 && c->data.bits != 32)
        return ts_fail(TS_ERR_INVALID, "%s: data.bits must be 16 or 32, got %d",
                       origin(c, ts_config_key_find("data.bits"), where, sizeof where),
                       c->data.bits);
    if (src == TS_CFG_GRAPH) {
        const int i_val = ts_config_key_find("data.val_fraction"),
                  i_test = ts_config_key_find("data.test_fraction");
        if (c->data.node_split[0] && (c->set[i_val] || c->set[i_test]))
            return ts_fail(TS_ERR_INVALID,
                           "%s: set data.node_split or the fractions (data.val_fraction, "
                           "data.test_fraction), not both",
                           origin(c, c->set[i_val] ? i_val : i_test, where, sizeof where));
        if (!c->data.node_split[0] && c->data.val_fraction + c->data.test_fraction >= 1)
            return ts_fail(TS_ERR_INVALID,
                           "%s: data.val_fraction %g + data.test_fraction %g leave no training "
                           "nodes",
                           origin(c, c->set[i_test] ? i_test : i_val, where, sizeof where),
                           c->data.val_fraction, c->data.test_fraction);
    }
    /* CSV with model.classes: the label column holds class ids (see load_csv). */
    return TS_OK;
}

/* precision.loss_scale: auto | dynamic | none | a positive number. */
static int loss_scale_kind(const char *v, double *num) {
    if (!strcmp(v, "auto")) return -1;
    if (!strcmp(v, "dynamic")) return TS_SCALE_DYNAMIC;
    if (!strcmp(v, "none")) return TS_SCALE_NONE;
    char *end;
    double x = strtod(v, &end);
    if (end != v && !*end && x > 0 && x <= 3.4e38) {
        *num = x;
        return TS_SCALE_STATIC;
    }
    return -2;
}

static ts_status check_precision(const ts_config *c) {
    char where[600];
    double num = 0;
    if (loss_scale_kind(c->precision.loss_scale, &num) == -2)
        return ts_fail(TS_ERR_INVALID,
                       "%s: precision.loss_scale '%s' is none of auto, dynamic, none or a "
                       "number in (0, 3.4e38]",
                       origin(c, ts_config_key_find("precision.loss_scale"), where, sizeof where),
                       c->precision.loss_scale);
    ts_precision_options o;
    ts_config_precision(c, &o);
    if (ts_precision_check(&o) != TS_OK) {
        ts_error_prefix("%s",
                        origin(c, ts_config_key_find("precision.keep_fp32"), where, sizeof where));
        return TS_ERR_INVALID;
    }
    return TS_OK;
}

void ts_config_precision(const ts_config *c, ts_precision_options *o) {
    static const ts_dtype types[] = {TS_F32, TS_BF16, TS_F16};
    memset(o, 0, sizeof *o);
    o->compute = types[c->precision.dflt];
    o->keep_fp32 = c->precision.keep_fp32[0] ? c->precision.keep_fp32 : NULL;
    double num = 0;
    int k = loss_scale_kind(c->precision.loss_scale, &num);
    o->loss_scale = k == -1 ? (o->compute == TS_F16 ? TS_SCALE_DYNAMIC : TS_SCALE_NONE)
                    : k < 0 ? TS_SCALE_NONE
                            : (ts_loss_scale_kind)k;
    o->init_scale = o->loss_scale == TS_SCALE_STATIC ? num : c->precision.init_scale;
    o->growth_factor = c->precision.growth_factor;
    o->backoff_factor = c->precision.backoff_factor;
    o->growth_interval = c->precision.growth_interval;
}

ts_status ts_config_finish(ts_config *c) {
    if (!c) return ts_fail(TS_ERR_INVALID, "config: NULL argument");
    if (c->finished) return TS_OK;
    char where[600];
    const int i_name = ts_config_key_find("model.name"),
              i_preset = ts_config_key_find("model.preset");
    const int i_opt = ts_config_key_find("train.optimizer"),
              i_in = ts_config_key_find("model.in_dim");
    const int i_wd = ts_config_key_find("train.weight_decay"),
              i_total = ts_config_key_find("train.total_steps");
    const int i_heads = ts_config_key_find("model.n_heads"),
              i_nest = ts_config_key_find("train.nesterov");
    const int i_source = ts_config_key_find("data.source");

    /* The model: name and preset imply each other when only one is given. */
    if (!c->set[i_name] && !c->set[i_preset])
        return ts_fail(TS_ERR_INVALID,
                       "%s: no model: set model.name (mlp, gpt, cnn, gru, lstm, unet3d or gcn) "
                       "or model.preset (w1, w2, w3, w4, w5, gpt2-124m or fashion)",
                       origin(c, -1, where, sizeof where));
    int family = preset_family(c->model.preset);
    if (!c->set[i_name]) c->model.name = family;
    if (!c->set[i_preset]) c->model.preset = family_preset(c->model.name);
    if (c->set[i_name] && c->set[i_preset] && family != c->model.name &&
        !(family == TS_CFG_GRU && c->model.name == TS_CFG_LSTM)) {
        char pn[32], fn[32], nn[32];
        choice_at(keys[i_preset].choices, c->model.preset, pn, sizeof pn);
        choice_at(keys[i_name].choices, family, fn, sizeof fn);
        choice_at(keys[i_name].choices, c->model.name, nn, sizeof nn);
        return ts_fail(TS_ERR_INVALID, "%s: model.preset %s is a %s preset, but model.name is %s",
                       origin(c, i_preset, where, sizeof where), pn, fn, nn);
    }

    ts_config preset, *p = &preset;
    memset(p, 0, sizeof *p);
    preset_values(c->model.preset, p);
    const int use_model = model_flag(c->model.name);
    const int use_opt = c->train.optimizer == TS_CFG_SGD ? FOR_SGD : FOR_ADAM;
    char opt_name[32];
    choice_at(keys[i_opt].choices, c->train.optimizer, opt_name, sizeof opt_name);
    for (int i = 0; i < N_KEYS; i++) {
        const ts_config_key *k = &keys[i];
        int model_key = (k->flags & FOR_MODEL) != 0, opt_key = (k->flags & (FOR_SGD | FOR_ADAM));
        if (model_key && !c->set[i]) memcpy((char *)c + k->offset, (char *)p + k->offset, k->size);
        if (!c->set[i]) continue;
        if (model_key && !(k->flags & use_model))
            return ts_fail(TS_ERR_INVALID, "%s: %s is not a key of %s models",
                           origin(c, i, where, sizeof where), k->path, model_word(c->model.name));
        if (opt_key && !(k->flags & use_opt))
            return ts_fail(TS_ERR_INVALID, "%s: %s is not used by %s (it is for %s)",
                           origin(c, i, where, sizeof where), k->path, opt_name,
                           (k->flags & FOR_SGD) ? "sgd" : "adam and adamw");
        if ((k->flags & FOR_FILES) && !(k->flags & source_flag(c->data.source))) {
            char src[32], users[64] = "";
            choice_at(keys[i_source].choices, c->data.source, src, sizeof src);
            source_names(k->flags, users, sizeof users);
            return ts_fail(TS_ERR_INVALID, "%s: %s is not used by data.source %s (it is for %s)",
                           origin(c, i, where, sizeof where), k->path, src, users);
        }
    }
    ts_status ds = check_data(c);
    if (ds != TS_OK) return ds;

    if (c->model.name == TS_CFG_MLP) {
        if (c->model.window > 0) {
            int64_t f[2] = {c->model.window, c->model.features};
            int64_t in = product((int64_t)1 << 40, 2, f);
            if (c->set[i_in] && c->model.in_dim != in)
                return ts_fail(TS_ERR_INVALID,
                               "%s: model.in_dim %lld does not match window * features = %lld; "
                               "set model.window: 0 for a flat input",
                               origin(c, i_in, where, sizeof where), (long long)c->model.in_dim,
                               (long long)in);
            c->model.in_dim = in;
        } else if (c->model.in_dim <= 0) {
            return ts_fail(TS_ERR_INVALID, "%s: model.window is 0, so set model.in_dim",
                           origin(c, ts_config_key_find("model.window"), where, sizeof where));
        }
    } else if (c->model.name == TS_CFG_CNN) {
        if (c->model.height % 4 || c->model.width % 4)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.height and model.width must be multiples of 4 (two 2x2 "
                           "poolings), got %lld x %lld",
                           origin(c, ts_config_key_find("model.height"), where, sizeof where),
                           (long long)c->model.height, (long long)c->model.width);
    } else if (is_rnn(c->model.name) || c->model.name == TS_CFG_UNET3D ||
               c->model.name == TS_CFG_GCN) {
        ts_status ms = ts_config_finish_zoo(c);
        if (ms != TS_OK) return ms;
    } else if (c->model.d_model % c->model.n_heads) {
        return ts_fail(
            TS_ERR_INVALID, "%s: model.d_model %lld is not divisible by model.n_heads %d",
            origin(c, i_heads, where, sizeof where), (long long)c->model.d_model, c->model.n_heads);
    }

    if (!c->set[i_wd]) c->train.weight_decay = c->train.optimizer == TS_CFG_ADAMW ? 0.01 : 0.0;
    if (!c->set[i_total]) c->train.total_steps = c->train.steps;
    if (c->train.optimizer == TS_CFG_SGD && c->train.nesterov &&
        (c->train.momentum <= 0 || c->train.dampening != 0))
        return ts_fail(TS_ERR_INVALID,
                       "%s: train.nesterov needs train.momentum > 0 and "
                       "train.dampening 0",
                       origin(c, i_nest, where, sizeof where));
    ts_status s = check_sizes(c);
    if (s == TS_OK) s = check_precision(c);
    if (s != TS_OK) return s;
    c->finished = 1;
    return TS_OK;
}

/* ---- output ------------------------------------------------------------- */

/* Shortest text that reads back as the same double. */
static void fmt_double(double v, char *buf, size_t n) {
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

static int key_applies(const ts_config *c, const ts_config_key *k) {
    if (!strcmp(k->path, "model.preset")) return 0; /* every model key is written out */
    /* Unset strings (no file, no run directory) stay unwritten. */
    if (k->type == TS_CFG_STR && !((const char *)c + k->offset)[0]) return 0;
    if (k->flags & FOR_FILES) return (k->flags & source_flag(c->data.source)) != 0;
    if (c->train.epochs > 0) {
        /* epochs decide the steps: writing both would not load back */
        if (!strcmp(k->path, "train.steps")) return 0;
        if (!strcmp(k->path, "train.total_steps") && !c->batches_per_epoch &&
            !c->set[ts_config_key_find("train.total_steps")])
            return 0;
    }
    if (k->flags & FOR_MODEL) return (k->flags & model_flag(c->model.name)) != 0;
    if (k->flags & (FOR_SGD | FOR_ADAM))
        return (k->flags & (c->train.optimizer == TS_CFG_SGD ? FOR_SGD : FOR_ADAM)) != 0;
    return 1;
}

ts_status ts_config_write(const ts_config *c, FILE *out) {
    if (!c || !out) return ts_fail(TS_ERR_INVALID, "config: NULL argument");
    if (!c->finished) return ts_fail(TS_ERR_INVALID, "config: write needs a finished config");
    char section[64] = "";
    for (int i = 0; i < N_KEYS; i++) {
        const ts_config_key *k = &keys[i];
        if (!key_applies(c, k)) continue;
        size_t sl = strcspn(k->path, ".");
        if (strlen(section) != sl || strncmp(section, k->path, sl)) {
            snprintf(section, sizeof section, "%.*s", (int)sl, k->path);
            fprintf(out, "%s:\n", section);
        }
        const char *src = (const char *)c + k->offset;
        char buf[64];
        fprintf(out, "  %s: ", leaf(k->path));
        switch (k->type) {
        case TS_CFG_INT: {
            int v;
            memcpy(&v, src, sizeof v);
            fprintf(out, "%d\n", v);
            break;
        }
        case TS_CFG_I64: {
            int64_t v;
            memcpy(&v, src, sizeof v);
            fprintf(out, "%lld\n", (long long)v);
            break;
        }
        case TS_CFG_U64: {
            uint64_t v;
            memcpy(&v, src, sizeof v);
            fprintf(out, "%llu\n", (unsigned long long)v);
            break;
        }
        case TS_CFG_F64: {
            double v;
            memcpy(&v, src, sizeof v);
            fmt_double(v, buf, sizeof buf);
            fprintf(out, "%s\n", buf);
            break;
        }
        case TS_CFG_BOOL:
        case TS_CFG_ENUM: {
            int v;
            memcpy(&v, src, sizeof v);
            if (k->type == TS_CFG_BOOL)
                snprintf(buf, sizeof buf, "%s", v ? "true" : "false");
            else if (!choice_at(k->choices, v, buf, sizeof buf))
                return ts_fail(TS_ERR_INTERNAL, "config: %s holds %d", k->path, v);
            fprintf(out, "%s\n", buf);
            break;
        }
        case TS_CFG_STR:
            /* Double-quoted YAML: escape what would end or bend the string. */
            fputc('"', out);
            for (const char *s = src; *s; s++) {
                if (*s == '"' || *s == '\\') fputc('\\', out);
                fputc(*s, out);
            }
            fputs("\"\n", out);
            break;
        }
    }
    return ferror(out) ? ts_fail(TS_ERR_IO, "config: write failed") : TS_OK;
}

/* ---- building ----------------------------------------------------------- */

ts_mlp_config ts_config_mlp(const ts_config *c) {
    ts_mlp_config m = {c->model.batch,   c->model.window,     c->model.features,
                       c->model.in_dim,  c->model.hidden,     c->model.n_hidden,
                       c->model.out_dim, c->model.layer_norm, c->model.classes};
    return m;
}

ts_status ts_config_fit_data(ts_config *c, const ts_config_data_shape *d) {
    if (!c || !d) return ts_fail(TS_ERR_INVALID, "config: NULL argument");
    if (!c->finished) return ts_fail(TS_ERR_INVALID, "config: call ts_config_finish first");
    char where[600];
    const int i_window = ts_config_key_find("model.window"),
              i_in = ts_config_key_find("model.in_dim"),
              i_out = ts_config_key_find("model.out_dim"),
              i_classes = ts_config_key_find("model.classes"),
              i_total = ts_config_key_find("train.total_steps");
    if (c->model.name == TS_CFG_MLP) {
        if (c->set[i_window] && c->model.window > 0 &&
            c->model.window * c->model.features != d->in_dim)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.window %lld x model.features %lld does not match the data's "
                           "%lld values per example; leave the input shape to the data",
                           origin(c, i_window, where, sizeof where), (long long)c->model.window,
                           (long long)c->model.features, (long long)d->in_dim);
        if (c->set[i_in] && c->model.window == 0 && c->model.in_dim != d->in_dim)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.in_dim is %lld, but the data has %lld values per example",
                           origin(c, i_in, where, sizeof where), (long long)c->model.in_dim,
                           (long long)d->in_dim);
        /* A flat input: the data's example layout is what x holds. */
        c->model.window = 0;
        c->model.in_dim = d->in_dim;
        if (d->classes > 0) {
            if (c->set[i_classes] && c->model.classes == 0)
                return ts_fail(TS_ERR_INVALID,
                               "%s: model.classes is 0 (regression), but the targets are class "
                               "ids",
                               origin(c, i_classes, where, sizeof where));
            if (!c->set[i_classes]) c->model.classes = d->classes;
        } else {
            if (c->model.classes > 0)
                return ts_fail(TS_ERR_INVALID,
                               "%s: model.classes is %lld, but the targets are numbers, not class "
                               "ids",
                               origin(c, i_classes, where, sizeof where),
                               (long long)c->model.classes);
            if (c->set[i_out] && c->model.out_dim != d->out_dim)
                return ts_fail(TS_ERR_INVALID,
                               "%s: model.out_dim is %lld, but the data has %lld targets per "
                               "example",
                               origin(c, i_out, where, sizeof where), (long long)c->model.out_dim,
                               (long long)d->out_dim);
            c->model.out_dim = d->out_dim;
        }
    } else if (c->model.name == TS_CFG_CNN) {
        const int64_t f[3] = {c->model.channels, c->model.height, c->model.width};
        if (product((int64_t)1 << 40, 3, f) != d->in_dim)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.channels %lld x height %lld x width %lld does not match the "
                           "data's %lld values per example",
                           origin(c, ts_config_key_find("model.channels"), where, sizeof where),
                           (long long)f[0], (long long)f[1], (long long)f[2], (long long)d->in_dim);
        if (d->classes <= 0)
            return ts_fail(TS_ERR_INVALID,
                           "%s: a cnn is a classifier, but the targets are numbers, not class ids",
                           origin(c, ts_config_key_find("model.name"), where, sizeof where));
        if (!c->set[i_classes]) c->model.classes = d->classes;
    }
    if (is_rnn(c->model.name) || c->model.name == TS_CFG_UNET3D || c->model.name == TS_CFG_GCN) {
        ts_status zs = ts_config_fit_zoo(c, d);
        if (zs != TS_OK) return zs;
    }
    if (d->batches_per_epoch <= 0)
        return ts_fail(TS_ERR_INVALID, "config: the training split has no full batch");
    c->batches_per_epoch = d->batches_per_epoch;
    if (c->train.epochs > 0) {
        c->train.steps = c->train.epochs * d->batches_per_epoch;
        if (!c->set[i_total]) c->train.total_steps = c->train.steps;
    }
    return TS_OK;
}

ts_gpt_config ts_config_gpt(const ts_config *c) {
    ts_gpt_config g = {c->model.batch,    c->model.ctx,     c->model.vocab,  c->model.d_model,
                       c->model.n_layers, c->model.n_heads, c->model.dropout};
    return g;
}

ts_cnn_config ts_config_cnn(const ts_config *c) {
    ts_cnn_config m = {c->model.batch, c->model.channels, c->model.height,  c->model.width,
                       c->model.c1,    c->model.c2,       c->model.classes, 1};
    return m;
}

ts_rnn_config ts_config_rnn(const ts_config *c) {
    /* model.classes 1 (binary) is the builder's classes 0 and out_dim 0. */
    ts_rnn_config r = {c->model.batch,
                       c->model.window,
                       c->model.features,
                       c->model.hidden,
                       c->model.n_layers,
                       c->model.classes >= 2 ? c->model.classes : 0,
                       c->model.classes == 0 ? c->model.out_dim : 0};
    return r;
}

ts_unet3d_config ts_config_unet3d(const ts_config *c) {
    ts_unet3d_config u = {c->model.batch, c->model.channels, c->model.size,   c->model.c1,
                          c->model.c2,    c->model.c3,       c->model.classes};
    return u;
}

ts_status ts_config_build(const ts_config *c, ts_graph **g, ts_model *m, ts_train_spec *spec,
                          ts_compile_options *opt) {
    return ts_config_build_graph(c, NULL, g, m, spec, opt);
}

ts_status ts_config_build_graph(const ts_config *c, const ts_config_graph *graph, ts_graph **g,
                                ts_model *m, ts_train_spec *spec, ts_compile_options *opt) {
    if (!c || !g || !m || !spec || !opt) return ts_fail(TS_ERR_INVALID, "config: NULL argument");
    if (!c->finished) return ts_fail(TS_ERR_INVALID, "config: call ts_config_finish first");
    *g = NULL;
    if (c->model.name == TS_CFG_GCN && !graph)
        return ts_fail(TS_ERR_INVALID,
                       "config: a gcn is built on its graph: load the data (data.source graph) "
                       "and pass it to ts_config_build_graph");
    ts_graph *gr = ts_graph_new();
    if (!gr) return ts_fail(TS_ERR_NOMEM, "config: out of memory for the graph");
    ts_status s;
    if (is_rnn(c->model.name)) {
        ts_rnn_config rc = ts_config_rnn(c);
        s = c->model.name == TS_CFG_GRU ? ts_build_gru(gr, &rc, m) : ts_build_lstm(gr, &rc, m);
    } else if (c->model.name == TS_CFG_UNET3D) {
        ts_unet3d_config uc = ts_config_unet3d(c);
        s = ts_build_unet3d(gr, &uc, m);
    } else if (c->model.name == TS_CFG_GCN) {
        ts_gcn_config nc = {graph->nodes,   c->model.features, c->model.hidden, c->model.classes,
                            graph->n_edges, graph->src,        graph->dst};
        s = ts_build_gcn(gr, &nc, m);
    } else if (c->model.name == TS_CFG_MLP) {
        ts_mlp_config mc = ts_config_mlp(c);
        s = ts_build_mlp(gr, &mc, m);
    } else if (c->model.name == TS_CFG_CNN) {
        ts_cnn_config cc = ts_config_cnn(c);
        s = ts_build_cnn(gr, &cc, m);
    } else {
        ts_gpt_config gc = ts_config_gpt(c);
        s = ts_build_gpt(gr, &gc, m);
    }
    if (s != TS_OK) {
        ts_fail(s, "%s", ts_graph_error(gr));
        ts_error_prefix("building the %s model", model_word(c->model.name));
        ts_graph_free(gr);
        return s;
    }
    const double lr = c->train.lr, wd = c->train.weight_decay;
    *spec = ts_train_spec_default(m->loss);
    switch ((ts_cfg_optimizer)c->train.optimizer) {
    case TS_CFG_SGD:
        spec->opt = ts_sgd(lr, c->train.momentum, c->train.dampening, c->train.nesterov, wd);
        break;
    case TS_CFG_ADAM:
        spec->opt = ts_adam(lr, c->train.beta1, c->train.beta2, c->train.eps, wd);
        break;
    case TS_CFG_ADAMW:
        spec->opt = ts_adamw(lr, c->train.beta1, c->train.beta2, c->train.eps, wd);
        break;
    }
    static const ts_lr_kind kinds[] = {TS_LR_CONSTANT, TS_LR_LINEAR, TS_LR_COSINE};
    spec->schedule = (ts_lr_schedule){kinds[c->train.schedule], c->train.warmup_steps,
                                      c->train.total_steps, c->train.min_lr};
    spec->clip_grad_norm = c->train.clip_grad_norm;
    *opt = ts_compile_options_default();
    opt->seed = c->train.seed;
    opt->threads = c->train.threads;
    opt->debug_nan = c->compile.debug_nan;
    opt->no_simplify = c->compile.no_simplify;
    opt->naive_schedule = c->compile.naive_schedule;
    opt->no_inplace = c->compile.no_inplace;
    opt->no_fuse = c->compile.no_fuse;
    opt->no_recompute = c->compile.no_recompute;
    opt->discard_outputs = c->compile.discard_outputs;
    ts_config_precision(c, &opt->precision); /* checked by ts_config_finish */
    *g = gr;
    return TS_OK;
}
