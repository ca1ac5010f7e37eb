/* quant/export.h — FP8 weight export of a checkpoint; declared in the
 * public tessel/quant.h. */
#ifndef TS_QUANT_EXPORT_H
#define TS_QUANT_EXPORT_H

#include "tessel/ckpt.h"
#include "tessel/quant.h"

#endif
