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
#include "tessel/tessel.h"

/* Enum values are positions in the key's `choices` list. */
typedef enum ts_cfg_model_name {
    TS_CFG_MLP = 0,
    TS_CFG_GPT,
    TS_CFG_CNN,
    TS_CFG_GRU,
    TS_CFG_LSTM,
    TS_CFG_UNET3D,
    TS_CFG_GCN
} ts_cfg_model_name;
typedef enum ts_cfg_preset {
    TS_CFG_W1 = 0,
    TS_CFG_W3,
    TS_CFG_GPT2_124M,
    TS_CFG_FASHION,
    TS_CFG_W2,
    TS_CFG_W4,
    TS_CFG_W5
} ts_cfg_preset;
typedef enum ts_cfg_optimizer { TS_CFG_SGD = 0, TS_CFG_ADAM, TS_CFG_ADAMW } ts_cfg_optimizer;
typedef enum ts_cfg_schedule { TS_CFG_CONSTANT = 0, TS_CFG_LINEAR, TS_CFG_COSINE } ts_cfg_schedule;
typedef enum ts_cfg_source {
    TS_CFG_SYNTHETIC = 0,
    TS_CFG_IDX,
    TS_CFG_NPY,
    TS_CFG_CSV,
    TS_CFG_TOKENS,
    TS_CFG_GRAPH
} ts_cfg_source;

#define TS_CFG_MAX_KEYS 128

