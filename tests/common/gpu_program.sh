#!/bin/sh
# A lab's program on the GPU (ctest label gpu): gpu_program.sh <probe> <regex> <command...>
# Skipped (exit 77, ctest's SKIP_RETURN_CODE) where <probe> finds no CUDA device; otherwise the
# command must exit 0 (every program exits 1 when its own check fails) and print, for each part of
# <regex> (extended regular expressions joined by @@), a line that matches it: the program's twin
# or equivalence lines, so a run that skips its check cannot pass. <probe> "-": no probe, the
# command always runs (the simulated GPU, --device sim, is on every machine).
probe=$1
regex=$2
shift 2
if [ "$probe" = "-" ]; then
  :
elif [ ! -x "$probe" ]; then  # a pack without it would skip every test silently: fail instead
  echo "FAILED: no probe $probe (build the gpu_probe target)"
  exit 1
elif ! "$probe" >/dev/null 2>&1; then
  echo "no CUDA device (or a build without CUDA): skipped"
  exit 77
fi
out=$("$@" 2>&1)
code=$?
printf '%s\n' "$out"
if [ "$code" -ne 0 ]; then
  echo "FAILED: the program exited $code"
  exit 1
fi
rest=$regex
while [ -n "$rest" ]; do
  part=${rest%%@@*}
  if [ "$part" = "$rest" ]; then rest=""; else rest=${rest#*@@}; fi
  if ! printf '%s\n' "$out" | grep -Eq -- "$part"; then
    echo "FAILED: no line matches: $part"
    exit 1
  fi
done
exit 0
