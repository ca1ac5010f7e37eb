/* cpu.h — the CPU backend's own functions (internal to src/backends/cpu;
 * the plan reaches them only through ts_backend_cpu, backend.c). */
#ifndef TS_BACKEND_CPU_H
#define TS_BACKEND_CPU_H

#include "plan/plan.h"

/* Choose optimised kernels for the plan's instructions (creating their
 * state once) and size the shared backend scratch (prepare.c). */
ts_status ts_cpu_prepare(ts_plan *p);
/* Run every instruction once, asking the update gate (if any) at
 * p->gate_ins; *skipped receives whether the update phase was skipped
 * (exec.c). */
ts_status ts_cpu_execute(ts_plan *p, int *skipped);

#endif
