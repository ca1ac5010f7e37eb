/* Model presets: the benchmark shapes (w1, w3, gpt2-124m, fashion, w2, w4,
 * w5, ...) that fill every model key a config leaves unset, looked up in the
 * model registry (presets.h). */
#include "frontend/presets.h"

void cfg_preset_values(int preset, ts_config *p) {
    const ts_model_preset *mp = ts_model_preset_at(preset, NULL);
    if (mp) mp->fill(p);
}

int cfg_preset_family(int preset) {
    int owner = 0;
    return ts_model_preset_at(preset, &owner) ? owner : 0;
}

int cfg_family_preset(int name) {
    const ts_model_desc *d = ts_model_at(name);
    const int p = d ? ts_model_preset_find(d->preset) : -1;
    return p < 0 ? 0 : p;
}

int cfg_preset_fits(int preset, int name) {
    return cfg_preset_family(preset) == name || cfg_family_preset(name) == preset;
}
