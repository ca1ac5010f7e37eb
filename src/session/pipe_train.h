/* pipe_train.h — tessel train with pipeline stages (dist.pipeline_stages;
 * docs/distributed.md "Pipeline stages"): the session's side of
 * session/stages.h (internal to src/session).
 *
 * Every rank runs one stage (rank = replica x S + stage) and also keeps
 * the session's whole-model plan s->plan, which no step runs: it holds the
 * weights in the usual logical layout for checkpoints, evaluation and the
 * test split. The stages' values are copied into it (rank 0's) before
 * those, and out of it into the stages at the start (a fresh run's
 * initial values, or a checkpoint of any run: one process or stages).
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

/* A pipelined run (dist.pipeline_stages > 1): checks the combinations it
 * supports (naming the key of one it does not) and sets s->nslices to the
 * micro-batches of the whole batch (dist.microbatches x replicas). */
ts_status ts_sess_pipe_resolve(session *s);
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
