/* An imported ONNX model (model.name: onnx): the graph of model.onnx (a
 * torch.onnx.export, docs/onnx.md) read by ts_onnx_import with its
 * initialisers as the parameters, and a loss over its first output:
 *
 *   cross_entropy: logits [batch, classes] against class ids y [batch]
 *   mse:           pred [batch, out] against y [batch, out]
 *
 * The model's one input takes the data's examples (npy arrays: x [n, ...]
 * with the model's per-example shape); a dynamic batch dimension takes
 * model.batch. model.onnx is relative to the config file and made absolute
 * when the config is finished, so a written config loads from anywhere.
 *
 * model.name: onnx_lm is an imported language model (the W3 GPT exported
 * from PyTorch): token ids [batch, ctx] (int64) in, logits [batch, ctx,
 * vocab] out, cross-entropy against the next tokens, fed by data.source
 * tokens (or synthetic tokens) as the gpt model is; a dynamic sequence
 * axis takes model.ctx, and model.vocab comes from the logits.
 *
 * The file is imported twice: when the config is finished (so a refused
 * model fails before any data is read, and to derive classes / vocab) and
 * when the graph is built. One import cannot serve both: the graph is
 * built per rank for model.batch / ranks rows, and a resumed or exported
 * run rebuilds it from the written config. The first import records the
 * file's SHA-256 in model.onnx_sha256 (written to the run's config.yaml,
 * and to the checkpoints' data lineage); the build imports only a file
 * with that hash, so both imports read the same model. */
#include "models/model.h"
#include "tessel/onnx.h"
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const ts_model_desc ts_model_onnx_lm;

static int is_lm(const ts_config *c) {
    return ts_model_of(c) == &ts_model_onnx_lm;
}
static int is_ce(const ts_config *c) {
    return is_lm(c) || !strcmp(c->model.loss, "cross_entropy");
}

/* An imported language model: x [batch, ctx] int64 in, logits [batch, ctx,
 * vocab] out. */
static ts_status check_lm(const ts_config *c, ts_graph *g, const ts_onnx_info *info) {
    char where[600];
    const ts_val x = info->inputs[0], y = info->outputs[0];
    if (ts_dtype_of(g, x) != TS_I64 || ts_rank(g, x) != 2 || ts_dim(g, x, 0) != c->model.batch ||
        ts_rank(g, y) != 3 || ts_dim(g, y, 0) != c->model.batch ||
        ts_dim(g, y, 1) != ts_dim(g, x, 1))
        return ts_fail(TS_ERR_SHAPE,
                       "%s: %s: an onnx_lm model takes token ids '%s' [batch, ctx] (int64) and "
                       "gives logits '%s' [batch, ctx, vocab], with batch = model.batch %lld",
                       ts_config_key_origin(c, "model.onnx", where, sizeof where), c->model.onnx,
                       info->input_names[0], info->output_names[0], (long long)c->model.batch);
    if (c->model.ctx > 0 && ts_dim(g, x, 1) != c->model.ctx)
        return ts_fail(TS_ERR_SHAPE, "%s: model.ctx is %lld, but the input '%s' of %s holds %lld",
                       ts_config_key_origin(c, "model.ctx", where, sizeof where),
                       (long long)c->model.ctx, info->input_names[0], c->model.onnx,
                       (long long)ts_dim(g, x, 1));
    return TS_OK;
}

/* Imports model.onnx into g for model.batch (and model.ctx); errors name
 * the key. */
static ts_status import(const ts_config *c, ts_graph *g, ts_onnx_info *info) {
    ts_onnx_options o = {.batch = c->model.batch};
    if (is_lm(c)) o.dims[1] = c->model.ctx;
    o.expect_sha256 = c->model.onnx_sha256[0] ? c->model.onnx_sha256 : NULL;
    ts_status s = ts_onnx_import(g, c->model.onnx, &o, info);
    char where[600];
    if (s != TS_OK)
        ts_error_prefix("%s", ts_config_key_origin(c, "model.onnx", where, sizeof where));
    if (s != TS_OK) return s;
    if (info->n_inputs == 1 && info->n_outputs >= 1 && is_lm(c)) return check_lm(c, g, info);
    if (info->n_inputs != 1 || info->n_outputs < 1)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "%s: an onnx model needs exactly one graph input (the data's x) and an "
                       "output; %s has %d inputs and %d outputs",
                       ts_config_key_origin(c, "model.onnx", where, sizeof where), c->model.onnx,
                       info->n_inputs, info->n_outputs);
    const ts_val x = info->inputs[0], y = info->outputs[0];
    if (ts_dim(g, x, 0) != c->model.batch || ts_rank(g, y) != 2 ||
        ts_dim(g, y, 0) != c->model.batch)
        return ts_fail(TS_ERR_SHAPE,
                       "%s: %s: input '%s' and output '%s' must be [batch, ...] and [batch, n] "
                       "with batch = model.batch %lld (got %lld rows in, rank %d out)",
                       ts_config_key_origin(c, "model.onnx", where, sizeof where), c->model.onnx,
                       info->input_names[0], info->output_names[0], (long long)c->model.batch,
                       (long long)ts_dim(g, x, 0), ts_rank(g, y));
    return TS_OK;
}

