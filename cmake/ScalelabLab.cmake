# scalelab_add_lab(<NN> <name> SOURCES <impl.cpp...> STEPS <n> RANKS <k...>
#                  [GIVEN <given.cpp...>] [STEP_RANKS "<step>:<k>,<k>" ...] [LIBS <targets...>]
#                  [OPTIONAL_STEPS <step...>] [STEP_USES "<step>:<step>,<step>" ...] [TIMEOUT <s>])
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
# from the core; STEP_USES "4:3" (step 4's graders run the attendee's step 3, checked by ctest
# labNN.step_uses: scalelab_add_step_uses_check) labels step 4's entries `uses-step3`, from which
# the grader says "fix step 3 first" when both fail. Custom targets labNN_starter /
# labNN_reference build one side, so the grader can build each lab on its own. labNN_reference
# also builds the programs this file adds for the lab's other entries (its planted submissions,
# its traced and core-only copies): built alone, it runs `ctest -R labNN.planted`; `reference`
# (./scalelab test) builds every lab's.
#
# COMPOSES <NN...> (lab 10): the lab is built from earlier labs' work. Its code compiles against
# their contracts only (labNN_headers); its graders link their references (each lab is graded on
# its own); its programs link the same side: labNN_<name> (the attendee's program) runs the
# attendee's own labs, labNN_<name>_solution the references. labNN_<name>_ref<AA>_<BB>
# (built on demand: ./scalelab run NN --reference AA,BB) is the attendee's program with the
# references of labs AA and BB in place of their own, for an attendee who skipped those. The
# attendee's program is not in labNN_starter, so grading lab NN does not build the other labs.
function(scalelab_add_lab nn name)
  cmake_parse_arguments(L "" "STEPS;TIMEOUT"
                        "SOURCES;GIVEN;RANKS;STEP_RANKS;LIBS;OPTIONAL_STEPS;COMPOSES;STEP_USES" ${ARGN})
  foreach(step IN LISTS L_OPTIONAL_STEPS)
    if(NOT step MATCHES "^[0-9]+$" OR step LESS 1 OR step GREATER L_STEPS)
      message(FATAL_ERROR "lab ${nn}: OPTIONAL_STEPS names step '${step}', not one of 1..${L_STEPS}")
    endif()
  endforeach()
  foreach(uses IN LISTS L_STEP_USES)
    if(NOT uses MATCHES "^([0-9]+):([0-9]+(,[0-9]+)*)$")
      message(FATAL_ERROR "lab ${nn}: STEP_USES '${uses}' is not <step>:<step>,<step>...")
    endif()
    string(REPLACE "," ";" used "${CMAKE_MATCH_2}")
    foreach(step IN LISTS CMAKE_MATCH_1 used)
      if(step LESS 1 OR step GREATER L_STEPS)
        message(FATAL_ERROR "lab ${nn}: STEP_USES '${uses}' names step ${step}, not one of 1..${L_STEPS}")
      endif()
    endforeach()
  endforeach()
  set(dir ${nn}_${name})
  set(lab_dir ${PROJECT_SOURCE_DIR}/labs/${dir})
  set(sol_dir ${PROJECT_SOURCE_DIR}/solutions/${dir})
  set(test_dir ${PROJECT_SOURCE_DIR}/tests/${dir})
  file(GLOB test_sources CONFIGURE_DEPENDS ${test_dir}/*.cpp)

  add_custom_target(lab${nn}_starter)
  add_custom_target(lab${nn}_reference)
  add_dependencies(reference lab${nn}_reference)
  set_property(GLOBAL PROPERTY SCALELAB_LAB_${nn}_NAME ${name})

  # The contract alone (to compile against): this lab's headers and those of the labs it links.
  add_library(lab${nn}_headers INTERFACE)
  target_include_directories(lab${nn}_headers INTERFACE ${lab_dir})
  target_link_libraries(lab${nn}_headers INTERFACE scalelab::common)
  foreach(lib IN LISTS L_LIBS)
    if(lib MATCHES "^lab([0-9][0-9])_.*_solution_impl$")
      target_link_libraries(lab${nn}_headers INTERFACE lab${CMAKE_MATCH_1}_headers)
    endif()
  endforeach()
  set(composed_headers)
  foreach(c IN LISTS L_COMPOSES)
    get_property(cname GLOBAL PROPERTY SCALELAB_LAB_${c}_NAME)
    if(NOT cname)
      message(FATAL_ERROR "lab ${nn} COMPOSES lab ${c}, which is not defined before it")
    endif()
    list(APPEND composed_headers lab${c}_headers)
    target_link_libraries(lab${nn}_headers INTERFACE lab${c}_headers)
  endforeach()

  # What both sides share is compiled once (object libraries): the GIVEN files, the program's
  # main.cpp and the graders. On a 2-core CI runner each copy of a grader costs seconds of
  # GoogleTest templates; the planted submissions below link the same objects.
  set(given_objects)
  if(L_GIVEN)
    list(TRANSFORM L_GIVEN PREPEND ${lab_dir}/ OUTPUT_VARIABLE given_sources)
    add_library(lab${nn}_given OBJECT ${given_sources})
    target_link_libraries(lab${nn}_given PUBLIC lab${nn}_headers ${L_LIBS} ${composed_headers})
    set(given_objects $<TARGET_OBJECTS:lab${nn}_given>)
  endif()
  add_library(lab${nn}_main OBJECT ${lab_dir}/main.cpp)
  target_link_libraries(lab${nn}_main PRIVATE lab${nn}_headers ${L_LIBS} ${composed_headers})
  if(SCALELAB_BUILD_TESTS AND test_sources)
    add_library(test_lab${nn}_objects OBJECT ${test_sources})
    target_link_libraries(test_lab${nn}_objects PRIVATE lab${nn}_headers ${L_LIBS}
                          ${composed_headers} scalelab::lab_testing scalelab::test_main)
  endif()

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
    add_library(${impl} STATIC ${impl_sources} ${given_objects})
    target_include_directories(${impl} PUBLIC ${lab_dir})
    target_link_libraries(${impl} PUBLIC scalelab::common ${L_LIBS} ${composed_headers})
    # the composed labs' code, as a side: "starter" (the attendee's) or "solution"
    set(composed_starter)
    set(composed_solution)
    foreach(c IN LISTS L_COMPOSES)
      get_property(cname GLOBAL PROPERTY SCALELAB_LAB_${c}_NAME)
      list(APPEND composed_starter lab${c}_${cname}_starter_impl)
      list(APPEND composed_solution lab${c}_${cname}_solution_impl)
    endforeach()

    set(program lab${nn}_${name}${suffix})
    add_executable(${program} $<TARGET_OBJECTS:lab${nn}_main>)
    target_link_libraries(${program} PRIVATE ${impl} ${composed_${side}})
    if(NOT (L_COMPOSES AND side STREQUAL "starter"))
      add_dependencies(${group} ${program})
    endif()

    if(SCALELAB_BUILD_TESTS AND test_sources)
      set(test_exe test_lab${nn}${suffix})
      add_executable(${test_exe} $<TARGET_OBJECTS:test_lab${nn}_objects>)
      target_link_libraries(${test_exe} PRIVATE ${impl} ${composed_solution} scalelab::lab_testing
                                                scalelab::test_main)
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
        foreach(uses IN LISTS L_STEP_USES)  # the grader reads these: "fix step J first"
          if(uses MATCHES "^${step}:(.*)$")
            string(REPLACE "," ";" used "${CMAKE_MATCH_1}")
            list(TRANSFORM used PREPEND uses-step)
            list(APPEND step_labels ${used})
          endif()
        endforeach()
        list(GET ranks -1 most)
        list(APPEND step_most_ranks ${step}:${most})
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

  if(SCALELAB_BUILD_TESTS AND test_sources)
    list(REMOVE_DUPLICATES step_most_ranks)
    scalelab_add_step_uses_check(${nn} STEPS ${L_STEPS} STEP_USES ${L_STEP_USES}
                                 RANKS ${step_most_ranks} LIBS ${composed_solution})
  endif()

  # The attendee's program with the references of some composed labs (every non-empty subset).
  list(LENGTH L_COMPOSES n_composed)
  if(n_composed GREATER 0)
    math(EXPR last_mask "(1 << ${n_composed}) - 1")
    foreach(mask RANGE 1 ${last_mask})
      set(suffix "")
      set(libs)
      set(i 0)
      foreach(c IN LISTS L_COMPOSES)
        get_property(cname GLOBAL PROPERTY SCALELAB_LAB_${c}_NAME)
        math(EXPR bit "(${mask} >> ${i}) & 1")
        if(bit)
          string(APPEND suffix "_${c}")
          list(APPEND libs lab${c}_${cname}_solution_impl)
        else()
          list(APPEND libs lab${c}_${cname}_starter_impl)
        endif()
        math(EXPR i "${i} + 1")
      endforeach()
      set(variant lab${nn}_${name}_ref${suffix})
      string(REPLACE "_ref_" "_ref" variant ${variant})
      add_executable(${variant} EXCLUDE_FROM_ALL $<TARGET_OBJECTS:lab${nn}_main>)
      target_link_libraries(${variant} PRIVATE lab${nn}_${name}_starter_impl ${libs})
    endforeach()
  endif()
endfunction()

# scalelab_add_step_uses_check(<NN> STEPS <n> [STEP_USES "<K>:<J>,<J>"...] RANKS "<K>:<k>"...
#                              [LIBS <targets...>])
# STEP_USES says which steps' tests run which other steps' code: "4:3" = step 4's graders call
# the attendee's step 3 (a step 4 that fails while step 3 does is no news about step 4, and the
# grader says "fix step 3 first"). This checks the claim: test_labNN_traced is the lab's graders
# linked with its reference, each step's blocks noting that they ran in the file
# SCALELAB_STEP_TRACE names (cmake/plant_steps.cmake); ctest labNN.step_uses runs each step's
# graders once (on its largest rank count; tools/step_uses) and fails, naming the pairs and the
# STEP_USES to write, where a step's tests reach a step the declaration does not name, never reach
# one it names, or never run their own step's code.
function(scalelab_add_step_uses_check nn)
  cmake_parse_arguments(U "" "STEPS" "STEP_USES;RANKS;LIBS" ${ARGN})
  get_property(name GLOBAL PROPERTY SCALELAB_LAB_${nn}_NAME)
  set(all_steps)
  foreach(step RANGE 1 ${U_STEPS})
    list(APPEND all_steps ${step})
  endforeach()
  list(JOIN all_steps "," all_steps)
  scalelab_impl_from_reference_copy(${nn} lab${nn}_traced_impl traced_lab${nn}
                                    SCRIPT ${PROJECT_SOURCE_DIR}/cmake/plant_steps.cmake
                                    DEFINES -DLAB=${nn} -DSTEPS=${all_steps} -DTRACE=SCALELAB_STEP_TRACE
                                    COMMENT "lab ${nn}'s reference, each step noting that it ran")
  add_executable(test_lab${nn}_traced $<TARGET_OBJECTS:test_lab${nn}_objects>)
  target_link_libraries(test_lab${nn}_traced PRIVATE lab${nn}_traced_impl ${U_LIBS} scalelab::lab_testing
                        scalelab::test_main)
  scalelab_undefined_symbols(test_lab${nn}_traced lab${nn}_traced_impl ${name}.cpp)
  add_dependencies(lab${nn}_reference test_lab${nn}_traced)
  set(most 1)
  foreach(r IN LISTS U_RANKS)
    string(REGEX REPLACE "^[0-9]+:" "" r "${r}")
    if(r GREATER most)
      set(most ${r})
    endif()
  endforeach()
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
  add_test(NAME lab${nn}.step_uses
           COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/step_uses --lab ${nn} --steps ${U_STEPS}
                   --ranks ${U_RANKS} --uses ${U_STEP_USES} --
                   ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} @RANKS@ ${MPIEXEC_PREFLAGS}
                   $<TARGET_FILE:test_lab${nn}_traced> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(lab${nn}.step_uses PROPERTIES PROCESSORS ${most} TIMEOUT 600
                       LABELS "reference;lab${nn}" ENVIRONMENT "${SCALELAB_MPI_TEST_ENV}")
endfunction()

# scalelab_add_lab_gpu_tests(<nn>): ctest lab<nn>.gpu.np1 / .np2 (labels gpu, reference, lab<nn>)
# run the lab's reference test binary on its Gpu_* tests: the solution with CUDA tensors against
# the same on the CPU. They GTEST_SKIP where no GPU is visible, so CI runs them as skips. Not a
# graded step: an attendee's code is graded on the CPU. lab<nn>.gpu_on_sim.np1 / .np2 (labels
# reference, lab<nn>, sim) run the same tests on the simulated GPU (SCALELAB_TEST_DEVICE=sim,
# labtest::test_gpu), on every machine.
function(scalelab_add_lab_gpu_tests nn)
  if(NOT SCALELAB_BUILD_TESTS)
    return()
  endif()
  foreach(k 1 2)
    scalelab_add_mpi_test(lab${nn}.gpu.np${k} test_lab${nn}_solution RANKS ${k} TIMEOUT 120
                          LABELS gpu reference lab${nn} ARGS --gtest_filter=Gpu_*)
    scalelab_add_mpi_test(lab${nn}.gpu_on_sim.np${k} test_lab${nn}_solution RANKS ${k} TIMEOUT 120
                          LABELS reference lab${nn} sim ARGS --gtest_filter=Gpu_*)
    set_property(TEST lab${nn}.gpu_on_sim.np${k} APPEND PROPERTY ENVIRONMENT
                 SCALELAB_TEST_DEVICE=sim)
  endforeach()
endfunction()

# scalelab_impl_from_reference_copy(<NN> <impl-target> <dir> SCRIPT <script.cmake>
#                                   [DEFINES <-Dvar=value...>] [DEPENDS <files...>] COMMENT <text>)
# A static library <impl-target> like the lab's labNN_<name>_solution_impl (its GIVEN files, its
# include directory and libraries), but with the reference solutions/NN_name/<name>.cpp replaced
# by a copy that <script> writes at build time into <dir> under the build tree (cmake -DIN=<the
# reference> -DOUT=<the copy> DEFINES -P <script>): a planted submission, or the core alone.
function(scalelab_impl_from_reference_copy nn impl dir)
  cmake_parse_arguments(R "" "SCRIPT;COMMENT" "DEFINES;DEPENDS" ${ARGN})
  get_property(name GLOBAL PROPERTY SCALELAB_LAB_${nn}_NAME)
  set(reference ${PROJECT_SOURCE_DIR}/solutions/${nn}_${name}/${name}.cpp)
  set(copy ${CMAKE_CURRENT_BINARY_DIR}/${dir}/${name}.cpp)
  add_custom_command(OUTPUT ${copy}
                     COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_CURRENT_BINARY_DIR}/${dir}
                     COMMAND ${CMAKE_COMMAND} -DIN=${reference} -DOUT=${copy} ${R_DEFINES}
                             -P ${R_SCRIPT}
                     DEPENDS ${reference} ${R_SCRIPT} ${R_DEPENDS}
                     COMMENT "${R_COMMENT}" VERBATIM)
  get_target_property(sources lab${nn}_${name}_solution_impl SOURCES)
  get_target_property(libs lab${nn}_${name}_solution_impl LINK_LIBRARIES)
  list(TRANSFORM sources REPLACE "^${reference}$" "${copy}")
  add_library(${impl} STATIC ${sources})
  target_include_directories(${impl} PUBLIC ${PROJECT_SOURCE_DIR}/labs/${nn}_${name})
  target_link_libraries(${impl} PUBLIC ${libs})
endfunction()

# scalelab_add_planted_run(<ctest-name> <test-exe> RANKS <k> FILTER <gtest filter> PLANT <cheat>
#                          LAB <NN> REGEX <regex> [EXCEPTION])
# One planted run: <test-exe> (a lab's graders linked with a planted copy of its reference) on k
# ranks with SCALELAB_PLANT=<cheat>, the GoogleTest filter FILTER; the entry (labels reference,
# labNN) passes only when the run FAILS (exit 1) with a verdict line "failed: <regex>", or with
# EXCEPTION "error: exception in <regex>" (a library check thrown inside the graded test).
function(scalelab_add_planted_run name exe)
  cmake_parse_arguments(P "EXCEPTION" "RANKS;FILTER;PLANT;LAB;REGEX" "" ${ARGN})
  set(verdict "failed: ")
  if(P_EXCEPTION)
    set(verdict "error: exception in ")
  endif()
  set(cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${P_RANKS} ${MPIEXEC_PREFLAGS}
      $<TARGET_FILE:${exe}> ${MPIEXEC_POSTFLAGS} --gtest_filter=${P_FILTER})
  list(JOIN cmd "|" cmd)
  add_test(NAME ${name}
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${cmd}" -DEXPECT_CODE=1
                   "-DEXPECT_REGEX=\\[scalelab\\] verdict: ${verdict}${P_REGEX}" -DMAX_SECONDS=60
                   -DRUN_DIR=${CMAKE_BINARY_DIR}/runs/${name}
                   -P ${PROJECT_SOURCE_DIR}/tests/common/expect_exit.cmake)
  set_tests_properties(${name} PROPERTIES PROCESSORS ${P_RANKS} TIMEOUT 90
                       LABELS "reference;lab${P_LAB}"
                       ENVIRONMENT "${SCALELAB_MPI_TEST_ENV};SCALELAB_PLANT=${P_PLANT}")
endfunction()

# scalelab_add_sim_plant(<NN> <cheat> RANKS <k> FILTER <gtest filter> TEST <Suite.Test>
#                        STOP host_read|mixed|<regex>)
# A planted cheat that is right on the host and that the run of TEST on the simulated GPU stops
# (tests/support/on_sim.hpp: collective_run_on_sim ends the job, a verdict "error"): ctest
# labNN.planted.<cheat>.np<k>, on test_labNN_planted. STOP: host_read, a loop through data<T>()
# ("host code reached the elements of ..."); mixed, an op given host and sim tensors; else the
# regex of the stop's line after "on the simulated GPU (--device sim): ".
function(scalelab_add_sim_plant nn cheat)
  cmake_parse_arguments(S "" "RANKS;FILTER;TEST;STOP" "" ${ARGN})
  if(S_STOP STREQUAL "host_read")
    set(S_STOP ".*host code reached the elements of .* sim through data<T>.., outside an op")
  elseif(S_STOP STREQUAL "mixed")
    set(S_STOP ".*(cpu.* sim|sim.* cpu)")
  endif()
  scalelab_add_planted_run(lab${nn}.planted.${cheat}.np${S_RANKS} test_lab${nn}_planted
      RANKS ${S_RANKS} FILTER ${S_FILTER} PLANT ${cheat} LAB ${nn} EXCEPTION
      REGEX "${S_TEST} on rank [0-9]: on the simulated GPU .--device sim.: ${S_STOP}")
endfunction()

# scalelab_add_planted_submissions(<NN> [PLANTS <file.plant>]
#                                  CASES "<cheat>:<step>:<ranks>:<regex>" ...)
# Planted submissions: a copy of the lab's reference (solutions/NN_name/<name>.cpp) with the
# cheats of PLANTS (default: solutions/NN_name/planted/cheats.plant, beside the reference it
# quotes) planted (cmake/plant_file.cmake: each switched on at run time by
# SCALELAB_PLANT=<cheat>), linked with the lab's GIVEN files and graders (the objects of
# test_labNN, compiled once) into test_labNN_planted. Each CASE is one ctest entry
# labNN.planted.<cheat>.np<ranks> (labels reference, labNN): the step's graders run on the
# planted submission, as the grader runs them on an attendee's, and must FAIL (exit 1) with a
# verdict line matching <regex>: the class of cheat the step stops, shown stopped. <step> is a
# step number (every StepK* suite runs) or a step number and the start of a suite or test name
# ("1_Balance": Step1_Balance* only), for a cheat that an earlier check of its step would catch
# first but that one check is there to stop.
function(scalelab_add_planted_submissions nn)
  cmake_parse_arguments(P "" "PLANTS" "CASES" ${ARGN})
  if(NOT SCALELAB_BUILD_TESTS)
    return()
  endif()
  get_property(name GLOBAL PROPERTY SCALELAB_LAB_${nn}_NAME)
  if(NOT P_PLANTS)
    set(P_PLANTS ${PROJECT_SOURCE_DIR}/solutions/${nn}_${name}/planted/cheats.plant)
  endif()
  scalelab_impl_from_reference_copy(${nn} lab${nn}_planted_submission_impl planted_submissions_lab${nn}
                                    SCRIPT ${PROJECT_SOURCE_DIR}/cmake/plant_file.cmake
                                    DEFINES -DPLANTS=${P_PLANTS} DEPENDS ${P_PLANTS}
                                    COMMENT "planting lab ${nn}'s cheats into a copy of its reference")
  add_executable(test_lab${nn}_planted $<TARGET_OBJECTS:test_lab${nn}_objects>)
  target_link_libraries(test_lab${nn}_planted PRIVATE lab${nn}_planted_submission_impl scalelab::lab_testing
                        scalelab::test_main)
  # its symbols, as an attendee's
  scalelab_undefined_symbols(test_lab${nn}_planted lab${nn}_planted_submission_impl ${name}.cpp)
  add_dependencies(lab${nn}_reference test_lab${nn}_planted)
  foreach(case IN LISTS P_CASES)
    if(NOT case MATCHES "^([a-z0-9_]+):([0-9]+[A-Za-z0-9_.]*):([0-9]+):(.+)$")
      message(FATAL_ERROR "lab ${nn}: planted case '${case}' is not <cheat>:<step>:<ranks>:<regex>")
    endif()
    set(cheat ${CMAKE_MATCH_1})
    set(step ${CMAKE_MATCH_2})
    set(ranks ${CMAKE_MATCH_3})
    scalelab_add_planted_run(lab${nn}.planted.${cheat}.np${ranks} test_lab${nn}_planted
                             RANKS ${ranks} FILTER Step${step}* PLANT ${cheat} LAB ${nn}
                             REGEX "${CMAKE_MATCH_4}")
  endforeach()
endfunction()

# scalelab_add_core_only_impl(<NN> STEPS <K...>)
# labNN_core_only_impl: the lab's reference with its optional steps STEPS throwing their starter's
# NotImplemented (a copy made at build time by cmake/plant_steps.cmake) and its GIVEN files:
# what an attendee's code is before the optional steps are written. Once per lab.
function(scalelab_add_core_only_impl nn)
  cmake_parse_arguments(C "" "" "STEPS" ${ARGN})
  if(TARGET lab${nn}_core_only_impl)
    return()
  endif()
  list(JOIN C_STEPS "," steps)
  scalelab_impl_from_reference_copy(${nn} lab${nn}_core_only_impl core_only_lab${nn}
                                    SCRIPT ${PROJECT_SOURCE_DIR}/cmake/plant_steps.cmake
                                    DEFINES -DLAB=${nn} -DSTEPS=${steps}
                                    COMMENT "lab ${nn} with its optional steps ${C_STEPS} not written (a copy of the reference)")
endfunction()

# scalelab_add_core_only_program(<NN> STEPS <K...> RANKS <n> EXPECT_CODE <code> MATCH <regex...>
#                                ARGS <program arguments...>)
# The lab's program with only the core written: labNN_<name>_core_only, its main.cpp linked with
# labNN_core_only_impl (above), and one ctest entry labNN.program.core_only.np<n> (labels
# reference, labNN; the bf16_corpus fixture's data) that runs it with ARGS and expects EXPECT_CODE
# and every regex of MATCH: what an attendee's run does before the optional steps.
function(scalelab_add_core_only_program nn)
  cmake_parse_arguments(C "" "RANKS;EXPECT_CODE" "STEPS;MATCH;ARGS" ${ARGN})
  if(NOT SCALELAB_BUILD_TESTS)
    return()
  endif()
  get_property(name GLOBAL PROPERTY SCALELAB_LAB_${nn}_NAME)
  scalelab_add_core_only_impl(${nn} STEPS ${C_STEPS})
  add_executable(lab${nn}_${name}_core_only $<TARGET_OBJECTS:lab${nn}_main>)
  target_link_libraries(lab${nn}_${name}_core_only PRIVATE lab${nn}_core_only_impl)
  add_dependencies(lab${nn}_reference lab${nn}_${name}_core_only)
  set(cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${C_RANKS} ${MPIEXEC_PREFLAGS}
      $<TARGET_FILE:lab${nn}_${name}_core_only> ${MPIEXEC_POSTFLAGS} ${C_ARGS}
      --data ${PROJECT_BINARY_DIR}/tests/common/bf16_corpus)
  list(JOIN cmd "|" cmd)
  list(JOIN C_MATCH "@@" regexes)
  set(test lab${nn}.program.core_only.np${C_RANKS})
  add_test(NAME ${test}
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${cmd}" -DEXPECT_CODE=${C_EXPECT_CODE}
                   "-DEXPECT_REGEX=${regexes}" -DMAX_SECONDS=60
                   -P ${PROJECT_SOURCE_DIR}/tests/common/expect_exit.cmake)
  set_tests_properties(${test} PROPERTIES PROCESSORS ${C_RANKS} TIMEOUT 90
                       LABELS "reference;lab${nn}" FIXTURES_REQUIRED bf16_corpus
                       ENVIRONMENT "${SCALELAB_MPI_TEST_ENV}")
endfunction()
