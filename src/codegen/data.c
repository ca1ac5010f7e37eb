/* data.bin of an emitted program: the batches `tessel train` feeds, made by
 * the session's own data path (src/session/feed.c: the data source, its
 * split, shuffling and synthetic batches), and the learning rate of every
 * step (the schedule evaluated). Little-endian:
 *
 *     "TSLDATA1"                                   8 bytes
 *     x_bytes, y_bytes, n_batches, n_steps         u64 each
 *     n_steps x {batch index u64, lr f64}
 *     n_batches x {x: x_bytes, y: y_bytes}
 *
 * A batch equal to an earlier one (the benchmark models cycle over four)
 * is stored once. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "codegen/codegen.h"
#include "session/session_internal.h"

void cg_data_free(session *s) {
    if (!s) return;
    ts_loader_free(s->loader);
    ts_dataset_free(s->all);
    ts_dataset_free(s->train);
    ts_dataset_free(s->val);
    ts_dataset_free(s->test);
    for (int i = 0; i < s->n_synth; i++) free(s->sx[i]), free(s->sy[i]);
    ts_zoo_graph_free(&s->graph);
    free(s->bx);
    free(s->by);
    free(s);
}

static int put_u64(FILE *f, uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    return fwrite(b, 1, 8, f) == 8;
}

ts_status cg_data_load(const ts_config *c, session **out) {
    *out = NULL;
    /* The emitted step is the one plan of the whole batch: the micro-batch
     * tree and the bucket plans are not emitted. */
    if (c->dist.reproducible)
        return ts_fail(
            TS_ERR_UNSUPPORTED,
            "--emit-c: dist.reproducible (micro-batches summed in a tree) is not emitted; "
            "set dist.reproducible false");
    if (c->shape.policy == 1)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "--emit-c: shape.policy bucket (a plan per bucket) is not emitted; set "
                       "shape.policy exact");
    session *s = ts_zalloc(sizeof *s, "emit-c session");
    if (!s) return TS_ERR_NOMEM;
    s->c = *c;
    s->nranks = 1;
    s->nslices = 1; /* the batch is one slice: the session's buffers hold it */
    s->gpt = (ts_model_of(c)->flags & TS_MODEL_LM) != 0;
    ts_status st = ts_sess_load_data(s);
    if (st != TS_OK) {
        cg_data_free(s);
        return st;
    }
    *out = s;
    return TS_OK;
}

/* As the session builds it (ts_sess_build): on the data's graph for a gcn. */
ts_status cg_data_build(session *s, ts_graph **gr, ts_model *m, ts_train_spec *spec,
                        ts_compile_options *opt) {
    ts_config_graph cg = ts_zoo_graph_of(&s->graph);
    return ts_config_build_graph(&s->c, s->graph.nodes ? &cg : NULL, gr, m, spec, opt);
}

ts_status cg_write_data(cg_ctx *g, session *s) {
    const ts_program *p = g->prog;
    const ts_named *x = NULL, *y = NULL;
    for (int k = 0; k < p->n_named; k++) {
        if (!strcmp(p->named[k].name, g->in_name)) x = &p->named[k];
        if (!strcmp(p->named[k].name, g->tgt_name)) y = &p->named[k];
    }
    if (!x || !y) return ts_fail(TS_ERR_INTERNAL, "emit-c: no input or target in the plan");
    s->xb = ts_operand_bytes(&x->v);
    s->yb = ts_operand_bytes(&y->v);
    const int64_t steps = g->steps;
    unsigned char **batches = ts_zalloc(sizeof *batches * (size_t)(steps + 1), "emit-c batches");
    uint64_t *index = ts_zalloc(sizeof *index * (size_t)(steps + 1), "emit-c batches");
    ts_status st = batches && index ? TS_OK : TS_ERR_NOMEM;
    if (st == TS_OK && (!(s->bx = ts_alloc(s->xb, "batch")) || !(s->by = ts_alloc(s->yb, "batch"))))
        st = TS_ERR_NOMEM;
    if (st == TS_OK && !s->all) st = ts_sess_make_synthetic(s);
    int64_t n_batches = 0;
    const size_t bb = s->xb + s->yb;
    for (int64_t step = 1; st == TS_OK && step <= steps; step++) {
        if ((st = ts_sess_next_batch(s, step)) != TS_OK) break;
        int64_t hit = -1;
        for (int64_t b = 0; b < n_batches && hit < 0; b++)
            if (!memcmp(batches[b], s->bx, s->xb) && !memcmp(batches[b] + s->xb, s->by, s->yb))
                hit = b;
        if (hit < 0) {
            if (!(batches[n_batches] = ts_alloc(bb ? bb : 1, "emit-c batch"))) {
                st = TS_ERR_NOMEM;
                break;
            }
            memcpy(batches[n_batches], s->bx, s->xb);
            memcpy(batches[n_batches] + s->xb, s->by, s->yb);
            hit = n_batches++;
        }
        index[step - 1] = (uint64_t)hit;
    }
    if (st == TS_OK) {
        char path[1024];
        snprintf(path, sizeof path, "%s/data.bin", g->dir);
        FILE *f = fopen(path, "wb");
        if (!f) {
            st = ts_fail(TS_ERR_IO, "emit-c: cannot write %s: %s", path, strerror(errno));
        } else {
            int ok = fwrite("TSLDATA1", 1, 8, f) == 8 && put_u64(f, s->xb) && put_u64(f, s->yb) &&
                     put_u64(f, (uint64_t)n_batches) && put_u64(f, (uint64_t)steps);
            for (int64_t k = 0; ok && k < steps; k++) {
                double lr = ts_lr_at(&p->spec.schedule, p->spec.opt.lr, k + 1);
                uint64_t bits;
                memcpy(&bits, &lr, 8);
                ok = put_u64(f, index[k]) && put_u64(f, bits);
            }
            for (int64_t b = 0; ok && b < n_batches; b++) ok = fwrite(batches[b], 1, bb, f) == bb;
            if (fclose(f) != 0) ok = 0;
            st = ok ? cg_record(g, "data.bin")
                    : ts_fail(TS_ERR_IO, "emit-c: writing %s failed", path);
        }
    }
    for (int64_t b = 0; batches && b < n_batches; b++) free(batches[b]);
    free(batches);
    free(index);
    return st;
}

const ts_config *cg_data_config(const session *s) {
    return &s->c;
}
