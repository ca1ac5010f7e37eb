/* stages_plan.c — a plan's step run in pieces (plan/stages.h). */
#include "plan/stages.h"
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "plan/plan.h"

int ts_plan_n_ins(const ts_plan *p) {
    return p->prog.n_ins;
}

int ts_plan_gate_ins(const ts_plan *p) {
    return p->prog.gate_ins >= 0 ? p->prog.gate_ins : p->prog.n_ins;
}

static int overlaps(const ts_operand *o, size_t off, size_t bytes) {
    const size_t b = ts_operand_bytes(o);
    return b && o->off < off + bytes && off < o->off + b;
}

int ts_plan_first_reader(const ts_plan *p, const char *name) {
    const ts_named *nm = ts_plan_find(p, name);
    if (!nm) return -1;
    const size_t off = nm->v.off, bytes = ts_operand_bytes(&nm->v);
    for (int i = 0; i < p->prog.n_ins; i++)
        for (int j = 0; j < p->prog.ins[i].n_in; j++)
            if (overlaps(&p->prog.ins[i].in[j], off, bytes)) return i;
    return -1;
}

int ts_plan_last_writer(const ts_plan *p, const char *name) {
    const ts_named *nm = ts_plan_find(p, name);
    if (!nm) return -1;
    const size_t off = nm->v.off, bytes = ts_operand_bytes(&nm->v);
    int last = -1;
    for (int i = 0; i < p->prog.n_ins; i++)
        for (int j = 0; j < p->prog.ins[i].n_out; j++)
            if (overlaps(&p->prog.ins[i].out[j], off, bytes)) last = i;
    return last;
}

ts_status ts_plan_run_range(ts_plan *p, int lo, int hi) {
    if (!p->backend->execute_range)
        return ts_fail(TS_ERR_UNSUPPORTED, "pipeline: backend %s cannot run part of a step",
                       p->backend->name);
    p->rt.ctx.step = p->rt.steps_done + 1;
    p->rt.ctx.opt_step = p->rt.updates_applied + 1;
    p->rt.ctx.lr = ts_lr_at(&p->prog.spec.schedule, p->prog.spec.opt.lr, p->rt.ctx.step);
    if (p->prog.opt.threads > 0) omp_set_num_threads(p->prog.opt.threads);
    return p->backend->execute_range(&p->prog, &p->rt, lo, hi);
}

double ts_plan_loss_now(const ts_plan *p) {
    if (!p->prog.has_loss) return NAN;
    const unsigned char *l = ts_plan_at(p, p->prog.loss_off);
    return p->prog.loss_dtype == TS_F64 ? *(const double *)l : (double)*(const float *)l;
}

void ts_plan_end_step(ts_plan *p, int updated) {
    p->rt.last_skipped = !updated;
    if (p->prog.gate_ins >= 0 && updated) p->rt.updates_applied++;
    if (p->prog.has_loss) p->rt.last_loss = ts_plan_loss_now(p);
    p->rt.steps_done++;
}

typedef struct span {
    size_t lo, hi;
} span;

