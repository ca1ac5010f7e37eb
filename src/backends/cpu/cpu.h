/* cpu.h — the CPU backend's own functions (internal to src/backends/cpu;
 * the plan reaches them only through ts_backend_cpu, backend.c). */
#ifndef TS_BACKEND_CPU_H
#define TS_BACKEND_CPU_H

#include "backends/backend.h"

/* Choose optimised kernels for the program's instructions (creating their
 * state once in rt) and size the shared backend scratch (prepare.c). */
ts_status ts_cpu_prepare(const ts_program *prog, ts_runtime *rt);
/* Run every instruction once, asking the update gate (if any) at
 * prog->gate_ins; *skipped receives whether the update phase was skipped
 * (exec.c). */
ts_status ts_cpu_execute(const ts_program *prog, ts_runtime *rt, int *skipped);
ts_status ts_cpu_execute_range(const ts_program *prog, ts_runtime *rt, int lo, int hi);

#endif
