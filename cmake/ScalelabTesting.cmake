# Test helpers. Every test binary links the MPI-aware GoogleTest main (tests/support) and runs
# under mpiexec, even at one rank, so a test sees the same start-up as a lab program.
# scalelab::test_main is an OBJECT library: link it directly to each test executable (objects do
# not travel through other libraries), so its strong `main` is always linked in and a lab's own
# `main` is a link error (the grader relies on it: docs/grading.md).

# What lets Open MPI start as root and with more ranks than cores (a 2-core laptop or CI runner
# running 4 ranks): the KEY=VALUE lines of tools/mpi_env, the one list the launcher and the
# grader read too. Editing it re-runs CMake.
set(SCALELAB_MPI_ENV_FILE ${CMAKE_CURRENT_LIST_DIR}/../tools/mpi_env)
cmake_path(NORMAL_PATH SCALELAB_MPI_ENV_FILE)
file(STRINGS ${SCALELAB_MPI_ENV_FILE} SCALELAB_MPI_TEST_ENV REGEX "^[A-Za-z_][A-Za-z0-9_]*=")
if(NOT SCALELAB_MPI_TEST_ENV)
  message(FATAL_ERROR "${SCALELAB_MPI_ENV_FILE}: no KEY=VALUE lines")
endif()
set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             ${SCALELAB_MPI_ENV_FILE})

# Open MPI 4's mpiexec shares one session directory between the jobs started on a machine, and
# two jobs started at once can race on it (cmake/mpiexec_own_tmp.sh.in says how): every test here
# launches through a wrapper that gives each job a directory of its own. From here on
# MPIEXEC_EXECUTABLE is the wrapper (the cache keeps the real launcher). Open MPI 5 (PRRTE) and
# other MPIs are launched as they are.
execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE scalelab_mpiexec_version
                ERROR_QUIET RESULT_VARIABLE scalelab_mpiexec_rc)
if(scalelab_mpiexec_rc EQUAL 0 AND scalelab_mpiexec_version MATCHES "\\((Open MPI|OpenRTE)\\) [1-4]\\.")
  set(SCALELAB_REAL_MPIEXEC ${MPIEXEC_EXECUTABLE})
  configure_file(${CMAKE_CURRENT_LIST_DIR}/mpiexec_own_tmp.sh.in ${PROJECT_BINARY_DIR}/mpiexec_own_tmp
                 @ONLY FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ
                 GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
  set(MPIEXEC_EXECUTABLE ${PROJECT_BINARY_DIR}/mpiexec_own_tmp)
endif()

# scalelab_add_mpi_test(<ctest-name> <target> RANKS <k> [TIMEOUT <s>] [LABELS ...] [ARGS ...])
# Registers one ctest entry that runs <target> on <k> ranks.
function(scalelab_add_mpi_test name target)
  cmake_parse_arguments(T "" "RANKS;TIMEOUT" "LABELS;ARGS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT ${SCALELAB_TEST_TIMEOUT})
  endif()
  add_test(NAME ${name}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${T_RANKS} ${MPIEXEC_PREFLAGS}
                   $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS} ${T_ARGS})
  set_tests_properties(${name} PROPERTIES
                       PROCESSORS ${T_RANKS}
                       TIMEOUT ${T_TIMEOUT}
                       LABELS "${T_LABELS}"
                       ENVIRONMENT "${SCALELAB_MPI_TEST_ENV}")
endfunction()

# scalelab_expect_usage_error(<ctest-name> <target> <program args...>)
# scalelab_expect_usage_error(<ctest-name> <target> [RANKS <k>] [LABELS ...] [MATCH <regex>]
#                             ARGS <program args...>)
# Bad input to a program: exit code 2 and one "error:" line, never a hang. Without RANKS the
# program runs directly (a singleton MPI process) and must print exactly one line on stderr; with
# RANKS it runs under mpiexec on k ranks, every rank reports the error and mpiexec adds its own
# notice, so the check is one DISTINCT "error:" line. MATCH: that line must also match the
# extended regular expression (grep -E), e.g. the option and the limit it names. Labels default
# to "reference;common".
function(scalelab_expect_usage_error name target)
  cmake_parse_arguments(U "" "RANKS;MATCH" "LABELS;ARGS" ${ARGN})
  list(APPEND U_ARGS ${U_UNPARSED_ARGUMENTS})
  if(NOT U_LABELS)
    set(U_LABELS reference common)
  endif()
  # The regex travels in the environment (EXPECT_ERROR): no quoting through sh -c's arguments.
  set(match "if [ -z \"$EXPECT_ERROR\" ] || grep '^error: ' \"$e\" | grep -qE -- \"$EXPECT_ERROR\"; \
then m=0; else m=1; echo \"want an error line matching: $EXPECT_ERROR\"; fi")
  if(U_RANKS)
    add_test(NAME ${name}
             COMMAND sh -c "e=$(mktemp); \"$0\" \"$@\" >/dev/null 2>\"$e\"; rc=$?; cat \"$e\"; \
n=$(grep '^error: ' \"$e\" | sort -u | wc -l); ${match}; rm -f \"$e\"; \
[ $rc -eq 2 ] && [ $n -eq 1 ] && [ $m -eq 0 ]"
                     ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${U_RANKS} ${MPIEXEC_PREFLAGS}
                     $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS} ${U_ARGS})
    set_tests_properties(${name} PROPERTIES PROCESSORS ${U_RANKS})
  else()
    add_test(NAME ${name}
             COMMAND sh -c "e=$(mktemp); \"$0\" \"$@\" >/dev/null 2>\"$e\"; rc=$?; cat \"$e\"; \
n=$(wc -l < \"$e\"); g=$(grep -c '^error: ' \"$e\"); ${match}; rm -f \"$e\"; \
[ $rc -eq 2 ] && [ $n -eq 1 ] && [ $g -eq 1 ] && [ $m -eq 0 ]"
                     $<TARGET_FILE:${target}> ${U_ARGS})
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${U_LABELS}" TIMEOUT 30
                       ENVIRONMENT "${SCALELAB_MPI_TEST_ENV};EXPECT_ERROR=${U_MATCH}")
