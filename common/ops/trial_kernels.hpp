#pragma once
/// @file trial_kernels.hpp
/// GPU kernels that replace a simpler one (its *version 1*), and whether each may run. Most of
/// this project is built and tested on machines without a GPU; a kernel written there stays off
/// the default path, *on trial*, until `ctest -L gpu` has checked it against the host on a GPU
/// and its speed was measured beside the kernel it would replace (build/common/
/// scalelab_bench_kernels, and lab 02's step: tools/gpu_checks/issue33.sh). Until then it runs
/// only when asked for, by name:
///
///     SCALELAB_TRY_GPU_KERNELS=layernorm_backward_v2  ./build/...   # this one as well
///     SCALELAB_TRY_GPU_KERNELS=all ctest -L gpu                     # every one
///
/// or ops::set_trial_kernels (tests and benchmarks). A kernel that passed its trial moves to
/// kCheckedKernels: on by default, and version 1 stays beside it, to be read, checked and timed
/// against it (llm.c's dev/cuda practice): "-name" turns one off, "none" runs every op's version
/// 1. The host is unaffected: its path is the same either way. The simulated GPU (Device::sim)
/// follows a GPU's choice where it is a choice of algorithm (norm_on_device, adamw_one_launch),
/// with the host's kernels: its traces and host reads are then a GPU's.
#include <string>

