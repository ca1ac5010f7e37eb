/* The model registry (src/models/registry.c): the built-in models at the
 * positions of ts_cfg_model_name, descriptors that are whole (names,
 * keys of the key table, presets, builders), the key table's model.name
 * and model.preset choices made from it, and the config engine asking the
 * descriptors (keys a model refuses, a preset of another model). */
#include <string.h>
#include "check.h"
#include "frontend/config.h"

static void test_positions(void) {
    static const struct {
        int name;
        const char *word;
    } builtin[] = {{TS_CFG_MLP, "mlp"}, {TS_CFG_GPT, "gpt"},   {TS_CFG_CNN, "cnn"},
                   {TS_CFG_GRU, "gru"}, {TS_CFG_LSTM, "lstm"}, {TS_CFG_UNET3D, "unet3d"},
                   {TS_CFG_GCN, "gcn"}};
    for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++) {
        const ts_model_desc *d = ts_model_at(builtin[i].name);
        CHECK(d && !strcmp(d->name, builtin[i].word), "model %d is %s", builtin[i].name,
              builtin[i].word);
        CHECK(ts_model_find(builtin[i].word) == builtin[i].name, "find %s", builtin[i].word);
        CHECK(!strcmp(ts_config_model_word(builtin[i].name), builtin[i].word), "word of %s",
              builtin[i].word);
    }
    CHECK(ts_model_at(-1) == NULL && ts_model_at(ts_model_count()) == NULL, "out of range");
    CHECK(!strcmp(ts_config_model_word(ts_model_count()), "?"), "no model's word");
    CHECK(ts_model_find("nosuch") < 0 && ts_model_preset_find("nosuch") < 0, "unknown names");
}

static void test_descriptors(void) {
    const int i_name = ts_config_key_find("model.name"),
              i_preset = ts_config_key_find("model.preset");
    char buf[512];
    const ts_config_key *kn = ts_config_key_at(i_name), *kp = ts_config_key_at(i_preset);
    ts_config_type_name(kn, buf, sizeof buf);
    char want[512] = "";
    for (int i = 0; i < ts_model_count(); i++) {
        const ts_model_desc *d = ts_model_at(i);
        snprintf(want + strlen(want), sizeof want - strlen(want), i ? ", %s" : "%s", d->name);
        CHECK(d->build && d->tensors && d->unit && d->keys && d->about, "%s is whole", d->name);
        CHECK(ts_model_find(d->name) == i, "%s: one model of that name", d->name);
        /* Every key it reads is a model key of the table. */
        const char *p = d->keys;
        int n_keys = 0;
        while (*p) {
            p += strspn(p, " ");
            size_t len = strcspn(p, " ");
            if (!len) break;
            char path[64];
            snprintf(path, sizeof path, "model.%.*s", (int)len, p);
            const int k = ts_config_key_find(path);
            CHECK(k >= 0 && (ts_config_key_at(k)->flags & TS_CFG_MODEL_KEY) &&
                      ts_model_uses(d, path + 6),
                  "%s reads %s, a model key", d->name, path);
            p += len;
            n_keys++;
        }
        CHECK(n_keys > 0, "%s reads keys", d->name);
        CHECK(!ts_model_uses(d, "name") && !ts_model_uses(d, "bat"), "%s: whole leaves only",
              d->name);
        /* Its default preset exists, and its own presets are its. */
        CHECK(ts_model_preset_find(d->preset) >= 0, "%s: preset %s exists", d->name, d->preset);
        for (int k = 0; k < d->n_presets; k++) {
            int owner = -1;
            const int at = ts_model_preset_find(d->presets[k].name);
            CHECK(at >= 0 && ts_model_preset_at(at, &owner) == &d->presets[k] && owner == i,
                  "%s owns preset %s", d->name, d->presets[k].name);
        }
        /* A model reads some source; `reads` words the refusal of the others. */
        CHECK(d->sources != 0, "%s reads some data.source", d->name);
        CHECK(d->reads || d->check_source, "%s: the refusal of a source is worded", d->name);
    }
    CHECK(!strcmp(buf, want), "model.name choices '%s' vs the registry's '%s'", buf, want);
    ts_config_type_name(kp, buf, sizeof buf);
    CHECK(!strncmp(buf, "w1, w3, gpt2-124m, fashion, w2, w4, w5", 38),
          "model.preset choices keep the built-in order: '%s'", buf);
    CHECK(ts_model_preset_count() >= 7, "presets");
    CHECK(ts_model_preset_at(ts_model_preset_count(), NULL) == NULL, "preset out of range");
}

static ts_status load(ts_config *c, const char *yaml) {
    ts_config_init(c);
    ts_status s = ts_config_load_string(c, yaml, strlen(yaml), "t.yaml");
    return s == TS_OK ? ts_config_finish(c) : s;
}

/* The config engine through the descriptors. */
static void test_config(void) {
    ts_config c;
    /* lstm starts from gru's w2, and may name it. */
    CHECK_OK(load(&c, "model: {name: lstm}\n"));
    CHECK(c.model.preset == ts_model_preset_find("w2") && c.model.hidden == 256, "lstm from w2");
    CHECK_OK(load(&c, "model: {name: lstm, preset: w2}\n"));
    CHECK(load(&c, "model: {name: cnn, preset: w4}\n") == TS_ERR_INVALID &&
              strstr(ts_last_error(), "model.preset w4 is a unet3d preset, but model.name is cnn"),
          "preset of another model: %s", ts_last_error());
    /* The message without a model lists the registry. */
    CHECK(load(&c, "train: {steps: 1}\n") == TS_ERR_INVALID &&
              strstr(ts_last_error(), "no model: set model.name (mlp, gpt, cnn, gru, lstm, "
                                      "unet3d") &&
              strstr(ts_last_error(), "or model.preset (w1, w3, gpt2-124m"),
          "no model: %s", ts_last_error());
    /* A key of no model the config names; a key of the model. */
    CHECK(load(&c, "model: {name: gcn, window: 3}\n") == TS_ERR_INVALID &&
              strstr(ts_last_error(), "t.yaml:1:20: model.window is not a key of gcn models"),
          "gcn has no window: %s", ts_last_error());
    CHECK_OK(load(&c, "model: {name: unet3d, c3: 8, size: 8}\n"));
    CHECK(c.model.c3 == 8 && c.model.size == 8 && c.model.c1 == 16, "unet3d keys and w4's");
    /* The 2^40 check reads the descriptor's tensors. */
    CHECK(load(&c, "model: {name: gcn, hidden: 1000000000, features: 1000000000}\n") ==
                  TS_ERR_INVALID &&
              strstr(ts_last_error(), "its first weight would exceed 2^40"),
          "gcn too large: %s", ts_last_error());
}

int main(void) {
    test_positions();
    test_descriptors();
    test_config();
    return check_summary("model_registry");
}