static int by_lo(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The bytes instructions [lo, hi) have written so far: sorted, disjoint
 * spans. */
typedef struct written {
    span *s;
    int n, cap;
} written;

static ts_status written_add(written *w, size_t lo, size_t hi) {
    /* the spans it touches merge with it */
    int a = 0;
    while (a < w->n && w->s[a].hi < lo) a++;
    int b = a;
    while (b < w->n && w->s[b].lo <= hi) {
        if (w->s[b].lo < lo) lo = w->s[b].lo;
        if (w->s[b].hi > hi) hi = w->s[b].hi;
        b++;
    }
    if (a == b) { /* a new span at a */
        if (w->n == w->cap) {
            const int cap = w->cap ? 2 * w->cap : 64;
            span *s = realloc(w->s, (size_t)cap * sizeof *s);
            if (!s) return ts_fail(TS_ERR_NOMEM, "pipeline: out of memory for %d spans", cap);
            w->s = s, w->cap = cap;
        }
        memmove(w->s + a + 1, w->s + a, (size_t)(w->n - a) * sizeof *w->s);
        w->n++;
    } else { /* spans a .. b-1 become one */
        memmove(w->s + a + 1, w->s + b, (size_t)(w->n - b) * sizeof *w->s);
        w->n -= b - a - 1;
    }
    w->s[a] = (span){lo, hi};
    return TS_OK;
}

/* Appends the parts of [lo, hi) that w does not cover to sp. */
static ts_status add_unwritten(const written *w, size_t lo, size_t hi, span **sp, int *ns,
                               int *cap) {
    for (int i = 0; i < w->n && lo < hi; i++) {
        if (w->s[i].hi <= lo) continue;
        if (w->s[i].lo >= hi) break;
        if (w->s[i].lo > lo) {
            if (*ns == *cap) {
                span *s = realloc(*sp, (size_t)(2 * *cap) * sizeof *s);
                if (!s) return ts_fail(TS_ERR_NOMEM, "pipeline: out of memory for ranges");
                *sp = s, *cap *= 2;
            }
            (*sp)[(*ns)++] = (span){lo, w->s[i].lo};
        }
        lo = w->s[i].hi;
    }
    if (lo < hi) {
        if (*ns == *cap) {
            span *s = realloc(*sp, (size_t)(2 * *cap) * sizeof *s);
            if (!s) return ts_fail(TS_ERR_NOMEM, "pipeline: out of memory for ranges");
            *sp = s, *cap *= 2;
        }
        (*sp)[(*ns)++] = (span){lo, hi};
    }
    return TS_OK;
}

ts_status ts_plan_read_ranges(const ts_plan *p, int lo, int hi, const char *except,
                              ts_plan_range *out, int max, int *n) {
    const ts_arena_layout *L = &p->prog.layout;
    const ts_named *ex = except ? ts_plan_find(p, except) : NULL;
    int cap = 64;
    span *sp = malloc((size_t)cap * sizeof *sp);
    if (!sp) return ts_fail(TS_ERR_NOMEM, "pipeline: out of memory for %d ranges", cap);
    int ns = 0;
    written w = {0};
    ts_status s = TS_OK;
    /* the two regions a later piece of the step may find overwritten */
    const size_t rlo[2] = {L->io_off, L->temp_off},
                 rhi[2] = {L->io_off + L->io_bytes, L->temp_off + L->temp_bytes};
    for (int i = lo; i < hi && s == TS_OK; i++) {
        const ts_instr *in = &p->prog.ins[i];
        /* what it reads that no instruction of the range wrote before it
         * (the memory planner gives a backward's temporaries bytes the
         * forward's values had: those are not the forward's) */
        for (int j = 0; j < in->n_in && s == TS_OK; j++) {
            const ts_operand *o = &in->in[j];
            const size_t b = ts_operand_bytes(o);
            if (!b || (ex && o->off == ex->v.off)) continue;
            for (int r = 0; r < 2 && s == TS_OK; r++) {
                size_t a = o->off, e = o->off + b;
                if (a < rlo[r]) a = rlo[r];
                if (e > rhi[r]) e = rhi[r];
                if (a < e) s = add_unwritten(&w, a, e, &sp, &ns, &cap);
            }
        }
        /* a kernel writes every byte of its outputs */
        for (int j = 0; j < in->n_out && s == TS_OK; j++) {
            const size_t b = ts_operand_bytes(&in->out[j]);
            if (b) s = written_add(&w, in->out[j].off, in->out[j].off + b);
        }
    }
    free(w.s);
    if (s != TS_OK) {
        free(sp);
        return s;
    }
    qsort(sp, (size_t)ns, sizeof *sp, by_lo);
    int m = 0;
    for (int i = 0; i < ns; i++) {
        /* merge overlapping spans of one region (never across the two) */
        const int same_region = m > 0 && (sp[i].lo >= L->temp_off) == (sp[m - 1].lo >= L->temp_off);
        if (m > 0 && same_region && sp[i].lo <= sp[m - 1].hi) {
            if (sp[i].hi > sp[m - 1].hi) sp[m - 1].hi = sp[i].hi;
        } else {
            sp[m++] = sp[i];
        }
    }
    for (int i = 0; i < m && i < max; i++)
        out[i] = (ts_plan_range){ts_plan_at(p, sp[i].lo), sp[i].hi - sp[i].lo};
    *n = m;
    free(sp);
    return TS_OK;
}

unsigned char *ts_plan_value_at(ts_plan *p, const char *name, size_t *bytes) {
    const ts_named *nm = ts_plan_find(p, name);
    if (!nm) return NULL;
    *bytes = ts_operand_bytes(&nm->v);
    if (nm->kind == TS_NAMED_PARAM) p->rt.copies_stale = 1; /* the caller may write it */
    return ts_plan_at(p, nm->v.off);
}
