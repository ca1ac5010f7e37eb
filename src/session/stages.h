/* stages.h — one pipeline stage of a training run (dist.pipeline_stages;
 * docs/distributed.md "Pipeline stages"), on the rank of a comm whose
 * size is the stage count.
 *
 *     ts_stage *st;
 *     if (ts_stage_new(&c, comm, &st) != TS_OK) ...        // rank r runs stage r
 *     const char *names[2] = {"tokens", "targets"};
 *     const void *data[2] = {tokens, targets};              // the whole batch
 *     for (...) ts_stage_step(st, 2, names, data);          // every stage, every step
 *     ts_plan_read(ts_stage_plan(st), "h.0.attn.c_attn.weight", ...);
 *     ts_stage_free(st);
 *
 * Each stage compiles its part of the training graph (partition_stage.c)
 * into one plan whose step runs in pieces: the forward of a micro-batch
 * (instructions before the first reader of the received gradient), its
 * backward, and after the last micro-batch the update. The bytes a
 * backward reads are saved after its forward and put back before it, so
 * forwards of later micro-batches may run in between (1F1B keeps at most
 * S - s, GPipe M). Gradients are summed over the micro-batches in the
 * fixed tree of dist.reproducible (dist/repro_sum.h) and divided by M, so
 * the weights are those of one process with dist.reproducible and
 * dist.microbatch = model.batch / M. A parameter two stages read (a tied
 * embedding) is held by both: the later stage sends its share of each
 * micro-batch's gradient to the earlier one, which adds it to its own
 * (the sum the whole graph forms, a + b = b + a exactly), sums the tree,
 * and sends the result back, so both copies take the same update. */
#ifndef TS_SESSION_STAGES_H
#define TS_SESSION_STAGES_H

#include "tessel/config.h"
#include "tessel/dist.h"
#include "tessel/models.h"
#include "tessel/pipeline.h"
#include "tessel/plan.h"

/* The model as the stages see it: built at one micro-batch's rows. */
typedef struct ts_stage_model {
    ts_graph *g;
    ts_model m;
    ts_train_spec spec;
    ts_compile_options opt;
} ts_stage_model;

/* The partition of c's model (measured: every stage's speeds, or NULL to
 * measure this process's); sm gets the forward graph (the caller frees
 * sm->g). */
ts_status ts_stage_partition(ts_config *c, const ts_device_speed *measured, int n_measured,
                             ts_stage_model *sm, ts_partition **out);

typedef struct ts_stage ts_stage;

/* Stage ts_comm_rank(comm) % S of c's model (S = dist.pipeline_stages) in
 * replica ts_comm_rank(comm) / S: comm's size must be S x D, D replicas of
 * every stage (data parallelism: each replica trains on its model.batch / D
 * rows of the batch and the replicas of a stage add their gradients, see
 * replicas_sum in stages_run.c; with dist.zero 1 each replica keeps the
 * optimizer state of its block of the stage's parameters and the replicas
 * all-gather them after the update). Collective over the comm (the devices'
 * speeds are measured by each and exchanged when dist.devices is measure). */
ts_status ts_stage_new(ts_config *c, ts_comm *comm, ts_stage **out);
/* One training step over the whole batch: data[i] holds model.batch rows
 * of the input named names[i] (each stage feeds those its plan has). */
ts_status ts_stage_step(ts_stage *st, int n, const char *const *names, const void *const *data);
/* The mean loss of the last step's micro-batches (the last stage; NaN on
 * the others). */
double ts_stage_loss(const ts_stage *st);
ts_plan *ts_stage_plan(ts_stage *st);
const ts_partition *ts_stage_partition_of(const ts_stage *st);

/* Where the last step's time went on this stage, in seconds. */
typedef struct ts_stage_times {
    double step, forward, backward, update, wait; /* wait: for messages */
    double start;       /* when the step began (CLOCK_MONOTONIC seconds) */
    double cpu;         /* the process's CPU seconds in the step */
    size_t stash_bytes; /* saved per micro-batch in flight */
} ts_stage_times;
void ts_stage_last_times(const ts_stage *st, ts_stage_times *t);
/* The last step on this stage as a timeline, each piece of work and each
 * wait in the order it happened (bench/pipeline.c prints the stages'
 * side by side). `what` is one of: "F", "B" (a micro-batch's forward,
 * backward), "FB" (both, on the last stage), "wait act", "wait grad",
 * "wait share", "wait sum", "wait replica" (for a message: an activation,
 * its gradient, a shared parameter's share or summed gradient, a
 * replica's sum), "wait sends" (for this stage's sends to finish),
 * "stash", "restore" (saving and putting back a backward's inputs),
 * "send" (copies into send buffers), "sum" (the gradient tree and the
 * shared parameters' adds), "norm", "clip", "update". Times are
 * CLOCK_MONOTONIC seconds, which the processes of one host share; cpu is
 * the process's CPU seconds in the piece (every thread's, and the little
 * between it and the piece before: what a loaded machine does not
 * stretch); mb is -1 for pieces of no micro-batch. */
typedef struct ts_stage_event {
    const char *what;
    int mb;
    double t0, t1;
    double cpu;
} ts_stage_event;
int ts_stage_timeline(const ts_stage *st, const ts_stage_event **events);
/* The host memory the stage holds outside its plan's arena: saved
 * activations of the micro-batches in flight, the send buffers, the
 * gradient sums (the most partial sums the fixed trees over the
 * micro-batches and over the replicas keep at once, and the replicas'
 * sums). */
size_t ts_stage_buffer_bytes(const ts_stage *st);
/* The elements of the model's parameters this stage holds (a parameter two
 * stages hold counted by the earlier one; pipe.in left out): the stages'
 * counts add up to the model's. */
double ts_stage_param_count(const ts_stage *st);
/* The squares of the last step's gradients of this stage's parameters,
 * summed before the update (a parameter two stages hold counted by the
 * earlier one; pipe.in's gradient left out): the stages' values add up to
 * the squared global norm. */
double ts_stage_grad_sq(const ts_stage *st);
/* This rank's stage; *replica of *replicas (data parallelism: rank =
 * replica x stages + stage). */
int ts_stage_index(const ts_stage *st, int *replica, int *replicas);
/* A slowed stage (bench/pipeline.c: a device of 1/factor the speed): after
 * each piece of its step it sleeps (factor - 1) times the piece's time. */
void ts_stage_set_slowdown(ts_stage *st, double factor);
void ts_stage_free(ts_stage *st);

/* Checkpoints: each stage saves its plan (parameters, optimizer state,
 * step count) as a standard checkpoint in RUN/stage-<s>/step-N (LATEST
 * names the newest); load restores the newest into a stage built from the
 * same config, so a killed pipeline resumes bit-exactly. */
/* Not for a stage with dist.zero 1 and replicas (TS_ERR_UNSUPPORTED). */
ts_status ts_stage_save(ts_stage *st, const char *run_dir);
ts_status ts_stage_load(ts_stage *st, const char *run_dir);

#endif
