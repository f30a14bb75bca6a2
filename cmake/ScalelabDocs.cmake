# 'docs' target: Doxygen HTML of the library and the lab contracts, when doxygen is installed.
# Zero warnings is the rule: Doxygen writes them to docs/warnings.log (docs/Doxyfile), and the
# target fails when the log is not empty. ./scalelab docs does the same without CMake.
find_package(Doxygen QUIET)
if(DOXYGEN_FOUND)
  set(SCALELAB_SOURCE_DIR ${PROJECT_SOURCE_DIR})
  set(SCALELAB_DOCS_DIR ${PROJECT_BINARY_DIR}/docs)
  configure_file(${PROJECT_SOURCE_DIR}/docs/Doxyfile ${PROJECT_BINARY_DIR}/Doxyfile @ONLY)
  # The second pass: every public name of the headers it lists is documented (no HTML).
  configure_file(${PROJECT_SOURCE_DIR}/docs/Doxyfile.documented
                 ${PROJECT_BINARY_DIR}/Doxyfile.documented @ONLY)
  file(WRITE ${PROJECT_BINARY_DIR}/check_doxygen_warnings.cmake [=[
file(READ "${LOG}" warnings)
string(STRIP "${warnings}" warnings)
if(NOT warnings STREQUAL "")
  message(FATAL_ERROR "Doxygen warnings (${LOG}):\n${warnings}")
endif()
]=])
  add_custom_target(docs
    COMMAND ${CMAKE_COMMAND} -E rm -f ${SCALELAB_DOCS_DIR}/warnings.log
            ${SCALELAB_DOCS_DIR}/documented_warnings.log
    COMMAND ${CMAKE_COMMAND} -E make_directory ${SCALELAB_DOCS_DIR}
    COMMAND Doxygen::doxygen ${PROJECT_BINARY_DIR}/Doxyfile
    COMMAND Doxygen::doxygen ${PROJECT_BINARY_DIR}/Doxyfile.documented
    COMMAND ${CMAKE_COMMAND} -E touch ${SCALELAB_DOCS_DIR}/warnings.log
            ${SCALELAB_DOCS_DIR}/documented_warnings.log
    COMMAND ${CMAKE_COMMAND} -DLOG=${SCALELAB_DOCS_DIR}/warnings.log -P ${PROJECT_BINARY_DIR}/check_doxygen_warnings.cmake
    COMMAND ${CMAKE_COMMAND} -DLOG=${SCALELAB_DOCS_DIR}/documented_warnings.log -P ${PROJECT_BINARY_DIR}/check_doxygen_warnings.cmake
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
    COMMENT "Doxygen: ${SCALELAB_DOCS_DIR}/html/index.html (fails on any warning)" VERBATIM)
endif()
