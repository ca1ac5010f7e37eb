/* registry.c — the table of op definitions, indexed by ts_op_id.
 * Adding an op: a ts_op_def in its family file and one line here. */
#include <string.h>
#include "op.h"

extern const ts_op_def ts_def_add;
extern const ts_op_def ts_def_sub;
extern const ts_op_def ts_def_mul;
extern const ts_op_def ts_def_div;
extern const ts_op_def ts_def_maximum;
extern const ts_op_def ts_def_minimum;
extern const ts_op_def ts_def_maxmin_bwd;
extern const ts_op_def ts_def_where;
extern const ts_op_def ts_def_neg;
extern const ts_op_def ts_def_exp;
extern const ts_op_def ts_def_log;
extern const ts_op_def ts_def_sqrt;
extern const ts_op_def ts_def_rsqrt;
extern const ts_op_def ts_def_abs;
extern const ts_op_def ts_def_relu;
extern const ts_op_def ts_def_sigmoid;
extern const ts_op_def ts_def_tanh;
extern const ts_op_def ts_def_pow_scalar;
extern const ts_op_def ts_def_leaky_relu;
extern const ts_op_def ts_def_affine_scalar;
extern const ts_op_def ts_def_gelu;
extern const ts_op_def ts_def_cast;
extern const ts_op_def ts_def_unary_bwd;
extern const ts_op_def ts_def_matmul;
extern const ts_op_def ts_def_softmax;
extern const ts_op_def ts_def_log_softmax;
extern const ts_op_def ts_def_softmax_bwd;
extern const ts_op_def ts_def_log_softmax_bwd;
extern const ts_op_def ts_def_layer_norm;
extern const ts_op_def ts_def_layer_norm_bwd;
extern const ts_op_def ts_def_reduce_sum;
extern const ts_op_def ts_def_reduce_max;
extern const ts_op_def ts_def_reduce_max_bwd;
extern const ts_op_def ts_def_reshape;
extern const ts_op_def ts_def_permute;
extern const ts_op_def ts_def_expand;
extern const ts_op_def ts_def_concat;
extern const ts_op_def ts_def_slice;
extern const ts_op_def ts_def_slice_bwd;
extern const ts_op_def ts_def_gather;
extern const ts_op_def ts_def_scatter_add;
extern const ts_op_def ts_def_dropout;
extern const ts_op_def ts_def_bce_logits;
extern const ts_op_def ts_def_bce_logits_bwd;
extern const ts_op_def ts_def_cross_entropy;
extern const ts_op_def ts_def_cross_entropy_bwd;
extern const ts_op_def ts_def_clip_coef;
extern const ts_op_def ts_def_sgd_update;
extern const ts_op_def ts_def_adam_update;
extern const ts_op_def ts_def_attention;
extern const ts_op_def ts_def_attention_bwd;
extern const ts_op_def ts_def_conv;
extern const ts_op_def ts_def_conv_bwd_data;
extern const ts_op_def ts_def_conv_bwd_weight;
extern const ts_op_def ts_def_conv_transpose;
extern const ts_op_def ts_def_pool;
extern const ts_op_def ts_def_pool_bwd;
extern const ts_op_def ts_def_batch_norm;
extern const ts_op_def ts_def_batch_norm_bwd;
extern const ts_op_def ts_def_gru_cell;
extern const ts_op_def ts_def_gru_cell_bwd;
extern const ts_op_def ts_def_lstm_cell;
extern const ts_op_def ts_def_lstm_cell_bwd;
extern const ts_op_def ts_def_spmm;
extern const ts_op_def ts_def_quantize;
extern const ts_op_def ts_def_dequantize;
extern const ts_op_def ts_def_fake_quant;
extern const ts_op_def ts_def_fake_quant_bwd;
extern const ts_op_def ts_def_grad_stats;
extern const ts_op_def ts_def_allreduce_start;
extern const ts_op_def ts_def_allreduce_wait;
extern const ts_op_def ts_def_reduce_scatter_start;
extern const ts_op_def ts_def_reduce_scatter_wait;
extern const ts_op_def ts_def_all_gather_start;
extern const ts_op_def ts_def_all_gather_wait;
extern const ts_op_def ts_def_zero_clip_coef;
extern const ts_op_def ts_def_shard_update;
extern const ts_op_def ts_def_zero_sync;
extern const ts_op_def ts_def_zero_found_inf;
extern const ts_op_def ts_def_fused_eltwise;
extern const ts_op_def ts_def_matmul_epi;
extern const ts_op_def ts_def_unscale_grads;

