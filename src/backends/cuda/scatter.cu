/* Deterministic scatter-add (the embedding's backward) on the GPU:
 *
 *     y = zeros [outer, extent, inner];  y[b, idx[j], :] += dy[b, j, :]
 *
 * Float atomics would add the rows of one index in whatever order the
 * threads arrive. Instead the (index, position) pairs are sorted by index
 * with CUB's radix sort, which is stable, so the positions of one index
 * stay in increasing order; then the thread that owns the first position of
 * a run of equal indices sums that run's rows in order, as the CPU kernel
 * does. Scratch (cu_scatter_add_scratch): keys and positions twice, then
 * CUB's temporary storage. */
#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>
#include <stdint.h>

#include "backends/cuda/kernels.h"

#define THREADS 256

static size_t align_up(size_t x) {
    return (x + 255) & ~(size_t)255;
}

/* The key bits the sort looks at: enough for 0..extent (extent marks a bad index). */
static int key_bits(int64_t extent) {
    int bits = 1;
    while (bits < 31 && ((int64_t)1 << bits) <= extent) bits++;
    return bits;
}

/* Bytes CUB needs to sort n pairs of int keys and values (0 on error). */
static size_t cub_bytes(int64_t n, int bits) {
    size_t temp = 0;
    if (cub::DeviceRadixSort::SortPairs(nullptr, temp, (const int *)nullptr, (int *)nullptr,
                                        (const int *)nullptr, (int *)nullptr, (int)n, 0,
                                        bits) != cudaSuccess)
        return 0;
    return temp;
}

extern "C" size_t cu_scatter_add_scratch(int64_t nidx, int64_t extent) {
    size_t arr = align_up((size_t)nidx * sizeof(int));
    size_t temp = cub_bytes(nidx, key_bits(extent));
    return temp ? 4 * arr + align_up(temp) : 0;
}

/* keys[j] = idx[j] (out-of-range: extent, sorted last and skipped), vals[j] = j. */
__global__ void k_keys(int *keys, int *vals, const void *idx, int idx64, int64_t n, int64_t extent,
                       int *err) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride) {
        int64_t r = idx64 ? ((const int64_t *)idx)[j] : (int64_t)((const int32_t *)idx)[j];
        if (r < 0 || r >= extent) {
            *err = 1;
            r = extent;
        }
        keys[j] = (int)r;
        vals[j] = (int)j;
    }
}

/* One thread per (b, sorted position p, k): when p starts a run of equal
 * keys, y[b, key, k] = the sum of dy[b, pos, k] over the run, in order. */
__global__ void k_runs(float *y, const float *dy, const int *keys, const int *pos, int64_t n,
                       int64_t outer, int64_t extent, int64_t inner) {
    const int64_t total = outer * n * inner, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        int64_t k = t % inner, p = (t / inner) % n, b = t / (inner * n);
        int key = keys[p];
        if (key >= extent || (p > 0 && keys[p - 1] == key)) continue;
        float acc = 0.0f;
        for (int64_t q = p; q < n && keys[q] == key; q++) acc += dy[(b * n + pos[q]) * inner + k];
        y[(b * extent + key) * inner + k] = acc;
    }
}

static unsigned grid_for(int64_t n) {
    int64_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

extern "C" int cu_scatter_add(float *y, const float *dy, const void *idx, int idx64, int64_t nidx,
                              int64_t outer, int64_t extent, int64_t inner, void *scratch,
                              size_t scratch_bytes, int *err, cu_stream s) {
    cudaStream_t cs = (cudaStream_t)s;
    cudaError_t e = cudaMemsetAsync(y, 0, (size_t)(outer * extent * inner) * sizeof(float), cs);
    if (e != cudaSuccess || nidx <= 0) return (int)e;
    size_t arr = align_up((size_t)nidx * sizeof(int));
    char *base = (char *)scratch;
    int *keys = (int *)base, *vals = (int *)(base + arr);
    int *skeys = (int *)(base + 2 * arr), *svals = (int *)(base + 3 * arr);
    size_t temp = scratch_bytes - 4 * arr;
    k_keys<<<grid_for(nidx), THREADS, 0, cs>>>(keys, vals, idx, idx64, nidx, extent, err);
    e = cub::DeviceRadixSort::SortPairs(base + 4 * arr, temp, keys, skeys, vals, svals, (int)nidx,
                                        0, key_bits(extent), cs);
    if (e != cudaSuccess) return (int)e;
    k_runs<<<grid_for(outer * nidx * inner), THREADS, 0, cs>>>(y, dy, skeys, svals, nidx, outer,
                                                               extent, inner);
    return (int)cudaGetLastError();
}
