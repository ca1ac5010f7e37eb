/* The "cuda" entry of the backend registry: a stand-in that loads the CUDA
 * backend plugin (libtessel_cuda.so, src/backends/cuda/, built when nvcc is
 * found) the first time a plan asks for it and forwards every call to the
 * plugin's own table, so that the tessel binary and libtessel never link
 * CUDA and start on machines without it (src/backends/cuda/plugin.h).
 *
 * The plugin is looked for at $TESSEL_CUDA_PLUGIN, then beside the running
 * executable (the build folder holds tessel, the tests and the plugin),
 * then by the dynamic loader's search path. Every failure is a
 * TS_ERR_UNSUPPORTED naming what is missing ("backend cuda: ..."). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "backends/backend.h"
#include "backends/cuda/plugin.h"

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const ts_backend *plugin; /* the plugin's table once loaded */
static char load_error[1024];    /* why it is not, when it is not */

static const ts_cuda_host host = {
    .abi = TS_CUDA_PLUGIN_ABI,
    .program_size = sizeof(ts_program),
    .runtime_size = sizeof(ts_runtime),
    .fail = ts_fail,
    .error_prefix = ts_error_prefix,
    .dtype_size = ts_dtype_size,
    .dtype_name = ts_dtype_name,
};

/* dlopen one candidate; on failure append dlerror() to load_error. */
static void *try_open(const char *path, int *found) {
    if (strchr(path, '/') && access(path, F_OK) == 0) *found = 1;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        size_t n = strlen(load_error);
        snprintf(load_error + n, sizeof load_error - n, "%s%s", n ? "; " : "", dlerror());
    }
    return h;
}

static void load(void) {
    void *h = NULL;
    int found = 0; /* a candidate file exists (its load failed for another reason) */
    const char *env = getenv("TESSEL_CUDA_PLUGIN");
    if (env && *env) h = try_open(env, &found);
    if (!h && !(env && *env)) {
        char exe[4096];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n > 0) {
            exe[n] = 0;
            char *slash = strrchr(exe, '/');
            if (slash && (size_t)(slash - exe) + 2 + strlen(TS_CUDA_PLUGIN_FILE) < sizeof exe) {
                strcpy(slash + 1, TS_CUDA_PLUGIN_FILE);
                h = try_open(exe, &found);
            }
        }
        if (!h) h = try_open(TS_CUDA_PLUGIN_FILE, &found);
    }
    if (!h) {
        /* the loader's reasons stay after the explanation (cut if long) */
        char why[sizeof load_error];
        memcpy(why, load_error, sizeof why);
        int n = found ? snprintf(load_error, sizeof load_error,
                                 "the plugin %s could not be loaded (are the CUDA runtime and "
                                 "cuBLASLt libraries on the loader's path?): ",
                                 TS_CUDA_PLUGIN_FILE)
                      : snprintf(load_error, sizeof load_error,
                                 "the plugin %s is not there (this build has no CUDA: configure "
                                 "with nvcc on the PATH and -DTESSEL_CUDA=ON, or set "
                                 "TESSEL_CUDA_PLUGIN): ",
                                 TS_CUDA_PLUGIN_FILE);
        if (n > 0 && (size_t)n < sizeof load_error)
            memcpy(load_error + n, why, strnlen(why, sizeof load_error - (size_t)n - 1) + 1);
        load_error[sizeof load_error - 1] = 0;
        return;
    }
    ts_cuda_plugin_fn entry = (ts_cuda_plugin_fn)(uintptr_t)dlsym(h, TS_CUDA_PLUGIN_SYMBOL);
    if (!entry) {
        snprintf(load_error, sizeof load_error, "%s has no %s: not a tessel CUDA plugin",
                 TS_CUDA_PLUGIN_FILE, TS_CUDA_PLUGIN_SYMBOL);
        dlclose(h);
        return;
    }
    plugin = entry(&host);
    if (!plugin) {
        snprintf(load_error, sizeof load_error,
                 "%s was built for another version of tessel (plugin ABI %d expected); rebuild it",
                 TS_CUDA_PLUGIN_FILE, TS_CUDA_PLUGIN_ABI);
        dlclose(h);
        return;
    }
    load_error[0] = 0; /* the handle stays open for the process's life */
}

static ts_status need_plugin(void) {
    pthread_once(&load_once, load);
    if (plugin) return TS_OK;
    return ts_fail(TS_ERR_UNSUPPORTED, "backend cuda: %s", load_error);
}

static int cuda_supports_op(int op) {
    return need_plugin() == TS_OK && plugin->supports_op(op);
}

static ts_status cuda_prepare(const ts_program *prog, ts_runtime *rt) {
    ts_status s = need_plugin();
    return s != TS_OK ? s : plugin->prepare(prog, rt);
}

/* The calls below only follow a successful prepare, so the plugin is there;
 * release also follows a failed one (ts_plan_free), hence its check. */
static ts_status cuda_execute(const ts_program *prog, ts_runtime *rt, int *skipped) {
    return plugin->execute(prog, rt, skipped);
}

static void cuda_profile(const ts_program *prog, const ts_runtime *rt, int i, double *seconds,
                         int64_t *calls) {
    *seconds = 0, *calls = 0;
    if (plugin) plugin->profile(prog, rt, i, seconds, calls);
}

static void cuda_profile_reset(const ts_program *prog, ts_runtime *rt) {
    if (plugin) plugin->profile_reset(prog, rt);
}

static void cuda_instr_info(const ts_program *prog, const ts_runtime *rt, int i,
                            ts_backend_instr_info *out) {
    memset(out, 0, sizeof *out);
    if (plugin) plugin->instr_info(prog, rt, i, out);
}

static void cuda_release(const ts_program *prog, ts_runtime *rt) {
    if (plugin) plugin->release(prog, rt);
}

static ts_status cuda_to_host(const ts_program *prog, ts_runtime *rt, size_t off, size_t bytes) {
    return plugin->to_host(prog, rt, off, bytes);
}

static ts_status cuda_to_device(const ts_program *prog, ts_runtime *rt, size_t off, size_t bytes) {
    return plugin->to_device(prog, rt, off, bytes);
}

static ts_status cuda_device_info(const ts_program *prog, const ts_runtime *rt,
                                  ts_device_info *out) {
    return plugin->device_info(prog, rt, out);
}

/* The tensor-core attention (cuda/attention_tc.cu) reads the packed qkv: bf16 plans, head
 * size 64; the f32 kernels take the split form only. */
static int64_t cuda_packed_attention_hd(ts_dtype compute) {
    return compute == TS_BF16 ? TS_CUDA_PACKED_ATTENTION_HD : -1;
}

const ts_backend ts_backend_cuda = {
    .name = "cuda",
    .dtypes = (1u << TS_F32) | (1u << TS_BF16) | (1u << TS_F16) | (1u << TS_I32) | (1u << TS_I64) |
              (1u << TS_U8),
    .memory = TS_MEM_DEVICE,
    .supports_op = cuda_supports_op,
    .packed_attention_hd = cuda_packed_attention_hd,
    .prepare = cuda_prepare,
    .execute = cuda_execute,
    .profile = cuda_profile,
    .profile_reset = cuda_profile_reset,
    .instr_info = cuda_instr_info,
    .release = cuda_release,
    .to_host = cuda_to_host,
    .to_device = cuda_to_device,
    .device_info = cuda_device_info,
};