namespace scalelab::ops {

/// The kernels on trial (off unless named), and what each replaces.
///  - add_16_bytes: a + b for bf16 in 16-byte pieces, 8 elements a thread (pointwise_cuda.cu;
///    a multiple of 8 elements, aligned) instead of one element a thread: the same bits, more
///    bytes in flight (the block-end residual add). Not yet run on a GPU.
///  - bias_backward_v2: a bias gradient's column sums with 16-byte loads, each lane's 8 sums in
///    registers over its rows (bias_backward_v2_cuda.cu; bf16, C a multiple of 256) instead of
///    version 1's one element a thread a row (column_sums.cuh); on, it also replaces the BGRADB
///    epilogue (ops::linear_parameter_backward: the plain GEMM, then this pass). Not yet run on a
///    GPU.
///  - flash_backward_one_kernel: flash attention's backward (version 2) as one kernel that adds
///    dQ's shares in a fixed order (flash_attention_tc_backward_cuda.cu) instead of a dK/dV
///    kernel and a dQ kernel that both compute the scores (flash_attention_tc_cuda.cu). Checked
///    on an H200, but slower: 0.92 ms against 0.72 ms causal, 1.82 against 1.10 unmasked
///    (lab 02's README, "Flash attention on tensor cores").
///  - layernorm_backward_v2: LayerNorm's dx, dweight and dbias from one read of x and dout
///    (layernorm_backward_v2_cuda.cu) instead of a dx kernel and two column-sum passes
///    (norm_cuda.cu). Slower on an H200: 0.34 ms against 0.10 ms at gpt-85m's shape
///    (scalelab_bench_kernels).
///  - flash_dkdv_three_blocks: flash attention's dK/dV kernel (version 2, head size 64) compiled
///    to fit 3 blocks an SM (168 registers a thread) instead of 2 (175 registers): 12 warps an SM
///    to hide latency instead of 8 (flash_attention_tc_cuda.cu). Not yet run on a GPU.
///  - flash_dq_from_kept_ds: flash attention's backward (head size 64) with S and dP computed
///    once: the dK/dV kernel keeps each dS^T tile (bf16, 2 bytes a score; kept_ds.hpp) and the dQ
///    kernel reads it back, one product a tile (dQ += dS K), instead of computing S, dP and dS a
///    second time (flash_attention_tc_cuda.cu; with flash_backward_wgmma, wgmma's dK/dV kernel
///    keeps them). Not yet run on a GPU.
///  - flash_forward_wgmma, flash_backward_wgmma: flash attention's forward, and its backward's
///    dK/dV and dQ kernels, on Hopper's warpgroup MMA (wgmma: 64 x 64 tiles of four warps, B
///    read from shared memory once for all four) instead of each warp's mma.sync and ldmatrix
///    (flash_attention_wgmma_cuda.cu; head size 64 on compute capability 9.0, elsewhere version
///    2 runs). Not yet run on a GPU.
///  - sums_16_bytes: a sum (or sum of squares) of f32 in 16-byte pieces on 512 blocks (optim_cuda.cu;
///    a multiple of 4 elements, aligned) instead of one 4-byte element a thread on 256: clipping's
///    norm over the flat gradients; other partials, so other bits, deterministic still. Not yet
///    run on a GPU.
///  - layernorm_backward_v3: LayerNorm's backward from one read with each lane's column sums in
///    registers over all its rows, 16-byte loads (layernorm_backward_v3_cuda.cu; bf16, C a
///    multiple of 256 up to 1024) instead of version 1's dx kernel and two column-sum passes (and
///    of version 2's per-element sums in shared memory). Not yet run on a GPU.
inline constexpr const char* kTrialKernels[] = {"add_16_bytes",
                                                "bias_backward_v2",
                                                "flash_backward_one_kernel",
                                                "flash_backward_wgmma",
                                                "flash_dkdv_three_blocks",
                                                "flash_dq_from_kept_ds",
                                                "flash_forward_wgmma",
                                                "layernorm_backward_v2",
                                                "layernorm_backward_v3",
                                                "sums_16_bytes"};

/// The kernels that passed their trial (checked against the host on an H200 and no slower in
/// lab 02's step, lab 02's README), on by default, and what each replaces (its version 1):
///  - adamw_one_launch: AdamW over the flat buffers in one launch (ops::adamw_update_segments)
///    instead of one adamw_update launch per parameter (optim.cpp).
///  - bias_grad_epilogue: a Linear's weight gradient with its bias gradient summed in the GEMM's
///    epilogue (ops::linear_parameter_backward, CUBLASLT_EPILOGUE_BGRADB) instead of a matmul,
///    then a column-sum pass over the output gradient (bias_backward).
///  - dgelu_epilogue: the MLP's proj backward with GELU's backward in the cuBLASLt epilogue
///    (ops::linear_dgelu_backward) instead of a matmul, then a gelu_backward pass (mlp.cpp).
///  - flash_forward_two_row_tiles: flash attention's forward (version 2, head size 64) with 32
///    query rows a warp instead of 16, each K and V fragment feeding two products
///    (flash_attention_tc_cuda.cu).
///  - grouped_rows_in_chunks: the embedding gradient's and index_add_rows' sums of rows grouped
///    by id cut into chunks of 64 positions, summed in two passes (rows_by_id.cuh) instead of one
///    thread per (row, column) walking its whole group (the most frequent id sets the time).
///  - norm_on_device: gradient clipping's norm summed, tested and applied on the GPU
///    (ops::sum_squares_into, clip_scale, sqrt_into) instead of read back to the host (ops.cpp).
inline constexpr const char* kCheckedKernels[] = {"adamw_one_launch", "bias_grad_epilogue",
                                                  "dgelu_epilogue", "flash_forward_two_row_tiles",
                                                  "grouped_rows_in_chunks", "norm_on_device"};

/// Whether the kernel `name` (in kTrialKernels or kCheckedKernels) may run: the checked ones
/// unless turned off, the trial ones when named. A name that is neither is a usage error (exit
/// 2), read at the first call.
bool trial_kernel(const char* name);

/// Sets which kernels may run: a comma-separated list applied in order to the default (the
/// checked kernels on, the trial ones off): "name" turns one on, "-name" off, "all" every one
/// on, "none" every one off (every op's version 1). "" is the default.
void set_trial_kernels(const std::string& list);

/// What differs from the default, as set_trial_kernels takes it: "-name" for each checked kernel
/// that is off, then each trial kernel that is on, in the lists' order ("" for the default).
/// The environment's list is read first if nothing has read it yet. A test that turns kernels
/// on or off for a while gives this back to set_trial_kernels after, to leave the list it found.
std::string trial_kernel_list();

}  // namespace scalelab::ops
