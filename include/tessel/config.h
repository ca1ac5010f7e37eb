/* tessel/config.h — a run's configuration: a YAML file plus `key.path=value`
 * overrides (the command line's --set), checked, completed and written back
 * resolved. docs/config.md lists every key.
 *
 *     ts_config c;
 *     ts_config_init(&c);
 *     if (ts_config_load_file(&c, "examples/w1.yaml") != TS_OK ||
 *         ts_config_set(&c, "train.lr=3e-4") != TS_OK || ts_config_finish(&c) != TS_OK)
 *         puts(ts_last_error());   // "w1.yaml:7:3: unknown key 'train.lrr' (did you mean ...)"
 *     ts_config_write(&c, stdout); // the resolved config, loadable again
 *
 * A finished config is what tessel/session.h runs. Errors name the file,
 * line and column of the key, or the --set that gave it.
 */
#ifndef TESSEL_CONFIG_H
#define TESSEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "tessel/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Enum values are positions in the key's `choices` list: model.name's are
 * the built-in models' places in the model registry (src/models/registry.c;
 * a model added later has no name here, its value is its place there), and
 * model.preset's the places of their presets. */
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
/* ckpt.on_signal: what a stop by SIGTERM/SIGINT commits (docs/cluster.md, Preemption). */
typedef enum ts_cfg_on_signal { TS_ON_SIGNAL_SAVE = 0, TS_ON_SIGNAL_NONE } ts_cfg_on_signal;
typedef enum ts_cfg_source {
    TS_CFG_SYNTHETIC = 0,
    TS_CFG_IDX,
    TS_CFG_NPY,
    TS_CFG_CSV,
    TS_CFG_TOKENS,
    TS_CFG_GRAPH
} ts_cfg_source;

