/* block_reduce.cuh — the fixed-order block reductions the CUDA kernels share
 * (through launch.cuh, and bn_pool.cu). Every thread of a block of CU_BLOCK threads
 * calls them with its value and a shared array of CU_BLOCK elements; all
 * get the block's total (or maximum), summed in one fixed tree, so the
 * result does not depend on timing: deterministic.
 *
 *     __shared__ double sh[CU_BLOCK];
 *     double total = cu_block_sum(mine, sh);
 */
#ifndef TESSEL_CUDA_BLOCK_REDUCE_CUH
#define TESSEL_CUDA_BLOCK_REDUCE_CUH

#define CU_BLOCK 256

__device__ static inline double cu_block_sum(double v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int w = CU_BLOCK / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

__device__ static inline float cu_block_max(float v, float *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int w = CU_BLOCK / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + w]);
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

#endif
