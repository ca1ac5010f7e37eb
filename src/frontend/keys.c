/* The key table of the run configuration: every key with its type, place
 * in ts_config, range, default and help (docs/config.md is checked against
 * it). The other files of src/frontend read it through keys.h: check.c
 * parses values, yaml.c reads files, finish.c checks keys against each
 * other, write.c writes the resolved config. A new key is a ts_config field
 * plus one line here. */
#include "frontend/keys.h"

#include <string.h>

#define FIELD(sec, f) offsetof(ts_config, sec.f), sizeof(((ts_config *)0)->sec.f)
#define SIZE_RANGE    "[1, 1e9]"

const ts_config_key cfg_keys[] = {
    /* model */
    {"model.name", TS_CFG_ENUM, FIELD(model, name), TS_CFG_DERIVED, ts_model_name_choices, NULL,
     "the preset's", "the model: one of the registry's (docs/models.md describes each)"},
    {"model.preset", TS_CFG_ENUM, FIELD(model, preset), TS_CFG_DERIVED, ts_model_preset_choices,
     NULL, "the model's default preset",
     "shape giving every model key not set; each model lists its presets (docs/models.md)"},
    {"model.batch", TS_CFG_I64, FIELD(model, batch), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL,
     SIZE_RANGE, "preset",
     "samples (mlp, cnn), sequences (gpt, gru, lstm) or volumes (unet3d) per step; a gcn takes "
     "the whole graph"},
    {"model.window", TS_CFG_I64, FIELD(model, window), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL,
     "[0, 1e9]", "preset",
     "time steps per sample; 0 for a flat input of in_dim features (gru, lstm: the sequence "
     "length, >= 1; from the data when it has sequences)"},
    {"model.features", TS_CFG_I64, FIELD(model, features), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL,
     SIZE_RANGE, "preset",
     "features per time step (input x is [batch, window, features]); gcn: per node (from the "
     "data)"},
    {"model.in_dim", TS_CFG_I64, FIELD(model, in_dim), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL,
     SIZE_RANGE, "window * features", "input width; set it with window: 0 for x [batch, in_dim]"},
    {"model.hidden", TS_CFG_I64, FIELD(model, hidden), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL,
     SIZE_RANGE, "preset", "width of each hidden layer (gru, lstm: the hidden state)"},
    {"model.n_hidden", TS_CFG_INT, FIELD(model, n_hidden), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL,
     "[0, 1000]", "preset", "hidden layers, each Linear -> ReLU (-> LayerNorm)"},
    {"model.out_dim", TS_CFG_I64, FIELD(model, out_dim), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL,
     SIZE_RANGE, "preset", "outputs per sample (MSE loss against y [batch, out_dim])"},
    {"model.layer_norm", TS_CFG_BOOL, FIELD(model, layer_norm), TS_CFG_MODEL_KEY | TS_CFG_DERIVED,
     NULL, NULL, "preset", "LayerNorm after each hidden ReLU"},
    {"model.classes", TS_CFG_I64, FIELD(model, classes), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL,
     "[0, 1e9]", "from integer labels, else 0",
     "> 0: a classifier (logits, cross-entropy against class ids); 0: regression (MSE); gru, "
     "lstm: 1 is a binary classifier (one logit, BCE with logits against 0/1 targets); unet3d "
     "and gcn: >= 2 classes of voxels or nodes"},
    {"model.ctx", TS_CFG_I64, FIELD(model, ctx), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL,
     SIZE_RANGE, "preset", "context length (tokens per sequence)"},
    {"model.vocab", TS_CFG_I64, FIELD(model, vocab), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL,
     SIZE_RANGE, "preset", "vocabulary size"},
    {"model.d_model", TS_CFG_I64, FIELD(model, d_model), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL,
     SIZE_RANGE, "preset", "embedding width; a multiple of n_heads"},
    {"model.n_layers", TS_CFG_INT, FIELD(model, n_layers), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL,
     "[0, 1000]", "preset", "transformer blocks (gpt) or stacked recurrent layers (gru, lstm)"},
    {"model.n_heads", TS_CFG_INT, FIELD(model, n_heads), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL,
     "[1, 1e6]", "preset", "attention heads per block"},
    {"model.dropout", TS_CFG_F64, FIELD(model, dropout), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL,
     "[0, 1)", "preset", "dropout probability on embeddings, attention and MLP outputs"},
    {"model.channels", TS_CFG_I64, FIELD(model, channels), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL,
     SIZE_RANGE, "preset",
     "image channels (x is [batch, channels * height * width]; unet3d: [batch, channels, size, "
     "size, size])"},
    {"model.height", TS_CFG_I64, FIELD(model, height), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL,
     SIZE_RANGE, "preset", "image height; a multiple of 4"},
    {"model.width", TS_CFG_I64, FIELD(model, width), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL,
     SIZE_RANGE, "preset", "image width; a multiple of 4"},
    {"model.c1", TS_CFG_I64, FIELD(model, c1), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL, SIZE_RANGE,
     "preset",
     "channels of the first Conv3x3 -> BatchNorm -> ReLU -> MaxPool block (unet3d: of the first "
     "level)"},
    {"model.c2", TS_CFG_I64, FIELD(model, c2), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL, SIZE_RANGE,
     "preset", "channels of the second block (unet3d: level)"},
    {"model.source_mask", TS_CFG_BOOL, FIELD(model, source_mask), TS_CFG_MODEL_KEY, NULL, NULL,
     "false",
     "fusion: an input valid [batch, 3] says which sources (camera, sequence, tabular) each row "
     "has; the head fuses the valid ones only (a source whose values hold a NaN is invalid)"},
    {"model.c3", TS_CFG_I64, FIELD(model, c3), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL, SIZE_RANGE,
     "preset", "channels of the unet3d's bottom level"},
    {"model.nodes", TS_CFG_I64, FIELD(model, nodes), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL,
     "[2, 1e9]", "preset",
     "nodes of the synthetic graph (data.source synthetic); a graph file has its own"},
    {"model.size", TS_CFG_I64, FIELD(model, size), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL,
     "[4, 4096]", "preset", "edge of the unet3d's cubic volumes; a multiple of 4"},
    {"model.onnx", TS_CFG_STR, FIELD(model, onnx), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL, NULL,
     "required (onnx)", "the ONNX file an onnx model imports, relative to the config file"},
    {"model.loss", TS_CFG_STR, FIELD(model, loss), TS_CFG_MODEL_KEY | TS_CFG_DERIVED, NULL, NULL,
     "preset", "loss over an onnx model's first output: cross_entropy (class ids) or mse"},
    {"model.onnx_sha256", TS_CFG_STR, FIELD(model, onnx_sha256), TS_CFG_MODEL_KEY | TS_CFG_DERIVED,
     NULL, NULL, "the file's",
     "SHA-256 of model.onnx (64 hex digits): recorded when the config "
     "is finished; set, the file must have it"},
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
    {"train.source_dropout", TS_CFG_F64, FIELD(train, source_dropout), 0, NULL, "[0, 1)", "0",
     "drop each source of each training row with this probability (model.source_mask; a row "
     "keeps at least one source)"},
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
     "worker threads per process (0: OMP_NUM_THREADS if set, else the cores divided by the "
     "run's processes on the host)"},
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
    {"compile.no_fuse_norm", TS_CFG_BOOL, FIELD(compile, no_fuse_norm), 0, NULL, NULL, "false",
     "keep an activation and the layer norm reading it (and their backward) separate ops"},
    {"compile.no_fuse_ce", TS_CFG_BOOL, FIELD(compile, no_fuse_ce), 0, NULL, NULL, "false",
     "keep the cross-entropy forward and backward two ops (each reads the logits)"},
    {"compile.no_recompute", TS_CFG_BOOL, FIELD(compile, no_recompute), 0, NULL, NULL, "false",
     "keep large GELU/LayerNorm outputs for the backward instead of recomputing them"},
    {"compile.no_gelu_grad", TS_CFG_BOOL, FIELD(compile, no_gelu_grad), 0, NULL, NULL, "false",
     "training: the GELU backward evaluates gelu'(x) itself instead of the forward gelu "
     "writing it"},
    {"compile.no_attn_bwd_low_out", TS_CFG_BOOL, FIELD(compile, no_attn_bwd_low_out), 0, NULL, NULL,
     "false",
     "bf16 training: the packed attention backward writes its gradient in f32 and a sum its "
     "bf16 copy and the qkv bias gradient, instead of the backward writing both"},
    {"compile.no_qkv_low", TS_CFG_BOOL, FIELD(compile, no_qkv_low), 0, NULL, NULL, "false",
     "bf16: the qkv projection writes f32 q, k and v for the bf16 attention instead of bf16"},
    {"compile.no_weight_copies", TS_CFG_BOOL, FIELD(compile, no_weight_copies), 0, NULL, NULL,
     "false",
     "bf16/fp16: cast the weights for the GEMMs every step instead of the optimizer keeping "
     "their low-precision copies"},
    {"compile.discard_outputs", TS_CFG_BOOL, FIELD(compile, discard_outputs), 0, NULL, NULL, "true",
     "training: do not keep marked outputs (the logits) readable after the step, so "
     "their memory is reused (tessel train never reads them; evaluation has its own plan)"},
    /* memory-aware scheduling (docs/scheduling.md) */
    {"compile.max_memory_mb", TS_CFG_F64, FIELD(compile, max_memory_mb), 0, NULL, "[0, 1e9]", "0",
     "the arena's limit in MiB (0: none): above it, forward activations are recomputed in the "
     "backward, cheapest first, until the step fits; refused when it cannot"},
    /* the CUDA backend (docs/cuda.md) */
    {"compile.backend", TS_CFG_ENUM, FIELD(compile, backend), 0, "cpu|cuda", NULL, "cpu",
     "what runs the step: the CPU, or a GPU through the CUDA plugin (libtessel_cuda.so)"},
    {"compile.no_cuda_graph", TS_CFG_BOOL, FIELD(compile, no_cuda_graph), 0, NULL, NULL, "false",
     "cuda: launch every kernel of every step instead of replaying the step captured as a CUDA "
     "graph (for checking)"},
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
    {"data.valid", TS_CFG_STR, FIELD(data, valid), FOR_NPY | TS_CFG_DERIVED, NULL, NULL, "none",
     ".npy of 0/1 flags [n, sources]: which sources each example has (model.source_mask; "
     "training and evaluation use them)"},
    {"data.edges", TS_CFG_STR, FIELD(data, edges), FOR_GRAPH | TS_CFG_DERIVED, NULL, NULL,
     "required (graph)", "edge list: a line \"src,dst\" (or tab/space separated) per edge"},
    {"data.node_split", TS_CFG_STR, FIELD(data, node_split), FOR_GRAPH | TS_CFG_DERIVED, NULL, NULL,
     "by fraction",
     ".npy of integers [nodes]: 0 train, 1 val, 2 test, -1 unused (instead of the fractions)"},
    {"data.test_fraction", TS_CFG_F64, FIELD(data, test_fraction), FOR_GRAPH, NULL, "[0, 1)", "0",
     "share of the nodes held out for the test split (evaluated at the end)"},
    {"data.path", TS_CFG_STR, FIELD(data, path), FOR_CSV | FOR_TOKENS | TS_CFG_DERIVED, NULL, NULL,
     "required (csv, tokens)",
     "the CSV file, or the raw token file (or a directory or glob of token shards)"},
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
    {"data.drop_last", TS_CFG_BOOL, FIELD(data, drop_last), TS_CFG_DERIVED, NULL, NULL, "false",
     "drop an epoch's short last batch; false trains it (docs/shapes.md)"},
    {"data.eot_id", TS_CFG_I64, FIELD(data, eot_id), FOR_TOKENS, NULL, "[-1, 1e9]", "-1",
     "token files as documents ending with this id, one example per document (or ctx-long "
     "piece), padded; -1: fixed windows of ctx tokens (docs/shapes.md)"},
    {"data.doc_offsets", TS_CFG_STR, FIELD(data, doc_offsets), FOR_TOKENS | TS_CFG_DERIVED, NULL,
     NULL, "none",
     "token files as documents starting at these token offsets (a text file: 0 first, "
     "increasing), instead of data.eot_id (docs/shapes.md)"},
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
    {"ckpt.verify_key", TS_CFG_STR, FIELD(ckpt, verify_key), TS_CFG_DERIVED, NULL, NULL,
     "sign_key's public half, else none",
     "public key a checkpoint must be signed with to resume (none: no signature check, "
     "checksums only)"},
    {"ckpt.async", TS_CFG_BOOL, FIELD(ckpt, async), 0, NULL, NULL, "true",
     "write checkpoints in a background thread while training goes on"},
    /* ckpt.on_signal: preemption (SIGTERM from Slurm, Kubernetes, kill); docs/cluster.md */
    {"ckpt.on_signal", TS_CFG_ENUM, FIELD(ckpt, on_signal), 0, "save|none", NULL, "save",
     "on SIGTERM or SIGINT every rank ends its step; save: the step's checkpoint is committed "
     "before the run exits 130 (with ckpt.every > 0); none: it exits without one"},
    {"ckpt.signal_grace_s", TS_CFG_F64, FIELD(ckpt, signal_grace), 0, NULL, "[1, 1e6]", "30",
     "seconds the scheduler allows between SIGTERM and SIGKILL: after a stop the ranks' "
     "collectives time out after it, and tessel deploy k8s sets the pod's grace period from it"},
    /* peft (docs/peft.md) */
    {"peft.lora.targets", TS_CFG_STR, FIELD(peft, targets), TS_CFG_DERIVED | TS_CFG_LIST, NULL,
     NULL, "none",
     "LoRA on every matmul whose weight's name matches one of these POSIX extended regexes; "
     "every other parameter is frozen (none: no LoRA)"},
    {"peft.lora.r", TS_CFG_INT, FIELD(peft, r), 0, NULL, "[1, 1e6]", "8",
     "rank of the LoRA matrices A [r, in] and B [out, r]"},
    {"peft.lora.alpha", TS_CFG_F64, FIELD(peft, alpha), 0, NULL, "[0, inf)", "8",
     "the LoRA branch is scaled by alpha / r"},
    {"peft.lora.use_rslora", TS_CFG_BOOL, FIELD(peft, use_rslora), 0, NULL, NULL, "false",
     "scale by alpha / sqrt(r) instead (rank-stabilised LoRA)"},
    {"peft.lora.dropout", TS_CFG_F64, FIELD(peft, dropout), 0, NULL, "[0, 1)", "0",
     "dropout on the LoRA branch's input during training steps"},
    {"peft.base", TS_CFG_STR, FIELD(peft, base), TS_CFG_DERIVED, NULL, NULL, "none",
     "base weights loaded before the first step: a checkpoint directory or a .safetensors file "
     "(names and shapes must match the model's)"},
    {"peft.load", TS_CFG_STR, FIELD(peft, load), TS_CFG_DERIVED, NULL, NULL, "none",
     "LoRA A and B start from a Hugging Face peft adapter directory (adapter_config.json, "
     "adapter_model.safetensors) instead of their init"},
    {"peft.adapter.after", TS_CFG_STR, FIELD(peft, adapter_after), TS_CFG_DERIVED | TS_CFG_LIST,
     NULL, NULL, "none",
     "a bottleneck adapter (Houlsby) after every layer whose matmul weight's name matches one of "
     "these regexes; trained with LoRA, everything else frozen (none: no adapters)"},
    {"peft.adapter.hidden", TS_CFG_INT, FIELD(peft, adapter_hidden), 0, NULL, "[1, 1e6]", "64",
     "bottleneck width m of the adapters (d -> m -> d)"},
    {"peft.adapter.activation", TS_CFG_ENUM, FIELD(peft, adapter_activation), 0,
     "gelu|gelu_tanh|relu|tanh", NULL, "gelu", "activation inside the adapters"},
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
    {"alerts.cooldown", TS_CFG_I64, FIELD(alerts, cooldown), 0, NULL, "[0, 1e15]", "100",
     "steps after a rule's snapshot, pause or webhook before it takes one again (firings in "
     "between are only reported; 0: no cooldown)"},
    {"alerts.pause_timeout", TS_CFG_F64, FIELD(alerts, pause_timeout), 0, NULL, "[0, 1e9]", "600",
     "seconds a pause waits for tessel ctl resume before alerts.pause_timeout_action (0: no "
     "limit)"},
    {"alerts.pause_timeout_action", TS_CFG_ENUM, FIELD(alerts, pause_timeout_stop), 0,
     "continue|stop", NULL, "continue",
     "after a pause nobody resumed: continue (later pauses of the run do not wait) or stop "
     "(exit status 3)"},
    {"alerts.snapshot_max", TS_CFG_INT, FIELD(alerts, snapshot_max), 0, NULL, "[0, 1e9]", "20",
     "anomaly snapshots (step-N-anomaly/) one tessel train process writes at most (0: no "
     "limit)"},
    {"alerts.snapshot_keep", TS_CFG_INT, FIELD(alerts, snapshot_keep), 0, NULL, "[0, 1e9]", "5",
     "newest anomaly snapshots kept in the run directory, older ones removed (0: all)"},
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
    {"dist.zero", TS_CFG_INT, FIELD(dist, zero), 0, NULL, "[0, 3]", "0",
     "ZeRO stage: 1 shards the optimizer state over the processes, 2 the gradients too, 3 the "
     "parameters too (gathered per bucket before use; 0: replicated)"},
    {"dist.prefetch", TS_CFG_BOOL, FIELD(dist, prefetch), 0, NULL, NULL, "true",
     "ZeRO-3: start the all-gather of the next parameter bucket one bucket ahead, so it overlaps "
     "compute (false: gather each bucket right before its use)"},
    {"dist.share_params", TS_CFG_BOOL, FIELD(dist, share_params), 0, NULL, NULL, "true",
     "ZeRO with --procs (processes of one host): one copy of the parameters in shared memory, "
     "each process updating its block in place (false: a copy per process, all-gathered after "
     "the update, as across hosts under mpirun)"},
    {"dist.timeout_s", TS_CFG_F64, FIELD(dist, timeout_s), 0, NULL, "[0, inf)", "0",
     "seconds a collective may wait for a peer (0: TESSEL_DIST_TIMEOUT, else 1800)"},
    {"dist.max_restarts", TS_CFG_INT, FIELD(dist, max_restarts), 0, NULL, "[0, 1000]", "0",
     "times the --procs launcher restarts failed workers from the latest checkpoint "
     "(tessel train --max-restarts overrides)"},
    {"dist.max_mem_mb", TS_CFG_F64, FIELD(dist, max_mem_mb), 0, NULL, "[0, inf)", "0",
     "memory limit per process (or per pipeline device) in MiB; a plan that needs more is refused "
     "(0: no limit)"},
    /* fed: federated training, tessel fed serve|keyholder|join (docs/federated.md) */
    {"fed.secure", TS_CFG_ENUM, FIELD(fed, secure), 0, "paillier|masking|none", NULL, "paillier",
     "how updates are protected: paillier (encrypted, added by the aggregator, decrypted as a sum "
     "by the key holder), masking (secure aggregation: pairwise masks that cancel in the sum) or "
     "none (plain FedAvg over the same TLS transport: the aggregator sees every update)"},
    {"fed.threshold", TS_CFG_INT, FIELD(fed, threshold), 0, NULL, "[0, 256]", "0",
     "masking: clients whose shares unmask a round (0: a majority of the round's clients)"},
    {"fed.addr", TS_CFG_STR, FIELD(fed, addr), 0, NULL, NULL, "127.0.0.1",
     "numeric IPv4 address of the aggregator (serve listens on it, the others connect)"},
    {"fed.port", TS_CFG_INT, FIELD(fed, port), 0, NULL, "[0, 65535]", "7450",
     "TCP port of the aggregator (serve with 0: any free port, printed)"},
    {"fed.rounds", TS_CFG_INT, FIELD(fed, rounds), 0, NULL, "[1, 1e6]", "5", "federated rounds"},
    {"fed.local_steps", TS_CFG_INT, FIELD(fed, local_steps), 0, NULL, "[1, 1e9]", "20",
     "training steps a client runs from the global model per round"},
    {"fed.prox_mu", TS_CFG_F64, FIELD(fed, prox_mu), 0, NULL, "[0, inf)", "0",
     "FedProx: weight mu of the proximal term (mu/2 times the squared distance to the global "
     "model) in a client's local objective (0: plain FedAvg)"},
    {"fed.min_clients", TS_CFG_INT, FIELD(fed, min_clients), 0, NULL, "[1, 256]", "2",
     "updates a round needs; with fewer it fails"},
    {"fed.max_clients", TS_CFG_INT, FIELD(fed, max_clients), 0, NULL, "[1, 256]", "16",
     "clients admitted; the fixed-point slots have headroom for this many summed updates"},
    {"fed.key_bits", TS_CFG_INT, FIELD(fed, key_bits), 0, NULL, "[1024, 4096]", "2048",
     "Paillier modulus size of a new key: 2048, 3072 or 4096 (1024 for tests only)"},
    {"fed.scale", TS_CFG_F64, FIELD(fed, scale), 0, NULL, "(0, inf)", "1048576",
     "fixed point: update values are rounded to multiples of 1/scale"},
    {"fed.clip", TS_CFG_F64, FIELD(fed, clip), 0, NULL, "(0, inf)", "1",
     "weighted update values beyond ±clip are clipped (and counted in a warning)"},
    {"fed.timeout_s", TS_CFG_F64, FIELD(fed, timeout_s), 0, NULL, "(0, 1e6]", "300",
     "seconds any connect (refused ones retried meanwhile), read or write may take (a "
     "client's local training included)"},
    {"fed.join_s", TS_CFG_F64, FIELD(fed, join_s), 0, NULL, "[0, 1e6]", "60",
     "seconds the aggregator admits clients before round 1 once min_clients are in"},
    {"fed.pool", TS_CFG_INT, FIELD(fed, pool), 0, NULL, "[0, 1e6]", "0",
     "r^n values a client precomputes in the background (0: none)"},
    {"fed.pool_threads", TS_CFG_INT, FIELD(fed, pool_threads), 0, NULL, "[1, 256]", "1",
     "threads that fill a client's r^n pool (a host with cores to spare refills a round's pool "
     "that many times faster)"},
    {"fed.key", TS_CFG_STR, FIELD(fed, key), 0, NULL, NULL, "fed-paillier.key",
     "the key holder's Paillier private key file (made, mode 0600, when missing; refused when "
     "group or others can read it)"},
    {"fed.tls.ca", TS_CFG_STR, FIELD(fed, ca), TS_CFG_DERIVED, NULL, NULL, "none",
     "PEM file of the CA that signed every role's certificate"},
    {"fed.tls.cert", TS_CFG_STR, FIELD(fed, cert), TS_CFG_DERIVED, NULL, NULL, "none",
     "PEM certificate of this role"},
    {"fed.tls.key", TS_CFG_STR, FIELD(fed, tls_key), TS_CFG_DERIVED, NULL, NULL, "none",
     "PEM private key of this role's certificate"},
    {"fed.keyholder_name", TS_CFG_STR, FIELD(fed, keyholder_name), 0, NULL, NULL, "keyholder",
     "common name of the key holder's certificate (the aggregator tells it from clients so)"},
    {"fed.server_name", TS_CFG_STR, FIELD(fed, server_name), 0, NULL, NULL, "aggregator",
     "name the aggregator's certificate must be issued to"},
    /* shape: batch and sequence buckets, the plan cache (docs/shapes.md) */
    {"shape.policy", TS_CFG_ENUM, FIELD(shape, policy), 0, "exact|bucket", NULL, "exact",
     "exact: a plan per batch shape met; bucket: each batch padded to the smallest bucket that "
     "holds it, padding masked out of the loss"},
    {"shape.batch_buckets", TS_CFG_STR, FIELD(shape, batch_buckets), TS_CFG_LIST, NULL, NULL,
     "multiple:8",
     "batch sizes: an increasing list, multiple:N or pow2 (model.batch is always the largest "
     "rule bucket)"},
    {"shape.seq_buckets", TS_CFG_STR, FIELD(shape, seq_buckets), TS_CFG_LIST, NULL, NULL,
     "multiple:64",
     "sequence lengths (gpt): an increasing list, multiple:N or pow2 (model.ctx "
     "is always the largest rule bucket)"},
    {"shape.split_oversize", TS_CFG_BOOL, FIELD(shape, split_oversize), 0, NULL, NULL, "false",
     "a batch larger than every batch bucket runs as several steps instead of failing"},
    {"shape.precompile", TS_CFG_BOOL, FIELD(shape, precompile), 0, NULL, NULL, "false",
     "compile every bucket before the first step instead of on first use"},
    {"shape.cache_mb", TS_CFG_F64, FIELD(shape, cache_mb), 0, NULL, "[0, 1e9]", "0",
     "memory of the cached bucket plans beyond the shared parameters and state, in MiB (least "
     "recently used evicted; 0: no limit)"},
    {"shape.sort_window", TS_CFG_I64, FIELD(shape, sort_window), 0, NULL, "[0, 1e6]", "0",
     "batches of token documents sorted by length together, so each pads little (0: no "
     "sorting)"},
    /* dist.compress*: gradient compression in the distribute pass (issue 18) */
    {"dist.compress", TS_CFG_ENUM, FIELD(dist, compress), 0, "none|topk|powersgd", NULL, "none",
     "gradient compression of the data-parallel exchange: topk (sparse top-k with error "
     "feedback), powersgd (rank-r factors); none: the dense all-reduce"},
    {"dist.compress_ratio", TS_CFG_F64, FIELD(dist, compress_ratio), 0, NULL, "(0, 1]", "0.001",
     "topk: share of each bucket's elements sent per step"},
    {"dist.compress_values", TS_CFG_ENUM, FIELD(dist, compress_values), 0, "e4m3|e5m2|bf16|f32",
     NULL, "e4m3", "topk: encoding of the sent values (fp8 with a power-of-two scale per bucket)"},
    {"dist.compress_warmup_steps", TS_CFG_I64, FIELD(dist, compress_warmup_steps), 0, NULL,
     "[0, 1e15]", "0",
     "topk: steps over which the sent share falls from 25 % to compress_ratio (0: none)"},
    {"dist.compress_rank", TS_CFG_INT, FIELD(dist, compress_rank), 0, NULL, "[1, 64]", "4",
     "powersgd: rank of the factors P and Q"},
    {"dist.compress_min_elems", TS_CFG_I64, FIELD(dist, compress_min_elems), 0, NULL, "[0, 1e15]",
     "65536", "powersgd: gradients with fewer elements (and vectors) are all-reduced dense"},
    {"dist.compress_max_elems", TS_CFG_I64, FIELD(dist, compress_max_elems), 0, NULL, "[0, 1e15]",
     "0",
     "powersgd: gradients with more elements are all-reduced dense too, e.g. a tied "
     "embedding whose gradient is far from low rank (0: no limit)"},
    {"dist.compress_power_iters", TS_CFG_INT, FIELD(dist, compress_power_iters), 0, NULL, "[1, 16]",
     "1",
     "powersgd: power iterations a step; each one after the first costs two more blocking "
     "all-reduces of the factors and fits the ranks' mean gradient closer to its best rank r"},
    {"dist.compress_dense_steps", TS_CFG_I64, FIELD(dist, compress_dense_steps), 0, NULL,
     "[0, 1e15]", "0",
     "the first steps exchange every gradient dense (topk: all values in f32, the velocity "
     "kept), then compression starts (Vogels et al.'s start_powerSGD_iter; 0: from step 1)"},
    {"dist.compress_momentum", TS_CFG_BOOL, FIELD(dist, compress_momentum), 0, NULL, NULL, "false",
     "DGC momentum correction: SGD's momentum is accumulated per rank before the compression "
     "(topk: and masked where sent; train.optimizer sgd with momentum)"},
    {"dist.compress_clip", TS_CFG_F64, FIELD(dist, compress_clip), 0, NULL, "[0, inf)", "0",
     "topk: local clipping: each rank's gradient norm is clipped to this / sqrt(ranks) before "
     "it is accumulated (0: none)"},
    /* dist.reproducible: the same bits for any process count (issue 27, docs/reproducibility.md) */
    {"dist.reproducible", TS_CFG_BOOL, FIELD(dist, reproducible), 0, NULL, NULL, "false",
     "cut every batch into micro-batches of dist.microbatch rows and sum their gradients in a "
     "fixed tree, so 1, 2, 3, 4, ... processes (any count dividing the micro-batch count) give "
     "the same bits"},
    {"dist.microbatch", TS_CFG_I64, FIELD(dist, microbatch), 0, NULL, "[0, 1e9]", "0",
     "rows per micro-batch with dist.reproducible (0: model.batch / 4 when it divides, else / 2, "
     "else model.batch)"},
    /* pipeline stages placed by a cost model (issue 23, docs/distributed.md "Pipeline stages") */
    {"dist.pipeline_stages", TS_CFG_INT, FIELD(pipe, stages), 0, NULL, "[1, 64]", "1",
     "pipeline stages: the training graph is cut into this many stages, one process each, or "
     "S x D processes for D data-parallel replicas of every stage (1: no pipeline)"},
    {"dist.microbatches", TS_CFG_INT, FIELD(pipe, microbatches), 0, NULL, "[1, 1024]", "1",
     "pipeline: micro-batches each replica's share of the batch is cut into (model.batch / "
     "(replicas x this) rows each)"},
    {"dist.pipeline_schedule", TS_CFG_ENUM, FIELD(pipe, schedule), 0, "1f1b|gpipe", NULL, "1f1b",
     "pipeline: 1f1b (one forward, one backward: a stage keeps at most S - s micro-batches) or "
     "gpipe (every forward, then every backward)"},
    {"dist.devices", TS_CFG_STR, FIELD(pipe, devices), 0, NULL, NULL, "measure",
     "pipeline: file of device speeds, a line `name gemm_gflops mem_gbps link_gbps [mem_mb]` per "
     "stage (measure: this process's speeds, measured at start, for every stage)"},
    /* optim: the fused optimizer update (issue 25, docs/config.md "optim") */
    {"optim.fused_update", TS_CFG_BOOL, FIELD(optim, fused_update), 0, NULL, NULL, "false",
     "update each parameter as soon as its gradient is complete, so gradients are temporaries "
     "(same weights; not with train.clip_grad_norm, loss scaling or several processes)"},
};

