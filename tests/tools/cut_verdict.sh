#!/bin/sh
# A job whose printed verdict the launcher cut with another rank's line (as seen in CI), while
# the test main kept it whole in $SCALELAB_RUN_DIR/verdict.rank0 (tests/support/test_main.cpp):
# tools.expect_exit.kept_verdict finds the expected verdict in the kept line only.
printf '[scalelab] verdict: failed: Suite.TestNa[scalelab] rank 1 failed a check in Suite.TestName: x\n'
printf 'me on rank 0: boom\n'
if [ -n "${SCALELAB_RUN_DIR:-}" ]; then
  printf '[scalelab] verdict: failed: Suite.TestName on rank 0: boom' > "$SCALELAB_RUN_DIR/verdict.rank0"
fi
exit 1
