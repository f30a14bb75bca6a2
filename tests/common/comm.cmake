# Tests of the communication layer: collective semantics (mpi and self backends; nccl with a GPU),
# split, the matching check, the trace, the bandwidth helpers and the watchdog.
# Watchdog timeouts in these tests are a few seconds (SCALELAB_TIMEOUT), so a hang is reported
# quickly instead of waited out.
scalelab_add_test(NAME test_comm SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_comm.cpp
                  RANKS 1 2 3 4 TIMEOUT 120)

# Watchdog: a program that hangs on purpose must end with exit 3 and a report naming the rank and
# the sequence numbers, well within ctest's timeout (watchdog timeout 2 s; MAX_SECONDS bounds the
# whole run including start-up).
add_executable(watchdog_hang ${CMAKE_CURRENT_LIST_DIR}/watchdog_hang.cpp)
target_link_libraries(watchdog_hang PRIVATE scalelab::common)
add_dependencies(reference watchdog_hang)
# scalelab_expect_exit(<name> <ranks> <mode> <code> <regexes joined by @@> [TARGET t] [ARGS ...]
#                      [ENV ...] [REJECT regex])
# runs <target> (default watchdog_hang --mode <mode> --timeout 2) on <ranks> ranks, with ARGS;
# output matching REJECT fails it.
function(scalelab_expect_exit name ranks mode code regex)
  cmake_parse_arguments(E "" "TARGET;REJECT" "ENV;ARGS" ${ARGN})
  set(reject)
  if(E_REJECT)
    set(reject "-DREJECT_REGEX=${E_REJECT}")
  endif()
  if(E_TARGET)
    set(program $<TARGET_FILE:${E_TARGET}> ${MPIEXEC_POSTFLAGS} ${E_ARGS})
  else()
    set(program $<TARGET_FILE:watchdog_hang> ${MPIEXEC_POSTFLAGS} --mode ${mode} --timeout 2)
  endif()
  set(cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${MPIEXEC_PREFLAGS} ${program})
  list(JOIN cmd "|" cmd)
  add_test(NAME ${name}
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${cmd}" -DEXPECT_CODE=${code}
                   "-DEXPECT_REGEX=${regex}" ${reject} -DMAX_SECONDS=20
                   -P ${CMAKE_CURRENT_LIST_DIR}/expect_exit.cmake)
  set_tests_properties(${name} PROPERTIES PROCESSORS ${ranks} TIMEOUT 40
                       LABELS "reference;common" ENVIRONMENT "${SCALELAB_MPI_TEST_ENV};${E_ENV}")
endfunction()
# rank 2 skipped all_reduce #1 and waits in barrier #1 while ranks 0,1 wait in all_reduce #1.
scalelab_expect_exit(common.watchdog.skip.np3 3 skip 3
  "watchdog: rank [0-2] waits in (all_reduce|barrier) #1 \\(@@rank 2 (is in|waits in) barrier #1@@all_reduce #1 \\(4 MiB, group world, over mpi\\)@@for [2-4]\\.[0-9] s@@rank [0-2] entered (barrier|all_reduce) #1 where rank [0-2] entered (all_reduce|barrier) #1: the ranks called different collectives")
# rank 1 skipped one all_reduce and entered the next: rank 0 waits alone in #2, rank 1 finished #1
# and went on (it waits in MPI_Finalize, in no collective): the report leads with rank 1.
scalelab_expect_exit(common.watchdog.skip_next.np2 2 skip-next 3
  "watchdog: rank 1 is in no collective and has made no progress for [0-9.]+ s while rank 0 waits for it@@rank 0 waits for rank 1 in all_reduce #2 \\(4 MiB, group world, over mpi\\) for [2-4]\\.[0-9] s@@rank 1 finished #1@@rank 1 did not reach all_reduce #2")
scalelab_expect_exit(common.watchdog.mismatch.np2 2 mismatch 1
  "all_reduce #1 \\(group world\\): ranks disagree on the collective: rank 0: all_reduce of 2 f32 sum, rank 1: all_reduce of 3 f32 sum")
scalelab_expect_exit(common.watchdog.ok.np2 2 ok 0 "done")
# A rank that stops (SIGSTOP: what a rank stuck in the kernel, under a debugger or on a dead node
# looks like to its peers) answers nothing, not even its watchdog thread. The others infer it
# from its heartbeat, and the report must lead with it, then the chain of waits it causes: rank 2
# (in the middle of the world group, and of the chain rank 1 -> rank 3 -> rank 2) and rank 0.
# watchdog_stop.py continues and kills every rank whatever happens.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
foreach(stopped 2 0)
  add_test(NAME common.watchdog.stopped_rank${stopped}.np4
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/watchdog_stop.py
                   --rank ${stopped} --deadline 40 --
                   ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 ${MPIEXEC_PREFLAGS}
                   $<TARGET_FILE:watchdog_hang> ${MPIEXEC_POSTFLAGS} --mode loop --timeout 3)
  set_tests_properties(common.watchdog.stopped_rank${stopped}.np4 PROPERTIES PROCESSORS 4
                       TIMEOUT 60 LABELS "reference;common" ENVIRONMENT "${SCALELAB_MPI_TEST_ENV}")
