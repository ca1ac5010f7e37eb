#include "monitor_fill.h"

#include <math.h>

void tm_set_values(ts_monitor *m, double loss, double norm, double var) {
    for (int i = 0; i < TS_MON_COUNT; i++) m->value[i] = NAN;
    m->value[TS_MON_LOSS] = loss;
    m->value[TS_MON_GRAD_NORM] = norm;
    m->value[TS_MON_GRAD_VARIANCE] = var;
    m->value[TS_MON_NONFINITE] = 0;
}
