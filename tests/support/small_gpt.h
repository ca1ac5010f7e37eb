/* small_gpt.h — the small bf16-pass test GPT: two layers, batch 2, context
 * 70 (a ragged attention block), vocabulary 64, d_model 40 in 4 heads,
 * trained by SGD at lr 0.1, compiled with the caller's options and its
 * compiled graph kept for inspection (a failed build or compile is a CHECK
 * failure and NULL).
 *
 *     ts_compile_options o = ts_compile_options_default();
 *     o.precision.compute = TS_BF16;
 *     ts_compiled_graph kept;
 *     ts_plan *p = small_gpt_plan(&o, &kept);
 */
#ifndef TS_TEST_SMALL_GPT_H
#define TS_TEST_SMALL_GPT_H

#include "plan/plan.h"
#include "tessel/models.h"

enum { SMALL_GPT_B = 2, SMALL_GPT_T = 70, SMALL_GPT_V = 64 };

ts_plan *small_gpt_plan(const ts_compile_options *o, ts_compiled_graph *kept);

#endif
