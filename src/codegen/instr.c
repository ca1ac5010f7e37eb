/* step.c and step.h of an emitted program: one function per instruction
 * of the compiled plan, in plan order, each calling the kernel the library
 * runs for it (the op's reference kernel from the op table, or the oneDNN
 * GEMM the CPU backend chose, created from the same description), and
 * train_step() calling them in turn. Every operand is named in a comment
 * with its dtype, shape and arena offset. */
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/dnnl_matmul.h"
#include "codegen/codegen.h"
#include "ir/ir.h"
#include "ops/op.h"

/* The op table's C names (ts_def_<name>), by op id. */
static const char *const def_names[] = {
#define X(NAME, name) [TS_OP_##NAME] = #name,
#include "ops/ops.def"
#undef X
};

/* Text for inside a comment. */
static void cmt(FILE *f, const char *s) {
    for (; s && *s; s++) {
        if (s[0] == '*' && s[1] == '/')
            fputs("*_", f);
        else
            fputc(*s, f);
    }
}

/* A C string literal. */
static void lit(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 32 || ch > 126)
            fprintf(f, "\\%03o", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void dims_lit(FILE *f, const ts_operand *o) {
    fputs("(const int64_t[]){", f);
    for (int d = 0; d < o->rank; d++) fprintf(f, "%s%lld", d ? ", " : "", (long long)o->dims[d]);
    if (!o->rank) fputs("0", f);
    fputs("}", f);
}

/* The optimizer's bf16 / f16 copies of the weights (passes/weight_copies.c), made in
 * step_init from the weights main.c has just loaded (the plan makes them in plan/arena.c). */
static void emit_copies(FILE *f, const ts_program *p) {
    for (int i = 0; i < p->n_ins; i++) {
        const ts_instr *in = &p->ins[i];
        ts_update_layout L;
        if (!ts_update_layout_of(in->op, &in->a, in->n_in, &L)) continue;
        for (int j = 0; j < L.n_low; j++) {
            const ts_operand *w = &in->in[j * L.gs], *c = &in->in[L.first_copy + j];
            fprintf(f,
                    "    ts_f32_to_%s_n((uint16_t *)(A + %zu), (const float *)(A + %zu), %lld);\n",
                    c->dtype == TS_BF16 ? "bf16" : "f16", c->off, w->off,
                    (long long)ts_shape_numel(w->rank, w->dims));
        }
    }
}

/* An instruction's label up to " = " (labels read "%5 = matmul(...)"). */
static void short_label(const ts_instr *p, int q, char *out, size_t n) {
    const char *l = p->label ? p->label : "?";
    const char *eq = strstr(l, " = ");
    int len = eq ? (int)(eq - l) : (int)strlen(l);
    if (q == 0)
        snprintf(out, n, "%.*s", len, l);
    else
        snprintf(out, n, "%.*s.out%d", len, l, q);
}

/* What names an operand in the comments: the named value at its offset
 * with its size (a reshape views it with another shape), else the label
 * of the instruction writing it (for an output, this one; for an input,
 * the last earlier one that wrote there), else its offset. */
static void operand_name(const cg_ctx *g, int i, int out_q, const ts_operand *o, char *out,
                         size_t n) {
    for (int k = 0; k < g->prog->n_named; k++) {
        const ts_named *nm = &g->prog->named[k];
        if (nm->v.off == o->off && ts_operand_bytes(&nm->v) == ts_operand_bytes(o)) {
            snprintf(out, n, "%s", nm->name);
            return;
        }
    }
    if (out_q >= 0) {
        short_label(&g->prog->ins[i], out_q, out, n);
        return;
    }
    for (int j = i - 1; j >= 0; j--) {
        const ts_instr *p = &g->prog->ins[j];
        for (int q = 0; q < p->n_out; q++)
            if (p->out[q].off == o->off) {
                short_label(p, q, out, n);
                return;
            }
    }
    const ts_arena_layout *l = &g->prog->layout;
    snprintf(out, n, "%s@%zu", o->off >= l->io_off && o->off < l->temp_off ? "constant " : "",
             o->off);
}

static void operand_comment(FILE *f, const cg_ctx *g, int i, int is_out, int j,
                            const ts_operand *o) {
    char name[256], sh[160];
    operand_name(g, i, is_out ? j : -1, o, name, sizeof name);
    for (char *c = name; *c; c++)
        if (c[0] == '*' && c[1] == '/') c[1] = '_'; /* never ends the comment */
    ts_shape_str(sh, sizeof sh, o->dtype, o->rank, o->dims);
    char tag[16];
    snprintf(tag, sizeof tag, "%s%d", is_out ? "out" : "in", j);
    fprintf(f, " *   %-5s %-28s %-20s @%zu\n", tag, name, sh, o->off);
}

/* How an instruction runs: the op's reference kernel, oneDNN's GEMM, or a
 * convolution, whose kernel the backend's own ts_cpu_prepare_conv picks in
 * the emitted program as it does in the library (oneDNN, or the reference
 * kernel where oneDNN has no primitive for it). */
enum { RUN_REF, RUN_MM, RUN_CONV };

static int is_conv(int op) {
    return op == TS_OP_CONV || op == TS_OP_CONV_BWD_DATA || op == TS_OP_CONV_BWD_WEIGHT ||
           op == TS_OP_CONV_TRANSPOSE;
}

static ts_status run_kind(const cg_ctx *g, int i, int *kind, const ts_mm_desc **d) {
    const ts_instr *in = &g->prog->ins[i];
    const ts_rt_instr *r = &g->rt->ins[i];
    *kind = RUN_REF;
    if (is_conv(in->op)) {
        *kind = RUN_CONV;
        return TS_OK;
    }
    if (r->fn == in->kernel) return TS_OK;
    if ((in->op == TS_OP_MATMUL || in->op == TS_OP_MATMUL_EPI) && r->k.backend &&
        in->in[0].dtype != TS_F16) {
        *kind = RUN_MM;
        *d = ts_mm_get_desc(r->k.backend);
        return TS_OK;
    }
    return ts_fail(TS_ERR_UNSUPPORTED,
                   "emit-c: instruction %d (%s, '%s') runs on an optimised CPU kernel that "
                   "--emit-c does not emit yet",
                   i, in->name, in->label ? in->label : "");
}

static void emit_header_comment(FILE *f, const cg_ctx *g, int i, int kind) {
    const ts_instr *in = &g->prog->ins[i];
    fprintf(f, "/* ---- instruction %d: %s", i, in->name);
    if (in->label) {
        fputs(" -> ", f);
        cmt(f, in->label);
    }
    fprintf(f, "%s\n",
            kind == RUN_MM     ? "  (oneDNN GEMM)"
            : kind == RUN_CONV ? "  (oneDNN convolution where it has one)"
                               : "");
    /* the attributes as `tessel compile --dump ir` prints them */
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (m) {
        ts_node nd;
        memset(&nd, 0, sizeof nd);
        nd.op = in->op;
        nd.a = in->a;
        ts_attrs_print(&nd, m);
        fclose(m);
        if (buf && len) {
            fputs(" *  ", f);
            cmt(f, buf);
            fputc('\n', f);
        }
        free(buf);
    }
    for (int j = 0; j < in->n_in; j++) operand_comment(f, g, i, 0, j, &in->in[j]);
    for (int j = 0; j < in->n_out; j++) operand_comment(f, g, i, 1, j, &in->out[j]);
    if (in->scratch_bytes && kind != RUN_MM)
        fprintf(f, " *   scratch  %zu bytes  @%zu\n", in->scratch_bytes, in->scratch_off);
    fprintf(f, " */\n");
}

static void operand_lit(FILE *f, const ts_operand *o) {
    fprintf(f, "{%s, %d, {", cg_dtype_enum(o->dtype), o->rank);
    for (int d = 0; d < o->rank; d++) fprintf(f, "%s%lld", d ? ", " : "", (long long)o->dims[d]);
    if (!o->rank) fputs("0", f);
    fprintf(f, "}, %zu}", o->off);
}

/* conv: the reference kernel's arguments, and the instruction as the
 * backend's prepare reads it (conv_ins[c], conv_rt[c]; step_init runs
 * ts_cpu_prepare_conv over them). */
static void emit_conv_tail(FILE *f, const cg_ctx *g, int i, int c) {
    const ts_instr *in = &g->prog->ins[i];
    fprintf(f, "static ts_operand opin%d[%d] = {", i, in->n_in);
    for (int j = 0; j < in->n_in; j++) {
        fputs(j ? ",\n    " : "\n    ", f);
        operand_lit(f, &in->in[j]);
    }
    fprintf(f, "};\nstatic void conv%d(void) {\n", i);
    fprintf(f, "    conv_ins[%d] = (ts_instr){.op = %d, .name = ", c, in->op);
    lit(f, in->name);
    fprintf(f,
            ", .flags = %uu, .kernel = ts_def_%s.kernel, .a = a%d,\n"
            "                           .n_in = %d, .n_out = %d, .in = opin%d, .out = {",
            in->flags, def_names[in->op], i, in->n_in, in->n_out, i);
    for (int j = 0; j < in->n_out; j++) {
        if (j) fputs(", ", f);
        operand_lit(f, &in->out[j]);
    }
    fprintf(f, "},\n                           .scratch_off = %zu, .scratch_bytes = %zu, .label = ",
            in->scratch_off, in->scratch_bytes);
    lit(f, in->label ? in->label : "");
    fprintf(f,
            "};\n    conv_rt[%d] = (ts_rt_instr){.fn = ts_def_%s.kernel, .k = k%d, .in = in%d};\n"
            "    memcpy(conv_rt[%d].out, out%d, sizeof(ts_tensor) * %d);\n"
            "    conv_rt[%d].k.out = conv_rt[%d].out;\n}\n",
            c, def_names[in->op], i, i, c, i, in->n_out, c, c);
    char id[64];
    cg_ident(id, sizeof id, in->name);
    fprintf(f, "static ts_status i%d_%s(void) {\n    return conv_rt[%d].fn(&conv_rt[%d].k);\n}\n\n",
            i, id, c, c);
}

static void emit_ref(FILE *f, const cg_ctx *g, int i, int conv) {
    const ts_instr *in = &g->prog->ins[i];
    fprintf(f,
            "static ts_tensor in%d[%d], out%d[%d];\nstatic ts_attrs a%d;\nstatic ts_kargs k%d;\n",
            i, in->n_in ? in->n_in : 1, i, in->n_out ? in->n_out : 1, i, i);
    fprintf(f, "static ts_status init%d(void) {\n", i);
    for (int j = 0; j < in->n_in; j++) {
        fprintf(f, "    bind(&in%d[%d], %s, %d, ", i, j, cg_dtype_enum(in->in[j].dtype),
                in->in[j].rank);
        dims_lit(f, &in->in[j]);
        fprintf(f, ", %zu);\n", in->in[j].off);
    }
    for (int j = 0; j < in->n_out; j++) {
        fprintf(f, "    bind(&out%d[%d], %s, %d, ", i, j, cg_dtype_enum(in->out[j].dtype),
                in->out[j].rank);
        dims_lit(f, &in->out[j]);
        fprintf(f, ", %zu);\n", in->out[j].off);
    }
    /* the attributes bit for bit: int64 and double fields only (core/attrs.h) */
    uint64_t w[sizeof(ts_attrs) / 8];
    memcpy(w, &in->a, sizeof w);
    int nw = (int)(sizeof w / 8);
    while (nw > 0 && !w[nw - 1]) nw--;
    if (nw) {
        fprintf(f, "    static const uint64_t aw[%d] = {", nw);
        for (int q = 0; q < nw; q++)
            fprintf(f, "%s0x%016llxull", q ? (q % 4 ? ", " : ",\n        ") : "",
                    (unsigned long long)w[q]);
        fprintf(f, "};\n    set_attrs(&a%d, aw, %d);\n", i, nw);
    } else {
        fprintf(f, "    a%d = ts_attrs_zero();\n", i);
    }
    fprintf(f,
            "    k%d = (ts_kargs){.a = &a%d, .n_in = %d, .n_out = %d, .in = in%d, .out = out%d,\n",
            i, i, in->n_in, in->n_out, i, i);
    if (in->scratch_bytes)
        fprintf(f, "                   .scratch = A + %zu, .scratch_bytes = %zu,\n",
                in->scratch_off, in->scratch_bytes);
    fprintf(f, "                   .ctx = &ctx, .label = ");
    lit(f, in->label ? in->label : "");
    fprintf(f, "};\n    return TS_OK;\n}\n");
    if (conv >= 0) {
        emit_conv_tail(f, g, i, conv);
        return;
    }
    char id[64], fn[96];
    cg_ident(id, sizeof id, in->name);
    snprintf(fn, sizeof fn, "i%d_%s", i, id);
    /* a fused chain: the generated loop, or with -DSTEP_FUSED_INTERPRETER the library's
     * tile interpreter (for measuring one against the other) */
    char *loop = NULL;
    size_t len = 0;
    FILE *m = in->op == TS_OP_FUSED_ELTWISE ? open_memstream(&loop, &len) : NULL;
    int gen = m && cg_fused_loop(m, g, i, fn);
    if (m) fclose(m);
    if (gen) fprintf(f, "#ifdef STEP_FUSED_INTERPRETER\n");
    fprintf(f, "static ts_status %s(void) {\n    return ts_def_%s.kernel(&k%d);\n}\n", fn,
            def_names[in->op], i);
    if (gen) fprintf(f, "#else\n%s#endif\n", loop);
    fputc('\n', f);
    free(loop);
}

static void emit_mm(FILE *f, const cg_ctx *g, int i, const ts_mm_desc *d) {
    const ts_instr *in = &g->prog->ins[i];
    fprintf(f, "static ts_mm *mm%d;\nstatic ts_status init%d(void) {\n", i, i);
    fprintf(f,
            "    ts_mm_desc d = {.a_dt = %s, .b_dt = %s, .c_dt = %s, .batch = %lld,\n"
            "                    .M = %lld, .N = %lld, .K = %lld, .trans_a = %d, .trans_b = %d,\n"
            "                    .b_broadcast = %d, .a_broadcast = %d, .accumulate = %d,\n"
            "                    .n_post = %d, .post = {%d, %d, %d, %d}, .label = ",
            cg_dtype_enum(d->a_dt), cg_dtype_enum(d->b_dt), cg_dtype_enum(d->c_dt),
            (long long)d->batch, (long long)d->M, (long long)d->N, (long long)d->K, d->trans_a,
            d->trans_b, d->b_broadcast, d->a_broadcast, d->accumulate, d->n_post, d->post[0],
            d->post[1], d->post[2], d->post[3]);
    lit(f, in->label ? in->label : "");
    fprintf(f, "};\n    return ts_mm_create(&d, &mm%d);\n}\n", i);
    char id[64];
    cg_ident(id, sizeof id, in->name);
    fprintf(f, "static ts_status i%d_%s(void) {\n", i, id);
    if (in->op == TS_OP_MATMUL_EPI) {
        fprintf(f, "    const void *post[%d] = {", in->n_in - 2 > 0 ? in->n_in - 2 : 1);
        for (int j = 2; j < in->n_in; j++)
            fprintf(f, "%sA + %zu", j > 2 ? ", " : "", in->in[j].off);
        if (in->n_in <= 2) fputs("NULL", f);
        fprintf(
            f,
            "};\n    return ts_mm_run_post(mm%d, A + %zu, A + %zu, A + %zu, post, mm_scratch);\n",
            i, in->in[0].off, in->in[1].off, in->out[0].off);
    } else {
        fprintf(f, "    return ts_mm_run(mm%d, A + %zu, A + %zu, A + %zu, mm_scratch);\n", i,
                in->in[0].off, in->in[1].off, in->out[0].off);
    }
    fprintf(f, "}\n\n");
}

static void emit_step_h(FILE *f, const cg_ctx *g) {
    int n_params = 0;
    for (int k = 0; k < g->prog->n_named; k++) n_params += g->prog->named[k].kind == TS_NAMED_PARAM;
    fprintf(
        f,
        "/* step.h — generated by tessel compile --emit-c: the compiled training step.\n"
        " *\n"
        " *     unsigned char *arena = ...;          // STEP_ARENA_BYTES, zeroed, 64-byte aligned\n"
        " *     step_load_constants(arena);          // constants.c\n"
        " *     // parameters (step_params) and inputs (step_inputs) at their offsets\n"
        " *     if (step_init(arena) != TS_OK) ...;  // binds the kernels to the arena\n"
        " *     for (step = 1; ...) train_step(step, lr), step_loss();\n"
        " *     step_free();\n"
        " */\n"
        "#ifndef STEP_H\n#define STEP_H\n\n#include <stddef.h>\n#include <stdint.h>\n"
        "#include \"tessel/graph.h\"\n#include \"tessel/status.h\"\n\n"
        "#define STEP_ARENA_BYTES %zu\n#define STEP_N_PARAMS %d\n\n"
        "/* A tensor main.c reads or writes: name, safetensors dtype, shape, place. */\n"
        "typedef struct step_tensor {\n    const char *name;\n    const char *dtype;\n"
        "    int rank;\n    int64_t dims[TS_MAX_RANK];\n    size_t off, bytes;\n} step_tensor;\n\n"
        "extern const step_tensor step_params[STEP_N_PARAMS];\n"
        "/* The model's input and target, in the order data.bin holds them. */\n"
        "extern const step_tensor step_inputs[2];\n\n"
        "void step_load_constants(unsigned char *arena);\n"
        "ts_status step_init(unsigned char *arena);\n"
        "/* Step `step` (1-based) at learning rate lr; the message of a failure is\n"
        " * ts_last_error(). */\n"
        "ts_status train_step(int64_t step, double lr);\n"
        "/* The loss of the last step. */\n"
        "double step_loss(void);\n"
        "void step_free(void);\n\n#endif\n",
        g->prog->layout.arena_bytes, n_params);
}

static void tensor_row(FILE *f, const ts_named *n) {
    fputs("    {", f);
    lit(f, n->name);
    fprintf(f, ", \"%s\", %d, {", cg_st_dtype(n->v.dtype), n->v.rank);
    for (int d = 0; d < n->v.rank; d++)
        fprintf(f, "%s%lld", d ? ", " : "", (long long)n->v.dims[d]);
    fprintf(f, "}, %zu, %zu},\n", n->v.off, ts_operand_bytes(&n->v));
}

static ts_status emit_step_c(FILE *f, const cg_ctx *g, const int *kinds,
                             const ts_mm_desc *const *descs) {
    const ts_program *p = g->prog;
    fprintf(f, "/* step.c — generated by tessel compile --emit-c from ");
    cmt(f, g->config_path);
    fprintf(f,
            ":\n * the compiled training step, %d instructions in plan order (%.3f GFLOP per "
            "step).\n * Each instruction is one function calling the kernel the library runs "
            "for it;\n * train_step() at the end calls them in turn. The kernels are "
            "kernels/, the\n * library's own sources. */\n",
            p->n_ins, p->flops * 1e-9);
    fprintf(f, "#include <stdlib.h>\n#include <string.h>\n#include \"backends/cpu/dnnl_conv.h\"\n"
               "#include \"backends/cpu/dnnl_matmul.h\"\n#include \"core/half.h\"\n"
               "#include \"ops/kern.h\"\n#include \"ops/op.h\"\n#include \"ops/vmath.h\"\n"
               "#include \"step.h\"\n\n");
    if (p->opt.threads > 0) fprintf(f, "#include <omp.h>\n\n");
    cg_emit_layout(g, f);
    if (p->has_loss) fprintf(f, "#define LOSS_OFF %zu /* the loss */\n", p->loss_off);
    fprintf(f, "#define SEED %lluull /* compile seed (dropout streams) */\n\n",
            (unsigned long long)p->opt.seed);
    /* the op tables used */
    char used[TS_OP_COUNT];
    memset(used, 0, sizeof used);
    for (int i = 0; i < p->n_ins; i++)
        if (kinds[i] != RUN_MM && !used[p->ins[i].op]) {
            used[p->ins[i].op] = 1;
            fprintf(f, "extern const ts_op_def ts_def_%s; /* src/ops: op '%s' */\n",
                    def_names[p->ins[i].op], p->ins[i].name);
        }
    fprintf(
        f,
        "\nstatic unsigned char *A; /* the arena */\n"
        "static ts_step_ctx ctx;  /* what a kernel sees of the step: number, seed, lr */\n"
        "static void *mm_scratch; /* oneDNN's scratchpad, shared by the GEMMs in turn */\n\n"
        "static void bind(ts_tensor *t, ts_dtype dt, int rank, const int64_t *dims, size_t off) "
        "{\n"
        "    t->dtype = dt;\n    t->rank = rank;\n    memset(t->dims, 0, sizeof t->dims);\n"
        "    memcpy(t->dims, dims, sizeof(int64_t) * (size_t)rank);\n    t->data = A + off;\n}\n\n"
        "static void set_attrs(ts_attrs *a, const uint64_t *w, size_t n) {\n"
        "    *a = ts_attrs_zero();\n    memcpy(a, w, n * sizeof *w);\n}\n\n");
    int n_conv = 0;
    for (int i = 0; i < p->n_ins; i++) n_conv += kinds[i] == RUN_CONV;
    if (n_conv)
        fprintf(f,
                "/* the convolutions as the CPU backend's prepare reads them */\n"
                "static ts_instr conv_ins[%d];\nstatic ts_rt_instr conv_rt[%d];\n"
                "static ts_runtime conv_runtime; /* its oneDNN scratchpad */\n\n",
                n_conv, n_conv);
    for (int i = 0, c = 0; i < p->n_ins; i++) {
        emit_header_comment(f, g, i, kinds[i]);
        if (kinds[i] == RUN_MM)
            emit_mm(f, g, i, descs[i]);
        else
            emit_ref(f, g, i, kinds[i] == RUN_CONV ? c++ : -1);
    }
    /* tables for main.c */
    int np = 0;
    fprintf(f, "const step_tensor step_params[STEP_N_PARAMS] = {\n");
    for (int k = 0; k < p->n_named; k++)
        if (p->named[k].kind == TS_NAMED_PARAM) tensor_row(f, &p->named[k]), np++;
    fprintf(f, "};\n\nconst step_tensor step_inputs[2] = {\n");
    const char *io[2] = {g->in_name, g->tgt_name};
    for (int q = 0; q < 2; q++) {
        const ts_named *hit = NULL;
        for (int k = 0; k < p->n_named; k++)
            if (p->named[k].kind == TS_NAMED_INPUT && !strcmp(p->named[k].name, io[q]))
                hit = &p->named[k];
        if (!hit)
            return ts_fail(TS_ERR_INTERNAL, "emit-c: the plan has no input named '%s'", io[q]);
        tensor_row(f, hit);
    }
    fprintf(f, "};\n\n");
    (void)np;
    /* init */
    fprintf(f, "ts_status step_init(unsigned char *arena) {\n    A = arena;\n    ts_status s;\n");
    for (int i = 0; i < p->n_ins; i++) {
        fprintf(f, "    if ((s = init%d()) != TS_OK) return s;\n", i);
        if (kinds[i] == RUN_CONV) fprintf(f, "    conv%d();\n", i);
    }
    if (n_conv)
        fprintf(
            f,
            "    ts_program conv_prog = {.ins = conv_ins, .n_ins = %d};\n"
            "    conv_runtime.ins = conv_rt;\n"
            "    if ((s = ts_cpu_prepare_conv(&conv_prog, &conv_runtime)) != TS_OK) return s;\n",
            n_conv);
    emit_copies(f, p);
    fprintf(f, "    size_t sb = 0;\n");
    for (int i = 0; i < p->n_ins; i++)
        if (kinds[i] == RUN_MM)
            fprintf(f, "    if (ts_mm_scratch_bytes(mm%d) > sb) sb = ts_mm_scratch_bytes(mm%d);\n",
                    i, i);
    fprintf(f, "    if (sb && !(mm_scratch = ts_aligned_alloc(sb, \"oneDNN scratchpad\")))\n"
               "        return TS_ERR_NOMEM;\n    return TS_OK;\n}\n\n");
    fprintf(f, "void step_free(void) {\n");
    for (int i = 0; i < p->n_ins; i++)
        if (kinds[i] == RUN_MM) fprintf(f, "    ts_mm_free(mm%d);\n    mm%d = NULL;\n", i, i);
    if (n_conv)
        fprintf(
            f,
            "    for (int c = 0; c < %d; c++)\n"
            "        if (conv_rt[c].backend_free) conv_rt[c].backend_free(conv_rt[c].k.backend);\n"
            "    ts_aligned_free(conv_runtime.backend_scratch);\n"
            "    memset(&conv_runtime, 0, sizeof conv_runtime);\n",
            n_conv);
    fprintf(f, "    ts_aligned_free(mm_scratch);\n    mm_scratch = NULL;\n}\n\n");
    /* the step */
    fprintf(f,
            "static ts_status failed(int64_t step, int i, const char *op, ts_status s) {\n"
            "    ts_error_prefix(\"step %%lld, instruction %%d (%%s)\", (long long)step, i, op);\n"
            "    return s;\n}\n\n");
    fprintf(f, "ts_status train_step(int64_t step, double lr) {\n"
               "    ctx.step = step;\n    ctx.seed = SEED;\n    ctx.lr = lr;\n");
    fprintf(f, "    ctx.opt_step = %s; /* no update is ever skipped here */\n",
            p->gate_ins >= 0 ? "step" : "1");
    if (p->opt.threads > 0) fprintf(f, "    omp_set_num_threads(%d);\n", p->opt.threads);
    fprintf(f, "    ts_status s;\n");
    for (int i = 0; i < p->n_ins; i++) {
        char id[64];
        cg_ident(id, sizeof id, p->ins[i].name);
        fprintf(f, "    if ((s = i%d_%s()) != TS_OK) return failed(step, %d, \"%s\", s);\n", i, id,
                i, id);
    }
    fprintf(f, "    return TS_OK;\n}\n\n");
    if (p->has_loss)
        fprintf(f, "double step_loss(void) {\n    return %s;\n}\n",
                p->loss_dtype == TS_F64 ? "*(const double *)(A + LOSS_OFF)"
                                        : "(double)*(const float *)(A + LOSS_OFF)");
    else
        fprintf(f, "double step_loss(void) {\n    return 0.0;\n}\n");
    return TS_OK;
}

ts_status cg_write_step(cg_ctx *g) {
    const ts_program *p = g->prog;
    int *kinds = ts_zalloc(sizeof(int) * (size_t)(p->n_ins + 1), "emit-c");
    const ts_mm_desc **descs = ts_zalloc(sizeof *descs * (size_t)(p->n_ins + 1), "emit-c");
    ts_status s = kinds && descs ? TS_OK : TS_ERR_NOMEM;
    for (int i = 0; s == TS_OK && i < p->n_ins; i++) s = run_kind(g, i, &kinds[i], &descs[i]);
    cg_mem m;
    if (s == TS_OK && (s = cg_mem_open(&m)) == TS_OK) {
        emit_step_h(m.f, g);
        s = cg_mem_write(g, &m, "step.h");
    }
    if (s == TS_OK && (s = cg_mem_open(&m)) == TS_OK) {
        s = emit_step_c(m.f, g, kinds, descs);
        if (s == TS_OK)
            s = cg_mem_write(g, &m, "step.c");
        else
            cg_mem_free(&m);
    }
    free(kinds);
    free(descs);
    return s;
}
