# 'docs' target: Doxygen HTML of the library and the lab contracts, when doxygen is installed.
find_package(Doxygen QUIET)
if(DOXYGEN_FOUND)
  set(SCALELAB_SOURCE_DIR ${PROJECT_SOURCE_DIR})
  set(SCALELAB_DOCS_DIR ${PROJECT_BINARY_DIR}/docs)
  configure_file(${PROJECT_SOURCE_DIR}/docs/Doxyfile ${PROJECT_BINARY_DIR}/Doxyfile @ONLY)
  add_custom_target(docs COMMAND Doxygen::doxygen ${PROJECT_BINARY_DIR}/Doxyfile
                    COMMENT "Doxygen: ${SCALELAB_DOCS_DIR}/html/index.html" VERBATIM)
endif()
