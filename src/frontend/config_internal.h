/* config_internal.h — what the parts of the config module share
 * (internal to src/frontend). */
#ifndef TS_FRONTEND_CONFIG_INTERNAL_H
#define TS_FRONTEND_CONFIG_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "frontend/config.h"

/* Where key i got its value, for messages: "FILE:LINE:COL", "--set", or
 * the file alone for i < 0 or a default. */
const char *ts_config_origin(const ts_config *c, int i, char *buf, size_t n);
/* a * b * ... of n factors; 0 if one is 0, -1 if one is negative or the
 * product exceeds limit. */
int64_t ts_config_product(int64_t limit, int n, const int64_t *f);
/* model.name is gru or lstm. */
int ts_config_is_rnn(int name);

/* config_zoo.c: the gru/lstm, unet3d and gcn parts of ts_config_finish
 * (checks and derived values) and ts_config_fit_data (shapes and task
 * from the data). */
ts_status ts_config_finish_zoo(ts_config *c);
ts_status ts_config_fit_zoo(ts_config *c, const ts_config_data_shape *d);

#endif
