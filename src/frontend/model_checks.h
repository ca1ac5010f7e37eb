/* model_checks.h — the model keys checked against each other and the data
 * (internal to src/frontend; finish.c calls these).
 *
 *     ts_status s = cfg_finish_model(c);         // in ts_config_finish
 *     if (s == TS_OK) s = cfg_check_sizes(c);
 *     ...
 *     s = cfg_fit_model(c, &shape);              // in ts_config_fit_data
 */
#ifndef TS_FRONTEND_MODEL_CHECKS_H
#define TS_FRONTEND_MODEL_CHECKS_H

#include "frontend/config.h"

/* The model's own checks and derived values (mlp in_dim, cnn image sizes,
 * gpt heads, gru/lstm/unet3d/gcn keys); errors name the key's origin. */
ts_status cfg_finish_model(ts_config *c);
/* Every tensor of the model within 2^40 elements. */
ts_status cfg_check_sizes(const ts_config *c);
/* The input shape and task from the data, checked against keys the config
 * set. */
ts_status cfg_fit_model(ts_config *c, const ts_config_data_shape *d);

#endif
