/* The model registry: one line per model below. A model's position is its
 * model.name value, so the built-in models keep the order of
 * ts_cfg_model_name; a new model goes at the end (docs/models.md). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "models/model.h"

#define TS_MODELS(X)                                                                               \
    X(mlp)                                                                                         \
    X(gpt)                                                                                         \
    X(cnn)                                                                                         \
    X(gru)                                                                                         \
    X(lstm)                                                                                        \
    X(unet3d)                                                                                      \
    X(gcn)                                                                                         \
    X(tcn)                                                                                         \
    X(onnx)                                                                                        \
    X(onnx_lm)                                                                                     \
    X(fusion)                                                                                      \
    /* a new model: one line X(name) above this one */

#define DECLARE(n) extern const ts_model_desc ts_model_##n;
TS_MODELS(DECLARE)
#undef DECLARE
#define ENTRY(n) &ts_model_##n,
static const ts_model_desc *const models[] = {TS_MODELS(ENTRY)};
#undef ENTRY
enum { N_MODELS = (int)(sizeof models / sizeof models[0]) };

char ts_model_name_choices[512];
char ts_model_preset_choices[512];

static void join(char *buf, size_t n, const char *word) {
    const size_t len = strlen(buf);
    snprintf(buf + len, n - len, len ? "|%s" : "%s", word);
}

static void init_choices(void) {
    for (int i = 0; i < N_MODELS; i++) {
        join(ts_model_name_choices, sizeof ts_model_name_choices, models[i]->name);
        for (int k = 0; k < models[i]->n_presets; k++)
            join(ts_model_preset_choices, sizeof ts_model_preset_choices,
                 models[i]->presets[k].name);
    }
}

void ts_models_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, init_choices);
}

int ts_model_count(void) {
    return N_MODELS;
}

const ts_model_desc *ts_model_at(int name) {
    return name >= 0 && name < N_MODELS ? models[name] : NULL;
}

const ts_model_desc *ts_model_of(const ts_config *c) {
    return ts_model_at(c->model.name);
}

int ts_model_find(const char *name) {
    for (int i = 0; name && i < N_MODELS; i++)
        if (!strcmp(models[i]->name, name)) return i;
    return -1;
}

int ts_model_preset_count(void) {
    int n = 0;
    for (int i = 0; i < N_MODELS; i++) n += models[i]->n_presets;
    return n;
}

const ts_model_preset *ts_model_preset_at(int preset, int *owner) {
    for (int i = 0; preset >= 0 && i < N_MODELS; i++) {
        if (preset < models[i]->n_presets) {
            if (owner) *owner = i;
            return &models[i]->presets[preset];
        }
        preset -= models[i]->n_presets;
    }
    return NULL;
}

int ts_model_preset_find(const char *name) {
    for (int p = 0, n = ts_model_preset_count(); name && p < n; p++)
        if (!strcmp(ts_model_preset_at(p, NULL)->name, name)) return p;
    return -1;
}

int ts_model_uses(const ts_model_desc *d, const char *leaf) {
    const size_t n = strlen(leaf);
    for (const char *p = d->keys; p && *p;) {
        p += strspn(p, " ");
        const size_t len = strcspn(p, " ");
        if (len == n && !strncmp(p, leaf, n)) return 1;
        p += len;
    }
    return 0;
}

ts_status ts_model_check_synthetic_classes(const ts_config *c, const char *synthetic_is) {
    char where[600];
    if (c->data.source == TS_CFG_SYNTHETIC && c->model.classes >= 2)
        return ts_fail(TS_ERR_INVALID,
                       "%s: model.classes %lld needs labelled data (set data.source); %s",
                       ts_config_key_origin(c, "model.classes", where, sizeof where),
                       (long long)c->model.classes, synthetic_is);
    return TS_OK;
}

int64_t ts_model_product(int64_t limit, int n, const int64_t *f) {
    int64_t p = 1;
    for (int i = 0; i < n; i++) {
        if (f[i] <= 0) return f[i] == 0 ? 0 : -1;
        if (p > limit / f[i]) return -1;
        p *= f[i];
    }
    return p;
}
