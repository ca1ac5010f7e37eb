/* Evaluation: every example of a split through the inference plan, with
 * the training plan's parameters copied in; loss, accuracy or mse and the
 * metrics of train.metrics, logged, written to metrics.jsonl and
 * TensorBoard. See session_internal.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "models/fusion_mask.h"
#include "session/session_internal.h"

/* ZeRO-3 (dist.zero 3): no rank holds a parameter whole between steps,
 * each holds the pieces of its blocks (ts_plan_shard_layout). Every rank
 * writes its pieces into a zeroed copy of the parameter and the ranks
 * all-reduce the copies' bits as integers: each element is non-zero on at
 * most its owner, so the sum is the owner's bits exactly (a float sum would
 * turn -0.0 into +0.0). One parameter at a time, in the same order on every
 * rank (a collective), through the parameter copy buffer. */
static ts_status gather_zero3_params(session *s) {
    ts_shard_piece *pc = NULL;
    int npc = 0;
    ts_status st = ts_plan_shard_layout(s->plan, &pc, &npc);
    char *blk = NULL;
    size_t blk_cap = 0;
    const char *blk_name = NULL;
    for (int i = 0; st == TS_OK && i < ts_plan_param_count(s->plan); i++) {
        const char *name = ts_plan_param_name(s->plan, i);
        ts_dtype dt;
        int rank;
        int64_t dims[TS_MAX_RANK];
        if ((st = ts_plan_value_info(s->plan, name, &dt, &rank, dims)) != TS_OK) break;
        const size_t esz = ts_dtype_size(dt);
        size_t bytes = esz;
        for (int d = 0; d < rank; d++) bytes *= (size_t)dims[d];
        /* the same on every rank: the eval plan is the same graph */
        if (ts_plan_value_info(s->eval, name, NULL, NULL, NULL) != TS_OK) continue;
        const size_t words = (bytes + 3) / 4;
        if (words * 4 > s->pbuf_bytes) {
            st = ts_fail(TS_ERR_INTERNAL,
                         "evaluation: parameter '%s' (%zu bytes) exceeds the copy "
                         "buffer (%zu)",
                         name, bytes, s->pbuf_bytes);
            break;
        }
        memset(s->pbuf, 0, words * 4);
        for (int q = 0; st == TS_OK && q < npc; q++) {
            if (pc[q].what[0] || strcmp(pc[q].param, name)) continue;
            if (!blk_name || strcmp(blk_name, pc[q].state)) { /* read each block once */
                int br;
                int64_t bd[TS_MAX_RANK];
                if ((st = ts_plan_value_info(s->plan, pc[q].state, NULL, &br, bd)) != TS_OK) break;
                const size_t bb = (size_t)bd[0] * esz;
                if (bb > blk_cap) {
                    char *nb = realloc(blk, bb);
                    if (!nb) {
                        st = ts_fail(TS_ERR_NOMEM, "evaluation: out of memory for block '%s'",
                                     pc[q].state);
                        break;
                    }
                    blk = nb, blk_cap = bb;
                }
                if ((st = ts_plan_read(s->plan, pc[q].state, blk, bb)) != TS_OK) break;
                blk_name = pc[q].state;
            }
            memcpy((char *)s->pbuf + (size_t)pc[q].param_off * esz,
                   blk + (size_t)pc[q].state_off * esz, (size_t)pc[q].count * esz);
        }
        if (st == TS_OK)
            st = ts_allreduce(s->o->comm, s->pbuf, words, TS_I32, TS_RED_SUM, TS_ALGO_AUTO);
        if (st == TS_OK) st = ts_plan_write_param(s->eval, name, s->pbuf, bytes);
    }
    free(blk);
    free(pc);
    return st;
}

ts_status ts_sess_eval_gather(session *s) {
    ts_plan_stats ps;
    ts_status st = ts_plan_get_stats(s->plan, &ps);
    if (st != TS_OK || ps.zero_param_bytes == 0 || !s->eval) return st;
    if ((st = gather_zero3_params(s)) != TS_OK) ts_error_prefix("evaluation under dist.zero 3");
    return st;
}

/* Parameters and persistent state (BatchNorm running statistics: eval mode
 * normalises with them) go into the eval plan by name; optimizer moments
 * have no counterpart there and are skipped. Under ZeRO-3 the parameters
 * are not persistent values of the training plan: every rank has written
 * them into the eval plan before (ts_sess_eval_gather). */
