#!/usr/bin/env bash
# Issue 33's measurements on one GPU (H100 or H200), in one call: lab 02 against PyTorch-compiled
# at gpt-85m, batch 16 x context 1024, bf16 (tools/bench_gpt_vs_torch: tokens/s, MFU, peak
# memory), and one step's kernel time by what the kernels do, scalelab beside PyTorch
# (tools/kernel_table.py: ncu on lab 02 at two step counts, torch.profiler on PyTorch's step).
#
# On the build machine, from the project root:
#   ../shared/gpu/pack $(tools/gpu_checks/issue33.sh --targets)
# On the GPU machine, from a copy of the same checkout, with $OUT the folder that comes back:
#   bash tools/gpu_checks/issue33.sh        # summary in $OUT/summary.txt, the table in
#                                           # $OUT/kernel_table.md, everything in full.log
# DEADLINE / ONLY / SKIP as in tools/gpu_checks/run_step.sh. Exit status: the failed steps.
set -uo pipefail
if [[ ${1:-} == --targets ]]; then
  echo lab02_single_device_solution test_ops_cuda test_ops_cuda_bf16 test_ops_cuda_flash \
    test_wgmma_products scalelab_bench_kernels scalelab_bench_adamw scalelab_bench_attention
  exit 0
fi
# run NAME CAP CMD...; $failed; DEADLINE (sourced first: it refuses the build machine)
source "$(dirname "$0")/run_step.sh"
source build/gpu-pack/env.sh || exit 1
out=${OUT:-/tmp}
export SCALELAB_BUILD_DIR=$B
lab02=("$B/labs/lab02_single_device_solution" --device cuda --precision bf16 --model gpt-85m
       --batch 16 --context 1024 --attention flash --log-every 1 --eval-every 0 --eval-batches 1
       --sample 0 --checkpoint "$out/lab02.ckpt" --data "$DATA")
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)

# In the order of what the issue needs most, so that a DEADLINE cuts the least needed last.
# 1. the trial kernels' tests (common/ops/trial_kernels.hpp: written without a GPU, off by default
# until checked on one). A trial kernel leaves the list once its test passed and it is no slower.
TAILN=40 run trial_kernel_tests 120 env SCALELAB_TRY_GPU_KERNELS=all "$B/tests/common/test_ops_cuda" \
  --gtest_filter='*LayerNormBackwardVersion*:*ReductionsAndOptimizers*:*SumsIn16BytePieces*:*GroupedRowsInChunks*:*EmbeddingBackwardVersion1*'
TAILN=40 run trial_kernel_tests_bf16 120 "$B/tests/common/test_ops_cuda_bf16" \
  --gtest_filter='*NormSoftmax*:*Dgelu*:*BiasGrad*:*BiasBackwardVersion2*:*AddIn16BytePieces*:*TrialKernels*'
# flash attention's forward with two row tiles a warp and its backward in one kernel (dQ's shares
# added in a fixed order): against the host and version 2's default kernels, their own bits
# twice; one process each, as a turn that never comes traps and takes the CUDA context with it
TAILN=12 run trial_flash_forward_test 90 "$B/tests/common/test_ops_cuda_flash" \
  --gtest_filter='*TwoRowTileForward*'
TAILN=12 run trial_flash_backward_test 90 "$B/tests/common/test_ops_cuda_flash" \
  --gtest_filter='*OneKernelBackward*'
TAILN=12 run trial_flash_dkdv_test 90 "$B/tests/common/test_ops_cuda_flash" \
  --gtest_filter='*DkdvKernelAtThreeBlocks*'
# dQ from the dS^T the dK/dV kernel kept (written without a GPU; its own buffer of tiles): against
# the host and version 2, then the short shapes under memcheck (a tile stored or read out of place)
TAILN=12 run trial_flash_kept_ds_test 90 "$B/tests/common/test_ops_cuda_flash" \
  --gtest_filter='*KeptDsBackwardMatchesTheHost*:*KeptDsBackwardOnLongShapes*'
if command -v compute-sanitizer > /dev/null; then
  TAILN=12 run trial_flash_kept_ds_memcheck 120 compute-sanitizer --tool memcheck \
    --error-exitcode 1 "$B/tests/common/test_ops_cuda_flash" \
    --gtest_filter='*KeptDsBackwardMatchesTheHost*'
fi
# flash attention on Hopper's warpgroup MMA (written without a GPU): against the host and version
# 2, then under compute-sanitizer's memcheck (out-of-bounds or misaligned shared and global
# accesses of the swizzled tiles)
# first each kind of product alone (S = Q K^T from two K-major tiles; O += P V from register
# fragments and an MN-major tile): if the kernels' test fails, these say whether the descriptors
# and layouts are wrong or the flash logic
TAILN=12 run wgmma_products_test 60 "$B/tests/common/test_wgmma_products"
TAILN=12 run trial_flash_wgmma_test 90 "$B/tests/common/test_ops_cuda_flash" \
  --gtest_filter='*WgmmaKernels*:*WgmmaKeptDs*'
