/* peft.load: a Hugging Face peft LoRA adapter directory read into a LoRA
 * run (docs/peft.md). adapter_config.json must agree with the run's
 * peft.lora.* (r, lora_alpha, use_rslora, target_modules); keys tessel does
 * not know are ignored with a warning naming them (peft adds keys in every
 * release). Every LoRA tensor of the plan is then written from
 * adapter_model.safetensors under its peft name (tessel/peft.h). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/safetensors.h"
#include "core/core.h"
#include "session/session_internal.h"
#include "tessel/peft.h"

/* The keys peft writes for LoRA (up to 0.21.2); only some are acted on. */
static const char *const KNOWN[] = {"peft_type",
                                    "task_type",
                                    "base_model_name_or_path",
                                    "revision",
                                    "inference_mode",
                                    "r",
                                    "lora_alpha",
                                    "lora_dropout",
                                    "target_modules",
                                    "fan_in_fan_out",
                                    "bias",
                                    "use_rslora",
                                    "use_dora",
                                    "init_lora_weights",
                                    "modules_to_save",
                                    "layers_to_transform",
                                    "layers_pattern",
                                    "layer_replication",
                                    "rank_pattern",
                                    "alpha_pattern",
                                    "loftq_config",
                                    "megatron_config",
                                    "megatron_core",
                                    "auto_mapping",
                                    "peft_version",
                                    "exclude_modules",
                                    "lora_bias",
                                    "eva_config",
                                    "corda_config",
                                    "use_qalora",
                                    "qalora_group_size",
                                    "trainable_token_indices",
                                    "target_parameters",
                                    "alora_invocation_tokens",
                                    "arrow_config",
                                    "ensure_weight_tying",
                                    "kasa_config",
                                    "lora_ga_config",
                                    "monteclora_config",
                                    "use_bdlora",
                                    "velora_config"};

static int is_lora(const char *name) {
    size_t n = strlen(name);
    return n > 7 && (!strcmp(name + n - 7, ".lora_A") || !strcmp(name + n - 7, ".lora_B"));
}

/* The peft module name of a LoRA parameter "W.lora_X" (tessel/peft.h). */
static void module_of(const char *name, char *out, size_t n) {
    size_t w = strlen(name) - 7;
    if (w > 7 && !strncmp(name + w - 7, ".weight", 7)) w -= 7;
    snprintf(out, n, "%.*s", (int)w, name);
}

/* peft's list matching: the module is the entry or ends in "." entry. */
static int names(const char *module, const char *entry) {
    size_t m = strlen(module), e = strlen(entry);
    return !strcmp(module, entry) ||
           (m > e && module[m - e - 1] == '.' && !strcmp(module + m - e, entry));
}

static ts_status check_targets(const ts_plan *p, json_t *tm, const char *file) {
    if (!json_is_array(tm))
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "peft.load: %s: target_modules must be a list of module names (tessel "
                       "writes one)",
                       file);
    size_t i;
    json_t *e;
    json_array_foreach(tm, i, e) {
        const char *entry = json_string_value(e);
        if (!entry)
            return ts_fail(TS_ERR_FORMAT, "peft.load: %s: target_modules[%zu] is not a string",
                           file, i);
        int hit = 0;
        for (int k = 0; k < ts_plan_param_count(p) && !hit; k++) {
            char m[600];
            const char *name = ts_plan_param_name(p, k);
            if (!is_lora(name)) continue;
            module_of(name, m, sizeof m);
            hit = names(m, entry);
        }
        if (!hit)
            return ts_fail(TS_ERR_INVALID,
                           "peft.load: %s: target_modules names '%s', which the run's "
                           "peft.lora.targets does not patch",
                           file, entry);
    }
    for (int k = 0; k < ts_plan_param_count(p); k++) {
        char m[600];
        const char *name = ts_plan_param_name(p, k);
        if (!is_lora(name)) continue;
        module_of(name, m, sizeof m);
        int hit = 0;
        json_array_foreach(tm, i, e) hit |= json_string_value(e) && names(m, json_string_value(e));
        if (!hit)
            return ts_fail(TS_ERR_INVALID,
                           "peft.load: %s: target_modules does not name '%s', which the run's "
                           "peft.lora.targets patches",
                           file, m);
    }
    return TS_OK;
}

