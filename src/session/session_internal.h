/* session_internal.h — what the parts of a training run share (internal to
 * src/session). ts_session_run (session.c) owns one `session` and calls the
 * parts in the order session.h promises: checks and setup (rundir.c,
 * feed.c, build.c, observe.c, checkpoint.c) before the run directory is
 * made, then the loop (session.c) feeding batches (feed.c), evaluating
 * (eval.c), observing (observe.c) and checkpointing (checkpoint.c).
 *
 *     session *s = ...;                  // s->c, s->o, s->r set
 *     ts_sess_load_data(s);              // feed.c: datasets and loader
 *     ts_sess_build(s);                  // build.c: graph, plans, buffers
 *     ts_sess_write_run_files(s);        // rundir.c: config.yaml, lineage.json, ...
 *     ts_sess_next_batch(s, step);       // feed.c: s->bx, s->by
 *     ts_sess_eval_split(s, "val", s->val, &r->val, step, epoch);
 *
 * Each function returns a ts_status with its message set (ts_fail). */
#ifndef TS_SESSION_INTERNAL_H
#define TS_SESSION_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include "core/dirlock.h"
#include "core/fsat.h"
#include "data/data.h"
#include "frontend/buckets.h"
#include "frontend/config.h"
#include "obs/alert_run.h"
#include "obs/http.h"
#include "obs/metrics.h"
#include "obs/progress.h"
#include "obs/tfevents.h"
#include "session/metrics_eval.h"
#include "session/session.h"
#include "session/zoo_data.h"
#include "tessel/ckpt.h"
#include "tessel/tessel.h"

/* Synthetic data cycles over a few fixed batches, as the reference
 * benchmark does: a GPT can then lower its loss by memorising them, which
 * fresh uniform tokens (whose best loss is log(vocab) from the start) would
 * not allow. */
enum { N_SYNTH = 4 };
/* Step rates kept for the median: enough for any run a person watches. */
enum { MAX_RATES = 1 << 20 };

static const char *const source_names[] = {"synthetic", "idx", "npy", "csv", "tokens", "graph"};

