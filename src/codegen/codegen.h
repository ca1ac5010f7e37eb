/* codegen.h — what the parts of `tessel compile --emit-c` share (internal;
 * docs/aot.md). emit.c compiles the plan and calls the writers in turn:
 *
 *     cg_write_kernels(g);     // sources.c: kernels/, the library's files
 *     cg_write_init(g);        // arena.c: init.safetensors
 *     cg_write_constants(g);   // arena.c: constants.c
 *     cg_write_step(g);        // instr.c: step.h, step.c
 *     cg_write_data(g, c);     // data.c: data.bin
 *     cg_write_main(g);        // program.c: main.c, Makefile
 *     cg_write_manifest(g);    // program.c: MANIFEST, last
 *
 * Every writer returns a ts_status with its message set. */
#ifndef TS_CODEGEN_CODEGEN_H
#define TS_CODEGEN_CODEGEN_H

#include <stdio.h>
#include "plan/plan.h"
#include "tessel/config.h"
#include "tessel/models.h"

enum { CG_MAX_FILES = 512 };

typedef struct cg_ctx {
    const ts_plan *plan;
    const ts_program *prog;
    const ts_runtime *rt;
    const char *dir;
    const char *config_path;
    const char *in_name, *tgt_name; /* the model's input and target */
    int64_t steps;                  /* train.steps: the batches data.bin holds */
    char *files[CG_MAX_FILES];      /* written so far, relative to dir (owned) */
    int n_files;
    char **opname; /* per instruction and operand: a readable name (see instr.c) */
} cg_ctx;

/* Writes `n` bytes as dir/rel (parent folders made) and records it for the
 * manifest. */
ts_status cg_write_file(cg_ctx *g, const char *rel, const void *data, size_t n);
/* Records dir/rel, written by the caller, for the manifest. */
ts_status cg_record(cg_ctx *g, const char *rel);
/* A text buffer (open_memstream): cg_mem_open, fprintf into m->f, then
 * cg_mem_write (writes dir/rel and frees) or cg_mem_free. */
typedef struct cg_mem {
    FILE *f;
    char *buf;
    size_t len;
} cg_mem;
ts_status cg_mem_open(cg_mem *m);
ts_status cg_mem_write(cg_ctx *g, cg_mem *m, const char *rel);
void cg_mem_free(cg_mem *m);

/* A C identifier from `s` (letters, digits, '_'; others as '_'). */
void cg_ident(char *out, size_t n, const char *s);
/* "F32" and the like: the safetensors name of dt, NULL if none. */
const char *cg_st_dtype(ts_dtype dt);
/* "TS_F32": the enumerator naming dt in tessel/dtype.h. */
const char *cg_dtype_enum(ts_dtype dt);

ts_status cg_write_kernels(cg_ctx *g);
ts_status cg_write_init(cg_ctx *g);
ts_status cg_write_constants(cg_ctx *g);
/* The arena layout as #defines and the named values as comments. */
void cg_emit_layout(const cg_ctx *g, FILE *f);
ts_status cg_write_step(cg_ctx *g);
/* fused.c: instruction i (a fused_eltwise) as a generated loop, the
 * function `fname`; 0 (nothing written) where the interpreter must stay. */
int cg_fused_loop(FILE *f, const cg_ctx *g, int i, const char *fname);
/* The same for a fused_eltwise instruction `in` whose program (its last
 * input) is `prog`: the function reads and writes the arena through a
 * `unsigned char *A` the including file declares (tests/unit/emit_c_fused.c). */
int cg_fused_emit(FILE *f, const ts_instr *in, const int64_t *prog, const char *fname);
/* data.c: the session's data path. cg_data_load loads data.source and fits
 * the config to it (cg_data_config); cg_data_build builds the model as the
 * session does; cg_write_data writes data.bin. */
struct session;
ts_status cg_data_load(const ts_config *c, struct session **out);
const ts_config *cg_data_config(const struct session *s);
ts_status cg_data_build(struct session *s, ts_graph **gr, ts_model *m, ts_train_spec *spec,
                        ts_compile_options *opt);
ts_status cg_write_data(cg_ctx *g, struct session *s);
void cg_data_free(struct session *s);
ts_status cg_write_main(cg_ctx *g);
ts_status cg_write_manifest(cg_ctx *g);

#endif
