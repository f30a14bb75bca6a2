# Runs a command and checks its exit code and output (ctest's PASS_REGULAR_EXPRESSION alone
# ignores the exit code). Used by the watchdog tests, whose program must end with exit 3 and a
# report.
#   cmake -DCOMMAND="mpiexec|-n|2|prog|--mode|skip" -DEXPECT_CODE=3
#         -DEXPECT_REGEX="regex 1@@regex 2" [-DREJECT_REGEX="regex"] -P expect_exit.cmake
# REJECT_REGEX: output that fails the test even with the right code and lines (a crash report
# beside the expected verdict). RUN_DIR: a directory made empty for the run and given to it as
# SCALELAB_RUN_DIR, where the test main keeps the verdict line whole (verdict.rank<r>); an
# EXPECT_REGEX also matches those lines. The launcher forwards the ranks' output in pieces, and
# another rank's line can land inside the printed verdict (tests/support/test_main.cpp).
string(REPLACE "|" ";" command "${COMMAND}")
string(REPLACE "@@" ";" regexes "${EXPECT_REGEX}")
if(DEFINED RUN_DIR)
  file(REMOVE_RECURSE "${RUN_DIR}")
  file(MAKE_DIRECTORY "${RUN_DIR}")
  set(ENV{SCALELAB_RUN_DIR} "${RUN_DIR}")
endif()
string(TIMESTAMP start "%s")
execute_process(COMMAND ${command} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(TIMESTAMP stop "%s")
math(EXPR seconds "${stop} - ${start}")
message("${out}${err}")
set(kept "")
if(DEFINED RUN_DIR)
  file(GLOB verdicts "${RUN_DIR}/verdict.rank*")
  list(FILTER verdicts EXCLUDE REGEX "\\.tmp$")  # a write that never finished
  foreach(f IN LISTS verdicts)
    file(READ "${f}" line)
    string(APPEND kept "${line}\n")
    message("kept in ${f}: ${line}")
  endforeach()
endif()
message("exit code ${code} after ${seconds} s")
if(NOT "${code}" STREQUAL "${EXPECT_CODE}")
  message(FATAL_ERROR "expected exit code ${EXPECT_CODE}, got ${code}")
endif()
foreach(regex IN LISTS regexes)
  if(NOT "${out}${err}" MATCHES "${regex}" AND NOT "${kept}" MATCHES "${regex}")
    message(FATAL_ERROR "output does not match '${regex}'")
  endif()
endforeach()
if(DEFINED REJECT_REGEX AND "${out}${err}" MATCHES "${REJECT_REGEX}")
  message(FATAL_ERROR "output matches '${REJECT_REGEX}', which it must not")
endif()
if(DEFINED MAX_SECONDS AND seconds GREATER MAX_SECONDS)
  message(FATAL_ERROR "took ${seconds} s, more than ${MAX_SECONDS} s")
endif()
message("ok")
