# STEP_USES: which earlier steps' code each step's graders run (measured: ctest labNN.step_uses)
scalelab_add_lab(09 zero SOURCES zero.cpp GIVEN zero_policies.cpp STEPS 5 RANKS 1 2 4 LIBS lab03_ddp_solution_impl TIMEOUT 60
                 STEP_USES "2:1" "3:1,2" "4:1"
                 OPTIONAL_STEPS 4 5)  # the core (steps 1-3) fits 90 minutes: README.md
# Bad input: one "error:" line and exit 2 (checked before any data is read).
if(SCALELAB_BUILD_TESTS)
  scalelab_expect_usage_error(lab09.cli.bad_stage lab09_zero_solution LABELS reference lab09 ARGS --stage 4)
  # Issue 22: a batch too large for this machine (the bytes needed and available, every rank),
  # and a flag given a value that is not a truth value (the shared CLI names the option).
  scalelab_expect_usage_error(lab09.cli.batch_too_large_for_memory lab09_zero_solution
    RANKS 2 LABELS reference lab09
    MATCH "^error: --batch 1000000000: a training step needs at least [0-9.]+GiB \\([0-9]+ bytes\\) of host memory on rank [01].*. the node has [0-9.]+GiB available"
    ARGS --model tiny --batch 1000000000 --data ${PROJECT_SOURCE_DIR}/tests/data/gpt_golden.txt)
  scalelab_expect_usage_error(lab09.cli.table_not_a_bool lab09_zero_solution LABELS reference lab09
    MATCH "^error: --table maybe: expected true or false" ARGS --table=maybe)
  # A mixture-of-experts --model: each rank routes its rows as their own group (capacity, the
  # balancing loss), the twin the whole batch, so the losses parted (exit 1 on the twin check).
  scalelab_expect_usage_error(lab09.cli.moe_model lab09_zero_solution RANKS 2 LABELS reference lab09
    MATCH "^error: --model tiny-moe: lab 09's ZeRO trains dense blocks only. its mixture-of-experts blocks are lab 12's"
    ARGS --model tiny-moe --data ${PROJECT_SOURCE_DIR}/tests/data/gpt_golden.txt)
  # ZeRO-3 in bf16 (2-byte gathers into per-unit compute buffers) on 2 ranks: exit 0 only if the
  # losses are within 1e-3 of the bf16 twin's, the replicas agree and every table row (stages 0-3
  # in bf16) has held == allocator. On tests/common's bf16 corpus (its fixture makes it).
  scalelab_add_mpi_test(lab09.program.stage3_bf16.np2 lab09_zero_solution RANKS 2 TIMEOUT 60
                        LABELS reference lab09
                        ARGS --model tiny --steps 3 --batch 8 --precision bf16 --stage 3
                             --verify-steps 2 --data ${PROJECT_BINARY_DIR}/tests/common/bf16_corpus)
  set_tests_properties(lab09.program.stage3_bf16.np2 PROPERTIES FIXTURES_REQUIRED bf16_corpus)
  # --diverge at stage 3 (tests/common/bf16.cmake runs stage 2): each rank's gradient shard of
  # every unit is compared with the twin's elements too, not the activations only (it compared
  # 70 tensors, stage 2 99: a fault in reduce_scatter_unit went unreported). Exit 0, 101 tensors.
  set(cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIEXEC_PREFLAGS}
          $<TARGET_FILE:lab09_zero_solution> ${MPIEXEC_POSTFLAGS} --model tiny --batch 4
          --peak-tflops 1 --data ${PROJECT_BINARY_DIR}/tests/common/bf16_corpus --diverge --stage 3)
  list(JOIN cmd "|" cmd)
  add_test(NAME lab09.program.diverge_stage3.np2
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${cmd}" -DEXPECT_CODE=0
                   "-DEXPECT_REGEX=no divergence: 101 tensors \\(55 on rank 0, 46 on rank 1\\) within tolerance" -DMAX_SECONDS=40
                   -P ${PROJECT_SOURCE_DIR}/tests/common/expect_exit.cmake)
  set_tests_properties(lab09.program.diverge_stage3.np2 PROPERTIES PROCESSORS 2 TIMEOUT 60
                       LABELS "reference;lab09" ENVIRONMENT "${SCALELAB_MPI_TEST_ENV}"
                       FIXTURES_REQUIRED bf16_corpus)
endif()

