/* session.h — a training run; the API is public: tessel/session.h. */
#ifndef TS_SESSION_H
#define TS_SESSION_H

#include "frontend/config.h"
#include "obs/progress.h"
#include "tessel/session.h"

#endif
