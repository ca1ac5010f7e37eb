/* ts_config_finish and ts_config_fit_data: the keys checked against each
 * other once every file and override is applied (the data section, sizes,
 * precision, metrics), the preset filled in, derived defaults computed.
 * The model's own checks are model_checks.c's. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "core/core.h"
#include "frontend/buckets.h"
#include "frontend/check.h"
#include "frontend/config_models.h"
#include "frontend/keys.h"
#include "frontend/model_checks.h"
#include "frontend/presets.h"
#include "frontend/run_checks.h"
#include "passes/passes.h"

/* "csv and tokens" for the sources whose flags are set. */
static void source_names(int flags, char *buf, size_t n) {
    static const char *names[] = {"synthetic", "idx", "npy", "csv", "tokens", "graph"};
    int count = 0, total = 0;
    for (int s = 1; s < 6; s++) total += (flags & cfg_source_flag(s)) != 0;
    size_t k = 0;
    for (int s = 1; s < 6 && k < n; s++) {
        if (!(flags & cfg_source_flag(s))) continue;
        count++;
        const char *sep = count == 1 ? "" : count == total ? " and " : ", ";
        k += (size_t)snprintf(buf + k, n - k, "%s%s", sep, names[s]);
    }
}

/* "a, b or c" for the choices "a|b|c". */
static void choice_list(const char *choices, char *buf, size_t n) {
    char w[64];
    int count = 0;
    while (cfg_choice_at(choices, count, w, sizeof w)) count++;
    size_t k = 0;
    for (int i = 0; i < count && k < n; i++) {
        cfg_choice_at(choices, i, w, sizeof w);
        k += (size_t)snprintf(buf + k, n - k, "%s%s",
                              i == 0           ? ""
                              : i == count - 1 ? " or "
                                               : ", ",
                              w);
    }
}

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

