/* plot.h — PNG curves of a run; the API is public: tessel/plot.h. */
#ifndef TS_OBS_PLOT_H
#define TS_OBS_PLOT_H

#include "tessel/plot.h"

#endif