static ts_status copy_params(session *s) {
    for (int i = 0; i < ts_plan_persistent_count(s->plan); i++) {
        ts_persistent pv;
        ts_status st = ts_plan_persistent(s->plan, i, &pv);
        if (st != TS_OK) return st;
        /* A value the forward pass does not read is not in the eval plan. */
        if (ts_plan_value_info(s->eval, pv.name, NULL, NULL, NULL) != TS_OK) continue;
        st = ts_plan_read(s->plan, pv.name, s->pbuf, pv.bytes);
        if (st == TS_OK) st = ts_plan_write_param(s->eval, pv.name, s->pbuf, pv.bytes);
        if (st != TS_OK) return st;
    }
    return TS_OK;
}

/* Every example of d, in order, in batches of the plan's size; the last
 * batch is padded with copies of its first example, which are not counted.
 * A mapped split (token windows, .npy or IDX images) is read batch by
 * batch from its mapping (ts_dataset_read), never copied whole: the
 * validation part of a 4 GB token file adds a batch to resident memory,
 * not gigabytes. The values are those an in-memory copy holds. */
static ts_status evaluate(session *s, const ts_dataset *d, ts_eval_result *e) {
    const int64_t B = s->c.model.batch / s->nslices; /* the plan's batch */
    const size_t xe = ts_dataset_x_bytes(d), ye = ts_dataset_y_bytes(d);
    /* Targets per example: class ids (classifier) or numbers (regression);
     * the output has `width` values per target for a classifier. */
    const int64_t per = (int64_t)(ye / (s->classifier ? sizeof(int64_t) : sizeof(float)));
    const int64_t width = s->classifier ? (int64_t)(s->outb / sizeof(float)) / (B * per) : 1;
    double loss = 0, sq = 0;
    int64_t correct = 0, targets = 0, ignored = 0;
    ts_metric_acc_reset(&s->macc);
    const unsigned mf = ts_model_of(&s->c)->flags;
    const int chfirst = (mf & TS_MODEL_CHANNELS_FIRST) != 0, dice = (mf & TS_MODEL_DICE_LOSS) != 0;
    ts_status st = dice ? ts_zoo_dice_reset(&s->dice, width) : TS_OK;
    if (st == TS_OK) st = copy_params(s);
    /* the batch's targets (x goes to s->bx) */
    /* data.valid: each example's flags, read after the targets */
    const size_t fe = d->valid ? (size_t)d->valid_cols : 0;
    char *ys = st == TS_OK ? ts_alloc((size_t)B * (ye + fe), "evaluation targets") : NULL;
    if (st == TS_OK && !ys) st = TS_ERR_NOMEM;
    for (int64_t start = 0; st == TS_OK && start < d->n; start += B) {
        const int64_t cnt = d->n - start < B ? d->n - start : B;
        if ((st = ts_dataset_read(d, start, cnt, s->bx, ys)) != TS_OK) break;
        for (int64_t i = cnt; i < B; i++) memcpy((char *)s->bx + (size_t)i * xe, s->bx, xe);
        st = ts_plan_set_input(s->eval, s->in_name, s->bx, s->xb);
        if (st == TS_OK && s->valid) { /* model.source_mask: the data's sources, or all */
            const size_t nv = (size_t)B * TS_FUSION_SOURCES;
            if (fe) {
                memcpy(s->valid, ys + (size_t)cnt * ye, (size_t)cnt * fe);
                for (int64_t i = cnt; i < B; i++) memcpy(s->valid + (size_t)i * fe, s->valid, fe);
            } else {
                memset(s->valid, 1, nv);
            }
            st = ts_plan_set_input(s->eval, "valid", s->valid, nv);
        }
        if (st == TS_OK) st = ts_plan_step(s->eval);
        if (st == TS_OK) st = ts_plan_read(s->eval, s->out_name, s->bout, s->outb);
        if (st == TS_OK && chfirst) /* [B, C, voxels]: a row per voxel */
            st = ts_zoo_channels_last(s->bout, B, width, per);
        if (st != TS_OK) break;
        const int64_t nt = cnt * per;
        if (dice) ts_zoo_dice_add(&s->dice, s->bout, (const int64_t *)ys, nt);
        if (s->binary) {
            const float *y = (const float *)ys;
            st = ts_zoo_binary_add(s->bout, y, nt, &loss, &correct, &s->macc);
            if (st != TS_OK) break;
        } else if (s->classifier) {
            const int64_t *y = (const int64_t *)ys;
            for (int64_t t = 0; t < nt; t++) {
                if (y[t] == TS_ZOO_IGNORE) { /* a graph node outside this split */
                    ignored++;
                    continue;
                }
                const float *row = s->bout + t * width;
                int64_t arg = 0;
                double mx = row[0], sum = 0;
                for (int64_t k = 1; k < width; k++)
                    if (row[k] > mx) mx = row[k], arg = k;
                for (int64_t k = 0; k < width; k++) sum += exp((double)row[k] - mx);
                loss += mx + log(sum) - (double)row[y[t]];
                correct += arg == y[t];
                if (s->macc.flags && (st = ts_metric_acc_add(&s->macc, row, y[t])) != TS_OK) break;
            }
            if (st != TS_OK) break;
        } else {
            const float *y = (const float *)ys;
            for (int64_t t = 0; t < nt; t++) {
                double diff = (double)s->bout[t] - (double)y[t];
                sq += diff * diff;
            }
        }
        targets += nt;
    }
    free(ys);
    if (st != TS_OK) {
        ts_error_prefix("evaluation");
        return st;
    }
    e->examples = d->n;
    targets -= ignored;
    if (s->graph.nodes) e->examples = targets; /* the split's nodes */
    e->accuracy = e->mse = e->auc = e->dice = e->miou = NAN;
    if (s->macc.flags &&
        (st = ts_metric_acc_result(&s->macc, &e->auc, &e->dice, &e->miou)) != TS_OK)
        return st;
    if (s->classifier || s->binary) {
        e->loss = targets ? loss / (double)targets : NAN;
        /* unet3d: cross-entropy + soft Dice over the split, as it trains */
        if (dice) e->loss += ts_zoo_dice_loss(&s->dice);
        if (s->want_acc) e->accuracy = targets ? (double)correct / (double)targets : NAN;
    } else {
        e->loss = targets ? sq / (double)targets : NAN;
        if (s->want_mse) e->mse = e->loss;
    }
    return TS_OK;
}