if command -v compute-sanitizer > /dev/null; then
  TAILN=12 run trial_flash_wgmma_memcheck 150 compute-sanitizer --tool memcheck \
    --error-exitcode 1 "$B/tests/common/test_ops_cuda_flash" --gtest_filter='*WgmmaKernels*'
fi
# Block::backward sets its temporaries' gradients into uninitialised memory (nn::InputGrad::set,
# cuBLAS beta 0): the same losses with every new tensor starting as NaN (SCALELAB_POISON_EMPTY)
# as without; a kernel that reads what it never wrote would make them NaN or different
TAILN=8 run poisoned_empty_same_losses 120 sh -c '"$@" --steps 3 --log-every 1 | grep -o "loss=[^ ]*" \
  > "'"$out"'/losses_plain.txt" && SCALELAB_POISON_EMPTY=1 "$@" --steps 3 --log-every 1 \
  | grep -o "loss=[^ ]*" > "'"$out"'/losses_poisoned.txt" && cat "'"$out"'/losses_plain.txt" \
  && cmp "'"$out"'/losses_plain.txt" "'"$out"'/losses_poisoned.txt" && echo same losses' \
  sh "${lab02[@]}"
# 2. the side-by-side table (the issue's target: >= 1.0x PyTorch-compiled, memory <= its), as the
# default path runs, with the candidate default ($new: the trial kernels that would join it if
# their tests above passed) and with it less the wgmma kernels ($safer: the row that stands if
# theirs fail), against the same PyTorch run (every op's version 1 and the trial kernels one by
# one: lab02_trial_*, 4.)
safer=flash_dq_from_kept_ds,layernorm_backward_v3,bias_backward_v2,add_16_bytes,sums_16_bytes
new=flash_forward_wgmma,flash_backward_wgmma,$safer
TAILN=16 run side_by_side 240 python3 tools/bench_gpt_vs_torch --model gpt-85m --batch 16 \
  --steps 10 --warmup 3 --data "$DATA" --also-kernels "$new" --also-kernels "$safer"
# 3. the kernel pairs side by side, each checked against the host: attention (the one-kernel
# backward beside the two-kernel one and PyTorch's; cuDNN's took 2.7 ms a step), then
# LayerNorm's backward, the MLP's DGELU epilogue, the bias gradients' BGRADB epilogue, the
# token embedding's gradient (versions 1, 2 and 3: the chunked groups)
TAILN=20 run flash_backward_one_kernel 120 "$B/common/scalelab_bench_attention" --device cuda \
  --dtype bf16 --batch 16 --heads 12 --context 1024 --head-size 64 --repeats 10 --warmup 3 \
  --torch-python python3
# unmasked (lab 11's off-diagonal blocks), where the one-kernel backward's key blocks all start
# at query tile 0 and take their turns there one after the other: flip it for causal only if it
# loses here
TAILN=16 run flash_unmasked 90 "$B/common/scalelab_bench_attention" --device cuda --dtype bf16 \
  --batch 16 --heads 12 --context 1024 --head-size 64 --repeats 10 --warmup 3 --mask none \
  --torch-python python3
TAILN=12 run kernel_pairs 120 "$B/common/scalelab_bench_kernels"
# 4. each newer kernel alone in lab 02's step (on top of every op's version 1), then none, the
# default (the checked kernels) and all: which one buys what, end to end (lab 02's row of the
# side-by-side table, measured the same way, without PyTorch's)
# (the candidate defaults, $new and $safer, are timed in side_by_side above, beside PyTorch)
for k in none adamw_one_launch add_16_bytes bias_backward_v2 bias_grad_epilogue dgelu_epilogue \
  flash_backward_one_kernel flash_backward_wgmma flash_dkdv_three_blocks flash_dq_from_kept_ds \
  flash_forward_two_row_tiles flash_forward_wgmma grouped_rows_in_chunks layernorm_backward_v2 \
  layernorm_backward_v3 norm_on_device sums_16_bytes default all; do
  case $k in
    none | all) list=$k ;;
    default) list= ;;
    *) list=none,$k ;;
  esac
  TAILN=3 run "lab02_trial_$k" 60 env SCALELAB_TRY_GPU_KERNELS="$list" python3 \
    tools/bench_gpt_vs_torch --scalelab-only --model gpt-85m --batch 16 --steps 5 --warmup 3 \
    --data "$DATA"
