/* config_models.h — what the config engine asks the model registry
 * (internal to src/frontend). The public part (ts_config_build,
 * ts_config_model_word, ...) is in config.h; the models' descriptors are
 * models/model.h's.
 *
 *     if ((k->flags & FOR_MODEL) && !cfg_model_uses(c, k)) ...   // not this model's key
 */
#ifndef TS_FRONTEND_CONFIG_MODELS_H
#define TS_FRONTEND_CONFIG_MODELS_H

#include "frontend/config.h"

/* Whether the config's model reads model key k (its descriptor lists it). */
int cfg_model_uses(const ts_config *c, const ts_config_key *k);

#endif
