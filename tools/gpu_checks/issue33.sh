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
  echo lab02_single_device_solution
  exit 0
fi
source build/gpu-pack/env.sh || exit 1
source "$(dirname "$0")/run_step.sh"   # run NAME CAP CMD...; $failed; DEADLINE
out=${OUT:-/tmp}
export SCALELAB_BUILD_DIR=$B
lab02=("$B/labs/lab02_single_device_solution" --device cuda --precision bf16 --model gpt-85m
       --batch 16 --context 1024 --attention flash --log-every 1 --eval-every 0 --eval-batches 1
       --sample 0 --checkpoint "$out/lab02.ckpt" --data "$DATA")
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)

# 1. the side-by-side table (the issue's target: >= 1.0x PyTorch-compiled, memory <= its)
TAILN=12 run side_by_side 150 python3 tools/bench_gpt_vs_torch --model gpt-85m --batch 16 \
  --steps 10 --warmup 3 --data "$DATA"
# 1b. AdamW in one launch over the flat buffers (SCALELAB_ADAMW_ONE_LAUNCH=1; off by default on a
# GPU until test_ops_cuda's "adamw segments" has passed there): the same table with it on
TAILN=12 run side_by_side_adamw_one_launch 150 env SCALELAB_ADAMW_ONE_LAUNCH=1 \
  python3 tools/bench_gpt_vs_torch --model gpt-85m --batch 16 --steps 10 --warmup 3 --data "$DATA"
# 2. one step's kernels: ncu at 1 and 2 steps (their difference is one step), PyTorch profiled
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
echo "issue33.sh: $failed step(s) failed" | tee -a "$out/summary.txt"
exit "$failed"
