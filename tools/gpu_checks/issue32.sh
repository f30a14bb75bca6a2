#!/usr/bin/env bash
# Issue 32's checks on a GPU, in one call (the caps add up to 520 s, under the device tool's 600 s
# a command): flash attention's versions 1 and 2 against the host (test_ops_cuda_flash, and issue
# 14's test_ops_cuda_bf16, which runs version 1), the bench table at B 16 x 12 heads x T 1024 x
# head 64, causal, bf16 (with PyTorch's SDPA when the machine's python3 has torch), then
# compute-sanitizer's memcheck, racecheck and synccheck on both versions. Exits 1 if any failed.
#
# On the build machine (no GPU needed), from the project root:
#   ../shared/gpu/pack test_ops_cuda_flash test_ops_cuda_bf16 scalelab_bench_attention \
#     lab02_single_device_solution      # env.sh finds the CUDA libraries through lab 02's program
# On the GPU machine, from a copy of the same checkout, with $OUT the folder that comes back:
#   bash tools/gpu_checks/issue32.sh        # summary in $OUT/summary.txt, everything in full.log
set -uo pipefail
# run NAME CAP CMD...; $failed; DEADLINE (sourced first: it refuses the build machine)
source "$(dirname "$0")/run_step.sh"
source build/gpu-pack/env.sh || exit 1
san=$(command -v compute-sanitizer ||
  ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
flash=$B/tests/common/test_ops_cuda_flash

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# 1. correctness: both versions, both layouts, every gradient; the issue-14 tests still pass
run tests 100 ctest --test-dir "$B" -R 'test_ops_cuda_flash|test_ops_cuda_bf16' --output-on-failure
# 2. the table: unfused, version 1, version 2 (both layouts), PyTorch SDPA flash and cuDNN
TAILN=40 run bench 90 "$B/common/scalelab_bench_attention" --device cuda --dtype bf16 \
  --batch 16 --heads 12 --context 1024 --head-size 64 --repeats 10 --warmup 3 \
  --torch-python python3 --torch-script "$(pwd)/tools/bench_attention_torch.py"
# 3. sanitizers on both versions (bf16, both layouts; racecheck and synccheck watch the shared
#    memory and the barriers of the kernels' tiles)
if [[ -n $san ]]; then
  tests='CudaFlash.Version1MatchesTheHost:CudaFlash.Version2MatchesTheHost:CudaFlash.QkvLayout*'
  run memcheck 90 "$san" --tool memcheck --error-exitcode 9 "$flash" --gtest_filter="$tests"
  run racecheck 150 "$san" --tool racecheck --racecheck-report all --error-exitcode 9 "$flash" \
    --gtest_filter="$tests"
  run synccheck 90 "$san" --tool synccheck --error-exitcode 9 "$flash" --gtest_filter="$tests"
else
  echo "no compute-sanitizer on this machine" | tee -a "${OUT:-/tmp}/summary.txt"
  failed=1
fi
exit $((failed > 0))
