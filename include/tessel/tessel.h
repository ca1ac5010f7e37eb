/* tessel/tessel.h — the whole public API.
 *
 * tessel compiles a model's whole training step (forward, backward,
 * optimizer) into one static plan with a fixed memory layout and runs it.
 * Start with graph.h (build), compile.h (compile), plan.h (run); or with
 * config.h and session.h to train a configured model as `tessel train` does.
 */
#ifndef TESSEL_H
#define TESSEL_H

#include "tessel/status.h"
#include "tessel/dtype.h"
#include "tessel/log.h"
#include "tessel/graph.h"
#include "tessel/compile.h"
#include "tessel/plan.h"
#include "tessel/models.h"
#include "tessel/sparse.h"
#include "tessel/ckpt.h"
#include "tessel/dist.h"
#include "tessel/quant.h"
#include "tessel/util.h"
#include "tessel/data.h"
#include "tessel/plot.h"
#include "tessel/progress.h"
#include "tessel/config.h"
#include "tessel/session.h"
#include "tessel/pipeline.h"

#define TESSEL_VERSION "0.1.0"

#endif
