/* The 3D U-Net of the model zoo (benchmark W4).
 *
 * Built channels last ([B, S, S, S, C] activations): the convolutions then
 * run on oneDNN without converting layouts around each of them, and the
 * per-voxel losses read the class axis where it already is. The model's
 * interface stays torch's: x [B, C_in, S, S, S], logits [B, classes, S, S,
 * S], and every parameter in torch's layout. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "models/model.h"
#include "tessel/tessel.h"

ts_unet3d_config ts_unet3d_w4(void) {
    ts_unet3d_config c = {4, 1, 32, 16, 32, 64, 2};
    return c;
}

/* torch's default conv init: kaiming_uniform(sqrt 5) weight, bias
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = dims[1] * kernel volume. */
static ts_val conv_param(ts_graph *g, const char *prefix, const char *what, int64_t d0, int64_t d1,
                         int64_t k) {
    char name[160];
    snprintf(name, sizeof name, "%s.%s", prefix, what);
    int64_t wd[5] = {d0, d1, k, k, k};
    return ts_param(g, name, TS_F32, 5, wd, ts_init_kaiming_uniform(sqrt(5.0)));
}

static ts_val conv_bias(ts_graph *g, const char *prefix, int64_t n, int64_t fan_in) {
    char name[96];
    snprintf(name, sizeof name, "%s.bias", prefix);
    int64_t bd[1] = {n};
    double bound = 1.0 / sqrt((double)fan_in);
    return ts_param(g, name, TS_F32, 1, bd, ts_init_uniform(-bound, bound));
}

/* nn.Sequential(Conv3d, BatchNorm3d, ReLU, Conv3d, BatchNorm3d, ReLU). */
static ts_val double_conv(ts_graph *g, ts_val x, const char *prefix, int64_t cin, int64_t cout) {
    int64_t pad[3] = {1, 1, 1}, cd[1] = {cout};
    for (int i = 0; i < 2; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s.%d", prefix, 3 * i);
        ts_val w = conv_param(g, name, "weight", cout, i ? cout : cin, 3);
        x = ts_conv_layout(g, x, w, TS_NONE, 3, NULL, pad, NULL, 1, TS_CHANNELS_LAST);
        snprintf(name, sizeof name, "%s.%d.weight", prefix, 3 * i + 1);
        ts_val bw = ts_param(g, name, TS_F32, 1, cd, ts_init_ones());
        snprintf(name, sizeof name, "%s.%d.bias", prefix, 3 * i + 1);
        ts_val bb = ts_param(g, name, TS_F32, 1, cd, ts_init_zeros());
        snprintf(name, sizeof name, "%s.%d", prefix, 3 * i + 1);
        x = ts_batch_norm_layout(g, x, bw, bb, name, 0.1, 1e-5, 1, TS_CHANNELS_LAST);
    }
    return x;
}

/* ConvTranspose3d(cin, cout, 2, stride 2): weight [cin, cout, 2, 2, 2]. */
static ts_val up(ts_graph *g, ts_val x, const char *prefix, int64_t cin, int64_t cout) {
    int64_t s[3] = {2, 2, 2};
    ts_val w = conv_param(g, prefix, "weight", cin, cout, 2);
    ts_val b = conv_bias(g, prefix, cout, cout * 8);
    return ts_conv_transpose_layout(g, x, w, b, 3, s, NULL, NULL, 1, TS_CHANNELS_LAST);
}