typedef struct session {
    ts_config c; /* resolved copy */
    const ts_session_options *o;
    ts_session_result *r;
    ts_progress pr;
    /* data */
    ts_dataset *all, *train, *val, *test;
    ts_loader *loader;
    int n_synth;
    void *sx[N_SYNTH], *sy[N_SYNTH];
    /* model and plans */
    ts_graph *g;
    ts_model m;
    ts_plan *plan, *eval;
    int gpt, classifier, want_acc, want_mse;
    const char *in_name, *tgt_name, *out_name;
    size_t xb, yb, outb; /* bytes of one batch's x, y and model output */
    void *bx, *by;
    float *bout;
    void *pbuf; /* one parameter, for copying into the eval plan */
    size_t pbuf_bytes;
    double *rates;
    int64_t n_rates;
    /* run directory: opened once, locked for the run (core/fsat.h, dirlock.h) */
    ts_dir dir;
    ts_dir_lock lock;
    FILE *metrics;
    int dir_made;
    int from_start; /* --resume latest of a run stopped before its first checkpoint */
    /* checkpoints */
    int resume_in_place; /* --resume latest: continue in the run directory */
    ts_ckpt *ck;         /* the verified checkpoint to resume from */
    int64_t start_step;  /* steps done before this run's first step */
    char ck_dir[512], ck_id[80], ck_config[80];
    /* peft.base as loaded (a checkpoint: its step directory) and its
     * SHA-256 (peft_base.c): what PEFT checkpoints refer to */
    char peft_base_path[600], peft_base_sha[65];
    char *ident; /* the config text checkpoints are tied to (see identity) */
    size_t ident_bytes;
    char ident_sha[65];
    ts_ckpt_data_file *lineage; /* data lineage for the manifests */
    int n_lineage;
    /* A mapped token file hashed while training starts (lineage.c):
     * lineage.json waits for the hashes (deferred), done once they are in. */
    int lineage_deferred, lineage_done;
    ts_audit *audit;
    ts_ckpt_saver *sv;
    uint64_t ckpt_group; /* ZeRO checkpoints: this launch's (ts_session_ckpt_group) */
    /* observability (docs/observability.md) */
    ts_train_metrics tm;
    int tm_made;
    ts_http_server *http;
    ts_tfevents *tb;
    ts_metric
        *compress_m[5];  /* gradient compression's gauges (compress_obs.c), made on first use */
    ts_metric *gpu_m[3]; /* GPU utilisation, memory, power (gpu_obs.c), made on first use */
    int rank, nranks;    /* data parallelism: this rank's rows of every batch */
    /* threads per process (ts_sess_resolve_threads): what every plan is compiled with when
     * train.threads is 0 (0: OpenMP's default), the count used and why, for the log */
    int threads, threads_used;
    char threads_why[96];
    double model_params;    /* > 0: the model's parameters when s->plan is a pipeline stage's */
    int nslices;            /* slices of a batch the plan is built for: nranks, or with
                               dist.reproducible the micro-batches (session/repro.h) */
    struct ts_repro *rp;    /* dist.reproducible, else NULL */
    char *replay_json;      /* the manifests' "replay" object (ts_repro_manifest) */
    struct ts_trace *trace; /* --trace */
    float *gbuf;            /* one parameter or gradient, read back for norms and histograms */
    size_t gbuf_bytes;
    /* dist.pipeline_stages > 1: this rank's stage (pipe_train.h), else NULL */
    struct ts_sess_pipe *pipe;
    ts_alert_runner *ar; /* gradient monitors and alert rules (src/obs/alert_run.h) */
    ts_ckpt_saver *asv;  /* anomaly snapshots when ckpt.every is 0 (no s->sv) */
    /* evaluation metrics beyond accuracy/mse (metrics_eval.h) */
    unsigned metric_flags;
    ts_metric_acc macc;
    /* gru/lstm, unet3d, gcn (zoo_data.h) */
    int binary;         /* a gru/lstm with one logit: BCE against 0/1 targets */
    ts_zoo_graph graph; /* data.source graph: the gcn's edges */
    ts_zoo_dice dice;   /* unet3d: the soft Dice term of the evaluation loss */
    /* shape buckets and short batches (shape_feed.c, docs/shapes.md) */
    struct ts_plan_cache *cache; /* NULL: one plan of model.batch rows */
    ts_buckets bb, sb;           /* shape.batch_buckets, shape.seq_buckets */
    int64_t rows;                /* real rows of this step's batch */
    int64_t bucket, seq_bucket;  /* the bucket the last step ran on */
    double step_loss;            /* the last step's loss (row-weighted over split steps) */
    void *pad_x, *pad_y;         /* a padded batch: pad_rows rows */
    float *mask;                 /* 1 for a real row, 0 for padding (float targets) */
    int bn_mask;                 /* BatchNorm reads the "mask" input too (shapes.c) */
    size_t pad_rows;
    /* model.source_mask: the input valid, u8 [rows, 3] for the whole batch,
     * then room for one bucket's rows (feed_rows pads it) */
    uint8_t *valid;
    /* data.valid: the flags the data gives the batch's rows, [batch, 3]
     * after the targets in by (NULL: every source present) */
    const uint8_t *data_valid;
    struct ts_metric *shape_metric[8]; /* the cache's Prometheus gauges */
} session;

/* data.source names, in ts_cfg_source order (lineage.json, the header line). */
extern const char *const ts_sess_source_names[];

/* A number for a JSON line: shortest text that reads back the same float,
 * null for NaN and infinities (which JSON lacks). */
static inline const char *num(double v, char *buf, size_t n) {
    if (!isfinite(v)) return "null";
    snprintf(buf, n, "%.9g", v);
    return buf;
}

static inline int64_t numel_dims(int rank, const int64_t *dims) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= dims[i];
    return n;
}

/* ---- rundir.c: the run directory and the run's identity ------------------ */

/* Opens and locks the run directory `dir` when it exists (s->dir, s->lock;
 * a new one is made and locked by ts_sess_write_run_files): a new run's
 * must be empty but for the lock file; with --resume latest it must exist,
 * and s->from_start is set when it holds no checkpoint yet. A link as the
 * directory, or another process holding its lock, is an error naming it. */
ts_status ts_sess_open_run_dir(session *s, const char *dir);
/* s->from_start: the run directory's audit log begins with this config's
 * identity (after ts_sess_identity), and the run did not complete. */
ts_status ts_sess_check_from_start(session *s);
/* s->ident and s->ident_sha: the config text checkpoints are tied to. */
ts_status ts_sess_identity(session *s);
/* Makes the run directory and writes config.yaml, the audit log's first
 * entries, lineage.json, normalisation.json; opens metrics.jsonl and the
 * checkpoint saver (ckpt.every). */
