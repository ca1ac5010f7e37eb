/* A training run: the loop over the steps and the order of everything
 * around it. The order matters for the promise in session.h: every check
 * that can fail on bad input (config, data, labels, shapes, compile, the
 * run directory's state) runs before the run directory is created. The
 * parts live beside this file (session_internal.h). */
#include "session/session.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "plan/plan_cache.h"
#include "session/pipe_train.h"
#include "session/ranks.h"
#include "session/repro.h"
#include "session/session_internal.h"

ts_session_options ts_session_options_default(void) {
    ts_session_options o = {NULL, NULL, NULL, TS_PROGRESS_LINES, NULL, NULL, NULL,
                            NULL, NULL, NULL};
    return o;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A stop was seen: from now on the ranks' collectives wait at most
 * ckpt.signal_grace_s for a peer (the scheduler's SIGKILL follows then), so
 * a rank that is gone fails the stop at once instead of after
 * dist.timeout_s. Returns the time it was seen. */
static double stop_grace(session *s) {
    const double g = s->c.ckpt.signal_grace;
    if (s->nranks > 1 && s->o->comm && g > 0 &&
        (ts_comm_timeout(s->o->comm) <= 0 || g < ts_comm_timeout(s->o->comm)))
        ts_comm_set_timeout(s->o->comm, g);
    return ts_now();
}

static ts_status train_loop(session *s) {
    ts_session_result *r = s->r;
    const ts_config *c = &s->c;
    const int64_t steps = c->train.steps, bpe = c->batches_per_epoch;
    const double per_step = (double)c->model.batch * (s->gpt ? (double)c->model.ctx : 1.0);
    /* Ranks hold the same weights: rank 0 alone evaluates. */
    const int has_val = s->val && s->val->n > 0 && s->rank == 0;
    const double t_start = ts_now();
    ts_status st = TS_OK;
    /* A stop (SIGTERM from a scheduler, Ctrl-C): when it was first seen and
     * the step whose checkpoint ckpt.on_signal save commits for it. */
    double t_stop = 0;
    int64_t stop_saved = 0;
    /* The data's own fault found during the loop (a batch's bad token, or the lineage's hashing
     * pass that reached it first): a data error like one found before the first step (exit 2),
     * whichever of the two readers meets the bad token first. */
    int bad_data = 0;
    /* A stop requested while the data loaded or the plan compiled. */
    if (s->o->stop && *s->o->stop) {
        r->interrupted = 1;
        ts_progress_log(&s->pr, "stopped before the first step (interrupted)");
    }
    for (int64_t step = s->start_step + 1; step <= steps && !r->interrupted; step++) {
        const int64_t epoch = bpe ? (step - 1) / bpe + 1 : 0;
        const int first = step == s->start_step + 1;
        if (first) r->start_to_first_step = ts_process_age();
        const double lr = ts_plan_lr(s->plan), t0 = ts_now();
        /* The time this step waited for its batch (prefetch: src/data/prefetch.c). */
        const double w0 = s->loader ? ts_loader_wait_seconds(s->loader) : 0;
        st = ts_sess_next_batch(s, step);
        bad_data = st == TS_ERR_FORMAT || st == TS_ERR_INVALID;
        const double wait = s->loader ? ts_loader_wait_seconds(s->loader) - w0 : 0;
        double loss = NAN, agreed;
        int agreed_stop = -1; /* the step's own meetings agreed on the stop flag (repro.h) */
        if (s->pipe) {        /* pipeline stages: this rank's stage (pipe_train.h) */
            if (st == TS_OK) st = ts_sess_pipe_step(s, &loss);
        } else if (s->rp) { /* dist.reproducible: this rank's micro-batches (repro.h) */
            if (st == TS_OK) st = ts_repro_step(s, &loss, &agreed_stop);
        } else {
            if (st == TS_OK) st = ts_sess_step(s); /* shape_feed.c */
            loss = s->step_loss;
        }
        int stop = s->o->stop && *s->o->stop;
        if (stop && !t_stop) t_stop = stop_grace(s);
        agreed = loss;
        if (st == TS_OK && agreed_stop >= 0) { /* what every rank saw, not this rank's flag now */
            ts_session_kill_point();
            stop = agreed_stop;
        } else if (st == TS_OK && s->nranks > 1) {
            st = ts_session_agree(s->o->comm, &agreed, &stop);
        }
        if (stop && !t_stop) t_stop = stop_grace(s);
        /* reproducible and pipelined: already the batch's, in a fixed order */
        if (!s->rp && !s->pipe) loss = agreed;
        const double dt = ts_now() - t0;
        if (st != TS_OK) {
            ts_error_prefix("step %lld", (long long)step);
            if (s->pipe) ts_sess_pipe_explain(s, st); /* which stage each rank runs */
            break;
        }
        if (s->o->after_step &&
            (st = s->o->after_step(s->o->after_step_user, s->plan, step, lr)) != TS_OK) {
            ts_error_prefix("step %lld", (long long)step);
            break;
        }
        /* a short last batch (data.drop_last false) holds s->rows rows */
        const double rate = dt > 0 ? per_step * (double)s->rows / (double)c->model.batch / dt : 0;
        r->steps = step;
        r->final_loss = loss;
        if (first) r->first_loss = loss, r->first_step = dt;
        if (step > s->start_step + 1 && s->n_rates < MAX_RATES) s->rates[s->n_rates++] = rate;
        double gnorm = NAN;
        unsigned alert = 0;
        if (s->ar && (st = ts_alert_runner_step(s->ar, step, &alert)) != TS_OK) {
            ts_error_prefix("step %lld: alerts", (long long)step);
            break;
        }
        if ((st = ts_sess_observe_step(s, step, loss, lr, dt, rate, &gnorm)) != TS_OK ||
            (st = ts_sess_shape_observe(s)) != TS_OK) {
            ts_error_prefix("step %lld", (long long)step);
            break;
        }
        ts_progress_info in = {step, epoch, c->train.epochs, loss, lr, rate};
        ts_progress_step(&s->pr, &in);
        char cj[400]; /* gradient compression's bytes (compress_obs.c), the pipeline's bubble */
        if ((st = ts_sess_compress_observe(s, step, cj, sizeof cj)) != TS_OK) break;
        if ((st = ts_sess_lineage_settle(s, 0)) != TS_OK) break; /* hashed in the background */
        if (s->pipe) {
            if ((st = ts_sess_pipe_observe(s, step)) != TS_OK) break;
            ts_sess_pipe_json(s, cj + strlen(cj), sizeof cj - strlen(cj));
        }
        if ((st = ts_sess_gpu_observe(s, step)) != TS_OK) break;
        if (s->metrics) {
            char b1[32], b2[32], b3[32], b4[32], amp[96] = "", shp[256], data[96] = "";
            ts_sess_shape_json(s, shp, sizeof shp);
            double scale;
            if (ts_plan_loss_scale(s->plan, &scale, NULL, NULL)) /* mixed precision */
                snprintf(amp, sizeof amp, ",\"loss_scale\":%.9g,\"step_skipped\":%d", scale,
                         ts_plan_last_step_skipped(s->plan));
            size_t dl = 0;
            if (s->loader) ts_catf(data, sizeof data, &dl, ",\"data_wait_ms\":%.4f", 1e3 * wait);
            if (first && isfinite(r->start_to_first_step)) /* how soon training began */
                ts_catf(data, sizeof data, &dl, ",\"start_to_first_step_ms\":%.1f",
                        1e3 * r->start_to_first_step);
            fprintf(s->metrics,
                    "{\"type\":\"train\",\"step\":%lld,\"epoch\":%lld,\"loss\":%s,\"lr\":%s,"
                    "\"samples_per_s\":%s,\"grad_norm\":%s%s%s%s%s}\n",
                    (long long)step, (long long)epoch, num(loss, b1, sizeof b1),
                    num(lr, b2, sizeof b2),
                    num(rate / (s->gpt ? (double)c->model.ctx : 1.0), b3, sizeof b3),
                    num(gnorm, b4, sizeof b4), amp, data, shp, cj);
            /* the line reaches the kernel with its step: a run killed with SIGKILL keeps every
             * completed step's line (stdio held up to 4 KiB, about 33 W1 lines, and cut the
             * last), and a running run can be plotted; one write a step, a few microseconds */
            if (fflush(s->metrics) != 0) {
                st = ts_fail(TS_ERR_IO, "step %lld: writing %s/metrics.jsonl failed",
                             (long long)step, r->run_dir);
                break;
            }
        }
        /* A skipped update kept the weights: the run can go on. */
        if (!isfinite(loss) && !(alert & (1u << TS_AA_SKIP | 1u << TS_AA_STOP))) {
            st = ts_fail(TS_ERR_NUMERIC,
                         "step %lld: the loss is %g; lower train.lr, set train.clip_grad_norm, "
                         "or find the first bad value with --set compile.debug_nan=true",
                         (long long)step, loss);
            break;
        }
        if (alert && (st = ts_sess_alert_actions(s, step, alert)) != TS_OK) break;
        if (r->stopped_by_alert) break;
        const int due =
            c->train.eval_every > 0 ? step % c->train.eval_every == 0 : bpe > 0 && step % bpe == 0;
        const int val_due = s->val && s->val->n > 0 && (due || (step == steps && !stop));
        /* ZeRO-3: every rank gives rank 0's evaluation its blocks */
        if (val_due && (st = ts_sess_eval_gather(s)) != TS_OK) break;
        /* pipeline stages: their weights into rank 0's plan before it evaluates or saves */
        if (s->pipe &&
            (due || stop || step == steps || (c->ckpt.every > 0 && step % c->ckpt.every == 0)) &&
            (st = ts_sess_pipe_sync(s)) != TS_OK)
            break;
        if (has_val && val_due) {
            st = ts_sess_eval_split(s, "val", s->val, &r->val, step, epoch);
            if (st != TS_OK) break;
            r->has_val = 1;
        }
        const int save_stop = stop && c->ckpt.on_signal == TS_ON_SIGNAL_SAVE;
        if (s->sv && (step == steps || step % c->ckpt.every == 0 || save_stop) &&
            (st = ts_sess_save_checkpoint(s, step)) != TS_OK)
            break;
        if (s->sv && save_stop) stop_saved = step;
        if (stop) {
            r->interrupted = 1;
            ts_progress_log(&s->pr, "stopped after step %lld of %lld (interrupted)",
                            (long long)step, (long long)steps);
            break;
        }
    }
    if (st == TS_OK) {
        st = ts_sess_lineage_settle(s, 1);
        bad_data = st == TS_ERR_FORMAT || st == TS_ERR_INVALID;
    }
    st = ts_sess_last_save(s, st);
    if (st == TS_OK && stop_saved && s->rank == 0) {
        const double took = ts_now() - t_stop;
        ts_progress_log(&s->pr,
                        "stopped by a signal: the checkpoint of step %lld is committed, %.2f s "
                        "after the stop was seen (ckpt.signal_grace_s %g); resume with --resume "
                        "latest%s",
                        (long long)stop_saved, took, c->ckpt.signal_grace,
                        took > c->ckpt.signal_grace
                            ? " (warning: longer than the grace period: a scheduler would have "
                              "killed the run before it)"
                            : "");
    }
    r->seconds = ts_now() - t_start;
    if (st == TS_OK && s->metrics && (fflush(s->metrics) != 0 || ferror(s->metrics)))
        st = ts_fail(TS_ERR_IO, "writing %s/metrics.jsonl failed", r->run_dir);
    if (st != TS_OK) {
        r->failed_in_step = !bad_data;
        return st;
    }
    if (s->n_rates) {
        qsort(s->rates, (size_t)s->n_rates, sizeof *s->rates, cmp_double);
        r->median_rate = s->rates[s->n_rates / 2];
    } else if (r->steps == s->start_step + 1 && r->seconds > 0) {
        r->median_rate = per_step / r->seconds;
    }
    if (s->test && !r->interrupted && !r->stopped_by_alert &&
        (st = ts_sess_eval_gather(s)) != TS_OK)
        return st;
    if (s->test && !r->interrupted && !r->stopped_by_alert && s->rank == 0) {
        st = ts_sess_eval_split(s, "test", s->test, &r->test, r->steps,
                                bpe ? (r->steps - 1) / bpe + 1 : 0);
        if (st != TS_OK) return st;
        r->has_test = 1;
    }
    return TS_OK;
}

/* ---- the session ---------------------------------------------------------- */

/* What the training log calls the model ("mlp classifier", "gru"). */
static const char *model_label(const session *s) {
    const ts_model_desc *d = ts_model_of(&s->c);
    const char *label = d->label ? d->label : d->name;
    return s->classifier && d->label_clf ? d->label_clf : label;
}

static void header(session *s) {
    const ts_config *c = &s->c;
    ts_plan_stats st;
    ts_plan_get_stats(s->plan, &st);
    char data[256];
    if (s->graph.nodes) /* one example: the graph */
        snprintf(data, sizeof data, "graph of %lld nodes, %lld edges: %lld train, %lld val%s",
                 (long long)s->graph.nodes, (long long)s->graph.edges.n,
                 (long long)s->graph.n_train, (long long)s->graph.n_val, s->test ? ", " : "");
    else if (s->all)
        snprintf(data, sizeof data, "%s data: %lld train, %lld val%s",
                 ts_sess_source_names[c->data.source], (long long)s->train->n, (long long)s->val->n,
                 s->test ? ", " : "");
    else
        snprintf(data, sizeof data, "synthetic data");
    char test[64] = "";
    if (s->test)
        snprintf(test, sizeof test, "%lld test",
                 (long long)(s->graph.nodes ? s->graph.n_test : s->test->n));
    char epochs[96] = "";
    if (c->batches_per_epoch)
        snprintf(epochs, sizeof epochs, " (%.3g epochs of %lld)",
                 (double)c->train.steps / (double)c->batches_per_epoch,
                 (long long)c->batches_per_epoch);
    const double np = s->model_params > 0 ? s->model_params : ts_sess_param_count(s->plan);
    char params[32];
    if (np >= 1e6)
        snprintf(params, sizeof params, "%.2f M", np * 1e-6);
    else
        snprintf(params, sizeof params, "%.0f", np);
    ts_progress_log(&s->pr,
                    "training %s: %s parameters, batch %lld, %lld steps%s; %s%s; plan: %d "
                    "instructions, arena %.1f MiB",
                    model_label(s), params, (long long)c->model.batch, (long long)c->train.steps,
                    epochs, data, test, st.n_instructions,
                    (double)st.arena_bytes / (1024.0 * 1024.0));
    /* data.drop_last true: say what is left out, so no short batch is dropped silently */
    const int64_t left_out = s->all && !s->graph.nodes && c->data.drop_last && c->model.batch > 0
                                 ? s->train->n % c->model.batch
                                 : 0;
    if (left_out)
        ts_progress_log(&s->pr,
                        "data.drop_last: each epoch trains %lld of the %lld training examples; "
                        "its short batch of %lld is dropped (data.drop_last: false trains it)",
                        (long long)(s->train->n - left_out), (long long)s->train->n,
                        (long long)left_out);
    if (s->nranks > 1) /* the count every process of the run chose (docs/config.md) */
        ts_progress_log(&s->pr, "threads per process: %d (%s)", s->threads_used, s->threads_why);
    if (c->peft.targets[0] || c->peft.adapter_after[0] || c->peft.base[0]) {
        double tr, all;
        ts_sess_peft_counts(s->plan, &tr, &all);
        ts_progress_log(&s->pr, "peft: trainable %.0f of %.0f parameters (%.4g %%)%s%s", tr, all,
                        all > 0 ? 100.0 * tr / all : 0.0,
                        c->peft.base[0] ? "; base weights from " : "", c->peft.base);
        if (c->peft.load[0]) ts_progress_log(&s->pr, "peft: LoRA A and B from %s", c->peft.load);
    }
    if (s->pipe) {
        ts_sess_pipe_log(s);
    } else if (s->nranks > 1) {
        /* The host layout the hierarchical collectives see (srun -N 2). */
        char hosts[32] = "";
        if (ts_comm_num_hosts(s->o->comm) > 1)
            snprintf(hosts, sizeof hosts, ", %d hosts", ts_comm_num_hosts(s->o->comm));
        if (c->dist.reproducible) /* repro.h: the two ways the tree is summed */
            ts_progress_log(&s->pr,
                            "data parallel: %d processes (%s%s), dist.reproducible: %d "
                            "micro-batches of %lld rows, %d per process, summed in a fixed tree "
                            "(%s)",
                            s->nranks, ts_comm_transport(s->o->comm), hosts, s->nslices,
                            (long long)(c->model.batch / s->nslices), s->nslices / s->nranks,
                            ts_repro_zero(s) ? "each process's pieces summed across "
                                               "processes, its shard updated from the sums"
                                             : "each process's pieces summed across "
                                               "processes once per step");
        else
            ts_progress_log(&s->pr,
                            "data parallel: %d processes (%s%s), batch %lld per process, "
                            "gradients averaged in buckets of %g MiB",
                            s->nranks, ts_comm_transport(s->o->comm), hosts,
                            (long long)(c->model.batch / s->nranks), c->dist.bucket_mb);
        const double mib = 1024.0 * 1024.0;
        char zs[48] = "", zg[192] = "";
        if (c->dist.zero) snprintf(zs, sizeof zs, ": ZeRO-%d, this rank's shard", c->dist.zero);
        if (st.zero_grad_bytes)
            snprintf(zg, sizeof zg,
                     ": ZeRO-2, buckets of %.1f in the temporaries, at most %.1f at once; this "
                     "rank's shards %.1f",
                     (double)st.zero_grad_bytes / mib, (double)st.zero_grad_peak / mib,
                     (double)st.zero_shard_bytes / mib);
        char ps[160];
        if (st.shared_param_bytes)
            snprintf(ps, sizeof ps, "0.0: shared, below");
        else if (st.zero_param_bytes) /* ZeRO-3: the blocks are in the optimizer state */
            snprintf(ps, sizeof ps,
                     "%.1f: ZeRO-3, buckets of %.1f gathered in the temporaries, at most %.1f at "
                     "once; this rank's blocks %.1f in the state",
                     (double)st.param_bytes / mib, (double)st.zero_param_bytes / mib,
                     (double)st.zero_param_peak / mib,
                     (double)st.zero_param_bytes / mib / (double)s->nranks);
        else
            snprintf(ps, sizeof ps, "%.1f", (double)st.param_bytes / mib);
        ts_progress_log(&s->pr,
                        "per process: arena %.1f MiB (parameters %s, gradients %.1f%s, optimizer "
                        "state %.1f%s, temporaries %.1f)",
                        (double)st.arena_bytes / mib, ps, (double)st.grad_bytes / mib, zg,
                        (double)st.state_bytes / mib, zs, (double)st.temp_bytes / mib);
        if (st.shared_param_bytes)
            ts_progress_log(&s->pr,
                            "shared by the %d processes: parameters %.1f MiB (one copy, each "
                            "process updates its block)",
                            s->nranks, (double)st.shared_param_bytes / mib);
    }
}

static void session_free(session *s) {
    /* no collective may report into the metrics or trace freed below */
    if (s->o && s->o->comm) ts_comm_set_trace(s->o->comm, NULL, NULL);
    if (ts_sess_observe_end(s) != TS_OK)
        ts_progress_log(&s->pr, "tessel: warning: %s", ts_last_error());
    ts_alert_runner_free(s->ar);
    ts_repro_free(s->rp);
    ts_sess_pipe_free(s);
    free(s->replay_json);
    if (s->tm_made) ts_train_metrics_free(&s->tm);
    free(s->gbuf);
    ts_ckpt_saver_free(s->sv);
    ts_ckpt_saver_free(s->asv);
    if (s->audit && ts_audit_close(s->audit) != TS_OK)
        ts_progress_log(&s->pr, "tessel: warning: audit.log: %s", ts_last_error());
    ts_ckpt_close(s->ck);
    free(s->ident);
    free(s->lineage);
    if (s->metrics) fclose(s->metrics);
    ts_dir_lock_release(&s->lock); /* after the last write into the run directory */
    ts_dir_close(&s->dir);
    ts_loader_free(s->loader);
    ts_dataset_free(s->all);
    ts_dataset_free(s->train);
    ts_dataset_free(s->val);
    ts_dataset_free(s->test);
    for (int i = 0; i < s->n_synth; i++) free(s->sx[i]), free(s->sy[i]);
    ts_session_trace_close(s->plan, s->o, s->trace);
    ts_plan_cache_free(s->cache); /* gives s->plan its own program back */
    ts_plan_free(s->plan);
    free(s->pad_x);
    free(s->pad_y);
    free(s->mask);
    free(s->valid);
    ts_plan_free(s->eval);
    ts_metric_acc_free(&s->macc);
    ts_zoo_graph_free(&s->graph);
    ts_zoo_dice_free(&s->dice);
    ts_graph_free(s->g);
    free(s->bx);
    free(s->by);
    free(s->bout);
    free(s->pbuf);
    free(s->rates);
}

static ts_status setup(session *s) {
    ts_status st = ts_sess_load_data(s);
    if (st != TS_OK) return st;
    s->binary = ts_zoo_binary(&s->c);
    s->classifier = s->gpt || (s->c.model.classes > 0 && !s->binary);
    if ((st = ts_sess_resolve_metrics(s)) != TS_OK) return st;
    if (!s->all && ts_zoo_model(&s->c) && (st = ts_zoo_synth_val(&s->c, &s->val)) != TS_OK)
        return st;
    const int pipe = s->c.pipe.stages > 1;
    if ((st = pipe ? ts_sess_pipe_resolve(s) : ts_repro_resolve(s)) != TS_OK) return st;
    if ((st = ts_sess_build(s)) != TS_OK) return st;
    if (pipe && (st = ts_sess_pipe_setup(s)) != TS_OK) return st;
    if ((st = ts_sess_peft_load_base(s)) != TS_OK) return st;
    if ((st = pipe ? ts_sess_pipe_alerts(s) : ts_sess_alerts_setup(s)) != TS_OK) return st;
    if (!pipe && (st = ts_repro_setup(s)) != TS_OK) return st;
    if (!s->all && (st = ts_sess_make_synthetic(s)) != TS_OK) return st;
    int64_t cap = s->c.train.steps < MAX_RATES ? s->c.train.steps : MAX_RATES;
    if (!(s->rates = ts_alloc(sizeof(double) * (size_t)(cap + 1), "step rates")))
        return TS_ERR_NOMEM;
    /* An imported model's file (model.onnx) is part of the lineage too. */
    const int model_file = s->c.model.onnx[0] && s->c.model.onnx_sha256[0];
    const int n =
        (s->all ? s->all->n_lineage : 0) + (s->test ? s->test->n_lineage : 0) + model_file;
    if (n && !(s->lineage = ts_alloc(sizeof *s->lineage * (size_t)n, "data lineage")))
        return TS_ERR_NOMEM;
    for (int k = 0; k < 2; k++) {
        const ts_dataset *d = k ? s->test : s->all;
        for (int i = 0; d && i < d->n_lineage; i++)
            s->lineage[s->n_lineage++] =
                (ts_ckpt_data_file){d->lineage[i].path, d->lineage[i].sha256};
    }
    if (model_file)
        s->lineage[s->n_lineage++] = (ts_ckpt_data_file){s->c.model.onnx, s->c.model.onnx_sha256};
    if ((st = ts_sess_identity(s)) != TS_OK) return st;
    return ts_repro_manifest(s);
}

ts_status ts_session_run(const ts_config *c, const ts_session_options *o, ts_session_result *r) {
    if (!c || !r) return ts_fail(TS_ERR_INVALID, "session: NULL argument");
    ts_session_options dflt = ts_session_options_default();
    if (!o) o = &dflt;
    memset(r, 0, sizeof *r);
    r->first_loss = r->final_loss = r->median_rate = NAN;
    r->start_to_first_step = r->first_step = NAN;
    if (!c->finished) return ts_fail(TS_ERR_INVALID, "session: call ts_config_finish first");
    session *s = ts_zalloc(sizeof *s, "session");
    if (!s) return TS_ERR_NOMEM;
    s->c = *c;
    s->o = o;
    s->r = r;
    s->dir.fd = -1;
    s->lock.slot = -1;
    s->nranks = o->comm ? ts_comm_size(o->comm) : 1;
    s->rank = o->comm ? ts_comm_rank(o->comm) : 0;
    /* A language model: always a classifier, its rates in tokens. */
    s->gpt = (ts_model_of(c)->flags & TS_MODEL_LM) != 0;
    r->unit = ts_model_of(c)->unit;
    const char *dir = o->out_dir && *o->out_dir ? o->out_dir : c->output.dir;
    const char *from = o->resume && *o->resume ? o->resume : NULL;
    s->resume_in_place = from && !strcmp(from, "latest");
    /* first: a collective on several ranks, before any check that may fail on one alone */
    ts_status st = ts_sess_resolve_threads(s);
    if (st == TS_OK && dir[0]) {
        if (snprintf(r->run_dir, sizeof r->run_dir, "%s", dir) >= (int)sizeof r->run_dir ||
            snprintf(s->c.output.dir, sizeof s->c.output.dir, "%s", dir) >=
                (int)sizeof s->c.output.dir)
            st = ts_fail(TS_ERR_INVALID, "run directory '%.60s...': path too long", dir);
        if (st == TS_OK) st = ts_sess_open_run_dir(s, dir);
    } else if (st == TS_OK && s->resume_in_place) {
        st = ts_fail(TS_ERR_INVALID, "--resume latest continues a run in its directory: name it "
                                     "with --out RUN_DIR or output.dir");
    } else if (st == TS_OK && c->ckpt.every > 0 && !o->shard_dir) {
        st = ts_fail(TS_ERR_INVALID, "ckpt.every needs a run directory for the checkpoints "
                                     "(--out RUN_DIR or output.dir)");
    }
    if (st == TS_OK) st = ts_zoo_check_procs(c, s->nranks);
    if (st == TS_OK && c->pipe.stages <= 1 && c->model.batch % s->nranks)
        st = ts_fail(TS_ERR_INVALID,
                     "model.batch %lld does not divide by %d processes: every rank trains on "
                     "model.batch / processes rows of each batch",
                     (long long)c->model.batch, s->nranks);
    /* The key files (sign_key private, of this user, not a link) and the metrics ports of
     * every rank, before anything is written. */
    if (st == TS_OK) st = ts_config_check_run(c, s->rank, s->nranks);
    /* The key a resumed checkpoint must be signed with: verify_key's file, none, or by
     * default the public half of this run's own signing key. */
    char own_key[73];
    const char *verify_key = NULL;
    if (st == TS_OK) {
        const char *path = NULL;
        ts_cfg_verify how = ts_config_verify_key(c, &path);
        if (how == TS_CFG_VERIFY_FILE) verify_key = path;
        if (how == TS_CFG_VERIFY_OWN) {
            st = ts_ckpt_public_key_of(path, own_key);
            if (st != TS_OK) ts_error_prefix("ckpt.sign_key");
            verify_key = own_key;
        }
    }
    /* Verify the checkpoint (signature, file hashes, tensor CRCs) before
     * anything else is loaded or written. */
    if (st == TS_OK && from && !s->from_start) {
        st = ts_ckpt_open(s->resume_in_place ? dir : from, verify_key, NULL, &s->ck);
        if (st != TS_OK) ts_error_prefix("--resume %s", from);
    }
    ts_progress_start(&s->pr, o->log, o->progress, 1, 0, r->unit, 1);
    if (st == TS_OK) st = setup(s);
    if (st == TS_OK && s->from_start) st = ts_sess_check_from_start(s);
    if (st == TS_OK && s->ck) st = ts_sess_resume(s);
    if (st == TS_OK && s->pipe) st = ts_sess_pipe_load(s); /* s->plan's values into the stage */
    if (st == TS_OK) st = ts_sess_shard_saver(s);
    if (st == TS_OK) {
        r->planned_steps = s->c.train.steps;
        ts_progress_start(&s->pr, o->log, o->progress, s->c.train.steps, s->c.train.log_every,
                          r->unit,
                          (double)s->c.model.batch * (s->gpt ? (double)s->c.model.ctx : 1.0));
        header(s);
        if (s->ck)
            ts_progress_log(&s->pr, "resuming from %s at step %lld", s->ck_dir,
                            (long long)s->start_step);
        if (s->from_start)
            ts_progress_log(&s->pr, "resuming from step 0: %s holds no checkpoint yet",
                            s->dir.path);
        st = ts_sess_observe_start(s);
        if (st == TS_OK && r->run_dir[0]) st = ts_sess_write_run_files(s);
        if (st == TS_OK) st = ts_sess_tensorboard_start(s);
        if (st == TS_OK && s->ar)
            ts_alert_runner_attach(s->ar, &s->pr, s->tm_made ? &s->tm : NULL, s->tb, s->audit,
                                   r->run_dir);
    }
    if (st == TS_OK && o->trace)
        st = ts_session_trace_start(s->plan, o, s->c.train.steps, &s->trace);
    if (st == TS_OK && o->comm && (s->trace || s->tm_made))
        ts_comm_set_trace(o->comm, ts_sess_comm_span, s);
    if (st == TS_OK) {
        st = train_loop(s);
        if (st == TS_OK && s->trace) {
            st = ts_session_trace_finish(s->plan, o, s->trace, &s->pr);
            if (st != TS_OK) r->failed_in_step = 1;
        }
        /* The endpoint stops and the events are flushed when training ends. */
        ts_status oe = ts_sess_observe_end(s);
        if (st == TS_OK && oe != TS_OK) {
            st = oe;
            r->failed_in_step = 1;
        }
        ts_progress_end(&s->pr);
        ts_sess_shape_log(s);
        char waits[512];
        ts_repro_waits(s->rp, waits, sizeof waits);
        if (waits[0]) ts_progress_log(&s->pr, "%s", waits);
        /* A failed run reports how far it got, not a summary: its rate was
         * never computed (the error follows). */
        if (st == TS_OK)
            ts_progress_log(&s->pr, "done: %lld steps in %.2f s, loss %.6f -> %.6f, median %.0f %s",
                            (long long)r->steps, r->seconds, r->first_loss, r->final_loss,
                            r->median_rate, r->unit);
        else if (r->steps)
            ts_progress_log(&s->pr, "failed after %lld steps in %.2f s, loss %.6f -> %.6f",
                            (long long)r->steps, r->seconds, r->first_loss, r->final_loss);
        if (st != TS_OK) {
            /* The run's own error is what the caller needs to see, even if
             * the summary cannot be written either. */
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", ts_last_error());
            if (ts_sess_write_summary(s, "failed", msg) != TS_OK)
                ts_progress_log(&s->pr, "tessel: warning: %s", ts_last_error());
            ts_fail(st, "%s", msg);
        } else if ((st = ts_sess_write_summary(s,
                                               r->stopped_by_alert ? "stopped_by_alert"
                                               : r->interrupted    ? "interrupted"
                                                                   : "completed",
                                               NULL)) != TS_OK) {
            r->failed_in_step = 1;
        }
    }
    if (st != TS_OK && !s->dir_made) r->run_dir[0] = 0;
    session_free(s);
    free(s);
    return st;
}
