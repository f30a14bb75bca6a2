# cmake -DIN=<file> -DOUT=<file> -DPLANTS=<file> -P plant_file.cmake
# A planted fault made from a reference at build time (a test shows that a check catches it, or
# that a program really runs the code it links). PLANTS holds blocks
#   @@@ FROM
#   <text, exactly once in IN>
#   @@@ TO
#   <its replacement>
#   @@@ END
# (text outside the blocks is a comment). Writes IN to OUT with every FROM replaced by its TO.
# Fails if a FROM is not in IN exactly once (the reference changed: update the plants).
file(READ "${IN}" text)
file(READ "${PLANTS}" plants)
set(rest "${plants}")
set(count 0)
foreach(block RANGE 1000)  # a bound, not a limit: plant files hold a few blocks
  string(FIND "${rest}" "@@@ FROM\n" from_at)
  if(from_at EQUAL -1)
    break()
  endif()
  string(FIND "${rest}" "@@@ TO\n" to_at)
  string(FIND "${rest}" "@@@ END\n" end_at)
  if(to_at LESS from_at OR end_at LESS to_at)
    message(FATAL_ERROR "plant_file.cmake: ${PLANTS}: a block needs @@@ FROM, @@@ TO, @@@ END lines")
  endif()
  math(EXPR from_begin "${from_at} + 9")
  math(EXPR from_length "${to_at} - ${from_begin}")
  math(EXPR to_begin "${to_at} + 7")
  math(EXPR to_length "${end_at} - ${to_begin}")
  math(EXPR next "${end_at} + 8")
  string(SUBSTRING "${rest}" ${from_begin} ${from_length} from)
  string(SUBSTRING "${rest}" ${to_begin} ${to_length} to)
  string(SUBSTRING "${rest}" ${next} -1 rest)
  string(FIND "${text}" "${from}" first)
  string(FIND "${text}" "${from}" last REVERSE)
  if(first EQUAL -1 OR NOT first EQUAL last)
    message(FATAL_ERROR "plant_file.cmake: this text of ${PLANTS} is not in ${IN} exactly once:\n${from}")
  endif()
  string(REPLACE "${from}" "${to}" text "${text}")
  math(EXPR count "${count} + 1")
endforeach()
if(count EQUAL 0)
  message(FATAL_ERROR "plant_file.cmake: no @@@ FROM block in ${PLANTS}")
endif()
file(WRITE "${OUT}.tmp" "${text}")
file(RENAME "${OUT}.tmp" "${OUT}")
