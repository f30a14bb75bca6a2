scalelab_add_lab(01 collectives SOURCES collectives.cpp STEPS 4 RANKS 1 2 3 4 STEP_RANKS "4:1,2" TIMEOUT 90)
# Bad bench sizes and bench options: exit 2 and one distinct "error: ..." line on every rank,
# before any collective. A size is checked after its unit (0.5K is 512 bytes, valid), up to 4G:
# inf and 1e30 say the limit (they were cast to 0: "--min-bytes 4 is above --max-bytes 0"), a
# number below one f32 (0, 0.4, 3) says the least size (0 was "must be a size like 4, 64K or
# 16M"); the bench's options without --bench are refused, not ignored by the demo. Each as
# "ranks|name|regex|args...".
if(SCALELAB_BUILD_TESTS)
  scalelab_expect_usage_errors(lab01.cli lab01_collectives_solution LABELS reference lab01
      CASES
      "2|max_bytes_inf|^error: --max-bytes inf: at most 4G \\(4294967296 bytes\\)$|--bench|--max-bytes|inf"
      "2|max_bytes_1e30|^error: --max-bytes 1e30: at most 4G \\(4294967296 bytes\\)$|--bench|--max-bytes|1e30"
      "1|max_bytes_8G|^error: --max-bytes 8G: at most 4G|--bench|--max-bytes|8G"
      "1|min_bytes_nan|^error: --min-bytes must be a size like 4, 64K or 16M, got 'nan'|--bench|--min-bytes|nan"
      "1|min_bytes_below_a_byte|^error: --min-bytes 0.4: at least 4 bytes \\(one f32\\)$|--bench|--min-bytes|0.4"
      "1|min_bytes_zero|^error: --min-bytes 0: at least 4 bytes \\(one f32\\)$|--bench|--min-bytes|0"
      "1|max_bytes_below_a_float|^error: --max-bytes 3: at least 4 bytes \\(one f32\\)$|--bench|--max-bytes|3"
      "1|min_bytes_half_k_above_max|^error: --min-bytes 512 is above --max-bytes 256|--bench|--min-bytes|0.5K|--max-bytes|256"
      "2|iters_without_bench|^error: --iters is for --bench$|--iters|0"
      "2|max_bytes_without_bench|^error: --max-bytes is for --bench$|--max-bytes|abc"
      "1|min_bytes_without_bench|^error: --min-bytes is for --bench$|--min-bytes|4"
      "1|warmup_without_bench|^error: --warmup is for --bench$|--bench=false|--warmup|1")
  # A fractional size with a unit is a valid size: 0.5K is 512 bytes (refused before the unit
  # was applied).
  # (through expect_exit.cmake: the row and exit 0, which a PASS_REGULAR_EXPRESSION alone ignores)
  set(cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 1 ${MPIEXEC_PREFLAGS}
          $<TARGET_FILE:lab01_collectives_solution> ${MPIEXEC_POSTFLAGS} --bench --min-bytes 0.5K
          --max-bytes 1K --iters 2 --warmup 0)
  list(JOIN cmd "|" cmd)
  add_test(NAME lab01.program.fractional_size.np1
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${cmd}" -DEXPECT_CODE=0 "-DEXPECT_REGEX=[ ]512 +128 "
                   -P ${PROJECT_SOURCE_DIR}/tests/common/expect_exit.cmake)
  set_tests_properties(lab01.program.fractional_size.np1 PROPERTIES TIMEOUT 60
                       LABELS "reference;lab01" ENVIRONMENT "${SCALELAB_MPI_TEST_ENV}")
endif()
# Planted submissions (solutions/01_*/planted/cheats.plant), each with the right numbers: a
# ring_all_reduce that calls the library's all-reduce, or that passes the whole buffer round the
# ring n-1 times (no chunks: 3 x the buffer per rank at 4 ranks, where the ring sends 1.5 x; at 2
# ranks both send 1 x, so the case runs on 4), fails step 2's traffic check; a ring_broadcast or
# ring_all_gather that calls the library's fails step 3's; a ring that adds its chunks by its own
# loop through data<T>() (not add_into) fails step 2's run on the simulated GPU. From an attendee's
# walk-through: an all-gather output made on the host fails step 1's run on the simulated GPU;
# sends whose Work is dropped fail steps 2 and 3's wait checks; a segmented ring that walks its
# own chunk's segments fails step 2 at a size one element past whole segments (3 ranks).
scalelab_add_planted_submissions(01
  CASES "library_all_reduce:2:2:Step2_RingAllReduce.SendsOneChunkAStepToTheRightNeighbourOnly on rank [0-9]: ring_all_reduce called all_reduce on group [a-z0-9_]+: build it from send/recv"
        "whole_buffer_ring:2:4:Step2_RingAllReduce.SendsOneChunkAStepToTheRightNeighbourOnly on rank [0-9]: ring_all_reduce sent 3 x the buffer .*: a ring sends 2.n-1./n of it, one chunk a step"
        "own_add_loop:2_RingAllReduce.RunsOn:2:Step2_RingAllReduce.RunsOnTheSimulatedGpu on rank [0-9]: .*numel 7, on the simulated GPU .--device sim.: host code reached the elements of"
        "library_broadcast:3:2:Step3_RingBroadcast.EachRankReceivesOnceFromTheLeftAndPassesItOn on rank [0-9]: ring_broadcast called broadcast on group [a-z0-9_]+: build it from send/recv"
        "sends_not_waited:2_RingAllReduce.Waits:2:Step2_RingAllReduce.WaitsForEveryOperationItStarts on rank [0-9]: .*ring_all_reduce returned with [0-9]+ of the [0-9]+ operations it started never waited for: send"
        "broadcast_send_not_waited:3_RingBroadcast.Waits:2:Step3_RingBroadcast.WaitsForEveryOperationItStarts on rank [0-9]: .*ring_broadcast returned with 1 of the [0-9]+ operations it started never waited for"
        "library_all_gather:3:2:Step3_RingAllGather.PassesNMinusOneChunksToTheRightNeighbourOnly on rank [0-9]: ring_all_gather called all_gather on group [a-z0-9_]+: build it from send/recv")
# The all-gather's own chunk copied by a loop through data<T>(): right on the CPU, stopped by step
# 3's run on the simulated GPU (which ends the job at the first such line: a verdict "error").
if(SCALELAB_BUILD_TESTS)
  scalelab_add_sim_plant(01 own_chunk_loop RANKS 2 FILTER Step3*
      TEST Step3_RingAllGather.BothRingsRunOnTheSimulatedGpu STOP host_read)
  scalelab_add_sim_plant(01 output_on_host RANKS 2 FILTER Step1_EachCollective.RunsOn*
      TEST Step1_EachCollective.RunsOnTheSimulatedGpu
      STOP ".*all_gather: the input tensor .* and the output tensor .* are on different devices")
  # The segments' mismatch ends the job inside the ring (MPI's truncation, or the receive that
  # got another step's message): a verdict "error" naming the test.
  scalelab_add_planted_run(lab01.planted.own_segments.np3 test_lab01_planted RANKS 3
      FILTER Step2_RingAllReduce.Equals* PLANT own_segments LAB 01 EXCEPTION
      REGEX "Step2_RingAllReduce.EqualsLibraryExactlyOnIntegers on rank [0-9]: .*(TRUNCATE|expected [0-9]+ f[0-9]+ elements)")
endif()
