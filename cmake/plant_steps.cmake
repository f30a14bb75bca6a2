# cmake -DIN=<reference.cpp> -DOUT=<file> -DLAB=<NN> -DSTEPS=<K,K...> [-DTRACE=<VAR>]
#       -P plant_steps.cmake
# A copy of the reference, made at build time, marked at every `// BEGIN SOLUTION step K: <goal>`
# of the steps K in STEPS:
#   Without TRACE, a submission with those steps not written: each block is followed by the
#   NotImplemented its starter throws, "lab NN step K: <goal> (README.md#step-K)" (the core alone,
#   STEPS the optional steps: a program linked with it shows what an attendee's run does before
#   those steps are written).
#   With TRACE, the reference whole, each block noting that its step ran: the first time step K's
#   code runs in a process, "K" is appended to the file the environment variable VAR names. One
#   run of a step's graders then tells which steps' code they run (scalelab_add_step_uses_check).
# A block that opens a destructor's body is left whole: a throw there would end the program, and
# the step's constructor block throws (or notes) first. Fails if a step of STEPS has no solution
# block (the reference changed: update the caller).
file(READ "${IN}" text)
# CMake lists split at ';': the reference's semicolons travel as a placeholder meanwhile
string(REPLACE ";" "@SCALELAB_SEMICOLON@" text "${text}")
string(REGEX REPLACE "(~[A-Za-z0-9_]+\\(\\)[^{\n]*{\n[ ]*)// BEGIN SOLUTION" "\\1// BEGIN DESTRUCTOR-SOLUTION"
       text "${text}")
string(REPLACE "," ";" STEPS "${STEPS}")  # commas: a ; would split the -D argument
foreach(step IN LISTS STEPS)
  string(REGEX MATCHALL "\n[ ]*// BEGIN SOLUTION step ${step}: [^\n]*" blocks "${text}")
  if(NOT blocks)
    message(FATAL_ERROR "plant_steps.cmake: no solution block of step ${step} in ${IN}")
  endif()
  list(REMOVE_DUPLICATES blocks)  # REPLACE below plants at every copy of a line at once
  foreach(block IN LISTS blocks)
    string(REGEX REPLACE "^\n([ ]*)// BEGIN SOLUTION step ${step}: (.*)$" "\\1" indent "${block}")
    string(REGEX REPLACE "^\n([ ]*)// BEGIN SOLUTION step ${step}: (.*)$" "\\2" goal "${block}")
    string(REPLACE "\"" "'" goal "${goal}")  # as tools/make-labs writes it: a C++ string
    if(TRACE)
      set(mark "scalelab_step_ran(${step})")
    else()
      set(mark "throw scalelab::NotImplemented(\"lab ${LAB} step ${step}: ${goal} (README.md#step-${step})\")")
    endif()
    string(REPLACE "${block}\n" "${block}\n${indent}${mark}@SCALELAB_SEMICOLON@\n" text "${text}")
  endforeach()
endforeach()
string(REPLACE "// BEGIN DESTRUCTOR-SOLUTION" "// BEGIN SOLUTION" text "${text}")
string(REPLACE "@SCALELAB_SEMICOLON@" ";" text "${text}")
if(TRACE)
  # once per step and process (the blocks can sit in loops); O_APPEND lines from every rank
  string(PREPEND text [=[#include <atomic>
#include <cstdio>
#include <cstdlib>
namespace {
void scalelab_step_ran(int step) {
  static std::atomic<unsigned long long> noted{0};
  const unsigned long long bit = 1ull << step;
  if (noted.fetch_or(bit) & bit) return;
  if (const char* path = std::getenv("@VAR@"))
    if (std::FILE* f = std::fopen(path, "a")) {
      std::fprintf(f, "%d\n", step);
      std::fclose(f);
    }
}
}  // namespace
]=])
  string(REPLACE "@VAR@" "${TRACE}" text "${text}")
endif()
file(WRITE "${OUT}.tmp" "${text}")
file(RENAME "${OUT}.tmp" "${OUT}")
