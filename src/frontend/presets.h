/* presets.h — model presets (internal to src/frontend): the model keys of
 * each model.preset and the family it belongs to.
 *
 *     ts_config p = {0};
 *     cfg_preset_values(TS_CFG_W1, &p);    // p.model.batch, hidden, ... of W1
 */
#ifndef TS_FRONTEND_PRESETS_H
#define TS_FRONTEND_PRESETS_H

#include "frontend/config.h"

/* Write the model keys of `preset` into p->model. */
void cfg_preset_values(int preset, ts_config *p);
/* The model.name of a preset's family (w2: gru, also used by lstm). */
int cfg_preset_family(int preset);
/* The default preset of a model family. */
int cfg_family_preset(int name);

#endif
