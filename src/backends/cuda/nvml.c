/* GPU metrics through NVML (the driver's libnvidia-ml.so.1), loaded with
 * dlopen the first time they are asked for, so neither the plugin nor
 * tessel needs NVML to load: without it every value is NAN. The few
 * declarations below are NVML's stable C ABI (nvml.h), written out because
 * the toolkit on a build machine need not ship the header. */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include "backends/cuda/cuda.h"

typedef struct nvml_device *nvml_dev; /* nvmlDevice_t */
typedef struct {
    unsigned int gpu, memory; /* percent of the last sample period */
} nvml_util;
typedef struct {
    unsigned long long total, free, used; /* bytes */
} nvml_mem;

static struct {
    int ok;
    int (*init)(void);
    int (*by_pci)(const char *bus_id, nvml_dev *dev);
    int (*util)(nvml_dev dev, nvml_util *u);
    int (*mem)(nvml_dev dev, nvml_mem *m);
    int (*power)(nvml_dev dev, unsigned int *milliwatts);
} nv;
static pthread_once_t nv_once = PTHREAD_ONCE_INIT;

static void nv_load(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    *(void **)&nv.init = dlsym(h, "nvmlInit_v2");
    *(void **)&nv.by_pci = dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2");
    *(void **)&nv.util = dlsym(h, "nvmlDeviceGetUtilizationRates");
    *(void **)&nv.mem = dlsym(h, "nvmlDeviceGetMemoryInfo");
    *(void **)&nv.power = dlsym(h, "nvmlDeviceGetPowerUsage");
    nv.ok = nv.init && nv.by_pci && nv.util && nv.mem && nv.power && nv.init() == 0;
}

int cu_nvml_read(int device, double *util, double *mem_used, double *power_w) {
    *util = *mem_used = *power_w = NAN;
    pthread_once(&nv_once, nv_load);
    if (!nv.ok) return 0;
    char bus[32];
    nvml_dev d;
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess || nv.by_pci(bus, &d) != 0)
        return 0;
    nvml_util u;
    nvml_mem m;
    unsigned int mw;
    if (nv.util(d, &u) == 0) *util = u.gpu;
    if (nv.mem(d, &m) == 0) *mem_used = (double)m.used;
    if (nv.power(d, &mw) == 0) *power_w = mw / 1000.0;
    return 1;
}