const int cfg_n_keys = (int)(sizeof cfg_keys / sizeof cfg_keys[0]);
_Static_assert(sizeof cfg_keys / sizeof cfg_keys[0] <= TS_CFG_MAX_KEYS, "raise TS_CFG_MAX_KEYS");

int ts_config_key_count(void) {
    return CFG_N_KEYS;
}

const ts_config_key *ts_config_key_at(int i) {
    return i >= 0 && i < CFG_N_KEYS ? &cfg_keys[i] : NULL;
}

int ts_config_key_find(const char *path) {
    for (int i = 0; path && i < CFG_N_KEYS; i++)
        if (!strcmp(cfg_keys[i].path, path)) return i;
    return -1;
}

/* The i-th entry of "a|b|c" into buf; 0 if there is none. */
int cfg_choice_at(const char *choices, int i, char *buf, size_t n) {
    ts_models_init(); /* model.name's and model.preset's choices come from the registry */
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
        for (int i = 0; cfg_choice_at(k->choices, i, c, sizeof c) && k2 < n; i++)
            k2 += (size_t)snprintf(buf + k2, n - k2, i ? ", %s" : "%s", c);
        break;
    }
    }
    return buf;
}

const char *cfg_leaf(const char *path) {
    const char *dot = strrchr(path, '.');
    return dot ? dot + 1 : path;
}

int cfg_is_section(const char *path) {
    size_t n = strlen(path);
    for (int i = 0; i < CFG_N_KEYS; i++)
        if (!strncmp(cfg_keys[i].path, path, n) && cfg_keys[i].path[n] == '.') return 1;
    return 0;
}

int cfg_source_flag(int source) {
    static const int flags[] = {0, FOR_IDX, FOR_NPY, FOR_CSV, FOR_TOKENS, FOR_GRAPH};
    return source >= 0 && source < 6 ? flags[source] : 0;
}
