# Sourced by the gpu_checks scripts after build/gpu-pack/env.sh (which defines `step`).
# run NAME CAP CMD...: `step` that counts failures in $failed and honours DEADLINE (epoch seconds,
# optional): a cap is cut to the time left and a step past it is skipped and counted as failed,
# so several scripts can share one device call without one running the others out of time.
# ONLY / SKIP (optional, space-separated step names): run only those / all but those, so the
# timed steps can run alone after the others ran side by side.
# On the build machine build/gpu is the CMake build the pack is made from, and sourcing env.sh
# would replace it with the pack's programs (it unpacks over build/gpu): the scripts source this
# file first, and it stops them there.
if [[ -f build/gpu/CMakeCache.txt ]]; then
  echo "$(basename "$0"): build/gpu is a CMake build: this is the build machine, where env.sh" \
    "would replace it with the pack's programs. Run the GPU checks on the GPU machine." >&2
  exit 2
fi
failed=0
run() {
  local name=$1 cap=$2 left
  shift 2
  if [[ -n ${ONLY:-} && " $ONLY " != *" $name "* ]] || [[ " ${SKIP:-} " == *" $name "* ]]; then
    return 0
  fi
  if [[ -n ${DEADLINE:-} ]]; then
    left=$((DEADLINE - $(date +%s)))
    if ((left < 5)); then
      echo "=== $name skipped: past DEADLINE" | tee -a "${OUT:-/tmp}/summary.txt"
      failed=$((failed + 1))
      return 1
    fi
    ((cap > left)) && cap=$left
  fi
  step "$name" "$cap" "$@" || { failed=$((failed + 1)); return 1; }
}