typedef struct ts_config {
    struct {
        int name, preset; /* ts_cfg_model_name, ts_cfg_preset */
        int64_t batch;
        /* mlp */
        int64_t window, features, in_dim, hidden, out_dim;
        int n_hidden, layer_norm;
        int64_t classes; /* > 0: a classifier over this many classes */
        /* gpt */
        int64_t ctx, vocab, d_model;
        int n_layers, n_heads;
        double dropout;
        /* cnn (classes above) */
        int64_t channels, height, width, c1, c2;
        /* unet3d (channels, c1, c2 and classes above); gru/lstm use window
         * (sequence length), features, hidden, n_layers, classes, out_dim;
         * gcn features, hidden, classes */
        int64_t size, c3;
        int64_t nodes; /* gcn on synthetic data: the graph's size */
    } model;
    struct {
        int optimizer; /* ts_cfg_optimizer */
        double lr, momentum, dampening;
        int nesterov;
        double beta1, beta2, eps, weight_decay, clip_grad_norm;
        int schedule; /* ts_cfg_schedule */
        int64_t warmup_steps, total_steps;
        double min_lr;
        int64_t steps;
        uint64_t seed;
        int threads;
        int64_t epochs;     /* > 0: steps = epochs * batches per epoch (ts_config_fit_data) */
        int64_t eval_every; /* steps between evaluations; 0: at the end of each epoch */
        int64_t log_every;  /* steps between log lines; 0: about 100 lines per run */
        char metrics[64];   /* "accuracy, auc, dice, miou, mse"; "" until the data says */
    } train;
    struct {
        int debug_nan, no_simplify, naive_schedule, no_inplace;
        int no_fuse, no_recompute, discard_outputs;
    } compile;
    struct {
        int source; /* ts_cfg_source */
        char train_images[512], train_labels[512], test_images[512], test_labels[512]; /* idx */
        char x[512], y[512];                                                           /* npy */
        char path[512];          /* csv, tokens */
        char features[1024];     /* csv: "a, b, c"; "" for every column but the label */
        char label[128];         /* csv */
        int64_t window, horizon; /* csv */
        int normalise;           /* csv */
        int bits;                /* tokens: 16 or 32 */
        double val_fraction;
        int shuffle;
        int64_t skip_rows;    /* csv: lines skipped before the header */
        int header;           /* csv: 0 names columns "0", "1", ... */
        char edges[512];      /* graph: edge list (x: node features, y: node labels) */
        char node_split[512]; /* graph: .npy of split ids per node; "" to split by fraction */
        double test_fraction; /* graph: share of the nodes held out for the test split */
    } data;
    struct {
        char dir[512]; /* run directory; "" for none */
    } output;
    struct {
        int64_t every;        /* steps between checkpoints; 0: none */
        int keep_last;        /* retention: newest K (0: all) */
        int keep_every;       /* ... and every step multiple of M (0: none) */
        char sign_key[512];   /* private key for manifests and the audit log; "" unsigned */
        char verify_key[512]; /* public key checked on resume; "" checksums only */
        int async;            /* save in a background thread */
    } ckpt;
    struct {
        int metrics_port;        /* Prometheus /metrics endpoint; 0: none */
        char metrics_addr[64];   /* numeric address it listens on */
        int tensorboard;         /* event files under RUN_DIR/tb/ */
        int64_t histogram_every; /* steps between weight/gradient histograms; 0: none */
    } observe;
    struct {
        char rules[2048];       /* alert rules, comma-separated "key=value ..." texts */
        int defaults;           /* the default rules when there are none */
        char webhook_url[256];  /* receiver of action webhook */
        int baseline_window;    /* steps in a baseline */
        int baseline_warmup;    /* steps before a baseline is used */
        int update_ratio_every; /* steps between update-ratio measurements; 0: none */
    } alerts;
    struct {
        int inject;          /* 0 none, 1 nan, 2 scale: corrupt training batches (testing) */
        int64_t inject_step; /* first corrupted step */
        int inject_count;    /* consecutive corrupted steps */
        double inject_scale; /* factor for inject: scale */
    } debug;
    struct {
        int procs;        /* data-parallel worker processes on this host (tessel train) */
        double bucket_mb; /* gradient bucket size (MiB) */
        int algo;         /* ts_coll_algo of the gradient all-reduces */
        int zero;         /* ZeRO stage: 1 shards the optimizer state */
        int share_params; /* ZeRO on shm: one shared copy of the parameters */
        double timeout_s; /* per collective; 0: TESSEL_DIST_TIMEOUT or 1800 */
        int max_restarts; /* --procs: restarts of failed workers from the latest checkpoint */
    } dist;
    struct {
        int dflt;            /* compute type of GEMMs: 0 fp32, 1 bf16, 2 fp16 */
        char keep_fp32[256]; /* op names kept in f32 */
        char loss_scale[32]; /* auto | dynamic | none | a number */
        double init_scale, growth_factor, backoff_factor;
        int64_t growth_interval;
    } precision;
    /* Batches per epoch once ts_config_fit_data has seen the data (0 before). */
    int64_t batches_per_epoch;

    /* Where each key (by table index) got its value: set[i] is 0 for a
     * default, 1 from the file (at line[i]:col[i]), 2 from an override. */
    unsigned char set[TS_CFG_MAX_KEYS];
    int line[TS_CFG_MAX_KEYS], col[TS_CFG_MAX_KEYS];
    char file[512]; /* the loaded file, for messages ("" if none) */
    int finished;
} ts_config;

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
#define TS_CFG_FOR_MLP    1    /* model key used by mlp models */
#define TS_CFG_FOR_GPT    2    /* model key used by gpt models */
#define TS_CFG_DERIVED    4    /* `dflt` describes a computed default; it is not a value */
#define TS_CFG_LIST       1024 /* TS_CFG_STR that a file may also write as a YAML list of names */
#define TS_CFG_FOR_CNN    2048 /* model key used by cnn models */
#define TS_CFG_FOR_RNN    (1 << 13) /* model key used by gru and lstm models */
#define TS_CFG_FOR_UNET3D (1 << 14) /* model key used by unet3d models */
#define TS_CFG_FOR_GCN    (1 << 15) /* model key used by gcn models */

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

/* Every key at its default; no model chosen yet. */
void ts_config_init(ts_config *c);
/* Apply a YAML file: a mapping of sections (model, train, compile, data,
 * output, ckpt, observe)
 * to mappings of keys. Errors name the file, line and column. */