done
TAILN=16 run trial_table 10 python3 tools/gpu_checks/trial_table.py "$out/full.log"
# 5. item 6, shown in a trace: every step's "host read" events (common/scalar.hpp, HostRead)
# on the default path (norm_on_device keeps clipping's norm on the GPU): one a step, its
# printed loss, waiting for the step's kernels (tools/trace_reads prints each read's wait)
TAILN=14 run trace_host_reads 90 sh -c '"$@" --steps 6 --trace "'"$out"'/lab02_trace.json" \
  > /dev/null && python3 tools/trace_reads "'"$out"'/lab02_trace.json" --expect 1' \
  sh "${lab02[@]}"
# 6. one step's kernels by kind, scalelab beside PyTorch (the deck's table): ncu at 1 and 2 steps
# (their difference is one step), PyTorch profiled; lab 02's default path
if [[ -n $ncu ]]; then
  for s in 1 2; do
    # --clock-control none: the GPU's own clocks, as in a training run and PyTorch's profile
    # (ncu locks them to base by default: kernels then last ~8% longer)
    run "ncu_steps$s" 150 sh -c '"$0" --metrics gpu__time_duration.sum --clock-control none --csv \
      --print-units base --print-kernel-base function "$@" > "'"$out"'/ncu_steps'"$s"'.csv"' \
      "$ncu" "${lab02[@]}" --steps "$s"
  done
else
  echo "no ncu on this machine" | tee -a "$out/summary.txt"
  failed=$((failed + 1))
fi
run torch_kernels 150 python3 tools/bench_gpt_torch.py --device cuda --model gpt-85m --batch 16 \
  --steps 5 --warmup 3 --kernel-table "$out/torch_kernels.csv"
TAILN=60 run kernel_table 30 sh -c 'python3 tools/kernel_table.py --ncu "$0/ncu_steps1.csv" \
  "$0/ncu_steps2.csv" --step-diff 1 --torch "$0/torch_kernels.csv" | tee "$0/kernel_table.md"' "$out"
# 7. what limits flash attention's backward (the largest gap left): occupancy, registers, stall
# reasons and throughput of one launch of each tensor-core backward kernel at gpt-85m's shape
if [[ -n $ncu ]]; then
  TAILN=5 run ncu_flash_backward 120 sh -c '"$0" --kernel-name regex:"flash_tc_(dkdv|dq)_kernel" \
    --launch-count 2 --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    "$1" --repeats 1 --warmup 0 > "$2/ncu_flash_backward.txt" && grep -c "flash_tc_" "$2/ncu_flash_backward.txt"' \
    "$ncu" "$B/common/scalelab_bench_attention" "$out"
  # the same sections for the wgmma kernels (first launches: the bench's (BH, T, hs) rows)
  TAILN=5 run ncu_flash_wgmma 120 sh -c '"$0" --kernel-name regex:"flash_wgmma_" \
    --launch-count 3 --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    "$1" --repeats 1 --warmup 0 > "$2/ncu_flash_wgmma.txt" && grep -c "flash_wgmma_" "$2/ncu_flash_wgmma.txt"' \
    "$ncu" "$B/common/scalelab_bench_attention" "$out"
  # the same sections for the one-kernel backward (its first launch: the bench's (BH, T, hs) row)
  TAILN=5 run ncu_flash_backward_one_kernel 120 sh -c '"$0" --kernel-name regex:"flash_tc_backward_kernel" \
    --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    "$1" --repeats 1 --warmup 0 > "$2/ncu_flash_backward_one_kernel.txt" && grep -c "flash_tc_" "$2/ncu_flash_backward_one_kernel.txt"' \
    "$ncu" "$B/common/scalelab_bench_attention" "$out"
  # why LayerNorm's one-read backward (on trial) is 3.3x slower than version 1's three kernels:
  # its blocks of 32 rows zero and add 2C sums a warp (as much as the rows' own work?), then two
  # column sums over the blocks' partials; every LayerNorm-backward kernel of one bench call
  TAILN=5 run ncu_layernorm_backward 120 sh -c '"$0" --kernel-name regex:"layernorm|column_(partial|total)" \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --launch-count 30 "$1" --repeats 1 --warmup 0 \
    > "$2/ncu_layernorm_backward.txt" && grep -c "Section: GPU Speed Of Light" "$2/ncu_layernorm_backward.txt"' \
    "$ncu" "$B/common/scalelab_bench_kernels" "$out"
fi
# 8. AdamW alone: one launch per parameter against one launch over the flat buffers
TAILN=4 run adamw_per_parameter 60 env SCALELAB_TRY_GPU_KERNELS=-adamw_one_launch \
  "$B/common/scalelab_bench_adamw" --device cuda
TAILN=4 run adamw_one_launch 60 "$B/common/scalelab_bench_adamw" --device cuda
echo "issue33.sh: $failed step(s) failed" | tee -a "$out/summary.txt"
exit "$failed"
