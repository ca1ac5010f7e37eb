/* synthetic.h — deterministic synthetic batches; declared in the public
 * tessel/data.h. */
#ifndef TS_DATA_SYNTHETIC_H
#define TS_DATA_SYNTHETIC_H

#include "tessel/data.h"

#endif
