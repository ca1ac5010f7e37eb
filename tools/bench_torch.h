/* bench_torch.h — the PyTorch side of `tessel bench --compare-torch`: which
 * interpreter runs the reference script (torch_bench.py), in which modes,
 * and one timed run of one mode. Used by bench_step.c:
 *
 *     ts_status s = ts_torch_check_python(o->python);     // exists, executable
 *     char ver[32]; int major;
 *     if (s == TS_OK) s = ts_torch_version(o->python, ver, sizeof ver, &major);
 *     const char *modes[TS_TORCH_N_MODES];
 *     int n = ts_torch_pick_modes(o, major, modes);        // --torch-mode / --torch-best
 *     ts_bench_side t;
 *     s = ts_torch_run(o, modes[0], &t);                   // the RESULT line's figures
 *
 * Modes are torch_bench.py's: eager, compile (torch.compile of the model),
 * compile_opt (and of opt.step), bf16 (autocast), bf16_compile; the
 * compiled ones need torch >= 2. */
#ifndef TESSEL_TOOLS_BENCH_TORCH_H
#define TESSEL_TOOLS_BENCH_TORCH_H

#include <stddef.h>
#include "bench_step.h"

enum { TS_TORCH_N_MODES = 5 };

/* 1 if `mode` is one of the five modes above. */
int ts_torch_mode_valid(const char *mode);
/* "eager fp32", "bf16 autocast", ...: what a mode runs, for reports. */
const char *ts_torch_mode_label(const char *mode);

/* TS_OK if `python` names an executable file (a path, or a name found on
 * $PATH); otherwise an error naming it. */
ts_status ts_torch_check_python(const char *python);

/* Imports torch with `python`: its version string and major number. An
 * error naming the interpreter if torch does not import. */
ts_status ts_torch_version(const char *python, char *version, size_t n, int *major);

/* The modes one comparison runs, into modes[] (at most TS_TORCH_N_MODES):
 * o->torch_mode alone; with o->torch_best every mode of o->precision that
 * torch `major` supports (fp32: eager, compile, compile_opt; bf16: bf16,
 * bf16_compile; torch 1.x: eager or bf16 only, and W1 eager, whose
 * autocast fails there); otherwise the precision's default (bf16 autocast
 * for bf16 except W1, else eager). Returns how many. */
int ts_torch_pick_modes(const ts_bench_options *o, int major, const char **modes);

/* One run of the reference script in `mode`: median step, throughput and
 * peak RSS from its RESULT line. */
ts_status ts_torch_run(const ts_bench_options *o, const char *mode, ts_bench_side *t);

#endif
