# scalelab_add_lab(<NN> <name> SOURCES <impl.cpp...> STEPS <n> RANKS <k...>
#                  [GIVEN <given.cpp...>] [STEP_RANKS "<step>:<k>,<k>" ...] [LIBS <targets...>]
#                  [OPTIONAL_STEPS <step...>] [TIMEOUT <s>])
#
# SOURCES are exercises: solutions/NN_name/<file> for the reference, the generated starter
# labs/NN_name/<file> for the attendee. GIVEN files are not exercises: one copy, in labs/NN_name/,
# compiled into both sides.
#
# One lab, built twice from one contract (labs/NN_name/<name>.hpp):
#   labNN_<name>_starter_impl / labNN_<name>_solution_impl   the attendee's code / the reference
#   labNN_<name>            / labNN_<name>_solution          the program (labs/NN_name/main.cpp)
#   test_labNN              / test_labNN_solution            the graders (tests/NN_name/*.cpp,
#                                                            with tests/support/lab_fixture.hpp)
# and one ctest entry per (step, ranks, build): labNN.stepK.npR.starter|reference, each running
# only the GoogleTest suites named StepK* (--gtest_filter), so one hang cannot mask other steps.
# Labels: starter or reference, and labNN; the entries of OPTIONAL_STEPS (beyond the lab's
# 90-minute core, README.md says which) also carry `optional`, which the grader reports apart
# from the core. Custom targets labNN_starter / labNN_reference build
# one side, so the grader can build each lab on its own.
function(scalelab_add_lab nn name)
  cmake_parse_arguments(L "" "STEPS;TIMEOUT" "SOURCES;GIVEN;RANKS;STEP_RANKS;LIBS;OPTIONAL_STEPS"
                        ${ARGN})
  foreach(step IN LISTS L_OPTIONAL_STEPS)
    if(NOT step MATCHES "^[0-9]+$" OR step LESS 1 OR step GREATER L_STEPS)
      message(FATAL_ERROR "lab ${nn}: OPTIONAL_STEPS names step '${step}', not one of 1..${L_STEPS}")
    endif()
  endforeach()
  set(dir ${nn}_${name})
  set(lab_dir ${PROJECT_SOURCE_DIR}/labs/${dir})
  set(sol_dir ${PROJECT_SOURCE_DIR}/solutions/${dir})
  set(test_dir ${PROJECT_SOURCE_DIR}/tests/${dir})
  file(GLOB test_sources CONFIGURE_DEPENDS ${test_dir}/*.cpp)

  add_custom_target(lab${nn}_starter)
  add_custom_target(lab${nn}_reference)
  add_dependencies(reference lab${nn}_reference)

  foreach(side starter solution)
    if(side STREQUAL "starter")
      set(src_dir ${lab_dir})
      set(suffix "")
      set(label starter)
      set(group lab${nn}_starter)
    else()
      set(src_dir ${sol_dir})
      set(suffix "_solution")
      set(label reference)
      set(group lab${nn}_reference)
    endif()
    set(impl lab${nn}_${name}_${side}_impl)
    list(TRANSFORM L_SOURCES PREPEND ${src_dir}/ OUTPUT_VARIABLE impl_sources)
    list(TRANSFORM L_GIVEN PREPEND ${lab_dir}/ OUTPUT_VARIABLE given_sources)
    list(APPEND impl_sources ${given_sources})
    add_library(${impl} STATIC ${impl_sources})
    target_include_directories(${impl} PUBLIC ${lab_dir})
    target_link_libraries(${impl} PUBLIC scalelab::common ${L_LIBS})

    set(program lab${nn}_${name}${suffix})
    add_executable(${program} ${lab_dir}/main.cpp)
    target_link_libraries(${program} PRIVATE ${impl})
    add_dependencies(${group} ${program})

    if(SCALELAB_BUILD_TESTS AND test_sources)
      set(test_exe test_lab${nn}${suffix})
      add_executable(${test_exe} ${test_sources})
      target_link_libraries(${test_exe} PRIVATE ${impl} scalelab::lab_testing scalelab::test_main)
      add_dependencies(${group} ${test_exe})
      foreach(step RANGE 1 ${L_STEPS})
        set(ranks ${L_RANKS})
        foreach(override IN LISTS L_STEP_RANKS)
          if(override MATCHES "^${step}:(.*)$")
            string(REPLACE "," ";" ranks "${CMAKE_MATCH_1}")
          endif()
        endforeach()
        set(step_labels ${label} lab${nn})
        if(step IN_LIST L_OPTIONAL_STEPS)
          list(APPEND step_labels optional)
        endif()
        foreach(k IN LISTS ranks)
          set(timeout_arg)
          if(L_TIMEOUT)
            set(timeout_arg TIMEOUT ${L_TIMEOUT})
          endif()
          scalelab_add_mpi_test(lab${nn}.step${step}.np${k}.${label} ${test_exe} RANKS ${k}
                                ${timeout_arg} LABELS ${step_labels}
                                ARGS --gtest_filter=Step${step}*)
        endforeach()
      endforeach()
    endif()
  endforeach()
endfunction()

# scalelab_add_lab_gpu_tests(<nn>): ctest lab<nn>.gpu.np1 / .np2 (labels gpu, reference, lab<nn>)
# run the lab's reference test binary on its Gpu_* tests: the solution with CUDA tensors against
# the same on the CPU. They GTEST_SKIP where no GPU is visible, so CI runs them as skips. Not a
# graded step: an attendee's code is graded on the CPU.
function(scalelab_add_lab_gpu_tests nn)
  if(NOT SCALELAB_BUILD_TESTS)
    return()
  endif()
  foreach(k 1 2)
    scalelab_add_mpi_test(lab${nn}.gpu.np${k} test_lab${nn}_solution RANKS ${k} TIMEOUT 120
                          LABELS gpu reference lab${nn} ARGS --gtest_filter=Gpu_*)
  endforeach()
endfunction()
