/* registry.c — the table of op definitions, indexed by ts_op_id, generated
 * from ops.def. Adding an op: a ts_op_def in its family file and one line
 * in ops.def. */
#include <string.h>
#include "op.h"

#define X(NAME, name) extern const ts_op_def ts_def_##name;
#include "ops/ops.def"
#undef X

static const ts_op_def *const table[TS_OP_COUNT] = {
#define X(NAME, name) [TS_OP_##NAME] = &ts_def_##name,
#include "ops/ops.def"
#undef X
};

const ts_op_def *ts_op_get(int op) {
    return (op >= 0 && op < TS_OP_COUNT) ? table[op] : NULL;
}

int ts_op_find(const char *name) {
    for (int i = 0; i < TS_OP_COUNT; i++)
        if (table[i] && strcmp(table[i]->name, name) == 0) return i;
    return -1;
}