# Issue 25, class 7 (own work): the undefined symbols of the object of zero.cpp, for
# Step1_OwnWork (cmake/ScalelabOwnWork.cmake, tests/support/own_work.hpp). Planted: the
# reference with a step 1 that forwards to the library's nn::shard_range (every shard right),
# graded by Step1 of its own test binary: Step1_OwnWork fails it (exit 1, the call named).
scalelab_attendee_symbols(09 zero zero.cpp)
if(SCALELAB_BUILD_TESTS)
  set(planted_dir ${CMAKE_CURRENT_BINARY_DIR}/planted_lab09)
  set(planted_src ${planted_dir}/zero.cpp)
  set(lab09_reference ${PROJECT_SOURCE_DIR}/solutions/09_zero/zero.cpp)
  # the plants quote the reference: they live beside it (solutions/09_zero/planted/)
  set(lab09_plants ${PROJECT_SOURCE_DIR}/solutions/09_zero/planted/cheats.plant)
  add_custom_command(OUTPUT ${planted_src}
                     COMMAND ${CMAKE_COMMAND} -E make_directory ${planted_dir}
                     COMMAND ${CMAKE_COMMAND} -DIN=${lab09_reference} -DOUT=${planted_src}
                             -DPLANTS=${lab09_plants} -P ${PROJECT_SOURCE_DIR}/cmake/plant_file.cmake
                     DEPENDS ${lab09_reference} ${lab09_plants}
                             ${PROJECT_SOURCE_DIR}/cmake/plant_file.cmake
                     COMMENT "planting lab 09's cheats into a copy of its reference"
                     VERBATIM)
  add_library(lab09_planted_impl STATIC ${planted_src} $<TARGET_OBJECTS:lab09_given>)
  target_include_directories(lab09_planted_impl PUBLIC ${PROJECT_SOURCE_DIR}/labs/09_zero)
  target_link_libraries(lab09_planted_impl PUBLIC scalelab::common lab03_ddp_solution_impl)
  add_executable(test_lab09_planted $<TARGET_OBJECTS:test_lab09_objects>)
  target_link_libraries(test_lab09_planted PRIVATE lab09_planted_impl scalelab::lab_testing
                                                   scalelab::test_main)
  scalelab_undefined_symbols(test_lab09_planted lab09_planted_impl zero.cpp)
  add_dependencies(lab09_reference test_lab09_planted)
  set(planted_cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 1 ${MPIEXEC_PREFLAGS}
      $<TARGET_FILE:test_lab09_planted> ${MPIEXEC_POSTFLAGS} --gtest_filter=Step1*)
  list(JOIN planted_cmd "|" planted_cmd)
  add_test(NAME lab09.planted.step1_calls_the_library.np1
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${planted_cmd}" -DEXPECT_CODE=1
                   "-DEXPECT_REGEX=calls the library's reference, step 1 asks for your own shard_range:@@scalelab::nn::shard_range\\(@@FAILED.*Step1_OwnWork.ShardRangeIsYourOwnNotTheLibrarys"
                   -DMAX_SECONDS=60 -P ${PROJECT_SOURCE_DIR}/tests/common/expect_exit.cmake)
  set_tests_properties(lab09.planted.step1_calls_the_library.np1 PROPERTIES TIMEOUT 90
                       LABELS "reference;lab09" ENVIRONMENT "${SCALELAB_MPI_TEST_ENV}")
  # Issue 34, one object: with SCALELAB_PLANT=factory_lean the factory's ZeRO-3 is lean and one
  # built directly keeps a full copy of the parameters; the graders build their own (never the
  # attendee's make_trainer), so step 4's memory check fails it.
  scalelab_add_planted_run(lab09.planted.factory_lean.np2 test_lab09_planted RANKS 2
      FILTER Step4_Zero3.TheAllocatorSeesOnlyShards* PLANT factory_lean LAB 09
      REGEX "Step4_Zero3.TheAllocatorSeesOnlyShardsAndASmallWorkingSet on rank [0-9]: .*bytes between steps")
  # Padding (the walk-through of 2026-11-28): kLab's units are all multiples of 4, so code that
  # ignores the padding passed every check at 1, 2 and 4 ranks. The odd-sized test model's
  # checks fail a gather into values() (step 2) and a reduce-scatter of the unpadded unit (step 4)
  # at 2 ranks: the collective's shape check throws, and the verdict names the test and the lab's
  # function (and the unit) before the library's line. And a reduce_scatter_unit
  # that copies instead of adding (right while each unit is reduced once a step) fails step 4's
  # accumulation check on any number of ranks.
  scalelab_add_planted_run(lab09.planted.gather_unpadded.np2 test_lab09_planted RANKS 2
      FILTER Step2* PLANT gather_unpadded LAB 09 EXCEPTION
      REGEX "Step2_Zero1.APaddedLayoutStepsBitwiseLikeDdp on rank [0-9]: .*in Zero1::step .zero.cpp., a library check failed")
  # Step 2's two pieces, graded alone (lab 10 calls them, not Zero1): gradients read from the
  # flat buffer (right for Zero1, which passes that slice) and the gather as n broadcasts.
  scalelab_add_planted_run(lab09.planted.groups_read_flat_grads.np1 test_lab09_planted RANKS 1
      FILTER Step2* PLANT groups_read_flat_grads LAB 09
      REGEX "Step2_Pieces.ShardGroupsCoverTheShardsRealElementsOnce on rank 0: .*not a view of shard_grads")
  scalelab_add_planted_run(lab09.planted.gather_by_broadcasts.np2 test_lab09_planted RANKS 2
      FILTER Step2_Pieces* PLANT gather_by_broadcasts LAB 09
      REGEX "Step2_Pieces.AllGatherParametersSpreadsEachShardInOneGather on rank [0-9]: .*broadcast")
  # The gather made on a host copy (right bits): the copies step 2's simulated-GPU run counts.
  scalelab_add_planted_run(lab09.planted.gather_on_host.np2 test_lab09_planted RANKS 2
      FILTER Step2_Zero1.RunsOn* PLANT gather_on_host LAB 09
      REGEX "Step2_Zero1.RunsOnTheSimulatedGpuAsOnTheHost on rank [0-9]: .*Zero1::step copied [0-9]+ bytes from the device to the host")
  scalelab_add_planted_run(lab09.planted.reduce_scatter_unpadded.np2 test_lab09_planted RANKS 2
      FILTER Step4* PLANT reduce_scatter_unpadded LAB 09
      REGEX "Step4_Zero3.PaddedUnitsStepLikeDdp on rank [0-9]: .*in reduce_scatter_unit .zero.cpp., unit embedding of 9009 elements over 2 ranks")
  scalelab_add_planted_run(lab09.planted.reduce_scatter_copies.np2 test_lab09_planted RANKS 2
      FILTER Step4* PLANT reduce_scatter_copies LAB 09
      REGEX "Step4_Zero3.ReductionAddsIntoTheShard on rank [0-9]: .*not within")
  # Audit 09, finding 1: a copy of each unit's gradient reduced in its place (the right shard,
  # gone by the hook's end): the peak read around each hook's reduce_unit_to_owners names it.
  scalelab_add_planted_run(lab09.planted.clone_unit_grad.np2 test_lab09_planted RANKS 2
      FILTER Step3* PLANT clone_unit_grad LAB 09
      REGEX "Step3_Zero2.ReducingAUnitAllocatesNoCopyOfItsGradient on rank [0-9]: .*peak by [1-9]")
  # Right on the host, stopped on the simulated GPU (each step's RunsOnTheSimulatedGpuAsOnTheHost):
  # the shard copied out by a loop through data<T>() (step 2), a shard added to by one (step 3),
  # the bf16 cast for the all-gather made on the host (step 4). The run on the simulated GPU
  # stops the rank at its first such line and ends the job with it (a verdict "error").
  scalelab_add_sim_plant(09 shard_copy_loop RANKS 2 FILTER Step2*
      TEST Step2_Zero1.RunsOnTheSimulatedGpuAsOnTheHost STOP host_read)
  scalelab_add_sim_plant(09 shard_add_loop RANKS 2 FILTER Step3*
      TEST Step3_Zero2.RunsOnTheSimulatedGpuAsOnTheHost STOP host_read)
  scalelab_add_sim_plant(09 bf16_send_on_host RANKS 2 FILTER Step4*
      TEST Step4_Zero3.RunsOnTheSimulatedGpuAsOnTheHost STOP mixed)
endif()
# The program with only the core written (cmake/plant_steps.cmake: ZeRO-3 and the formulas,
# steps 4 and 5, throw their starter's NotImplemented): ZeRO-1 trains beside the twin, and --table
# leaves stage 3 and the formula columns out with a note naming the step; exit 0 on the core's
# checks. About 2 s on 2 cores.
scalelab_add_core_only_program(09 STEPS 4 5 RANKS 2 EXPECT_CODE 0
  MATCH "formula columns: - until step 5 \\(optional\\) is written"
        "not in the table: stage 3: lab 09 step 4: .*README.md#step-4.* \\(an optional step: \\./scalelab grade 09 lists them\\)"
  ARGS --model tiny --steps 2 --batch 4 --stage 1 --table)
