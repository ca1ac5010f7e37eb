/* launch.cuh — what the CUDA kernel files share (eltwise.cu, shape.cu,
 * reduce.cu, norm_loss.cu, optim.cu): launch shapes, the error check after a
 * launch, the copy kernels' unit dispatch, and reading an index tensor.
 *
 *     k<<<grid_fill(n), THREADS, 0, stream>>>(...);
 *     return launched();   // 0 or the cudaError of the launch
 */
#ifndef TESSEL_CUDA_LAUNCH_CUH
#define TESSEL_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

#include "backends/cuda/block_reduce.cuh"

#define THREADS CU_BLOCK

/* Blocks for a grid-stride loop over n elements. */
static inline unsigned grid_for(int64_t n) {
    int64_t b = (n + THREADS - 1) / THREADS;
    if (b < 1) b = 1;
    if (b > 65535) b = 65535;
    return (unsigned)b;
}

/* Blocks for one block per row (grid-stride beyond 65535 rows). */
static inline unsigned row_blocks(int64_t rows) {
    return rows > 65535 ? 65535u : (unsigned)rows;
}

static inline int launched(void) {
    return (int)cudaGetLastError();
}

/* Blocks for the grid-stride loops of the memory-bound kernels (elementwise,
 * cast, copies): 16 blocks of THREADS per SM (two waves at the 8 resident
 * blocks an SM holds at most; the loop covers the rest), fewer when n is
 * small. The SM count is asked once (132 on an H200). */
static inline unsigned grid_fill(int64_t n) {
    static std::atomic<int> sms{0};
    int m = sms.load(std::memory_order_relaxed);
    if (m <= 0) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&m, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            m <= 0) {
            (void)cudaGetLastError(); /* not this launch's error: only a launch shape */
            m = 132;
        }
        sms.store(m, std::memory_order_relaxed);
    }
    int64_t b = (n + THREADS - 1) / THREADS, cap = (int64_t)m * 16;
    if (b > cap) b = cap;
    if (b < 1) b = 1;
    return (unsigned)b;
}

/* The widest unit of 16, 8, 4, 2 or 1 bytes that divides every value of v
 * (addresses and byte counts): the copy kernels move whole units. */
static inline int unit_of(const uint64_t *v, int nv) {
    uint64_t g = 0;
    for (int i = 0; i < nv; i++) g |= v[i];
    int u = 16;
    while (u > 1 && (g & (uint64_t)(u - 1))) u >>= 1;
    return u;
}

/* Calls F<U, Idx>(...) for the unit of u bytes (uint4 for 16, uint2 for 8,
 * else the unsigned integer of that size) and Idx uint32_t when small (every
 * index and offset below 2^31: cheap 32-bit division), else uint64_t. */
#define UNIT_CALL(F, Idx, u, ...)                                                                  \
    switch (u) {                                                                                   \
    case 16: F<uint4, Idx>(__VA_ARGS__); break;                                                    \
    case 8: F<uint2, Idx>(__VA_ARGS__); break;                                                     \
    case 4: F<uint32_t, Idx>(__VA_ARGS__); break;                                                  \
    case 2: F<uint16_t, Idx>(__VA_ARGS__); break;                                                  \
    default: F<uint8_t, Idx>(__VA_ARGS__);                                                         \
    }
#define UNIT_DISPATCH(F, u, small, ...)                                                            \
    do {                                                                                           \
        if (small) {                                                                               \
            UNIT_CALL(F, uint32_t, u, __VA_ARGS__)                                                 \
        } else {                                                                                   \
            UNIT_CALL(F, uint64_t, u, __VA_ARGS__)                                                 \
        }                                                                                          \
    } while (0)

/* Element j of an index tensor of int64 (idx64) or int32. */
__device__ static inline int64_t index_at(const void *idx, int idx64, int64_t j) {
    return idx64 ? ((const int64_t *)idx)[j] : (int64_t)((const int32_t *)idx)[j];
}

#endif
