# cmake -DIN=<reference.cpp> -DOUT=<file> -DLAB=<NN> -DSTEPS=<K,K...> [-DSWITCH=<VAR>]
#       -P plant_steps.cmake
# A submission with some steps not written, made from the reference at build time: every
# `// BEGIN SOLUTION step K: <goal>` of the steps K in STEPS is followed by the NotImplemented its
# starter throws, "lab NN step K: <goal> (README.md#step-K)".
#   Without SWITCH (the core alone: STEPS are the optional steps), the throws always happen: a
#   program linked with it shows what an attendee's run does before those steps are written.
#   With SWITCH, a throw happens only while the environment variable SWITCH names its step
#   (SWITCH=3: step 3 is "not written", every other step is the reference's): one binary measures
#   which steps' tests run which steps' code (scalelab_add_step_uses_check).
# A block that opens a destructor's body is left whole: a throw there would end the program, and
# the step's constructor block throws first. Fails if a step of STEPS has no solution block (the
# reference changed: update the caller).
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
  if(SWITCH)
    set(when "const char* s = std::getenv(\"${SWITCH}\")@SCALELAB_SEMICOLON@ s && std::atoi(s) == ${step}")
  else()
    set(when "true")
  endif()
  foreach(block IN LISTS blocks)
    string(REGEX REPLACE "^\n([ ]*)// BEGIN SOLUTION step ${step}: (.*)$" "\\1" indent "${block}")
    string(REGEX REPLACE "^\n([ ]*)// BEGIN SOLUTION step ${step}: (.*)$" "\\2" goal "${block}")
    string(REPLACE "\"" "'" goal "${goal}")  # as tools/make-labs writes it: a C++ string
    string(REPLACE "${block}\n"
           "${block}\n${indent}if (${when}) throw scalelab::NotImplemented(\"lab ${LAB} step ${step}: ${goal} (README.md#step-${step})\")@SCALELAB_SEMICOLON@\n"
           text "${text}")
  endforeach()
endforeach()
string(REPLACE "// BEGIN DESTRUCTOR-SOLUTION" "// BEGIN SOLUTION" text "${text}")
if(SWITCH)
  string(PREPEND text "#include <cstdlib>  // std::getenv, std::atoi: the step switch\n")
endif()
string(REPLACE "@SCALELAB_SEMICOLON@" ";" text "${text}")
file(WRITE "${OUT}.tmp" "${text}")
file(RENAME "${OUT}.tmp" "${OUT}")
