/* parity.h — compare one training run of a tessel model with a PyTorch
 * fixture (tests/parity/fixtures, made by tests/parity/gen_fixtures.py):
 * initial weights and one batch in; loss and every gradient of the first
 * step, and the parameters after two AdamW steps on the same batch, out. */
#ifndef TS_TEST_PARITY_H
#define TS_TEST_PARITY_H

#include "check.h"

/* Loads weights "param.NAME" into the compiled plan, feeds "input.x" to
 * input_name and "target.y" to target_name, and checks:
 *   loss within 1e-5 relative, each gradient within 1e-4 * max|ref|,
 *   parameters after 2 steps within lr * 1e-3 absolute.
 * Returns the number of failed comparisons. */
int parity_run(const char *fixture, const ts_graph *g, ts_val loss, const char *input_name,
               const char *target_name, ts_optimizer opt);

/* As parity_run, and after the two steps also compares every fixture
 * tensor "buffer.NAME" (BatchNorm running_mean / running_var) with
 * ts_plan_read(NAME), within 1e-5 * max(1, max|ref|). */
int parity_run_buffers(const char *fixture, const ts_graph *g, ts_val loss,
                       const char *input_name, const char *target_name, ts_optimizer opt);

#endif
