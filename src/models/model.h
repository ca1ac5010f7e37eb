/* model.h — model descriptors: everything the config engine, the session
 * and the tools know about one model, kept in the model's own file
 * (src/models/NAME.c) beside its builder, and the registry that lists them
 * (registry.c, one line per model). docs/models.md shows how to add one.
 *
 *     const ts_model_desc *d = ts_model_of(c);      // c->model.name's model
 *     if (d->check) s = d->check(c);                // in ts_config_finish
 *     s = d->build(c, NULL, g, &m);                 // in ts_config_build
 *     for (int i = 0; i < ts_model_count(); i++) puts(ts_model_at(i)->name);
 *
 * model.name is a model's position in the registry (the built-in ones keep
 * the values of ts_cfg_model_name); model.preset a preset's position in the
 * list of every model's presets in registry order. Model files include only
 * public headers and this one: a descriptor reads the config through the
 * public ts_config and reports problems with ts_fail, naming the key with
 * ts_config_key_origin.
 */
#ifndef TS_MODELS_MODEL_H
#define TS_MODELS_MODEL_H

#include <stdint.h>
#include "tessel/config.h"
#include "tessel/tessel.h"

/* What the loaded data says about the model, for ts_config_fit_data. */
typedef struct ts_config_data_shape {
    int64_t in_dim;            /* features per example */
    int64_t out_dim;           /* regression targets per example (0 for class labels) */
    int64_t classes;           /* class labels: max label + 1; 0 for float targets */
    int64_t batches_per_epoch; /* of the training split */
    /* Sequences [window, features] and graphs [nodes, features]: those two
     * sizes; unet3d volumes: channels and size (edge); 0 otherwise. */
    int64_t rows, cols;
} ts_config_data_shape;

/* What a whole-graph model (gcn) is built on besides its config: the graph
 * the data holds. */
typedef struct ts_config_graph {
    int64_t nodes, n_edges;
    const int64_t *src, *dst; /* [n_edges] each */
} ts_config_graph;

/* The examples a model reads; the session loads, checks and synthesises
 * data by this kind, never by the model's name. */
typedef enum ts_model_input {
    TS_MODEL_IN_FLAT,      /* x [in_dim] per example (CSV windows flattened), float targets
                              or class ids: the generic loaders' shape */
    TS_MODEL_IN_TOKENS,    /* token sequences [ctx] (data.source tokens) */
    TS_MODEL_IN_IMAGES,    /* images [channels * height * width] with class ids */
    TS_MODEL_IN_SEQUENCES, /* [window, features] (CSV windows, npy), fresh synthetic
                              batches every step */
    TS_MODEL_IN_VOLUMES,   /* [channels, size, size, size] with a class id per voxel */
    TS_MODEL_IN_GRAPH      /* the whole graph is one example (full batch) */
} ts_model_input;

/* ts_model_desc.flags */
enum {
    TS_MODEL_REGRESSION = 1,     /* model.classes 0 is a regression (MSE); else a classifier */
    TS_MODEL_BINARY = 2,         /* model.classes 1 is a binary classifier (one logit, BCE) */
    TS_MODEL_CHANNELS_FIRST = 4, /* logits [batch, classes, positions]: a class per position */
    TS_MODEL_LM = 8,             /* a language model: always a classifier, rates in tokens */
    TS_MODEL_DICE_LOSS = 16      /* its loss adds soft Dice over the classes (evaluation too) */
};

/* A preset: the benchmark shape that fills every model key a config leaves
 * unset. `fill` writes the model keys into p->model. */
typedef struct ts_model_preset {
    const char *name;
    void (*fill)(ts_config *p);
} ts_model_preset;

/* One tensor of the model whose element count the config engine keeps
 * within 2^40 (the product of f[0..n-1]). */
typedef struct ts_model_tensor {
    const char *what;
    int n;
    int64_t f[4];
} ts_model_tensor;
#define TS_MODEL_MAX_TENSORS 8

