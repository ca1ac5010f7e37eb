/* config.h — run configuration from a YAML file plus `key.path=value`
 * overrides, and the graph, train spec and compile options it describes.
 *
 *     ts_config c;
 *     ts_config_init(&c);
 *     if (ts_config_load_file(&c, "examples/w1.yaml") != TS_OK ||
 *         ts_config_set(&c, "train.lr=3e-4") != TS_OK || ts_config_finish(&c) != TS_OK)
 *         puts(ts_last_error());   // "w1.yaml:7:3: unknown key 'train.lrr' (did you mean ...)"
 *     ts_graph *g; ts_model m; ts_train_spec spec; ts_compile_options opt;
 *     ts_config_build(&c, &g, &m, &spec, &opt);
 *
 * Every key lives in one table (ts_config_key_at) holding its path, type,
 * place in ts_config, allowed range, default and help; parsing, overrides,
 * validation, ts_config_write and the docs check all read that table, so a
 * new key is a struct field plus one table line.
 *
 * The struct and what a program needs to load, override, finish and write
 * a config are public (tessel/config.h); the key table, the data fit and
 * the model builders below are the library's.
 *
 * Model keys are stored flat (the keys of every model side by side) because a file
 * may set model.batch before it names the model; ts_config_finish() fills
 * every model key the config left unset from the preset and rejects keys
 * that do not belong to the chosen model.
 */
#ifndef TS_FRONTEND_CONFIG_H
#define TS_FRONTEND_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "models/model.h"
#include "tessel/config.h"
#include "tessel/tessel.h"

typedef enum ts_cfg_type {
    TS_CFG_INT,  /* int */
    TS_CFG_I64,  /* int64_t */
    TS_CFG_U64,  /* uint64_t */
    TS_CFG_F64,  /* double */
    TS_CFG_BOOL, /* int, 0 or 1 */
    TS_CFG_ENUM, /* int, index into choices */
    TS_CFG_STR   /* char[size] */
} ts_cfg_type;

/* Key flags. */
#define TS_CFG_MODEL_KEY 1    /* model.* key read by the models that list it (ts_model_desc.keys) */
#define TS_CFG_DERIVED   4    /* `dflt` describes a computed default; it is not a value */
#define TS_CFG_LIST      1024 /* TS_CFG_STR that a file may also write as a YAML list of names */

typedef struct ts_config_key {
    const char *path; /* "train.lr" */
    ts_cfg_type type;
    size_t offset, size; /* the field inside ts_config */
    int flags;
    const char *choices; /* TS_CFG_ENUM: "sgd|adam|adamw" */
    const char *range;   /* numbers: "[0, 1)", "(0, inf)"; NULL = any */
    const char *dflt;    /* as written in a config file, or a description (TS_CFG_DERIVED) */
    const char *help;
} ts_config_key;

int ts_config_key_count(void);
const ts_config_key *ts_config_key_at(int i);
/* Index of the key with this path, or -1. */
int ts_config_key_find(const char *path);
/* "integer", "number", "bool", "string" or the choices "sgd, adam, adamw". */
const char *ts_config_type_name(const ts_config_key *k, char *buf, size_t n);

/* After the data is loaded (a finished config with a data source): give an
 * mlp the input width, output width or class count of the data, checking
 * keys the config set against it, and turn train.epochs into train.steps
 * (and train.total_steps unless set). Errors name the key's file and line. */
ts_status ts_config_fit_data(ts_config *c, const ts_config_data_shape *d);

/* The metrics to evaluate: "accuracy, mse" split into flags. An unknown
 * name is an error. */
ts_status ts_config_metrics(const ts_config *c, int *accuracy, int *mse);
/* The same as flags, including the metrics of src/session/metrics_eval.h. */
enum {
    TS_METRIC_ACCURACY = 1,
    TS_METRIC_MSE = 2,
    TS_METRIC_AUC = 4,
    TS_METRIC_DICE = 8,
    TS_METRIC_MIOU = 16
};
ts_status ts_config_metric_flags(const ts_config *c, unsigned *flags);

/* The precision section as compile options (keep_fp32 points into c). */
void ts_config_precision(const ts_config *c, ts_precision_options *o);

/* Build the configured model into a new graph and describe its training
 * step. On success the caller owns *g (ts_graph_free). */
ts_status ts_config_build(const ts_config *c, ts_graph **g, ts_model *m, ts_train_spec *spec,
                          ts_compile_options *opt);

/* The models' builder configs (ts_config_mlp, ...), ts_config_data_shape
 * and ts_config_graph are models/model.h's. */
/* ts_config_build with the graph of a whole-graph model (gcn; gr is
 * ignored by other models and may be NULL for them). */
ts_status ts_config_build_graph(const ts_config *c, const ts_config_graph *gr, ts_graph **g,
                                ts_model *m, ts_train_spec *spec, ts_compile_options *opt);

#endif
