/* repro.h — dist.reproducible in a training session: every batch cut into
 * micro-batches of dist.microbatch rows, whatever the process count, each
 * run through the plan on its own, their gradients (and the BatchNorm
 * statistics and losses) summed in one fixed tree over the micro-batch
 * indices. docs/reproducibility.md explains the scheme.
 *
 *     ts_repro_resolve(s);     // before the plan is built: s->nslices, refusals
 *     ts_repro_setup(s);       // after the plan and the alerts: buffers, the gate
 *     ts_repro_step(s, &loss, &stop); // instead of feeding the rows and ts_plan_step
 *     ts_repro_free(s->rp);
 *
 * Micro-batch i of a batch is its rows i*m .. (i+1)*m - 1; with N processes
 * rank r runs the k = M/N consecutive micro-batches r*k .. (r+1)*k - 1 on a
 * plan without an all-reduce, sums them in its pieces of the tree
 * (dist/repro_sum.h), and the ranks finish the tree once per step
 * (dist/repro_gather.h). */
#ifndef TS_SESSION_REPRO_H
#define TS_SESSION_REPRO_H

#include "session/session_internal.h"

/* 1 when the plan is compiled for this rank alone (no all-reduce): dist.reproducible on more
 * than one process. Each rank then runs a run of consecutive micro-batches, and the tree is
 * finished across ranks by dist/repro_gather.h. */
int ts_repro_local(const session *s);

/* 1 for dist.reproducible with dist.zero 1 or 2 on more than one process: the plan is compiled
 * with the comm for its sharded update (ts_compile_options.zero_summed_grads) but reduces no
 * gradients; the tree is summed as for ts_repro_local, whole, on every rank, and each rank
 * updates its shard of the parameters from it. ZeRO-2 then keeps the gradients whole too. */
int ts_repro_zero(const session *s);

/* Without dist.reproducible: s->nslices = s->nranks. With it: resolves
 * dist.microbatch (0: model.batch / 4, / 2 or / 1, the first that
 * divides), sets s->nslices to the micro-batch count, and refuses a process
 * count that cannot share them (naming the counts that can), ZeRO and a
 * micro-batch size that does not divide model.batch. */
ts_status ts_repro_resolve(session *s);

/* Allocates the sums and puts the micro-batch gate in front of the
 * plan's update gate (after the alerts set theirs). With fp16 loss scaling
 * the skip decision and the scale update are made once per batch, on the
 * summed gradients. */
ts_status ts_repro_setup(session *s);

/* One training step over the batch in s->bx / s->by: this rank's
 * micro-batches, then the update; *loss is the batch's mean loss, the same
 * bits on every rank and for every process count. Where the ranks finish
 * the tree on shm (the split finish), each rank's stop flag (s->o->stop, read
 * as its micro-batches are done) rides on the finish's last meeting and
 * *stop is whether any rank's was set, the same on every rank: the session
 * needs no agreement of its own (ranks.h). Elsewhere *stop is -1. */
ts_status ts_repro_step(session *s, double *loss, int *stop);

/* The L2 norm of the batch's gradients after the step (the plan's gradient
 * monitors saw the last micro-batch only), in a fixed order: the same bits
 * for every process count (session/repro_norm.h). On more than one process
 * it was taken as the step's last pass wrote the gradients. */
ts_status ts_repro_grad_norm(struct ts_repro *r, double *norm);

/* buf = one line saying how long each rank waited at the split finish's meetings (the
 * meetings where it arrived first, their wall time, its naps), "" without them: which rank
 * holds up which (docs/reproducibility.md, "Cost", session 15). Read at the end of the run. */
void ts_repro_waits(const struct ts_repro *r, char *buf, size_t n);

/* Copies the batch's gradients into the plan's own region where the ranks finished the tree
 * into a region they share, which the update reads (the plan's region is stale then): before
 * reading gradients by name (ts_plan_read of "grad:..."). Nothing to do otherwise. */
void ts_repro_sync_grads(struct ts_repro *r);

/* s->replay_json: what `tessel audit replay` needs, recorded in every
 * manifest as "replay": the tessel version and the SHA-256 of the running
 * binary (its build), the config text the manifest's config_sha256 is the
 * hash of, and the batch layout (model.batch, micro-batches and their rows,
 * processes). With or without dist.reproducible. */
ts_status ts_repro_manifest(session *s);

void ts_repro_free(struct ts_repro *r);

#endif