static ts_status build(const ts_config *c, const ts_config_graph *gr, ts_graph *g, ts_model *m) {
    (void)gr;
    ts_onnx_info *info = malloc(sizeof *info);
    if (!info) return ts_fail(TS_ERR_NOMEM, "onnx: out of memory");
    ts_status s = import(c, g, info);
    if (s == TS_OK) {
        const int64_t B = c->model.batch, width = ts_dim(g, info->outputs[0], 1);
        const char *yname = ts_val_ok(ts_find(g, "y")) ? "target" : "y";
        m->input = info->inputs[0];
        m->output = info->outputs[0];
        if (is_lm(c)) {
            int64_t yd[2] = {B, ts_dim(g, m->input, 1)};
            m->target =
                ts_input(g, ts_val_ok(ts_find(g, "targets")) ? "y" : "targets", TS_I64, 2, yd);
            m->loss = ts_cross_entropy(g, m->output, m->target, -100);
        } else if (is_ce(c)) {
            int64_t yd[1] = {B};
            m->target = ts_input(g, yname, TS_I64, 1, yd);
            m->loss = ts_cross_entropy(g, m->output, m->target, -100);
        } else {
            int64_t yd[2] = {B, width};
            m->target = ts_input(g, yname, TS_F32, 2, yd);
            m->loss = ts_mse_loss(g, m->output, m->target);
        }
        ts_set_name(g, m->loss, "loss");
        s = ts_graph_status(g);
    }
    free(info);
    return s;
}

/* ---- descriptor ------------------------------------------------------------ */

static void preset_onnx(ts_config *p) {
    p->model.batch = 32;
    snprintf(p->model.loss, sizeof p->model.loss, "cross_entropy");
}

/* model.onnx against the config's directory, made absolute; the model is
 * imported once here so that a refused model fails before any data is
 * read, and its output width gives classes (cross_entropy) or out_dim. */
static ts_status check(ts_config *c) {
    char where[600];
    if (!c->model.onnx[0])
        return ts_fail(TS_ERR_INVALID,
                       "an onnx model needs model.onnx: the ONNX file to import (docs/onnx.md)");
    if (!is_lm(c) && strcmp(c->model.loss, "cross_entropy") && strcmp(c->model.loss, "mse"))
        return ts_fail(TS_ERR_INVALID, "%s: model.loss must be cross_entropy or mse, got '%s'",
                       ts_config_key_origin(c, "model.loss", where, sizeof where), c->model.loss);
    char joined[PATH_MAX + 600], real[PATH_MAX];
    const char *slash = strrchr(c->file, '/');
    if (c->model.onnx[0] != '/' && slash)
        snprintf(joined, sizeof joined, "%.*s/%s", (int)(slash - c->file), c->file, c->model.onnx);
    else
        snprintf(joined, sizeof joined, "%s", c->model.onnx);
    if (!realpath(joined, real))
        return ts_fail(TS_ERR_IO, "%s: cannot open the ONNX file %s: %s",
                       ts_config_key_origin(c, "model.onnx", where, sizeof where), joined,
                       strerror(errno));
    if (strlen(real) >= sizeof c->model.onnx)
        return ts_fail(TS_ERR_INVALID, "%s: the path %s is too long",
                       ts_config_key_origin(c, "model.onnx", where, sizeof where), real);
    memcpy(c->model.onnx, real, strlen(real) + 1); /* fits: checked above */
    ts_graph *g = ts_graph_new();
    ts_onnx_info *info = malloc(sizeof *info);
    ts_status s = !g || !info ? ts_fail(TS_ERR_NOMEM, "onnx: out of memory") : import(c, g, info);
    if (s == TS_OK && c->model.onnx_sha256[0] == 0)
        memcpy(c->model.onnx_sha256, info->sha256, sizeof c->model.onnx_sha256);
    if (s == TS_OK && is_lm(c)) {
        const int64_t V = ts_dim(g, info->outputs[0], 2);
        if (c->model.vocab > 0 && c->model.vocab != V)
            s = ts_fail(
                TS_ERR_SHAPE, "%s: model.vocab is %lld, but the logits '%s' of %s have %lld",
                ts_config_key_origin(c, "model.vocab", where, sizeof where),
                (long long)c->model.vocab, info->output_names[0], c->model.onnx, (long long)V);
        c->model.vocab = V;
        c->model.ctx = ts_dim(g, info->inputs[0], 1);
    } else if (s == TS_OK) {
        const int64_t width = ts_dim(g, info->outputs[0], 1);
        if (is_ce(c) && width < 2)
            s = ts_fail(TS_ERR_INVALID,
                        "%s: cross_entropy needs an output of 2 or more classes; '%s' has %lld",
                        ts_config_key_origin(c, "model.loss", where, sizeof where),
                        info->output_names[0], (long long)width);
        c->model.classes = is_ce(c) ? width : 0;
        c->model.out_dim = is_ce(c) ? 1 : width;
        /* What the data must hold per example (ts_config_data_shape.in_dim). */
        c->model.in_dim = ts_numel(g, info->inputs[0]) / c->model.batch;
    }
    free(info);
    ts_graph_free(g);
    return s;
}

