#!/usr/bin/env bash
# Every open issue's GPU checks in one device call, the most needed first, under one DEADLINE (a
# step past it is skipped and counted as failed, run_step.sh): every GPU test (issue 31's
# ctest -L gpu: every lab program over nccl, auto and mpi, and the trial kernels' tests), then
# issue 33's measurements (in their own order of need), then the rest of issue 31 (labs 03-12
# training over NCCL on the corpus, two ranks sharing the GPU, lab 01's busbw table: about two
# minutes; last, as ctest -L gpu already runs every program over NCCL). What the DEADLINE cut is
# named in $OUT/summary.txt: run that script again in a second call (ONLY="step names" runs just
# those). A session has about 15 minutes of device time, a start included: plan on one call.
#
# On the build machine, from the project root:
#   ../shared/gpu/pack $(tools/gpu_checks/all.sh --targets)
# On the GPU machine, with build/gpu-pack/pack.tar.xz and env.sh carried and $OUT set:
#   bash tools/gpu_checks/all.sh [SECONDS]     # default 560: under the device's 600 s a command
# Exit status: the failed (or skipped) steps of all three.
set -uo pipefail
here=$(dirname "$0")
if [[ ${1:-} == --targets ]]; then
  echo $(bash "$here/issue31.sh" --targets) $(bash "$here/issue33.sh" --targets) | tr " " "\n" | sort -u | tr "\n" " "
  exit 0
fi
export DEADLINE=$(( $(date +%s) + ${1:-560} ))
ONLY="facts ctest_gpu" bash "$here/issue31.sh"; a=$?
bash "$here/issue33.sh"; c=$?
SKIP="facts ctest_gpu" bash "$here/issue31.sh"; b=$?
echo "all.sh: issue 31 tests $a, issue 33 $c, issue 31 programs $b failed step(s)" | tee -a "${OUT:-/tmp}/summary.txt"
exit $((a + b + c))
