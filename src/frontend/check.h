/* check.h — values of single keys (internal to src/frontend): parsing one
 * value into the config with its range check, where a key got its value,
 * and "did you mean" suggestions. Depends on keys.h only.
 *
 *     if (cfg_store(c, &cfg_keys[i], "3e-4") != TS_OK) ...   // "train.lr: must be in ..."
 *     char where[600];
 *     ts_fail(TS_ERR_INVALID, "%s: ...", cfg_origin(c, i, where, sizeof where));
 */
#ifndef TS_FRONTEND_CHECK_H
#define TS_FRONTEND_CHECK_H

#include <stddef.h>
#include <stdint.h>
#include "frontend/config.h"

/* Parse `text` for key k and store it in c. The message names the key but
 * not the place; the caller adds that. */
ts_status cfg_store(ts_config *c, const ts_config_key *k, const char *text);
/* Where key i got its value, for messages: "FILE:LINE:COL", "--set", or
 * the file alone (or "config") for i < 0 or a default. */
const char *cfg_origin(const ts_config *c, int i, char *buf, size_t n);
/* " (did you mean 'train.lr'?)", else the names valid where `got` was. */
void cfg_suggestion(const char *got, char *out, size_t n);
/* "a number", "one of sgd, adam, adamw", ... for messages. */
const char *cfg_expected(const ts_config_key *k, char *buf, size_t n);
/* 'text' quoted, shortened for a message. */
const char *cfg_shown(const char *text, char *buf, size_t n);

#endif