#define TS_CFG_MAX_KEYS 256

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
        /* fusion: a validity mask input `valid` [batch, 3] (docs/shapes.md) */
        int source_mask;
        /* onnx: the model file (made absolute against the config's directory
         * when the config is finished) and the loss over its first output;
         * the file's SHA-256, recorded when the config is finished (or given
         * to pin it), which the graph build checks again */
        char onnx[512], loss[32], onnx_sha256[65];
    } model;
    struct {
        int optimizer; /* ts_cfg_optimizer */
        double lr, momentum, dampening;
        int nesterov;
        double beta1, beta2, eps, weight_decay, clip_grad_norm;
        int schedule; /* ts_cfg_schedule */
        int64_t warmup_steps, total_steps;
        double min_lr;
        /* each source of each row dropped with this probability (fusion
         * with model.source_mask; docs/shapes.md "Sensor masks") */
        double source_dropout;
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
        int no_fuse_norm;           /* activation + layer norm as separate ops */
        int no_fuse_ce;             /* cross-entropy forward and backward as two ops */
        int no_weight_copies;       /* bf16/fp16: cast the weights every step (precision.md) */
        int no_gelu_grad;           /* the GELU backward computes gelu'(x) itself */
        int no_attn_bwd_low_out;    /* the packed attention backward writes f32 dqkv */
        int no_qkv_low;             /* the qkv projection writes f32 for the bf16 attention */
        double max_memory_mb;       /* memory-aware scheduling: the arena's limit (0: none) */
        int backend, no_cuda_graph; /* backend: 0 cpu, 1 cuda (docs/cuda.md) */
    } compile;
    struct {
        int source; /* ts_cfg_source */
        char train_images[512], train_labels[512], test_images[512], test_labels[512]; /* idx */
        char x[512], y[512];                                                           /* npy */
        char valid[512];         /* npy: source flags [n, 3] (data.valid) */
        char path[512];          /* csv, tokens */
        char features[1024];     /* csv: "a, b, c"; "" for every column but the label */
        char label[128];         /* csv */
        int64_t window, horizon; /* csv */
        int normalise;           /* csv */
        int bits;                /* tokens: 16 or 32 */
        double val_fraction;
        int shuffle;
        int drop_last;         /* drop an epoch's short last batch */
        int64_t eot_id;        /* tokens: documents end with this id; -1: fixed windows */
        int64_t skip_rows;     /* csv: lines skipped before the header */
        int header;            /* csv: 0 names columns "0", "1", ... */
        char edges[512];       /* graph: edge list (x: node features, y: node labels) */
        char node_split[512];  /* graph: .npy of split ids per node; "" to split by fraction */
        double test_fraction;  /* graph: share of the nodes held out for the test split */
        char doc_offsets[512]; /* tokens: text file of document start offsets; "": none */
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
        int on_signal;        /* SIGTERM/SIGINT: TS_ON_SIGNAL_SAVE or _NONE */
        double signal_grace;  /* ckpt.signal_grace_s: seconds until the scheduler's SIGKILL */
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
        int64_t cooldown;       /* steps between one rule's snapshots/pauses/webhooks */
        double pause_timeout;   /* seconds a pause waits for tessel ctl resume; 0: no limit */
        int pause_timeout_stop; /* after a timed-out pause: 0 go on, 1 stop (exit 3) */
        int snapshot_max;       /* anomaly snapshots one process writes; 0: no limit */
        int snapshot_keep;      /* newest anomaly snapshots kept on disk; 0: all */
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
        int prefetch;     /* ZeRO-3: gather the next parameter bucket one bucket ahead */
        int share_params; /* ZeRO on shm: one shared copy of the parameters */
        double timeout_s; /* per collective; 0: TESSEL_DIST_TIMEOUT or 1800 */
        int max_restarts; /* --procs: restarts of failed workers from the latest checkpoint */
        /* gradient compression (dist.compress*, docs/distributed.md "Gradient compression") */
        int compress;                  /* 0 none, 1 topk, 2 powersgd */
        double compress_ratio;         /* topk: share of a bucket's elements sent per step */
        int compress_values;           /* topk values: 0 e4m3, 1 e5m2, 2 bf16, 3 f32 */
        int64_t compress_warmup_steps; /* topk: steps over which the ratio falls to its value */
        int compress_rank;             /* powersgd: rank r of the factors */
        int64_t compress_min_elems;    /* powersgd: smaller tensors are all-reduced dense */
        int64_t compress_max_elems;    /* powersgd: larger tensors too (0: no limit) */
        int compress_power_iters;      /* powersgd: power iterations a step */
        int64_t compress_dense_steps;  /* the first steps exchange dense */
        int compress_momentum;         /* topk: DGC momentum correction (SGD's momentum) */
        double compress_clip; /* topk: local clipping of each rank's gradient norm; 0 off */

        /* dist.reproducible: the same bits for any process count; rows per
         * micro-batch (0: chosen). docs/reproducibility.md */
        int reproducible;
        int64_t microbatch;
        double max_mem_mb;
    } dist;
    struct {
        int dflt;            /* compute type of GEMMs: 0 fp32, 1 bf16, 2 fp16 */
        char keep_fp32[256]; /* op names kept in f32 */
        char loss_scale[32]; /* auto | dynamic | none | a number */
        double init_scale, growth_factor, backoff_factor;
        int64_t growth_interval;
    } precision;
    struct {
        char targets[1024]; /* LoRA: regexes of matmul weight names; "" none */
        int r;
        double alpha, dropout;
        int use_rslora;
        char base[512]; /* base weights: checkpoint directory or .safetensors; "" none */
        char load[512]; /* LoRA A and B from a Hugging Face peft adapter directory; "" none */
        char adapter_after[1024]; /* Houlsby adapters: regexes of layer weight names; "" none */
        int adapter_hidden;       /* bottleneck width */
        int adapter_activation;   /* ts_peft_activation */
    } peft;
    struct {           /* federated training (docs/federated.md) */
        int secure;    /* 0: paillier, 1: masking, 2: none (plain FedAvg) */
        int threshold; /* masking: shares needed to unmask (0: a majority) */
        char addr[64]; /* the aggregator's numeric IPv4 address */
        int port;      /* ... and port */
        int rounds, local_steps, min_clients, max_clients, key_bits, pool;
        int pool_threads; /* threads filling the r^n pool */
        double scale, clip, timeout_s, join_s;
        double prox_mu; /* FedProx: weight of the proximal term (0: FedAvg) */
        char key[512];  /* the key holder's Paillier private key file */
        /* TLS: the run's CA, this role's certificate and key */
        char ca[512], cert[512], tls_key[512];
        char keyholder_name[128], server_name[128];
    } fed;
    struct {
        int policy;              /* 0 exact: a plan per batch shape; 1 bucket: padded to a bucket */
        char batch_buckets[256]; /* "8, 16, 32", "multiple:N" or "pow2" */
        char seq_buckets[256];   /* likewise, for sequence lengths */
        int split_oversize;      /* a batch larger than every bucket runs as several steps */
        int precompile;          /* compile every bucket before the first step */
        double cache_mb;         /* plans' own memory kept in the cache (MiB); 0: no limit */
        int64_t sort_window;     /* batches sorted by length together; 0: no sorting */
        int64_t build_seq; /* not a key: the sequence bucket a gpt is built at (0: model.ctx) */
    } shape;
    /* pipeline stages (dist.pipeline_*, dist.microbatches, dist.devices; docs/distributed.md
     * "Pipeline stages") */
    struct {
        int stages;        /* S: processes the model is cut into */
        int microbatches;  /* M: micro-batches per step */
        int schedule;      /* ts_pipe_schedule: 0 1f1b, 1 gpipe */
        char devices[512]; /* devices file ("" : speeds measured at start) */
    } pipe;
    struct {
        int fused_update; /* each parameter's update as soon as its gradient is complete */
    } optim;
    /* Batches per epoch once ts_config_fit_data has seen the data (0 before). */
    int64_t batches_per_epoch;

    /* Where each key (by table index) got its value: set[i] is 0 for a
     * default, 1 from the file (at line[i]:col[i]), 2 from an override. */
    unsigned char set[TS_CFG_MAX_KEYS];
    int line[TS_CFG_MAX_KEYS], col[TS_CFG_MAX_KEYS];
    char file[512]; /* the loaded file, for messages ("" if none) */
    int finished;
} ts_config;

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

/* The finished config as YAML that loads back to the same values. */
ts_status ts_config_write(const ts_config *c, FILE *out);

/* The model.name's word ("mlp", "gpt", ...; "?" if there is none). */
const char *ts_config_model_word(int name);

/* Where the key at `path` ("model.window") got its value, for messages:
 * "FILE:LINE:COL", "--set", or the file (or "config") for a default. */
const char *ts_config_key_origin(const ts_config *c, const char *path, char *buf, size_t n);
/* Whether the file or an override set the key at `path` (0: a default). */
int ts_config_key_is_set(const ts_config *c, const char *path);

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

/* dist.compress* as compile options (ts_compile_options.compress); also
 * refused by ts_config_check_run: compression with one process, with
 * dist.zero, momentum correction without SGD momentum. */
struct ts_compress_options;
void ts_config_compress_options(const ts_config *c, struct ts_compress_options *out);

/* The table index of the first dist.* key whose value is not its default,
 * or -1. */
int ts_config_dist_key(const ts_config *c);
/* TS_OK when every dist.* key is at its default; otherwise fails naming the
 * first one that is not, for tools that build one process's step (`tool`,
 * e.g. "tessel compile", names the tool in the message). */
ts_status ts_config_check_single_process(const ts_config *c, const char *tool);

#ifdef __cplusplus
}
#endif
#endif
