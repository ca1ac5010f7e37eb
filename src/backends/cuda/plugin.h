/* plugin.h — the boundary between libtessel and the CUDA backend plugin
 * (libtessel_cuda.so, built from this folder when nvcc is found).
 *
 * The tessel binary never links CUDA: src/backends/cuda_loader.c registers
 * a backend named "cuda" whose prepare dlopen()s the plugin, looks up
 * TS_CUDA_PLUGIN_SYMBOL and calls it with the host functions below; the
 * plugin answers with its own ts_backend table, to which every later call
 * is forwarded. The plugin links no part of libtessel (the executable's
 * symbols are not exported to it), so what it needs from the library comes
 * through ts_cuda_host:
 *
 *     const ts_backend *(*entry)(const ts_cuda_host *) = dlsym(h, TS_CUDA_PLUGIN_SYMBOL);
 *     const ts_backend *be = entry(&host);   // NULL: ABI mismatch (host->abi)
 */
#ifndef TS_CUDA_PLUGIN_H
#define TS_CUDA_PLUGIN_H

#include <stdint.h>
#include "backends/backend.h"

/* Bumped whenever ts_cuda_host, ts_backend or the program/runtime structs
 * change layout; the plugin refuses a host of another version. */
#define TS_CUDA_PLUGIN_ABI    2
#define TS_CUDA_PLUGIN_SYMBOL "ts_cuda_plugin_v1"
#define TS_CUDA_PLUGIN_FILE   "libtessel_cuda.so"

/* The head size of the plugin's packed attention (tensor-core kernels,
 * attention_tc.cu: CU_ATTN_TC_HD), which the loader reports as
 * ts_backend.packed_attention_hd for bf16 plans. */
#define TS_CUDA_PACKED_ATTENTION_HD 64

typedef struct ts_cuda_host {
    int abi;             /* TS_CUDA_PLUGIN_ABI */
    size_t program_size; /* sizeof(ts_program), sizeof(ts_runtime): layout checks */
    size_t runtime_size;
    /* ts_fail: records the message as the library's last error */
    ts_status (*fail)(ts_status s, const char *fmt, ...) TS_PRINTF(2, 3);
    void (*error_prefix)(const char *fmt, ...) TS_PRINTF(1, 2);
    size_t (*dtype_size)(ts_dtype t);
    const char *(*dtype_name)(ts_dtype t);
} ts_cuda_host;

typedef const ts_backend *(*ts_cuda_plugin_fn)(const ts_cuda_host *host);

#endif