static ts_status check_data(const ts_config *c) {
    char where[600], where2[600];
    const int i_source = ts_config_key_find("data.source"),
              i_ep = ts_config_key_find("train.epochs"),
              i_steps = ts_config_key_find("train.steps"),
              i_metrics = ts_config_key_find("train.metrics");
    const int src = c->data.source;
    const char *names[] = {"synthetic", "idx", "npy", "csv", "tokens", "graph"};
    const ts_model_desc *md = ts_model_of(c);
    if (c->set[i_ep] && c->train.epochs > 0) {
        if (src == TS_CFG_SYNTHETIC)
            return ts_fail(TS_ERR_INVALID,
                           "%s: train.epochs needs a dataset (set data.source); synthetic data "
                           "runs train.steps",
                           cfg_origin(c, i_ep, where, sizeof where));
        if (c->set[i_steps])
            return ts_fail(TS_ERR_INVALID,
                           "%s: set train.epochs or train.steps, not both (train.steps is set "
                           "at %s)",
                           cfg_origin(c, i_ep, where, sizeof where),
                           cfg_origin(c, i_steps, where2, sizeof where2));
    }
    if (c->set[i_metrics]) {
        int acc, mse;
        ts_status s = parse_metrics(c->train.metrics, &acc, &mse);
        if (s != TS_OK) {
            ts_error_prefix("%s", cfg_origin(c, i_metrics, where, sizeof where));
            return s;
        }
    }
    /* The model's own words on the source first (the older models keep
     * their messages), then the sources its descriptor lists. */
    if (md->check_source) {
        ts_status s = md->check_source(c);
        if (s != TS_OK) return s;
    }
    if (src == TS_CFG_SYNTHETIC) return TS_OK;
    if (md->reads && !(md->sources & (1u << src)))
        return ts_fail(TS_ERR_INVALID, "%s: data.source %s cannot feed a %s model (it reads %s)",
                       cfg_origin(c, i_source, where, sizeof where), names[src], md->name,
                       md->reads);
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
                           cfg_origin(c, i_source, where, sizeof where), names[src], need[i].key);
    if (src == TS_CFG_IDX && !c->data.test_images[0] != !c->data.test_labels[0])
        return ts_fail(TS_ERR_INVALID, "%s: set data.test_images and data.test_labels together",
                       cfg_origin(c,
                                  ts_config_key_find(c->data.test_images[0] ? "data.test_images"
                                                                            : "data.test_labels"),
                                  where, sizeof where));
    if (src == TS_CFG_TOKENS && c->data.bits != 16 && c->data.bits != 32)
        return ts_fail(TS_ERR_INVALID, "%s: data.bits must be 16 or 32, got %d",
                       cfg_origin(c, ts_config_key_find("data.bits"), where, sizeof where),
                       c->data.bits);
    if (src == TS_CFG_GRAPH) {
        const int i_val = ts_config_key_find("data.val_fraction"),
                  i_test = ts_config_key_find("data.test_fraction");
        if (c->data.node_split[0] && (c->set[i_val] || c->set[i_test]))
            return ts_fail(TS_ERR_INVALID,
                           "%s: set data.node_split or the fractions (data.val_fraction, "
                           "data.test_fraction), not both",
                           cfg_origin(c, c->set[i_val] ? i_val : i_test, where, sizeof where));
        if (!c->data.node_split[0] && c->data.val_fraction + c->data.test_fraction >= 1)
            return ts_fail(TS_ERR_INVALID,
                           "%s: data.val_fraction %g + data.test_fraction %g leave no training "
                           "nodes",
                           cfg_origin(c, c->set[i_test] ? i_test : i_val, where, sizeof where),
                           c->data.val_fraction, c->data.test_fraction);
    }
    /* CSV with model.classes: the label column holds class ids (see load_csv). */
    return TS_OK;
}

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
        return ts_fail(
            TS_ERR_INVALID,
            "%s: precision.loss_scale '%s' is none of auto, dynamic, none or a "
            "number in (0, 3.4e38]",
            cfg_origin(c, ts_config_key_find("precision.loss_scale"), where, sizeof where),
            c->precision.loss_scale);
    ts_precision_options o;
    ts_config_precision(c, &o);
    if (ts_precision_check(&o) != TS_OK) {
        ts_error_prefix(
            "%s", cfg_origin(c, ts_config_key_find("precision.keep_fp32"), where, sizeof where));
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
    const int i_opt = ts_config_key_find("train.optimizer");
    const int i_wd = ts_config_key_find("train.weight_decay"),
              i_total = ts_config_key_find("train.total_steps");
    const int i_nest = ts_config_key_find("train.nesterov");
    const int i_source = ts_config_key_find("data.source");

    /* The model: name and preset imply each other when only one is given. */
    if (!c->set[i_name] && !c->set[i_preset]) {
        char names[256] = "", presets[256] = "";
        choice_list(cfg_keys[i_name].choices, names, sizeof names);
        choice_list(cfg_keys[i_preset].choices, presets, sizeof presets);
        return ts_fail(TS_ERR_INVALID, "%s: no model: set model.name (%s) or model.preset (%s)",
                       cfg_origin(c, -1, where, sizeof where), names, presets);
    }
    int family = cfg_preset_family(c->model.preset);
    if (!c->set[i_name]) c->model.name = family;
    if (!c->set[i_preset]) c->model.preset = cfg_family_preset(c->model.name);
    if (c->set[i_name] && c->set[i_preset] && !cfg_preset_fits(c->model.preset, c->model.name)) {
        char pn[32], fn[32], nn[32];
        cfg_choice_at(cfg_keys[i_preset].choices, c->model.preset, pn, sizeof pn);
        cfg_choice_at(cfg_keys[i_name].choices, family, fn, sizeof fn);
        cfg_choice_at(cfg_keys[i_name].choices, c->model.name, nn, sizeof nn);
        return ts_fail(TS_ERR_INVALID, "%s: model.preset %s is a %s preset, but model.name is %s",
                       cfg_origin(c, i_preset, where, sizeof where), pn, fn, nn);
    }

    ts_config preset, *p = &preset;
    memset(p, 0, sizeof *p);
    cfg_preset_values(c->model.preset, p);
    const int use_opt = c->train.optimizer == TS_CFG_SGD ? FOR_SGD : FOR_ADAM;
    char opt_name[32];
    cfg_choice_at(cfg_keys[i_opt].choices, c->train.optimizer, opt_name, sizeof opt_name);
    for (int i = 0; i < CFG_N_KEYS; i++) {
        const ts_config_key *k = &cfg_keys[i];
        int model_key = (k->flags & FOR_MODEL) != 0, opt_key = (k->flags & (FOR_SGD | FOR_ADAM));
        if (model_key && !c->set[i]) memcpy((char *)c + k->offset, (char *)p + k->offset, k->size);
        if (!c->set[i]) continue;
        if (model_key && !cfg_model_uses(c, k))
            return ts_fail(TS_ERR_INVALID, "%s: %s is not a key of %s models",
                           cfg_origin(c, i, where, sizeof where), k->path,
                           ts_config_model_word(c->model.name));
        if (opt_key && !(k->flags & use_opt))
            return ts_fail(TS_ERR_INVALID, "%s: %s is not used by %s (it is for %s)",
                           cfg_origin(c, i, where, sizeof where), k->path, opt_name,
                           (k->flags & FOR_SGD) ? "sgd" : "adam and adamw");
        if ((k->flags & FOR_FILES) && !(k->flags & cfg_source_flag(c->data.source))) {
            char src[32], users[64] = "";
            cfg_choice_at(cfg_keys[i_source].choices, c->data.source, src, sizeof src);
            source_names(k->flags, users, sizeof users);
            return ts_fail(TS_ERR_INVALID, "%s: %s is not used by data.source %s (it is for %s)",
                           cfg_origin(c, i, where, sizeof where), k->path, src, users);
        }
    }
    ts_status ds = check_data(c);
    if (ds == TS_OK) ds = cfg_finish_model(c);
    if (ds != TS_OK) return ds;

    if (!c->set[i_wd]) c->train.weight_decay = c->train.optimizer == TS_CFG_ADAMW ? 0.01 : 0.0;
    if (!c->set[i_total]) c->train.total_steps = c->train.steps;
    if (c->train.optimizer == TS_CFG_SGD && c->train.nesterov &&
        (c->train.momentum <= 0 || c->train.dampening != 0))
        return ts_fail(TS_ERR_INVALID,
                       "%s: train.nesterov needs train.momentum > 0 and "
                       "train.dampening 0",
                       cfg_origin(c, i_nest, where, sizeof where));
    if (c->train.source_dropout > 0 && !c->model.source_mask)
        return ts_fail(
            TS_ERR_INVALID,
            "%s: train.source_dropout %g needs model.source_mask: true (a fusion "
            "model whose input valid says which sources a row has)",
            cfg_origin(c, ts_config_key_find("train.source_dropout"), where, sizeof where),
            c->train.source_dropout);
    if (!strcmp(c->data.valid, "none")) c->data.valid[0] = 0; /* no flags: every source */
    if (c->data.valid[0] && !c->model.source_mask)
        return ts_fail(TS_ERR_INVALID,
                       "%s: data.valid '%s' needs model.source_mask: true (a fusion model whose "
                       "input valid says which sources a row has)",
                       cfg_origin(c, ts_config_key_find("data.valid"), where, sizeof where),
                       c->data.valid);
    /* "none" is how a file says unsigned; the written config omits it. */
    if (!strcmp(c->ckpt.sign_key, "none")) c->ckpt.sign_key[0] = 0;
    if (!strcmp(c->peft.targets, "none")) c->peft.targets[0] = 0;
    if (!strcmp(c->peft.base, "none")) c->peft.base[0] = 0;
    if (!strcmp(c->peft.load, "none")) c->peft.load[0] = 0;
    if (!strcmp(c->peft.adapter_after, "none")) c->peft.adapter_after[0] = 0;
    if (c->peft.load[0] && !c->peft.targets[0])
        return ts_fail(TS_ERR_INVALID,
                       "peft.load: '%s' needs peft.lora.targets (the LoRA tensors it fills)",
                       c->peft.load);
    ts_status s = cfg_check_sizes(c);
    if (s == TS_OK) s = check_precision(c);
    /* --procs N (dist.procs) is known here; mpirun's ranks in ts_config_check_run */
    if (s == TS_OK) s = cfg_check_ports(c, 0, c->dist.procs);
    if (s == TS_OK) s = cfg_check_shape(c);
    if (s != TS_OK) return s;
    c->finished = 1;
    return TS_OK;
}

ts_status ts_config_fit_data(ts_config *c, const ts_config_data_shape *d) {
    if (!c || !d) return ts_fail(TS_ERR_INVALID, "config: NULL argument");
    if (!c->finished) return ts_fail(TS_ERR_INVALID, "config: call ts_config_finish first");
    const int i_total = ts_config_key_find("train.total_steps");
    ts_status ms = cfg_fit_model(c, d);
    if (ms != TS_OK) return ms;
    if (d->batches_per_epoch <= 0)
        return ts_fail(TS_ERR_INVALID, "config: the training split has no full batch");
    c->batches_per_epoch = d->batches_per_epoch;
    if (c->train.epochs > 0) {
        c->train.steps = c->train.epochs * d->batches_per_epoch;
        if (!c->set[i_total]) c->train.total_steps = c->train.steps;
    }
    return TS_OK;
}
