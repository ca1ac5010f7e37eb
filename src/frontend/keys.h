/* keys.h — the key table and what the files of src/frontend share about it
 * (internal to src/frontend; the public view is ts_config_key_at in
 * config.h). Lowest layer of the config engine: keys.c includes nothing
 * else of src/frontend.
 *
 *     for (int i = 0; i < CFG_N_KEYS; i++)
 *         if (cfg_keys[i].flags & FOR_FILES) ...
 */
#ifndef TS_FRONTEND_KEYS_H
#define TS_FRONTEND_KEYS_H

#include <stddef.h>
#include "frontend/config.h"

/* Which values of the choosing key (model.name, train.optimizer) use a key. */
#define FOR_MODEL TS_CFG_MODEL_KEY /* which models: their descriptors' keys */
#define FOR_SGD   8
#define FOR_ADAM  16 /* adam and adamw */
/* Which values of data.source use a key. */
#define FOR_IDX    32
#define FOR_NPY    64
#define FOR_CSV    128
#define FOR_TOKENS 256
#define FOR_GRAPH  (1 << 16)
#define FOR_FILES  (FOR_IDX | FOR_NPY | FOR_CSV | FOR_TOKENS | FOR_GRAPH)

/* ts_config.set[i]: where key i got its value. */
enum { ORIGIN_DEFAULT = 0, ORIGIN_FILE = 1, ORIGIN_SET = 2 };

/* The table, grouped by section (the writer and suggestions rely on it). */
extern const ts_config_key cfg_keys[];
extern const int cfg_n_keys;
#define CFG_N_KEYS cfg_n_keys

/* The i-th entry of "a|b|c" into buf; 0 if there is none. */
int cfg_choice_at(const char *choices, int i, char *buf, size_t n);
/* "lr" for "train.lr". */
const char *cfg_leaf(const char *path);
/* Whether path is a section ("train") of some key. */
int cfg_is_section(const char *path);
/* The FOR_* flag of a data.source value (0 for synthetic). */
int cfg_source_flag(int source);

#endif