ts_status ts_config_load_file(ts_config *c, const char *path);
/* Same, from text in memory; `name` stands for the file in messages. */
ts_status ts_config_load_string(ts_config *c, const char *text, size_t len, const char *name);
/* Apply one override "key.path=value" with the same checks as the file. */
ts_status ts_config_set(ts_config *c, const char *assignment);
/* Fill the model from the preset, derive defaults (weight_decay,
 * total_steps) and check the keys against each other. Call once, after
 * every load and set. */
ts_status ts_config_finish(ts_config *c);

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

/* The finished config as YAML that loads back to the same values. */
ts_status ts_config_write(const ts_config *c, FILE *out);

/* The model of a finished config, for callers that shape data for it. */
ts_mlp_config ts_config_mlp(const ts_config *c);
ts_gpt_config ts_config_gpt(const ts_config *c);
ts_cnn_config ts_config_cnn(const ts_config *c); /* flat_input: x [batch, c * h * w] */

/* Build the configured model into a new graph and describe its training
 * step. On success the caller owns *g (ts_graph_free). */
ts_status ts_config_build(const ts_config *c, ts_graph **g, ts_model *m, ts_train_spec *spec,
                          ts_compile_options *opt);

/* "mlp", "gpt", "cnn", "gru", "lstm", "unet3d" or "gcn" for model.name. */
const char *ts_config_model_word(int name);

/* The model of a finished gru/lstm or unet3d config. */
ts_rnn_config ts_config_rnn(const ts_config *c);
ts_unet3d_config ts_config_unet3d(const ts_config *c);

/* What a gcn is built on besides its config: the graph the data holds
 * (ts_config_build refuses a gcn, which needs its edges). */
typedef struct ts_config_graph {
    int64_t nodes, n_edges;
    const int64_t *src, *dst; /* [n_edges] each */
} ts_config_graph;
/* ts_config_build with the graph of a gcn (gr is ignored by other models
 * and may be NULL for them). */
ts_status ts_config_build_graph(const ts_config *c, const ts_config_graph *gr, ts_graph **g,
                                ts_model *m, ts_train_spec *spec, ts_compile_options *opt);

/* ckpt.verify_key resolved: how a resume checks a checkpoint's signature. */
typedef enum ts_cfg_verify {
    TS_CFG_VERIFY_NONE = 0, /* checksums only: verify_key none, or nothing set */
    TS_CFG_VERIFY_FILE,     /* the public key file verify_key names */
    TS_CFG_VERIFY_OWN       /* verify_key unset, sign_key set: the public half of the
                             * run's own signing key (*path is sign_key's file) */
} ts_cfg_verify;
/* The mode, and in *path the key file it reads (NULL for NONE). */
ts_cfg_verify ts_config_verify_key(const ts_config *c, const char **path);
/* ckpt.sign_key, or NULL for an unsigned run ("" or "none"). */
const char *ts_config_sign_key(const ts_config *c);

/* What a run checks before it creates anything (a refused config leaves
 * no directory behind): observe.metrics_port leaves a port for every rank
 * (rank r serves metrics_port + r; c is rank `rank`'s config, whose port
 * already has its rank added); ckpt.sign_key is a regular file, not a
 * link, of this user, mode 0600 or stricter; ckpt.verify_key (unless none)
 * a readable regular file. Errors name the key's file and line. */
ts_status ts_config_check_run(const ts_config *c, int rank, int nranks);

/* The table index of the first dist.* key whose value is not its default,
 * or -1. */
int ts_config_dist_key(const ts_config *c);
/* TS_OK when every dist.* key is at its default; otherwise fails naming the
 * first one that is not, for tools that build one process's step (`tool`,
 * e.g. "tessel compile", names the tool in the message). */
ts_status ts_config_check_single_process(const ts_config *c, const char *tool);

#endif
