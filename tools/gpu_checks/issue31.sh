#!/usr/bin/env bash
# Issue 31's checks on one GPU (H100 or H200), in one call: every program on the GPU over nccl,
# auto and mpi (ctest -L gpu), labs 03-12 training with --device cuda --backend nccl on one rank on
# the real corpus, lab 08 on one rank over auto (the ncclGroupEnd "invalid usage" of the issue),
# two ranks sharing the GPU (the one-line refusal under nccl, the staging under auto), and lab 01's
# busbw table on device buffers (your ring beside NCCL's all-reduce).
#
# On the build machine, from the project root (packs a CUDA build: ../shared/gpu/pack's header):
#
#   ../shared/gpu/pack $(tools/gpu_checks/issue31.sh --targets)
#
# then on the GPU machine, from the root of the same checkout with build/gpu-pack carried:
#
#   bash tools/gpu_checks/issue31.sh        # summary in $OUT/summary.txt, everything in full.log
#
# $OUT/summary.txt holds each step's tail, exit code and seconds; $OUT/full.log everything. The
# caps add up to about 9 minutes; a step that fails does not stop the others. Exit status: the
# number of failed steps.
set -uo pipefail

targets=(gpu_probe test_comm_gpu test_comm_route test_lab07_solution test_lab10_solution
         test_lab11_solution test_lab12_solution test_ops_cuda scalelab_data)
labs=(00_hello_dist 01_collectives 02_single_device 03_ddp 04_ddp_overlap 05_grad_accumulation
      06_activation_checkpointing 07_tensor_parallel 08_pipeline_parallel 09_zero 10_3d_parallel
      11_context_parallel 12_expert_parallel)
for lab in "${labs[@]}"; do targets+=("lab${lab}_solution"); done
if [[ ${1:-} == --targets ]]; then
  echo "${targets[@]}"
  exit 0
fi

# run NAME CAP CMD...; $failed; DEADLINE (sourced first: it refuses the build machine)
source "$(dirname "$0")/run_step.sh"
source build/gpu-pack/env.sh || exit 1   # $B, $DATA, step (unpacks the first time)
L=$B/labs
one=(mpiexec -n 1)
two=(mpiexec -n 2)

run facts 20 sh -c 'nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
  "$0" --gtest_filter=GpuSharing.* 2>&1 | tail -3' "$B/tests/common/test_comm_route"

# Every program on the GPU: 1 rank nccl, 1 rank auto, 2 ranks mpi; and the library's gpu tests.
# Four at a time: each program holds a few MiB of the GPU, and one-rank NCCL communicators of
# different processes never meet.
TAILN=80 run ctest_gpu 300 ctest --test-dir "$B" -L gpu -j 4 --output-on-failure --timeout 170

# Labs 03-12 train on the corpus with --device cuda --backend nccl on one rank (the issue's first
# failure: the host collectives of the step line, the twin and the tables went to NCCL).
common=(--device cuda --backend nccl --model tiny --steps 20 --data "$DATA")
run lab03_nccl 40 "${one[@]}" "$L/lab03_ddp_solution" "${common[@]}" --verify-steps 3
run lab04_nccl 40 "${one[@]}" "$L/lab04_ddp_overlap_solution" "${common[@]}" --reps 2
run lab05_nccl 40 "${one[@]}" "$L/lab05_grad_accumulation_solution" "${common[@]}" --accum 4
run lab06_nccl 40 "${one[@]}" "$L/lab06_activation_checkpointing_solution" "${common[@]}" --reps 2
run lab07_nccl 40 "${one[@]}" "$L/lab07_tensor_parallel_solution" "${common[@]}" --twin-steps 3 --reps 2
run lab08_nccl 40 "${one[@]}" "$L/lab08_pipeline_parallel_solution" "${common[@]}" --reps 2
run lab09_nccl 40 "${one[@]}" "$L/lab09_zero_solution" "${common[@]}" --stage 3 --verify-steps 3
run lab10_nccl 40 "${one[@]}" "$L/lab10_3d_parallel_solution" "${common[@]}" --twin-steps 3
run lab11_nccl 40 "${one[@]}" "$L/lab11_context_parallel_solution" --device cuda --backend nccl \
  --model tiny --steps 5 --batch 4 --twin-steps 3 --data "$DATA"
run lab12_nccl 40 "${one[@]}" "$L/lab12_expert_parallel_solution" --device cuda --backend nccl \
  --model tiny-moe --steps 5 --batch 8 --twin-steps 3 --data "$DATA"

# Lab 08 on one rank over auto: its table's interleaved rows send each chunk's activations to
# itself (issue 31: "recv #4 (group world): ncclGroupEnd failed: invalid usage").
run lab08_auto 40 "${one[@]}" "$L/lab08_pipeline_parallel_solution" --device cuda --backend auto \
  --model tiny --steps 3 --data "$DATA" --reps 1

# Two ranks on one GPU: --backend nccl says why in one line and exits 2 (before NCCL 2.30, or
# without NCCL_MULTI_RANK_GPU_ENABLE=1); --backend auto stages through MPI and says so once.
run share_nccl 30 sh -c '"$@"; rc=$?; echo "exit $rc (want 2 unless this NCCL accepts 2 ranks)"; [ $rc -eq 2 ] || [ $rc -eq 0 ]' \
  _ "${two[@]}" "$L/lab03_ddp_solution" --device cuda --backend nccl --model tiny --steps 2 --data "$DATA"
run share_auto 40 "${two[@]}" "$L/lab03_ddp_solution" --device cuda --backend auto --model tiny \
  --steps 3 --data "$DATA" --verify-steps 2

# Lab 01's busbw table on device buffers: the ring (one send/recv batch per step, the add a
# kernel) beside NCCL's all-reduce, nccl-tests' timing. One GPU: one rank (n = 1: busbw factor 0,
# algbw is NCCL's local copy); two ranks share it only over mpi (staged), shown for comparison.
TAILN=40 run lab01_busbw_nccl 90 "${one[@]}" "$L/lab01_collectives_solution" --device cuda \
  --backend nccl --bench --min-bytes 1K --max-bytes 1G --iters 20 --warmup 5
TAILN=40 run lab01_busbw_mpi2 90 "${two[@]}" "$L/lab01_collectives_solution" --device cuda \
  --backend mpi --bench --min-bytes 1K --max-bytes 64M --iters 10 --warmup 2

echo "issue31.sh: $failed step(s) failed" | tee -a "${OUT:-/tmp}/summary.txt"
exit "$failed"