endfunction()

# scalelab_expect_usage_errors(<prefix> <target> [LABELS ...] [ARGS <args every case gets...>]
#                              CASES "<ranks>|<name>|<regex>|<arg>|<arg>..." ...)
# A table of bad inputs to one program: each case is scalelab_expect_usage_error's ctest entry
# <prefix>.<name> on <ranks> ranks, ARGS then the case's own arguments, its one error line
# matching <regex> (which must not hold '|').
function(scalelab_expect_usage_errors prefix target)
  cmake_parse_arguments(U "" "" "LABELS;ARGS;CASES" ${ARGN})
  foreach(case IN LISTS U_CASES)
    string(REPLACE "|" ";" case "${case}")
    list(POP_FRONT case ranks name regex)
    scalelab_expect_usage_error(${prefix}.${name} ${target} RANKS ${ranks} LABELS ${U_LABELS}
                                MATCH "${regex}" ARGS ${U_ARGS} ${case})
  endforeach()
endfunction()

# scalelab_add_test(NAME <name> SOURCES <files...> [RANKS <k...>] [LABELS ...] [TIMEOUT <s>]
#                   [LIBS ...])
# A test of the library itself (tests/common): one binary, one ctest entry per rank count,
# labelled 'reference' (so './scalelab test' runs it) and 'common'.
function(scalelab_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;RANKS;LABELS;LIBS" ${ARGN})
  if(NOT T_RANKS)
    set(T_RANKS 1)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE scalelab::test_main ${T_LIBS})
  add_dependencies(reference ${T_NAME})
  foreach(k IN LISTS T_RANKS)
    set(timeout_arg)
    if(T_TIMEOUT)
      set(timeout_arg TIMEOUT ${T_TIMEOUT})
    endif()
    scalelab_add_mpi_test(common.${T_NAME}.np${k} ${T_NAME} RANKS ${k} ${timeout_arg}
                          LABELS reference common ${T_LABELS})
  endforeach()
endfunction()

# 'reference' builds everything './scalelab test' runs: the library's tests and every lab's
# solution program and reference tests (never the attendee's starters).
add_custom_target(reference)