ts_status ts_sess_write_run_files(session *s);
/* rundir.c: writes lineage.json (the data files with their SHA-256). */
ts_status ts_sess_write_lineage(session *s);
/* lineage.c: once the data's hashing pass is done (block: wait for it),
 * its error if it failed, else the hashes are in the lineage and a
 * deferred lineage.json is written. Called after every step (block 0),
 * before every checkpoint and at the end of the run (block 1). */
ts_status ts_sess_lineage_settle(session *s, int block);
/* peft.c: peft.base's weights into the training plan (every parameter
 * but the LoRA ones, names and shapes checked first); the trainable and
 * total parameter counts of a plan. */
ts_status ts_sess_peft_load_base(session *s);
/* peft_load.c: peft.load's adapter directory into the plan's LoRA tensors. */
ts_status ts_sess_peft_load_adapter(session *s);
void ts_sess_peft_counts(const ts_plan *p, double *trainable, double *total);

/* peft_base.c: base weights (peft.base) read by name, from a checkpoint
 * (a step directory, or a run directory's LATEST) or a safetensors file.
 * `path` is what was opened (the step directory for a checkpoint) and
 * `sha256` its identity: the SHA-256 of the safetensors file, or of the
 * checkpoint's manifest.json (which holds every file's SHA-256). */
typedef struct ts_peft_base {
    ts_ckpt *ck;
    struct ts_st_file *st;
    char path[600], sha256[65];
} ts_peft_base;
/* Opens and verifies it (checkpoint: checksums; no signature check);
 * errors are prefixed with `what` ("peft.base"). With expect_sha (not
 * NULL) a base of another SHA-256 is refused naming the file. */
ts_status ts_peft_base_open(const char *path, const char *what, const char *expect_sha,
                            ts_peft_base *b);
void ts_peft_base_close(ts_peft_base *b);
/* Tensor `name` (a parameter, not optimizer state): its type; 0 if absent. */
int ts_peft_base_find(const ts_peft_base *b, const char *name, ts_dtype *dt, int *rank,
                      int64_t *dims);
/* Its bytes (exactly its size) into dst. */
ts_status ts_peft_base_read(const ts_peft_base *b, const char *name, void *dst, size_t bytes);
/* The i-th parameter tensor's name (i from 0 while it returns non-NULL). */
const char *ts_peft_base_name(const ts_peft_base *b, int i);

/* train.threads 0 (auto) on several processes: each uses the cores it may run on divided by
 * the processes of the run on its host that share them (at least 1); OMP_NUM_THREADS, when
 * set, and an explicit train.threads win. Sets s->threads, threads_used and threads_why.
 * A collective when s->nranks > 1: every rank calls it first thing (ts_session_run). */
ts_status ts_sess_resolve_threads(session *s);

/* summary.json, however the run ended; `error` is NULL on success. */
ts_status ts_sess_write_summary(session *s, const char *status, const char *error);
/* Parameters (elements) of a plan. */
double ts_sess_param_count(const ts_plan *p);

/* ---- feed.c: data ---------------------------------------------------------- */

/* Loads data.source (nothing for synthetic data), splits it, fits the
 * config to it and makes the loader. */
ts_status ts_sess_load_data(session *s);
/* The fixed synthetic batches of the benchmark models (mlp, gpt). */
ts_status ts_sess_make_synthetic(session *s);
/* The batch of `step` (1-based) into s->bx, s->by, the whole global batch. */
ts_status ts_sess_next_batch(session *s, int64_t step);

/* ---- build.c: model and plans ---------------------------------------------- */

/* train.metrics: defaults for the model, checked against it. */
ts_status ts_sess_resolve_metrics(session *s);
/* The graph, the training plan, the evaluation plan and the buffers. */
ts_status ts_sess_build(session *s);

/* ---- shape_feed.c: shape buckets and short batches --------------------------- */

/* The graph of the configured model at lc's batch, compiled with the
 * training plan's options (masked loss under shape.policy bucket). */
ts_status ts_sess_shape_graph(session *s, ts_config *lc, ts_graph **g, ts_model *m,
                              ts_train_spec *spec, ts_compile_options *opt);
/* After the training plan is compiled: the plan cache when batches can
 * have other shapes (shape.policy bucket, data.drop_last false), checked
 * against the model, data parallelism and loss scaling; precompiles
 * with shape.precompile. */