endforeach()
# The same through the test main (what the grader runs): SCALELAB_TIMEOUT=2 instead of 45 s.
add_executable(watchdog_gtest_hang ${CMAKE_CURRENT_LIST_DIR}/watchdog_gtest_hang.cpp)
target_link_libraries(watchdog_gtest_hang PRIVATE scalelab::test_main)
add_dependencies(reference watchdog_gtest_hang)
scalelab_expect_exit(common.watchdog.in_test.np2 2 - 3
  "watchdog: rank 1 is in no collective and has made no progress@@rank 0 waits for rank 1 in all_reduce #1 \\(64 B, group world, over mpi\\) for [2-4]\\.[0-9] s@@rank 1 did not reach all_reduce #1 of group world"
  TARGET watchdog_gtest_hang ENV SCALELAB_TIMEOUT=2)

# exit_all beside a worker thread still busy with MPI: finalize only once its calls are done (a
# worker's send after MPI_Finalize crashed a rank), abort when one never is.
add_executable(exit_beside_worker ${CMAKE_CURRENT_LIST_DIR}/exit_beside_worker.cpp)
target_link_libraries(exit_beside_worker PRIVATE scalelab::common)
add_dependencies(reference exit_beside_worker)
scalelab_expect_exit(common.exit_all.worker_receiving.np2 2 - 1
  "stopped while receiving" TARGET exit_beside_worker ARGS --mode receiving
  REJECT "after MPI_FINALIZE|Segmentation fault|signal [0-9]")
scalelab_expect_exit(common.exit_all.static_communicator.np2 2 - 1
  "stopped beside a static communicator's pending receive" TARGET exit_beside_worker ARGS --mode static
  REJECT "after MPI_FINALIZE|Segmentation fault|signal [0-9]")
scalelab_expect_exit(common.exit_all.worker_stuck.np2 2 - 1
  "\\[rank [01]\\] stopped while a thread was stuck in MPI" TARGET exit_beside_worker ARGS --mode stuck
  REJECT "after MPI_FINALIZE|Segmentation fault")
# ... and when the program's body returns beside it: not finalized under it, not exit 0
scalelab_expect_exit(common.run_main.worker_stuck.np2 2 - 1
  "\\[rank [01]\\] error: the program ended with a background thread still inside an MPI call"
  TARGET exit_beside_worker ARGS --mode returns REJECT "after MPI_FINALIZE|Segmentation fault")

scalelab_add_test(NAME test_watchdog SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_watchdog.cpp
                  RANKS 1 2 3 TIMEOUT 60)
scalelab_add_test(NAME test_trace SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_trace.cpp
                  RANKS 1 2 TIMEOUT 60)

# CUDA tensors: nccl backend and mpi staging (label gpu; skips without a device). 2 ranks on one
# GPU need NCCL >= 2.30 and this variable; older NCCL falls back to worlds of one (in the test).
scalelab_add_test(NAME test_comm_gpu SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_comm_gpu.cpp
                  RANKS 1 2 LABELS gpu TIMEOUT 120)
foreach(k 1 2)
  set_property(TEST common.test_comm_gpu.np${k} APPEND PROPERTY ENVIRONMENT
               NCCL_MULTI_RANK_GPU_ENABLE=1)
endforeach()

# The process grid (issue 8): the layout tables of 8 and 16 ranks on one process, bad grids as
# UsageErrors, and real grids of every shape of 1, 2 and 4 ranks.
scalelab_add_test(NAME test_process_grid SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_process_grid.cpp
                  RANKS 1 2 4 TIMEOUT 120)
# A bad grid ends a program with exit 2 and one line naming the sizes and the world size.
add_executable(test_process_grid_bad ${CMAKE_CURRENT_LIST_DIR}/test_process_grid_bad.cpp)
target_link_libraries(test_process_grid_bad PRIVATE scalelab::common)
add_dependencies(reference test_process_grid_bad)
scalelab_expect_exit(common.process_grid.not_the_world.np2 2 - 2
  "error: process grid: dp 3 x tp 1 x pp 1 = 3 ranks, but the world has 2 ranks"
  TARGET test_process_grid_bad ARGS --dp 3)
scalelab_expect_exit(common.process_grid.zero_size.np2 2 - 2
  "error: process grid: dp, tp and pp must be at least 1, got dp 2 x tp 0 x pp 1 \\(world of 2 ranks\\)"
  TARGET test_process_grid_bad ARGS --dp 2 --tp 0)
scalelab_expect_exit(common.process_grid.unknown_order.np2 2 - 2
  "error: unknown process grid order 'zigzag': use megatron or picotron"
  TARGET test_process_grid_bad ARGS --dp 2 --order zigzag)
scalelab_expect_exit(common.process_grid.ok.np4 4 - 0
  "process grid: dp 2 x tp 2 x pp 1 = 4 ranks, order picotron@@   3   1   1   0  tp1 \\[2 3\\]"
  TARGET test_process_grid_bad ARGS --dp 2 --tp 2 --order picotron)

# Communication accounting (issue 8): calls and payload bytes per group and op, at 1, 2, 4 ranks.
# Which transport moves each operation, and whether NCCL takes ranks sharing a GPU: pure tables.
scalelab_add_test(NAME test_comm_route SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_comm_route.cpp
                  RANKS 1 TIMEOUT 60)
scalelab_add_test(NAME test_comm_counters SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_comm_counters.cpp
                  RANKS 1 2 4 TIMEOUT 120)
