/* GPU metrics of a run on the CUDA backend (docs/cuda.md): after each step,
 * the device's utilisation, memory used and power draw (NVML, through
 * ts_plan_device_info) as the Prometheus gauges tessel_gpu_* (so an alert
 * rule can watch them, e.g. utilisation above 95 for 3 minutes) and the
 * TensorBoard scalars gpu/... Values NVML cannot give (no libnvidia-ml) are
 * left out. A plan on the CPU reports nothing. */
#include <math.h>
#include "session/session_internal.h"

static const char *const NAMES[3] = {"tessel_gpu_utilization_percent",
                                     "tessel_gpu_memory_used_bytes", "tessel_gpu_power_watts"};
static const char *const HELP[3] = {"GPU utilisation over NVML's last sample period, percent",
                                    "device memory in use (all processes), bytes",
                                    "power draw of the GPU, watts"};
static const char *const TAGS[3] = {"gpu/utilization_percent", "gpu/memory_used_bytes",
                                    "gpu/power_watts"};

ts_status ts_sess_gpu_observe(session *s, int64_t step) {
    ts_device_info d;
    if (!s->c.compile.backend || ts_plan_device_info(s->plan, &d) != TS_OK) return TS_OK;
    const double v[3] = {d.util_pct, d.mem_used_bytes, d.power_w};
    ts_status st = TS_OK;
    for (int i = 0; i < 3 && st == TS_OK; i++) {
        if (!isfinite(v[i])) continue;
        if (s->tm_made && !s->gpu_m[i])
            st = ts_metrics_gauge(s->tm.reg, NAMES[i], HELP[i], 0, NULL, &s->gpu_m[i]);
        if (st == TS_OK && s->gpu_m[i]) st = ts_metric_set(s->gpu_m[i], v[i]);
        if (st == TS_OK && s->tb) st = ts_tfevents_scalars(s->tb, step, 1, &TAGS[i], &v[i]);
    }
    return st;
}