ts_status ts_build_unet3d(ts_graph *g, const ts_unet3d_config *c, ts_model *m) {
    if (!g || !c || !m) {
        ts_graph_fail(g, TS_ERR_INVALID, "model builder: NULL argument");
        return TS_ERR_INVALID;
    }
    if (c->batch <= 0 || c->in_channels <= 0 || c->size <= 0 || c->c1 <= 0 || c->c2 <= 0 ||
        c->c3 <= 0 || c->classes < 2) {
        ts_graph_fail(g, TS_ERR_INVALID,
                      "unet3d: batch, in_channels, size and channels c1-c2-c3 must be > 0 and "
                      "classes >= 2 (got batch %lld, in_channels %lld, size %lld, channels "
                      "%lld-%lld-%lld, classes %lld)",
                      (long long)c->batch, (long long)c->in_channels, (long long)c->size,
                      (long long)c->c1, (long long)c->c2, (long long)c->c3, (long long)c->classes);
        return ts_graph_status(g);
    }
    if (c->size % 4) {
        ts_graph_fail(g, TS_ERR_INVALID,
                      "unet3d: size must be a multiple of 4 (two 2x pooling levels), got %lld",
                      (long long)c->size);
        return ts_graph_status(g);
    }
    int64_t B = c->batch, S = c->size, C = c->classes;
    int64_t xd[5] = {B, c->in_channels, S, S, S}, yd[4] = {B, S, S, S}, k2[3] = {2, 2, 2};
    m->input = ts_input(g, "x", TS_F32, 5, xd);
    m->target = ts_input(g, "y", TS_I64, 4, yd);
    const ts_layout CL = TS_CHANNELS_LAST;
    int to_last[5] = {0, 2, 3, 4, 1}, to_first[5] = {0, 4, 1, 2, 3};
    int64_t xl[5] = {B, S, S, S, c->in_channels};
    /* One input channel is the same memory either way. */
    ts_val x =
        c->in_channels == 1 ? ts_reshape(g, m->input, 5, xl) : ts_permute(g, m->input, to_last);
    ts_val e1 = double_conv(g, x, "enc1", c->in_channels, c->c1);
    ts_val e2 =
        double_conv(g, ts_max_pool_layout(g, e1, 3, k2, NULL, NULL, CL), "enc2", c->c1, c->c2);
    ts_val bt =
        double_conv(g, ts_max_pool_layout(g, e2, 3, k2, NULL, NULL, CL), "bott", c->c2, c->c3);
    ts_val cat2[2] = {up(g, bt, "up2", c->c3, c->c2), e2};
    ts_val d2 = double_conv(g, ts_concat(g, 2, cat2, 4), "dec2", 2 * c->c2, c->c2);
    ts_val cat1[2] = {up(g, d2, "up1", c->c2, c->c1), e1};
    ts_val d1 = double_conv(g, ts_concat(g, 2, cat1, 4), "dec1", 2 * c->c1, c->c1);
    ts_val hw = conv_param(g, "head", "weight", C, c->c1, 1);
    ts_val hb = conv_bias(g, "head", C, c->c1);
    ts_val lg = ts_conv_layout(g, d1, hw, hb, 3, NULL, NULL, NULL, 1, CL); /* [B, S, S, S, C] */
    m->output = ts_permute(g, lg, to_first);
    ts_mark_output(g, m->output, "logits");

    ts_val ce = ts_cross_entropy(g, lg, m->target, -100);
    ts_val probs = ts_softmax(g, lg, 4);
    float *eye = calloc((size_t)(C * C), sizeof *eye);
    if (!eye) {
        ts_graph_fail(g, TS_ERR_NOMEM, "unet3d: out of memory");
        return ts_graph_status(g);
    }
    for (int64_t i = 0; i < C; i++) eye[i * C + i] = 1.0f;
    int64_t ed[2] = {C, C};
    ts_val onehot = ts_embedding(g, ts_constant(g, "unet3d.eye", TS_F32, 2, ed, eye), m->target);
    free(eye);
    int axes[4] = {0, 1, 2, 3};
    ts_val inter = ts_sum(g, ts_mul(g, probs, onehot), 4, axes, 0); /* [C] */
    ts_val denom = ts_add(g, ts_sum(g, probs, 4, axes, 0), ts_sum(g, onehot, 4, axes, 0));
    ts_val ratio =
        ts_div(g, ts_affine_scalar(g, inter, 2.0, 1e-5), ts_affine_scalar(g, denom, 1.0, 1e-5));
    int ax0[1] = {0};
    ts_val dice = ts_affine_scalar(g, ts_mean(g, ratio, 1, ax0, 0), -1.0, 1.0);
    m->loss = ts_add(g, ce, dice);
    ts_set_name(g, m->loss, "loss");
    return ts_graph_status(g);
}

/* ---- descriptor ------------------------------------------------------------ */

ts_unet3d_config ts_config_unet3d(const ts_config *c) {
    ts_unet3d_config u = {c->model.batch, c->model.channels, c->model.size,   c->model.c1,
                          c->model.c2,    c->model.c3,       c->model.classes};
    return u;
}

static void preset_w4(ts_config *p) {
    ts_unet3d_config m = ts_unet3d_w4();
    p->model.batch = m.batch, p->model.channels = m.in_channels, p->model.size = m.size;
    p->model.c1 = m.c1, p->model.c2 = m.c2, p->model.c3 = m.c3, p->model.classes = m.classes;
}

static ts_status check(ts_config *c) {
    char where[600];
    if (ts_config_key_is_set(c, "model.classes") && c->model.classes < 2)
        return ts_fail(TS_ERR_INVALID, "%s: a unet3d needs model.classes >= 2, got %lld",
                       ts_config_key_origin(c, "model.classes", where, sizeof where),
                       (long long)c->model.classes);
    if (c->model.size % 4)
        return ts_fail(
            TS_ERR_INVALID, "%s: model.size must be a multiple of 4 (two 2x2x2 poolings), got %lld",
            ts_config_key_origin(c, "model.size", where, sizeof where), (long long)c->model.size);
    return TS_OK;
}

static int tensors(const ts_config *c, ts_model_tensor *t) {
    const int64_t B = c->model.batch, S3[3] = {c->model.size, c->model.size, c->model.size};
    const int64_t vol = ts_model_product((int64_t)1 << 40, 3, S3);
    t[0] = (ts_model_tensor){"input x", 3, {B, c->model.channels, vol}};
    t[1] = (ts_model_tensor){
        "first level", 3, {B, c->model.c1 > c->model.c2 ? c->model.c1 : c->model.c2, vol}};
    t[2] = (ts_model_tensor){"logits", 3, {B, c->model.classes, vol}};
    t[3] = (ts_model_tensor){"bottom weights", 3, {c->model.c3, c->model.c3, 27}};
    return 4;
}

static ts_status build(const ts_config *c, const ts_config_graph *gr, ts_graph *g, ts_model *m) {
    (void)gr;
    ts_unet3d_config uc = ts_config_unet3d(c);
    return ts_build_unet3d(g, &uc, m);
}

static const ts_model_preset presets[] = {{"w4", preset_w4}};

const ts_model_desc ts_model_unet3d = {
    .name = "unet3d",
    .about = "3D U-Net segmenting volumes, a class per voxel (W4)",
    .keys = "batch classes channels c1 c2 c3 size",
    .presets = presets,
    .n_presets = 1,
    .preset = "w4",
    .input = TS_MODEL_IN_VOLUMES,
    .sources = 1u << TS_CFG_SYNTHETIC | 1u << TS_CFG_NPY,
    .reads = "synthetic or npy volumes",
    .flags = TS_MODEL_CHANNELS_FIRST | TS_MODEL_DICE_LOSS,
    .metrics = "accuracy, dice",
    .unit = "samples/s",
    .check = check,
    .tensors = tensors,
    .build = build,
};
