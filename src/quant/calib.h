/* quant/calib.h — the error report behind `tessel quant report`; declared
 * in the public tessel/quant.h. */
#ifndef TS_QUANT_CALIB_H
#define TS_QUANT_CALIB_H

#include "tessel/quant.h"

#endif
