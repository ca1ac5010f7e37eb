/* config_models.h — model dispatch (internal to src/frontend): what the
 * config engine asks about model.name. The public part (ts_config_build,
 * ts_config_mlp, ts_config_model_word, ...) is in config.h.
 *
 *     if (k->flags & cfg_model_flag(c->model.name)) ...   // the key is the model's
 */
#ifndef TS_FRONTEND_CONFIG_MODELS_H
#define TS_FRONTEND_CONFIG_MODELS_H

#include "frontend/config.h"

/* The TS_CFG_FOR_* key flag of a model family (0 for an unknown name). */
int cfg_model_flag(int name);
/* model.name is gru or lstm. */
int cfg_is_rnn(int name);

#endif