/* adapter_config.json against the run's config; unknown keys listed in warn. */
static ts_status check_config(session *s, const char *file, char *warn, size_t wn) {
    json_error_t err;
    json_t *o = json_load_file(file, 0, &err);
    if (!o) return ts_fail(TS_ERR_FORMAT, "peft.load: %s:%d: %s", file, err.line, err.text);
    const ts_config *c = &s->c;
    ts_status st = TS_OK;
    const char *type = json_string_value(json_object_get(o, "peft_type"));
    json_t *r = json_object_get(o, "r"), *alpha = json_object_get(o, "lora_alpha");
    json_t *rs = json_object_get(o, "use_rslora");
    const char *bias = json_string_value(json_object_get(o, "bias"));
    if (!json_is_object(o))
        st = ts_fail(TS_ERR_FORMAT, "peft.load: %s is not a JSON object", file);
    else if (!type || strcmp(type, "LORA"))
        st = ts_fail(TS_ERR_UNSUPPORTED, "peft.load: %s: peft_type is '%s', tessel reads LORA",
                     file, type ? type : "(missing)");
    else if (!json_is_integer(r) || json_integer_value(r) != c->peft.r)
        st =
            ts_fail(TS_ERR_INVALID, "peft.load: %s: r is %s%lld, the run's peft.lora.r is %d", file,
                    json_is_integer(r) ? "" : "not an integer: ", (long long)json_integer_value(r),
                    c->peft.r);
    else if (!json_is_number(alpha) || json_number_value(alpha) != c->peft.alpha)
        st = ts_fail(TS_ERR_INVALID,
                     "peft.load: %s: lora_alpha is %g, the run's peft.lora.alpha is %g", file,
                     json_number_value(alpha), c->peft.alpha);
    else if ((rs && !json_is_null(rs) && !json_is_boolean(rs)) ||
             (json_is_true(rs) ? 1 : 0) != (c->peft.use_rslora ? 1 : 0))
        st = ts_fail(TS_ERR_INVALID,
                     "peft.load: %s: use_rslora is %s, the run's peft.lora.use_rslora is %s", file,
                     json_is_true(rs) ? "true" : "false", c->peft.use_rslora ? "true" : "false");
    else if (bias && strcmp(bias, "none"))
        st = ts_fail(TS_ERR_UNSUPPORTED, "peft.load: %s: bias is '%s', tessel trains bias 'none'",
                     file, bias);
    else if (json_object_size(json_object_get(o, "rank_pattern")) ||
             json_object_size(json_object_get(o, "alpha_pattern")))
        st = ts_fail(TS_ERR_UNSUPPORTED,
                     "peft.load: %s: rank_pattern / alpha_pattern are not supported (one r and "
                     "alpha for every module)",
                     file);
    else if (json_is_true(json_object_get(o, "lora_bias")) ||
             json_is_true(json_object_get(o, "use_qalora")))
        st = ts_fail(TS_ERR_UNSUPPORTED,
                     "peft.load: %s: lora_bias / use_qalora is true; tessel's LoRA has neither",
                     file);
    else if (json_is_true(json_object_get(o, "use_dora")))
        st = ts_fail(TS_ERR_UNSUPPORTED, "peft.load: %s: use_dora is true; tessel has no DoRA",
                     file);
    else
        st = check_targets(s->plan, json_object_get(o, "target_modules"), file);
    const char *key;
    json_t *v;
    size_t k = 0;
    warn[0] = 0;
    json_object_foreach(o, key, v) {
        int known = 0;
        for (size_t i = 0; i < sizeof KNOWN / sizeof *KNOWN; i++) known |= !strcmp(key, KNOWN[i]);
        if (!known && k < wn) k += (size_t)snprintf(warn + k, wn - k, "%s%s", k ? ", " : "", key);
    }
    json_decref(o);
    return st;
}

/* Every LoRA tensor of the plan from the file, and no other tensor in it. */
static ts_status copy_tensors(ts_plan *p, const ts_st_file *f, const char *file) {
    int used = 0;
    for (int i = 0; i < ts_plan_param_count(p); i++) {
        const char *name = ts_plan_param_name(p, i);
        if (!is_lora(name)) continue;
        char key[700];
        ts_dtype dt;
        int rank;
        int64_t dims[TS_MAX_RANK] = {0};
        ts_st_tensor t;
        ts_status st = ts_plan_value_info(p, name, &dt, &rank, dims);
        if (st != TS_OK) return st;
        if (!ts_peft_hf_key(name, key, sizeof key))
            return ts_fail(TS_ERR_INVALID, "peft.load: '%s': name too long", name);
        if (ts_st_find(f, key, &t) != TS_OK)
            return ts_fail(TS_ERR_INVALID, "peft.load: %s has no '%s' (for the run's '%s')", file,
                           key, name);
        if (t.dtype != dt || t.rank != rank || memcmp(t.dims, dims, sizeof dims))
            return ts_fail(TS_ERR_INVALID,
                           "peft.load: %s: '%s' is %s of rank %d [%lld, %lld], the run's '%s' "
                           "is %s [%lld, %lld]",
                           file, key, ts_dtype_name(t.dtype), t.rank, (long long)t.dims[0],
                           (long long)t.dims[1], name, ts_dtype_name(dt), (long long)dims[0],
                           (long long)dims[1]);
        if ((st = ts_plan_write_param(p, name, t.data, t.bytes)) != TS_OK) return st;
        used++;
    }
    if (used != ts_st_count(f))
        for (int i = 0; i < ts_st_count(f); i++) {
            const char *key = ts_st_name(f, i);
            int found = 0;
            for (int k = 0; k < ts_plan_param_count(p) && !found; k++) {
                char want[700];
                found = ts_peft_hf_key(ts_plan_param_name(p, k), want, sizeof want) &&
                        !strcmp(want, key);
            }
            if (!found)
                return ts_fail(
                    TS_ERR_INVALID,
                    "peft.load: %s: '%s' is no LoRA tensor of the run (peft.lora.targets "
                    "patches fewer modules)",
                    file, key);
        }
    return TS_OK;
}

ts_status ts_sess_peft_load_adapter(session *s) {
    const char *dir = s->c.peft.load;
    if (!dir[0]) return TS_OK;
    char cfg[600], st_path[600], warn[512];
    snprintf(cfg, sizeof cfg, "%s/adapter_config.json", dir);
    snprintf(st_path, sizeof st_path, "%s/adapter_model.safetensors", dir);
    ts_status st = check_config(s, cfg, warn, sizeof warn);
    if (st != TS_OK) return st;
    if (warn[0])
        ts_progress_log(&s->pr,
                        "tessel: warning: peft.load: %s: ignoring keys tessel does not know: %s",
                        cfg, warn);
    ts_st_file *f = NULL;
    if ((st = ts_st_open(st_path, &f)) != TS_OK) {
        ts_error_prefix("peft.load");
        return st;
    }
    st = copy_tensors(s->plan, f, st_path);
    ts_st_close(f);
    return st;
}
