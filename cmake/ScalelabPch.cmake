# Precompiled headers (SCALELAB_PCH, on by default). Every C++ file here includes the standard
# library, MPI and fmt, about 100,000 lines that GCC parsed again in each of the ~250 files of a
# build: half the compile time of a small file. They are parsed once, into scalelab_pch (the
# library's and the programs' files) and scalelab_test_pch (the same and GoogleTest, for the
# graders and tests), and every target that links the library reuses one of them
# (target_precompile_headers REUSE_FROM). Only third-party headers are precompiled: a project
# header still has to include what it uses. The library's own files get their own copy (their
# target is position-independent with CUDA, and GCC refuses a header precompiled otherwise).
# Where GCC cannot use a precompiled header (other flags), it reads the headers as text: slower,
# never different.
option(SCALELAB_PCH "Precompile the standard library, MPI, fmt and GoogleTest headers once" ON)

set(SCALELAB_PCH_HEADERS
    <algorithm> <array> <atomic> <chrono> <cmath> <cstddef> <cstdint> <cstdio> <cstdlib>
    <cstring> <filesystem> <fstream> <functional> <limits> <map> <memory> <mutex> <optional>
    <random> <set> <sstream> <stdexcept> <string> <string_view> <thread> <tuple> <utility>
    <vector> <mpi.h> <fmt/format.h> <fmt/ranges.h>)

# scalelab_pch_for_library(<target>): the library's files precompile their own copy.
function(scalelab_pch_for_library target)
  if(SCALELAB_PCH)
    # C++ files only (the target's .cu files are nvcc's); a header's closing > spelled for the
    # generator expression around it
    set(headers)
    foreach(h IN LISTS SCALELAB_PCH_HEADERS)
      string(REPLACE ">" "$<ANGLE-R>" h "${h}")
      list(APPEND headers "$<$<COMPILE_LANGUAGE:CXX>:${h}>")
    endforeach()
    target_precompile_headers(${target} PRIVATE ${headers})
  endif()
endfunction()

# scalelab_pch_targets(): the two shared precompiled headers, built from an empty file with the
# library's usage requirements (and the test main's), before the targets that reuse them.
function(scalelab_pch_targets)
  if(NOT SCALELAB_PCH)
    return()
  endif()
  add_library(scalelab_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/pch.cpp)
  target_link_libraries(scalelab_pch PRIVATE scalelab::common)
  target_precompile_headers(scalelab_pch PRIVATE ${SCALELAB_PCH_HEADERS})
  if(TARGET scalelab::test_main)
    add_library(scalelab_test_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/pch.cpp)
    target_link_libraries(scalelab_test_pch PRIVATE scalelab::common GTest::gtest)
    target_precompile_headers(scalelab_test_pch PRIVATE ${SCALELAB_PCH_HEADERS} <gtest/gtest.h>)
  endif()
endfunction()

# Whether <target> links the library (directly or through other targets of this project).
function(scalelab_pch_links_common target out)
  set(${out} FALSE PARENT_SCOPE)
  set(todo ${target})
  set(seen)
  while(todo)
    list(POP_FRONT todo t)
    if(t IN_LIST seen OR NOT TARGET ${t})
      continue()
    endif()
    list(APPEND seen ${t})
    get_target_property(real ${t} ALIASED_TARGET)
    if(real)
      set(t ${real})
    endif()
    if(t STREQUAL "scalelab_common")
      set(${out} TRUE PARENT_SCOPE)
      return()
    endif()
    get_target_property(imported ${t} IMPORTED)
    if(imported)
      continue()
    endif()
    get_target_property(libs ${t} LINK_LIBRARIES)
    get_target_property(ilibs ${t} INTERFACE_LINK_LIBRARIES)
    foreach(l IN LISTS libs ilibs)
      if(l AND NOT l MATCHES "^\\$<" AND NOT l MATCHES "-NOTFOUND$")
        list(APPEND todo ${l})
      endif()
    endforeach()
  endwhile()
endfunction()

# Whether <target> is a test (links GoogleTest).
function(scalelab_pch_is_test target out)
  get_target_property(libs ${target} LINK_LIBRARIES)
  set(${out} FALSE PARENT_SCOPE)
  foreach(l IN LISTS libs)
    if(l MATCHES "^(GTest::|scalelab::test_main|scalelab_test_main|scalelab::lab_testing)")
      set(${out} TRUE PARENT_SCOPE)
    endif()
  endforeach()
endfunction()

# scalelab_pch_reuse(<dir>...): every target defined under the directories that has C++ files and
# links the library reuses a shared precompiled header: the test one where it links GoogleTest.
function(scalelab_pch_reuse)
  if(NOT SCALELAB_PCH)
    return()
  endif()
  set(dirs ${ARGN})
  while(dirs)
    list(POP_FRONT dirs dir)
    get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
    list(APPEND dirs ${subdirs})
    get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(t IN LISTS targets)
      if(t MATCHES "^(scalelab_common|scalelab_pch|scalelab_test_pch|scalelab_test_main|scalelab_lab_testing)$")
        continue()
      endif()
      get_target_property(type ${t} TYPE)
      if(NOT type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|OBJECT_LIBRARY|SHARED_LIBRARY)$")
        continue()
      endif()
      get_target_property(sources ${t} SOURCES)
      set(cxx FALSE)
      foreach(s IN LISTS sources)
        if(s MATCHES "\\.cpp$" AND NOT s MATCHES "^\\$<")
          set(cxx TRUE)
        endif()
      endforeach()
      get_target_property(own ${t} PRECOMPILE_HEADERS)
      if(NOT cxx OR own)
        continue()
      endif()
      scalelab_pch_links_common(${t} links)
      if(NOT links)
        continue()
      endif()
      # GCC 12 at -O3 reports a -Wstringop-overflow inside <bits/char_traits.h>, inlined from
      # cxxopts' integer parser, where the standard headers come from a precompiled header
      # (read as text, a system header's warning is not shown): a false positive, off here
      if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
        target_compile_options(${t} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-stringop-overflow>)
      endif()
      scalelab_pch_is_test(${t} is_test)
      if(is_test AND TARGET scalelab_test_pch)
        target_precompile_headers(${t} REUSE_FROM scalelab_test_pch)
      else()
        target_precompile_headers(${t} REUSE_FROM scalelab_pch)
      endif()
    endforeach()
  endwhile()
endfunction()
