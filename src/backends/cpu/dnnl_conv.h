/* dnnl_conv.h — convolutions of a plan on oneDNN primitives.
 *
 * ts_cpu_prepare_conv() gives every f32 (or mixed-precision) conv, conv_bwd_data,
 * conv_bwd_weight and conv_transpose instruction of a plan a oneDNN
 * convolution primitive (forward, backward data, backward weights; the
 * transposed convolution runs as backward data, which is what oneDNN's
 * deconvolution does inside), created once when the plan is built.
 *
 * Layouts: the arena keeps torch's plain layouts (x [N, C, spatial...],
 * weights [O, C/groups, k...]). The primitives are created with "any"
 * formats so that oneDNN picks its blocked layouts (nCdhw16c, ...), and the
 * wrapper reorders operands into and out of them through the scratch
 * buffer. Measured on the W4 conv (N=4, 16->16 channels, 32^3, 3^3 pad 1,
 * 1 thread): plain formats choose gemm:jit at ~340-390 ms per pass,
 * blocked formats jit:avx512_core at ~35-40 ms with the reorders included.
 *
 * Determinism: forward and backward-data primitives reduce each output over
 * its own inputs in a fixed order, and give the same bits for any thread
 * count (tests/gradcheck/conv.c checks 1 vs 2 threads). The backward-weights
 * primitive splits its reduction over the batch between threads, so its
 * bits depend on the thread count. It is therefore run per image: one
 * primitive for a single image, created for one thread, runs on the images
 * in parallel (one lane of scratch per thread), and the per-image weight
 * gradients are added in image order. Where oneDNN offers only its
 * im2col + SGEMM path for backward weights (`gemm:jit`: AVX2-only CPUs, 3^3
 * channels-last convs), tessel's per-tap kernel (dnnl_conv_wgrad.h) runs
 * instead when the shape allows it: faster, and thread-count independent by
 * construction.
 *
 * Winograd: f32 channels-last 3^3 convolutions with stride 1, padding 1, no
 * bias and at least 16 input and output channels (W4's), forward and
 * backward data, run tessel's Winograd F(2,3)^3 kernel (dnnl_conv_winograd.h)
 * instead of oneDNN's direct one on CPUs with AVX-512F: 3.375x fewer
 * multiplies, measured 1.0-1.7x faster per W4 shape (docs/benchmarks.md).
 * TESSEL_CONV_WINOGRAD=0 in the environment keeps oneDNN's kernels (read
 * when a plan is built). Its rounding differs from the direct sum by ~1e-6
 * relative; its bits do not depend on the thread count.
 *
 * Mixed precision (conv.low, set by the precision pass): the two
 * tensor operands are bf16 and the written tensor f32 (conv: bf16 src and
 * weights -> f32 dst; backward data: bf16 diff_dst and weights -> f32
 * diff_src; backward weights: bf16 src and diff_dst -> f32 diff_weights),
 * accumulated in f32 by oneDNN's avx512_core_bf16 (or AMX) kernels; the
 * bias stays f32. f16 is tried the same way; on a CPU without an f16
 * convolution oneDNN offers none (or only its reference one) and the
 * reference kernel runs. Determinism is handled as for f32.
 *
 * An instruction whose primitive oneDNN cannot create, or for which it
 * would only offer its reference implementation, keeps the op's reference
 * kernel. All primitives of a plan share the plan's backend scratch buffer
 * (grown here if the convolutions need more than the other backend kernels);
 * a step allocates nothing. */
#ifndef TS_DNNL_CONV_H
#define TS_DNNL_CONV_H

#include "backends/backend.h"

/* Prepare the program's convolutions (no-op with reference_kernels). */
ts_status ts_cpu_prepare_conv(const ts_program *prog, ts_runtime *rt);

#endif
