# cmake -DIN=<reference.cpp> -DOUT=<file> -DLAB=<NN> -DSTEPS=<K,K...> -P plant_optional.cmake
# A submission with only the core written, made from the reference at build time: every
# `// BEGIN SOLUTION step K: <goal>` of the steps K in STEPS (the optional ones) is followed by the
# NotImplemented its starter throws, "lab NN step K: <goal> (README.md#step-K)". A program linked
# with it shows what an attendee's run does before those steps are written. Fails if a step of
# STEPS has no solution block (the reference changed: update the caller).
file(READ "${IN}" text)
# CMake lists split at ';': the reference's semicolons travel as a placeholder meanwhile
string(REPLACE ";" "@SCALELAB_SEMICOLON@" text "${text}")
string(REPLACE "," ";" STEPS "${STEPS}")  # commas: a ; would split the -D argument
foreach(step IN LISTS STEPS)
  string(REGEX MATCHALL "  // BEGIN SOLUTION step ${step}: [^\n]*" blocks "${text}")
  if(NOT blocks)
    message(FATAL_ERROR "plant_optional.cmake: no solution block of step ${step} in ${IN}")
  endif()
  foreach(block IN LISTS blocks)
    string(REGEX REPLACE "^  // BEGIN SOLUTION step ${step}: " "" goal "${block}")
    string(REPLACE "${block}\n"
           "${block}\n  if (true) throw scalelab::NotImplemented(\"lab ${LAB} step ${step}: ${goal} (README.md#step-${step})\");\n"
           text "${text}")
  endforeach()
endforeach()
string(REPLACE "@SCALELAB_SEMICOLON@" ";" text "${text}")
file(WRITE "${OUT}.tmp" "${text}")
file(RENAME "${OUT}.tmp" "${OUT}")
