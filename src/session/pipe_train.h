/* pipe_train.h — tessel train with pipeline stages (dist.pipeline_stages;
 * docs/distributed.md "Pipeline stages"): the session's side of
 * session/stages.h (internal to src/session).
 *
 * Every rank runs one stage (rank = replica x S + stage) and compiles and
 * allocates only that stage: its s->plan is the stage's plan. Rank 0
 * alone also keeps a whole-model plan as s->plan, which no step runs, when
 * the run needs the weights in the usual logical layout there: for
 * checkpoints (ckpt.every), evaluation (a validation or test split) or an
 * after_step callback. The stages' values are copied into it before
 * those, and out of it into rank 0's stage at the start. A stage starts
 * from the values one process gives its parameters (they are initialised
 * by name); on --resume every rank reads its stage's tensors from the
 * checkpoint (ts_sess_pipe_restore), which one process or stages wrote.
 * With dist.zero 1 and replicas each replica's plan holds only its block of
 * the stage's optimizer state; the blocks travel as pieces of the logical
 * tensors (pipe_zero.c), so the whole-model plan and checkpoints do not
 * change.
 *
 *     ts_sess_pipe_resolve(s);   // before ts_sess_build: checks, s->nslices
 *     ts_sess_pipe_setup(s);     // after it: the stage (collective)
 *     ts_sess_pipe_load(s);      // after a resume: s->plan into the stage
 *     ts_sess_pipe_step(s, &loss);
 *     ts_sess_pipe_sync(s);      // the stages' values into rank 0's s->plan
 */
#ifndef TS_SESSION_PIPE_TRAIN_H
#define TS_SESSION_PIPE_TRAIN_H

#include <jansson.h>
#include "session/session_internal.h"
#include "session/stages.h"

/* The pipeline's part of a session (pipe_train.c, pipe_hold.c). */
struct ts_sess_pipe {
    ts_stage *st;
    int S, D, M;
    double pred_step, pred_bubble;
    double bubble, bubble_sum, grad_norm;
    double overhead, overhead_sum; /* step time in neither kernels nor waits */
    int defaults_off;              /* alerts.defaults was on: its rules are not run */
    int64_t n_bubble;
    ts_metric *gauge[2];
    int alias; /* s->plan is the stage's plan: this rank holds no whole-model plan */
    /* per rank (rank order), bytes: the stage's arena, the stage's buffers
     * outside it, the whole-model plan's arena, the evaluation plan's arena,
     * the stage's optimizer state (inside its arena; 1/D of it with ZeRO-1)
     * (pipe_hold.c) */
    double *mem;
};

/* A pipelined run (dist.pipeline_stages > 1): checks the combinations it
 * supports (naming the key of one it does not) and sets s->nslices to the
 * micro-batches of the whole batch (dist.microbatches x replicas). */
ts_status ts_sess_pipe_resolve(session *s);
/* Whether this rank compiles the whole-model plan (see above); the same
 * answer on every rank for whether rank 0 does (ts_sess_pipe_whole_wanted). */
int ts_sess_pipe_holds_whole(const session *s);
int ts_sess_pipe_whole_wanted(const session *s);
/* dist.zero 1 with more than one replica: each replica of a stage keeps
 * the optimizer state of its block of the stage's parameters. */
int ts_sess_pipe_zero(const session *s);
/* s->plan is this rank's stage plan (no whole-model plan here). */
int ts_sess_pipe_alias(const session *s);
/* --resume on a rank whose s->plan is its stage: the stage's parameters
 * and optimizer state from the checkpoint s->ck by name (the logical
 * tensors), its step count, after the checks ts_ckpt_restore makes for
 * them (seed, dtype, shape). */
ts_status ts_sess_pipe_restore(session *s);
/* After the stage is made (collective): every rank's memory into
 * s->pipe->mem and the model's parameter count into s->model_params. */
ts_status ts_sess_pipe_memory(session *s);
/* The values a stage's plan keeps between steps that the whole model has:
 * all but the received activation (pipe.in) and its optimizer state. */
int ts_sess_pipe_own_value(const char *name);
/* ZeRO-1 inside a stage (pipe_zero.c): whether a stage plan's value is a
 * block of sharded optimizer state ("zero.bucket<b>.<what>"), and each
 * piece of this replica's blocks as part of a logical tensor: fn gets the
 * logical name ("<param>.<what>"), the piece's bytes in the plan, and
 * their byte offset and count in the logical tensor (it may write them). */
int ts_sess_pipe_is_shard(const char *name);
typedef ts_status (*ts_sess_pipe_piece_fn)(void *user, const char *logical, unsigned char *at,
                                           size_t off, size_t bytes);
ts_status ts_sess_pipe_shards_each(ts_plan *sp, ts_sess_pipe_piece_fn fn, void *user);
/* The summary's per-rank memory (new reference) and the log's line. */
json_t *ts_sess_pipe_memory_json(const session *s);
void ts_sess_pipe_memory_log(session *s);
ts_status ts_sess_pipe_setup(session *s);
ts_status ts_sess_pipe_load(session *s);
/* One step of every stage over s->bx, s->by; *loss is the last stages'
 * mean loss (replica order), the same on every rank. */
ts_status ts_sess_pipe_step(session *s, double *loss);
ts_status ts_sess_pipe_sync(session *s);
/* The last step's global gradient norm (every stage's, before clipping). */
double ts_sess_pipe_grad_norm(const session *s);
/* ",\"bubble\":...,\"bubble_predicted\":..." for the metrics line. */
void ts_sess_pipe_json(const session *s, char *buf, size_t n);
/* The summary's "pipeline" object (new reference). */
json_t *ts_sess_pipe_summary(const session *s);
/* Alerts under stages: the gradient monitors are compiled into the
 * whole-model plan, which no step runs, so explicit alerts.rules are
 * refused and the default rules are not run (the header says so). */
ts_status ts_sess_pipe_alerts(session *s);
/* The header's line: stages, replicas, cuts, prediction. */
void ts_sess_pipe_log(session *s);
/* Publishes the last step's bubble (Prometheus gauge, TensorBoard). */
ts_status ts_sess_pipe_observe(session *s, int64_t step);
/* Appends to the last error which stage each rank runs (a failed step
 * names the rank that died). */
void ts_sess_pipe_explain(const session *s, ts_status st);
void ts_sess_pipe_free(session *s);

#endif