ts_status ts_sess_shape_setup(session *s);
/* Feeds the batch in s->bx, s->by (s->rows real rows) and runs the step:
 * this rank's rows on the one plan, or the bucket that holds them. Sets
 * s->step_loss. */
ts_status ts_sess_step(session *s);
/* The cache's gauges into Prometheus (after a step). */
ts_status ts_sess_shape_observe(session *s);
/* ",\"rows\":..,\"bucket\":..,\"plan_cache\":{...}" for a metrics.jsonl train
 * line; "" without a cache. */
void ts_sess_shape_json(const session *s, char *buf, size_t n);
/* summary.json's "plan_cache" object (a jansson json_t *; NULL without memory). */
struct json_t *ts_sess_shape_summary(const session *s);
/* The log line of the cache after training ("" without a cache). */
void ts_sess_shape_log(session *s);

/* ---- eval.c: evaluation ---------------------------------------------------- */

/* Evaluates split `d`, logs it and writes it to metrics.jsonl and TensorBoard. */
ts_status ts_sess_eval_split(session *s, const char *split, const ts_dataset *d, ts_eval_result *e,
                             int64_t step, int64_t epoch);
/* ZeRO-3 (a plan whose parameters are sharded): a collective of every
 * rank, right before rank 0 evaluates, that assembles each parameter from
 * the ranks' blocks into the eval plan; TS_OK doing nothing otherwise. */
ts_status ts_sess_eval_gather(session *s);

/* ---- observe.c: metrics, TensorBoard, alerts, trace ------------------------ */

ts_status ts_sess_observe_start(session *s);
/* The comm's span hook (ts_comm_set_trace), `user` the session. */
void ts_sess_comm_span(const ts_comm_span *sp, void *user);
ts_status ts_sess_tensorboard_start(session *s);
/* Stops the endpoint and closes the event file (idempotent). */
ts_status ts_sess_observe_end(session *s);
/* Gradient compression after step `step` (compress_obs.c): the bytes
 * exchanged into json (",\"comm_sent_bytes\":..." for metrics.jsonl; "" without
 * compression), Prometheus gauges and TensorBoard scalars. */
ts_status ts_sess_compress_observe(session *s, int64_t step, char *json, size_t n);
/* A plan on a GPU (compile.backend cuda), after step `step` (gpu_obs.c): NVML's
 * utilisation, memory used and power as Prometheus gauges and TensorBoard
 * scalars; nothing on the CPU. */
ts_status ts_sess_gpu_observe(session *s, int64_t step);
ts_status ts_sess_observe_step(session *s, int64_t step, double loss, double lr, double dt,
                               double rate, double *grad_norm);
ts_status ts_sess_alerts_setup(session *s);
ts_status ts_sess_alert_actions(session *s, int64_t step, unsigned act);

/* --trace: a trace of this rank's steps (instructions and collectives),
 * started before the first step and written when training ends: with
 * several ranks each writes FILE.rankR.json, then (after a barrier) rank 0
 * merges them into FILE and removes them. */
struct ts_trace;
ts_status ts_session_trace_start(ts_plan *plan, const ts_session_options *o, int64_t steps,
                                 struct ts_trace **out);
ts_status ts_session_trace_finish(ts_plan *plan, const ts_session_options *o, struct ts_trace *t,
                                  struct ts_progress *pr);
/* Detaches the trace from the plan and the comm and frees it (NULL: nothing). */
void ts_session_trace_close(ts_plan *plan, const ts_session_options *o, struct ts_trace *t);

/* ---- checkpoint.c: checkpoints and resume ---------------------------------- */

/* Begins a checkpoint of the state after `step`. */
/* What a checkpoint after `step` records of the run: its identity, data
 * lineage and the loader's position (step without a loader). */
ts_ckpt_meta ts_sess_ckpt_meta(const session *s, int64_t step);
ts_status ts_sess_save_checkpoint(session *s, int64_t step);
/* The last save of a run (also after Ctrl-C or a failed step `st`); returns
 * the run's status. */
ts_status ts_sess_last_save(session *s, ts_status st);
/* ZeRO checkpoints: this rank's saver of its block of the optimizer state. */
ts_status ts_sess_shard_saver(session *s);
/* Loads the verified checkpoint s->ck into the freshly compiled plan. */
ts_status ts_sess_resume(session *s);

#endif
