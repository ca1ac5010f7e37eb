/* Shared by the peft pass's two parts (peft.c: LoRA; peft_adapter.c:
 * Houlsby adapters): the target patterns of a key and the matmul weights
 * they may name. */
#ifndef TS_PASSES_PEFT_INTERNAL_H
#define TS_PASSES_PEFT_INTERNAL_H
#include <regex.h>
#include "passes.h"
#include "tessel/peft.h"

#define TS_PEFT_MAX_PATTERNS 64

typedef struct ts_peft_patterns {
    regex_t re[TS_PEFT_MAX_PATTERNS];
    char text[TS_PEFT_MAX_PATTERNS][256];
    int n;
} ts_peft_patterns;

/* Split the comma-separated `list` and compile each pattern; errors name
 * `key` ("peft.lora.targets"). Free with ts_peft_patterns_free. */
ts_status ts_peft_patterns_compile(const char *key, const char *list, ts_peft_patterns *p);
void ts_peft_patterns_free(ts_peft_patterns *p);

/* Is value v the weight operand (second input) of node n, a live matmul
 * with a named rank-2 float parameter there? */
int ts_peft_is_weight_of(const ts_graph *g, const ts_node *n, int32_t v);

/* The error for a pattern of `key` that names no weight: `what` says what
 * it should have named and the candidates (weight[v] != 0) are listed. */
ts_status ts_peft_no_match(const ts_graph *g, const char *key, const char *pattern,
                           const char *what, const char *weight);

/* Houlsby adapters (peft_adapter.c): *list (owned by the caller, n ids)
 * receives the new parameters, down, down_bias, up, up_bias per layer. */
ts_status ts_pass_peft_adapters(ts_graph *g, const ts_peft_options *o, int32_t **list, int *n);

#endif
