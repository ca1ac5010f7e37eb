/* op_ids.h — the op ids (internal), one per line of ops.def, in its order.
 * Kept apart from op.h (how an op is defined, which needs the graph IR) so
 * that code below the IR, such as the backends, can name ops. */
#ifndef TS_OP_IDS_H
#define TS_OP_IDS_H

typedef enum ts_op_id {
#define X(NAME, name) TS_OP_##NAME,
#include "ops/ops.def"
#undef X
    TS_OP_COUNT
} ts_op_id;

#endif
