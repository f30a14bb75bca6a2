# cmake -DNM=<nm> -DOBJECTS=<a|b|c> -DSOURCE=<file name> -DOUT=<file> -P attendee_symbols.cmake
# Writes to OUT the symbols that the object compiled from SOURCE (e.g. zero.cpp, the attendee's
# file) uses without defining (`nm -C --undefined-only`): what the attendee's code calls. The
# Step1_OwnWork graders read it to fail a step whose README says "write your own" when the
# object calls the library's reference (issue 25, class 7). Run before the test binary links
# (PRE_LINK), so the list is always that of the object the binary links. No object or no nm:
# OUT says so, and the graders fail on it rather than pass on nothing.
# With -DSTATIC_OUT=<file>: also the object's static storage, `nm -C -S --defined-only` lines of
# .bss and .data symbols (types b, B, d, D and unique globals u: a function-local static array
# too), which tests/support/own_work.hpp bounds (the instruments see no static array otherwise).
string(REPLACE "|" ";" objects "${OBJECTS}")
set(object "")
foreach(o IN LISTS objects)
  get_filename_component(n "${o}" NAME)
  if(n STREQUAL "${SOURCE}.o" OR n STREQUAL "${SOURCE}.obj")
    set(object "${o}")
  endif()
endforeach()
if(NOT object OR NOT EXISTS "${object}" OR NOT NM)
  file(WRITE "${OUT}" "error: no object of ${SOURCE} among ${OBJECTS} (nm: ${NM})\n")
  if(STATIC_OUT)
    file(WRITE "${STATIC_OUT}" "error: no object of ${SOURCE} among ${OBJECTS} (nm: ${NM})\n")
  endif()
  return()
endif()
if(STATIC_OUT)
  execute_process(COMMAND "${NM}" -C -S --defined-only "${object}" RESULT_VARIABLE code
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT code EQUAL 0)
    file(WRITE "${STATIC_OUT}"
         "error: ${NM} -C -S --defined-only ${object} exited ${code}: ${err}\n")
  else()
    set(data "")
    string(REPLACE "\n" ";" lines "${out}")
    foreach(line IN LISTS lines)
      if(line MATCHES "^[0-9a-f]+ [0-9a-f]+ [bBdDu] ")
        string(APPEND data "${line}\n")
      endif()
    endforeach()
    file(WRITE "${STATIC_OUT}.tmp" "object: ${object}\n${data}")
    file(RENAME "${STATIC_OUT}.tmp" "${STATIC_OUT}")
  endif()
endif()
execute_process(COMMAND "${NM}" -C --undefined-only "${object}" RESULT_VARIABLE code
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT code EQUAL 0)
  file(WRITE "${OUT}" "error: ${NM} -C --undefined-only ${object} exited ${code}: ${err}\n")
  return()
endif()
file(WRITE "${OUT}.tmp" "object: ${object}\n${out}")
file(RENAME "${OUT}.tmp" "${OUT}")
