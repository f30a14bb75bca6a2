# cmake -DIN=<file> -DOUT=<file> -DFROM=<text> -DTO=<text> -P plant.cmake
# Writes IN to OUT with the one occurrence of FROM replaced by TO: a planted fault made from the
# reference at build time, so a test can show that a program really runs the code it links.
# Fails if FROM is not in IN exactly once (the reference changed: update the test).
file(READ "${IN}" text)
string(FIND "${text}" "${FROM}" first)
string(FIND "${text}" "${FROM}" last REVERSE)
if(first EQUAL -1 OR NOT first EQUAL last)
  message(FATAL_ERROR "plant.cmake: '${FROM}' is not in ${IN} exactly once")
endif()
string(REPLACE "${FROM}" "${TO}" text "${text}")
file(WRITE "${OUT}.tmp" "${text}")
file(RENAME "${OUT}.tmp" "${OUT}")
