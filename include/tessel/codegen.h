/* tessel/codegen.h — the training step as a standalone C program
 * (`tessel compile CONFIG --emit-c DIR`, docs/aot.md).
 *
 *     ts_config c;  // loaded and finished (ts_config_finish)
 *     if (ts_emit_c(&c, "examples/w1.yaml", "w1_c") != TS_OK) puts(ts_last_error());
 *     // then: make -C w1_c && cd w1_c && ./train
 *
 * The program compiles the configured step exactly as `tessel train` does
 * (one process), and writes into DIR: step.c/step.h (the arena layout, one
 * function per instruction, train_step), constants.c, main.c, a Makefile,
 * kernels/ (the library's own kernel sources, byte for byte), init.safetensors
 * (the first weights), data.bin (the batches and learning rate of
 * train.steps steps) and MANIFEST (SHA-256 of every file and of the config).
 * It needs libc, libm, OpenMP and oneDNN, not libtessel. */
#ifndef TESSEL_CODEGEN_H
#define TESSEL_CODEGEN_H

#include "tessel/config.h"
#include "tessel/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Emit the step of config `c` (read from `config_path`, hashed into the
 * manifest) into directory `dir` (created if missing; files already there
 * with the same names are replaced). */
ts_status ts_emit_c(const ts_config *c, const char *config_path, const char *dir);

#ifdef __cplusplus
}
#endif
#endif
