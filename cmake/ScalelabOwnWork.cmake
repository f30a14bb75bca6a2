# Issue 25, class 7: a step whose README says "write your own" fails when the attendee's file
# calls the library's reference. Before a test binary links, the undefined symbols of the object
# compiled from the attendee's file (`nm -C --undefined-only`: the functions it calls) are written
# next to the binary as `<binary>.undefined.txt`; tests/support/own_work.hpp reads that list. The
# object's static storage (.bss/.data symbols with their sizes) goes beside it as
# `<binary>.static.txt`, which own_work.hpp bounds (issue 34).

# scalelab_undefined_symbols(<test_exe> <impl library> <source file name>)
function(scalelab_undefined_symbols test_exe impl source)
  add_custom_command(TARGET ${test_exe} PRE_LINK
                     COMMAND ${CMAKE_COMMAND} -DNM=${CMAKE_NM}
                             "-DOBJECTS=$<JOIN:$<TARGET_OBJECTS:${impl}>,|>" -DSOURCE=${source}
                             -DOUT=$<TARGET_FILE_DIR:${test_exe}>/${test_exe}.undefined.txt
                             -DSTATIC_OUT=$<TARGET_FILE_DIR:${test_exe}>/${test_exe}.static.txt
                             -P ${PROJECT_SOURCE_DIR}/cmake/attendee_symbols.cmake
                     VERBATIM)
endfunction()

# scalelab_attendee_symbols(<nn> <name> <source>): the same for test_lab<nn> (the attendee's
# <source>) and test_lab<nn>_solution (the reference's).
function(scalelab_attendee_symbols nn name source)
  if(NOT SCALELAB_BUILD_TESTS)
    return()
  endif()
  scalelab_undefined_symbols(test_lab${nn} lab${nn}_${name}_starter_impl ${source})
  scalelab_undefined_symbols(test_lab${nn}_solution lab${nn}_${name}_solution_impl ${source})
endfunction()