typedef struct ts_model_desc {
    const char *name;  /* model.name */
    const char *about; /* one line, for docs/models.md and listings */
    /* The model.* keys it reads besides name and preset, as leaves separated
     * by spaces ("batch window features"); any other model key the config
     * sets is an error, and ts_config_write writes exactly these. */
    const char *keys;
    const ts_model_preset *presets; /* its own presets (may be none) */
    int n_presets;
    const char *preset; /* the default preset's name (lstm: gru's w2) */
    ts_model_input input;
    unsigned sources;      /* the data.source values it reads, 1u << ts_cfg_source */
    const char *reads;     /* what it reads, for "data.source X cannot feed a NAME model (it
                              reads ...)"; NULL: check_source words its own messages */
    unsigned flags;        /* TS_MODEL_* */
    const char *metrics;   /* default train.metrics of a classifier (NULL: "accuracy") */
    const char *label;     /* what the training log calls it (NULL: name) */
    const char *label_clf; /* ... when it is a classifier (NULL: label) */
    const char *unit;      /* throughput unit of `tessel train` and bench */
    /* ts_config_finish, after the presets filled the keys: the data source
     * against the model (may be NULL); then the model's keys against each
     * other, deriving values (may be NULL). Errors name the key's origin. */
    ts_status (*check_source)(const ts_config *c);
    ts_status (*check)(ts_config *c);
    /* ts_config_fit_data: input shape and task from the data, checked
     * against the keys the config set. NULL: the generic fit of its input
     * kind (sequences, volumes, graphs) in src/frontend/model_checks.c. */
    ts_status (*fit)(ts_config *c, const ts_config_data_shape *d);
    /* Its large tensors, for the 2^40 check; returns how many (at most
     * TS_MODEL_MAX_TENSORS). */
    int (*tensors)(const ts_config *c, ts_model_tensor *t);
    /* The graph of a finished config; gr is the data's graph for a
     * TS_MODEL_IN_GRAPH model, else NULL. Errors are the graph's. */
    ts_status (*build)(const ts_config *c, const ts_config_graph *gr, ts_graph *g, ts_model *m);
} ts_model_desc;

/* The registry (registry.c). */
int ts_model_count(void);
const ts_model_desc *ts_model_at(int name); /* NULL out of range */
const ts_model_desc *ts_model_of(const ts_config *c);
int ts_model_find(const char *name); /* -1 if none */
/* Presets over every model, in registry order. */
int ts_model_preset_count(void);
const ts_model_preset *ts_model_preset_at(int preset, int *owner); /* owner: model index */
int ts_model_preset_find(const char *name);                        /* -1 if none */
/* "mlp|gpt|..." and "w1|w3|..." for the key table's choices. */
extern char ts_model_name_choices[];
extern char ts_model_preset_choices[];
/* Fills the two choice strings (once, thread safe); every reader of the
 * key table's choices calls it first. */
void ts_models_init(void);
/* Whether the model reads key leaf `leaf` (e.g. "window"). */
int ts_model_uses(const ts_model_desc *d, const char *leaf);

/* Synthetic data carries no class labels: model.classes >= 2 with
 * data.source synthetic is TS_ERR_INVALID naming the key, with
 * `synthetic_is` saying what the model's synthetic data is. */
ts_status ts_model_check_synthetic_classes(const ts_config *c, const char *synthetic_is);

/* a * b * ... without overflow: 0 if a factor is 0, -1 if one is negative
 * or the product exceeds `limit`. */
int64_t ts_model_product(int64_t limit, int n, const int64_t *f);

/* The model builders' configs from a finished config (in the model files). */
ts_mlp_config ts_config_mlp(const ts_config *c);
ts_gpt_config ts_config_gpt(const ts_config *c);
ts_cnn_config ts_config_cnn(const ts_config *c); /* flat_input: x [batch, c * h * w] */
ts_rnn_config ts_config_rnn(const ts_config *c);
ts_unet3d_config ts_config_unet3d(const ts_config *c);

#endif
