# Tests of the communication layer: collective semantics (mpi and self backends; nccl with a GPU),
# split, the matching check, the trace, the bandwidth helpers and the watchdog.
# Watchdog timeouts in these tests are a few seconds (SCALELAB_TIMEOUT), so a hang is reported
# quickly instead of waited out.
scalelab_add_test(NAME test_comm SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_comm.cpp
                  RANKS 1 2 3 4 TIMEOUT 120)