static const ts_op_def *const table[TS_OP_COUNT] = {
    [TS_OP_ADD] = &ts_def_add,
    [TS_OP_SUB] = &ts_def_sub,
    [TS_OP_MUL] = &ts_def_mul,
    [TS_OP_DIV] = &ts_def_div,
    [TS_OP_MAXIMUM] = &ts_def_maximum,
    [TS_OP_MINIMUM] = &ts_def_minimum,
    [TS_OP_MAXMIN_BWD] = &ts_def_maxmin_bwd,
    [TS_OP_WHERE] = &ts_def_where,
    [TS_OP_NEG] = &ts_def_neg,
    [TS_OP_EXP] = &ts_def_exp,
    [TS_OP_LOG] = &ts_def_log,
    [TS_OP_SQRT] = &ts_def_sqrt,
    [TS_OP_RSQRT] = &ts_def_rsqrt,
    [TS_OP_ABS] = &ts_def_abs,
    [TS_OP_RELU] = &ts_def_relu,
    [TS_OP_SIGMOID] = &ts_def_sigmoid,
    [TS_OP_TANH] = &ts_def_tanh,
    [TS_OP_POW_SCALAR] = &ts_def_pow_scalar,
    [TS_OP_LEAKY_RELU] = &ts_def_leaky_relu,
    [TS_OP_AFFINE_SCALAR] = &ts_def_affine_scalar,
    [TS_OP_GELU] = &ts_def_gelu,
    [TS_OP_CAST] = &ts_def_cast,
    [TS_OP_UNARY_BWD] = &ts_def_unary_bwd,
    [TS_OP_MATMUL] = &ts_def_matmul,
    [TS_OP_SOFTMAX] = &ts_def_softmax,
    [TS_OP_LOG_SOFTMAX] = &ts_def_log_softmax,
    [TS_OP_SOFTMAX_BWD] = &ts_def_softmax_bwd,
    [TS_OP_LOG_SOFTMAX_BWD] = &ts_def_log_softmax_bwd,
    [TS_OP_LAYER_NORM] = &ts_def_layer_norm,
    [TS_OP_LAYER_NORM_BWD] = &ts_def_layer_norm_bwd,
    [TS_OP_REDUCE_SUM] = &ts_def_reduce_sum,
    [TS_OP_REDUCE_MAX] = &ts_def_reduce_max,
    [TS_OP_REDUCE_MAX_BWD] = &ts_def_reduce_max_bwd,
    [TS_OP_RESHAPE] = &ts_def_reshape,
    [TS_OP_PERMUTE] = &ts_def_permute,
    [TS_OP_EXPAND] = &ts_def_expand,
    [TS_OP_CONCAT] = &ts_def_concat,
    [TS_OP_SLICE] = &ts_def_slice,
    [TS_OP_SLICE_BWD] = &ts_def_slice_bwd,
    [TS_OP_GATHER] = &ts_def_gather,
    [TS_OP_SCATTER_ADD] = &ts_def_scatter_add,
    [TS_OP_DROPOUT] = &ts_def_dropout,
    [TS_OP_BCE_LOGITS] = &ts_def_bce_logits,
    [TS_OP_BCE_LOGITS_BWD] = &ts_def_bce_logits_bwd,
    [TS_OP_CROSS_ENTROPY] = &ts_def_cross_entropy,
    [TS_OP_CROSS_ENTROPY_BWD] = &ts_def_cross_entropy_bwd,
    [TS_OP_CLIP_COEF] = &ts_def_clip_coef,
    [TS_OP_SGD_UPDATE] = &ts_def_sgd_update,
    [TS_OP_ADAM_UPDATE] = &ts_def_adam_update,
    [TS_OP_ATTENTION] = &ts_def_attention,
    [TS_OP_ATTENTION_BWD] = &ts_def_attention_bwd,
    [TS_OP_CONV] = &ts_def_conv,
    [TS_OP_CONV_BWD_DATA] = &ts_def_conv_bwd_data,
    [TS_OP_CONV_BWD_WEIGHT] = &ts_def_conv_bwd_weight,
    [TS_OP_CONV_TRANSPOSE] = &ts_def_conv_transpose,
    [TS_OP_POOL] = &ts_def_pool,
    [TS_OP_POOL_BWD] = &ts_def_pool_bwd,
    [TS_OP_BATCH_NORM] = &ts_def_batch_norm,
    [TS_OP_BATCH_NORM_BWD] = &ts_def_batch_norm_bwd,
    [TS_OP_GRU_CELL] = &ts_def_gru_cell,
    [TS_OP_GRU_CELL_BWD] = &ts_def_gru_cell_bwd,
    [TS_OP_LSTM_CELL] = &ts_def_lstm_cell,
    [TS_OP_LSTM_CELL_BWD] = &ts_def_lstm_cell_bwd,
    [TS_OP_SPMM] = &ts_def_spmm,
    [TS_OP_QUANTIZE] = &ts_def_quantize,
    [TS_OP_DEQUANTIZE] = &ts_def_dequantize,
    [TS_OP_FAKE_QUANT] = &ts_def_fake_quant,
    [TS_OP_FAKE_QUANT_BWD] = &ts_def_fake_quant_bwd,
    [TS_OP_GRAD_STATS] = &ts_def_grad_stats,
    [TS_OP_ALLREDUCE_START] = &ts_def_allreduce_start,
    [TS_OP_ALLREDUCE_WAIT] = &ts_def_allreduce_wait,
    [TS_OP_REDUCE_SCATTER_START] = &ts_def_reduce_scatter_start,
    [TS_OP_REDUCE_SCATTER_WAIT] = &ts_def_reduce_scatter_wait,
    [TS_OP_ALL_GATHER_START] = &ts_def_all_gather_start,
    [TS_OP_ALL_GATHER_WAIT] = &ts_def_all_gather_wait,
    [TS_OP_ZERO_CLIP_COEF] = &ts_def_zero_clip_coef,
    [TS_OP_SHARD_UPDATE] = &ts_def_shard_update,
    [TS_OP_ZERO_SYNC] = &ts_def_zero_sync,
    [TS_OP_ZERO_FOUND_INF] = &ts_def_zero_found_inf,
    [TS_OP_FUSED_ELTWISE] = &ts_def_fused_eltwise,
    [TS_OP_MATMUL_EPI] = &ts_def_matmul_epi,
    [TS_OP_UNSCALE_GRADS] = &ts_def_unscale_grads,
};

const ts_op_def *ts_op_get(int op) {
    return (op >= 0 && op < TS_OP_COUNT) ? table[op] : NULL;
}

int ts_op_find(const char *name) {
    for (int i = 0; i < TS_OP_COUNT; i++)
        if (table[i] && strcmp(table[i]->name, name) == 0) return i;
    return -1;
}
