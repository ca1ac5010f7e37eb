/* presets.h — model presets (internal to src/frontend): the model keys of
 * each model.preset and the model it belongs to, from the registry (each
 * model's descriptor lists its presets).
 *
 *     ts_config p = {0};
 *     cfg_preset_values(c->model.preset, &p);    // p.model.batch, hidden, ... of the preset
 */
#ifndef TS_FRONTEND_PRESETS_H
#define TS_FRONTEND_PRESETS_H

#include "frontend/config.h"

/* Write the model keys of `preset` into p->model. */
void cfg_preset_values(int preset, ts_config *p);
/* The model.name of the model that owns a preset (w2: gru). */
int cfg_preset_family(int preset);
/* The default preset of a model (lstm: gru's w2). */
int cfg_family_preset(int name);
/* Whether model `name` may start from `preset`: its own, or its default. */
int cfg_preset_fits(int preset, int name);

#endif
