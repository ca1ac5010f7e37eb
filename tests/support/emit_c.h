/* emit_c.h — checking a program of `tessel compile --emit-c` against
 * `tessel train` (tests/e2e/emit_c*.c; docs/aot.md).
 *
 *     char dir[64];
 *     if (!e2e_setup("emit_c", dir, sizeof dir)) ...;
 *     emit_c_check("w1", "examples/w1.yaml", "", 20);  // emit, make, run, compare
 */
#ifndef TS_TEST_EMIT_C_H
#define TS_TEST_EMIT_C_H

/* In the e2e scratch directory: emits CONFIG with the --set options SETS
 * and train.steps=STEPS into TAG/, builds it with cc (CC="ccache cc" when
 * ccache is installed), runs ./train, and checks that its weights equal
 * byte for byte those `tessel train` writes for the same config (exported
 * from its checkpoint at STEPS). Returns 1 when every check passed. */
int emit_c_check(const char *tag, const char *config, const char *sets, int steps);
/* The compiler the tests build emitted programs with. */
const char *emit_c_cc(void);
/* 1 when two safetensors files hold the same tensors (names, dtypes,
 * shapes, bytes); otherwise 0, with the first difference named on stderr. */
int emit_c_same_weights(const char *a, const char *b);

#endif