ts_status ts_sess_eval_split(session *s, const char *split, const ts_dataset *d, ts_eval_result *e,
                             int64_t step, int64_t epoch) {
    double t0 = ts_now();
    ts_status st = evaluate(s, d, e);
    if (st != TS_OK) return st;
    char metrics[160] = "", b1[32], b2[32];
    if (!isnan(e->accuracy))
        snprintf(metrics, sizeof metrics, "  accuracy %.2f %%", 100.0 * e->accuracy);
    else if (!isnan(e->mse))
        snprintf(metrics, sizeof metrics, "  mse %.6g", e->mse);
    const struct {
        const char *name;
        double v;
    } extra[] = {{"auc", e->auc}, {"dice", e->dice}, {"miou", e->miou}};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
        if (!isnan(extra[i].v)) {
            size_t len = strlen(metrics);
            snprintf(metrics + len, sizeof metrics - len, "  %s %.4f", extra[i].name, extra[i].v);
        }
    ts_progress_log(&s->pr,
                    "eval  step %lld  epoch %lld  %-4s loss %.6f%s  (%lld examples, %.1f s)",
                    (long long)step, (long long)epoch, split, e->loss, metrics,
                    (long long)e->examples, ts_now() - t0);
    if (s->metrics) {
        fprintf(s->metrics,
                "{\"type\":\"eval\",\"split\":\"%s\",\"step\":%lld,\"epoch\":%lld,"
                "\"examples\":%lld,\"loss\":%s",
                split, (long long)step, (long long)epoch, (long long)e->examples,
                num(e->loss, b1, sizeof b1));
        if (!isnan(e->accuracy))
            fprintf(s->metrics, ",\"accuracy\":%s", num(e->accuracy, b2, sizeof b2));
        if (!isnan(e->mse)) fprintf(s->metrics, ",\"mse\":%s", num(e->mse, b2, sizeof b2));
        for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
            if (!isnan(extra[i].v))
                fprintf(s->metrics, ",\"%s\":%s", extra[i].name, num(extra[i].v, b2, sizeof b2));
        fputs("}\n", s->metrics);
        fflush(s->metrics);
    }
    if (s->tb) {
        char tag[32];
        const char *const tags[] = {tag};
        snprintf(tag, sizeof tag, "%s/loss", split);
        if ((st = ts_tfevents_scalars(s->tb, step, 1, tags, &e->loss)) != TS_OK) return st;
    }
    return TS_OK;
}