static ts_status fit(ts_config *c, const ts_config_data_shape *d) {
    char where[600];
    const char *x = ts_config_key_origin(c, "model.onnx", where, sizeof where);
    if (d->in_dim != c->model.in_dim)
        return ts_fail(TS_ERR_SHAPE,
                       "the data's examples have %lld values, but the input of %s (%s) takes "
                       "%lld per example",
                       (long long)d->in_dim, c->model.onnx, x, (long long)c->model.in_dim);
    if (is_ce(c) && d->classes > c->model.classes)
        return ts_fail(TS_ERR_SHAPE, "the labels go up to %lld, but %s (%s) has %lld classes",
                       (long long)d->classes - 1, c->model.onnx, x, (long long)c->model.classes);
    if (!is_ce(c) && d->out_dim != c->model.out_dim)
        return ts_fail(TS_ERR_SHAPE,
                       "the data has %lld float targets per example, but %s (%s) outputs %lld "
                       "(model.loss mse; integer labels need cross_entropy)",
                       (long long)d->out_dim, c->model.onnx, x, (long long)c->model.out_dim);
    return TS_OK;
}

/* An imported model's input has no synthetic data of its own shape. */
static ts_status check_source(const ts_config *c) {
    char where[600];
    if (c->data.source != TS_CFG_NPY)
        return ts_fail(TS_ERR_INVALID,
                       "%s: an onnx model reads npy arrays (data.source npy with data.x of the "
                       "model's input shape [n, ...] and data.y)",
                       ts_config_key_origin(c, "data.source", where, sizeof where));
    return TS_OK;
}

static int tensors(const ts_config *c, ts_model_tensor *t) {
    if (is_lm(c)) {
        t[0] = (ts_model_tensor){"logits", 3, {c->model.batch, c->model.ctx, c->model.vocab}};
        return 1;
    }
    t[0] = (ts_model_tensor){"input x", 2, {c->model.batch, c->model.in_dim}};
    return 1;
}

/* ---- onnx_lm ------------------------------------------------------------------ */

static void preset_onnx_lm(ts_config *p) {
    p->model.batch = 8;
}

static ts_status check_source_lm(const ts_config *c) {
    char where[600];
    if (c->data.source != TS_CFG_TOKENS && c->data.source != TS_CFG_SYNTHETIC)
        return ts_fail(TS_ERR_INVALID,
                       "%s: an onnx_lm model reads token files (data.source tokens) or "
                       "synthetic tokens",
                       ts_config_key_origin(c, "data.source", where, sizeof where));
    return TS_OK;
}

static ts_status fit_lm(ts_config *c, const ts_config_data_shape *d) {
    (void)c, (void)d; /* the token file is cut to model.ctx and checked against model.vocab */
    return TS_OK;
}

static const ts_model_preset presets_lm[] = {{"onnx_lm", preset_onnx_lm}};

const ts_model_desc ts_model_onnx_lm = {
    .name = "onnx_lm",
    .about = "a language model imported from an ONNX file (token ids in, logits [batch, ctx, "
             "vocab] out), trained with next-token cross-entropy on token files",
    .keys = "batch ctx vocab onnx onnx_sha256",
    .presets = presets_lm,
    .n_presets = 1,
    .preset = "onnx_lm",
    .input = TS_MODEL_IN_TOKENS,
    .sources = 1u << TS_CFG_SYNTHETIC | 1u << TS_CFG_TOKENS,
    .reads = NULL, /* check_source words its message */
    .flags = TS_MODEL_LM,
    .unit = "tokens/s",
    .check_source = check_source_lm,
    .check = check,
    .fit = fit_lm,
    .tensors = tensors,
    .build = build,
};

static const ts_model_preset presets[] = {{"onnx", preset_onnx}};

const ts_model_desc ts_model_onnx = {
    .name = "onnx",
    .about = "a model imported from an ONNX file (torch.onnx.export), trained with "
             "cross-entropy or MSE over its first output",
    .keys = "batch onnx loss onnx_sha256",
    .presets = presets,
    .n_presets = 1,
    .preset = "onnx",
    .input = TS_MODEL_IN_FLAT,
    .sources = 1u << TS_CFG_NPY,
    .reads = NULL, /* check_source words its message */
    .flags = TS_MODEL_REGRESSION,
    .unit = "samples/s",
    .check_source = check_source,
    .check = check,
    .fit = fit,
    .tensors = tensors,
    .build = build,
};
