#pragma once
/// @file trial_kernels.hpp
/// GPU kernels that are written and compile but have not yet run on a GPU. Most of this project
/// is built and tested on machines without one; a kernel written there stays off the default
/// path until `ctest -L gpu` has checked it against the host on a GPU and its speed was measured
/// beside the kernel it would replace (build/common/scalelab_bench_kernels). Until then it runs
/// only when asked for, by name:
///
///     SCALELAB_TRY_GPU_KERNELS=adamw_one_launch,dgelu_epilogue  ./build/...   # these two
///     SCALELAB_TRY_GPU_KERNELS=all ctest -L gpu                               # every one
///
/// or ops::set_trial_kernels (tests and benchmarks). The host is unaffected: its path is the
/// same either way. Once a kernel is checked, its name leaves kTrialKernels and its call site
/// stops asking.
#include <string>

namespace scalelab::ops {

/// The kernels on trial, and what each replaces.
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
///  - layernorm_backward_v2: LayerNorm's dx, dweight and dbias from one read of x and dout
///    (norm_cuda.cu) instead of a dx kernel and two column-sum passes.
///  - flash_backward_one_kernel: flash attention's backward (version 2) as one kernel that adds
///    dQ's shares in a fixed order (flash_attention_tc_backward_cuda.cu) instead of a dK/dV
///    kernel and a dQ kernel that both compute the scores (flash_attention_tc_cuda.cu).
///  - norm_on_device: gradient clipping's norm summed, tested and applied on the GPU
///    (ops::sum_squares_into, clip_scale, sqrt_into) instead of read back to the host (ops.cpp).
inline constexpr const char* kTrialKernels[] = {"adamw_one_launch", "bias_grad_epilogue",
                                                "dgelu_epilogue",
                                                "flash_backward_one_kernel",
                                                "flash_forward_two_row_tiles",
                                                "grouped_rows_in_chunks",
                                                "layernorm_backward_v2", "norm_on_device"};

/// Whether the trial kernel `name` (one of kTrialKernels) may run: it is named in
/// SCALELAB_TRY_GPU_KERNELS (a comma-separated list, or "all"), or by set_trial_kernels. A name
/// in that list that is not a trial kernel is a usage error (exit 2), read at the first call.
bool trial_kernel(const char* name);

/// Replaces the environment's list: "" (none), "all", or names separated by commas.
void set_trial_kernels(const std::string& list);

/// The trial kernels that may run now, as set_trial_kernels takes them: their names in
/// kTrialKernels' order, separated by commas ("" for none; "all" comes back as every name). The
/// environment's list is read first if nothing has read it yet. A test that turns kernels on
/// for a while gives this back to set_trial_kernels after, so that it leaves the list it found.
std::string trial_kernel_list();

}  // namespace scalelab::ops
