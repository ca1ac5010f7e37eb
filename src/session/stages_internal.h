/* stages_internal.h — the state of one pipeline stage, shared by the
 * files of src/session/stages*.c (internal; the API is session/stages.h). */
#ifndef TS_SESSION_STAGES_INTERNAL_H
#define TS_SESSION_STAGES_INTERNAL_H

#include "dist/repro_sum.h"
#include "plan/stages.h"
#include <time.h>
#include "session/stages.h"

enum {
    TAG_ACT = 1,
    TAG_GRAD = 2,
    TAG_SHARE = 3,
    TAG_SHARED_SUM = 4,
    TAG_REPLICA = 5,
    MAX_SHARED = 16
};

/* A contiguous piece of the stage's gradient region that the micro-batch
 * tree sums (stages_sum.c). */
typedef struct grad_piece {
    size_t off, n; /* floats into the region */
    ts_tree_sum t;
} grad_piece;

/* A parameter this stage holds together with one other stage. */
typedef struct shared_param {
    char name[128];
    int peer, owner; /* the other stage; 1: this stage sums (the earlier one) */
    unsigned char *grad;
    size_t bytes;
    unsigned char *bufs; /* owner: one receive buffer; else one send buffer per micro-batch */
} shared_param;

struct ts_stage {
    ts_comm *comm;
    int s, S, M, last;
    int d, D, base; /* replica d of D (data parallel); rank of its stage 0 */
    ts_pipe_schedule kind;
    ts_partition *part;
    ts_plan *plan;
    int k, gate, n_ins;
    unsigned char *in_at, *gin_at, *out_at, *gout_at;
    size_t in_bytes, out_bytes;
    ts_plan_range *ranges;
    int n_ranges, n_slots;
    size_t stash_bytes;
    unsigned char *stash;                /* n_slots * stash_bytes */
    unsigned char *act_send, *grad_send; /* M messages each */
    ts_comm_req *reqs;                   /* sends in flight this step */
    ts_comm_req **pending;
    int n_pending, cap_pending;
    float *grad;
    size_t ngrad;
    /* the gradient region less the later holder's copies of shared
     * parameters (whose sum the earlier holder forms and sends back): the
     * pieces the micro-batch tree sums, nsum floats in all */
    grad_piece pieces[MAX_SHARED + 1];
    int n_pieces;
    size_t nsum;
    shared_param shared[MAX_SHARED];
    int n_shared;
    float *dp_buf; /* D > 1: every replica's sum of this stage's gradients */
    /* dist.zero 1 with D > 1: the stage's replicas (rank s, S + s, ...) as
     * one comm, over which the plan updates its block of the parameters and
     * all-gathers them (ZeRO-1 inside the stage) */
    ts_comm *group;
    ts_tree_sum dpsum; /* D > 1: the replicas' sums, in replica order */
    double loss;
    /* train.clip_grad_norm (stages_clip.c): the model's parameters' squared
     * norms, each stage parameter's place among them (-1: not counted) */
    double max_norm, *clip_v;
    int n_all, *clip_idx;
    float clip_coef;
    double grad_sq;  /* the last step's, before the update (ts_stage_grad_sq) */
    double slowdown; /* > 1: sleep (slowdown - 1) x each piece's time after it */
    ts_stage_times t;
    ts_stage_event *ev; /* the last step's timeline (ts_stage_timeline) */
    int n_ev, cap_ev;
    double cpu_last; /* the process's CPU time at the last piece's end */
};

/* The process's CPU time in seconds (every thread's; the figure a loaded
 * machine does not stretch the way it stretches wall time). */
static inline double ts_stage_cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Adds a piece of the step to its timeline (dropped past the capacity,
 * which setup sizes for every piece a step makes), as it ends: its CPU
 * time is the process's since the previous piece ended (the pieces follow
 * each other; what little runs between two goes to the later). */
static inline void ts_stage_mark(ts_stage *st, const char *what, int mb, double t0, double t1) {
    const double c = ts_stage_cpu_now();
    if (st->n_ev < st->cap_ev)
        st->ev[st->n_ev++] = (ts_stage_event){what, mb, t0, t1, c - st->cpu_last};
    st->cpu_last = c;
}

/* The comm rank of this replica's stage t. */
static inline int ts_stage_rank_of(const ts_stage *st, int t) {
    return st->base + t;
}

/* Clipping by the global norm across stages (stages_clip.c): setup after
 * the plan and the shared parameters (whole: the model's forward graph,
 * whose parameter order is one process's), then each step after the
 * gradients are final and before the update. */
ts_status ts_stage_clip_setup(ts_stage *st, const ts_graph *whole, double max_norm);
ts_status ts_stage_clip(ts_stage *st);
/* The squares of this stage's gradients now, summed (the log's gradient
 * norm; ts_stage_grad_sq keeps the last step's). */
double ts_stage_grad_sq_now(ts_stage *st);

/* The micro-batches' gradient sum (stages_sum.c): setup after the shared
 * parameters are found; after each micro-batch's backward (in micro-batch
 * order) ts_stage_sum_add puts its gradients into the tree, and the last
 * one's also finishes it in the same pass: the sum / M into the gradients
 * (one replica), or the replica's sum into its slot of dp_buf (D > 1). */
ts_status ts_stage_sum_setup(ts_stage *st);
ts_status ts_stage_sum_add(ts_stage *st, int mb);
void ts_stage_sum_free(ts_stage *st);

#endif
