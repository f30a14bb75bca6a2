# Start-up, errors, logging, command line, device discovery.
target_sources(scalelab_common PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/background_thread.cpp
  ${CMAKE_CURRENT_LIST_DIR}/exec_log.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cli.cpp)
if(SCALELAB_WITH_CUDA)
  target_sources(scalelab_common PRIVATE ${CMAKE_CURRENT_LIST_DIR}/device_cuda.cu)
else()
  target_sources(scalelab_common PRIVATE ${CMAKE_CURRENT_LIST_DIR}/device_nocuda.cpp)
endif()
