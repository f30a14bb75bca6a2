# The communication layer: Communicator and its backends (mpi, self, nccl), the process grid,
# the byte counters, the hang watchdog, the Chrome trace and the bandwidth helpers. The NCCL
# backend is compiled only when NCCL is found (SCALELAB_WITH_NCCL); otherwise a stub says "this
# build has no NCCL".
target_sources(scalelab_common PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/trace.cpp
  ${CMAKE_CURRENT_LIST_DIR}/watchdog.cpp
  ${CMAKE_CURRENT_LIST_DIR}/comm/communicator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/comm/route.cpp
  ${CMAKE_CURRENT_LIST_DIR}/comm/gpu_sharing.cpp
  ${CMAKE_CURRENT_LIST_DIR}/comm/process_grid.cpp
  ${CMAKE_CURRENT_LIST_DIR}/comm/stats.cpp
  ${CMAKE_CURRENT_LIST_DIR}/comm/bandwidth.cpp
  ${CMAKE_CURRENT_LIST_DIR}/comm/backend_mpi.cpp
  ${CMAKE_CURRENT_LIST_DIR}/comm/backend_self.cpp)
if(SCALELAB_WITH_NCCL)
  target_sources(scalelab_common PRIVATE ${CMAKE_CURRENT_LIST_DIR}/comm/backend_nccl.cpp)
  target_include_directories(scalelab_common PRIVATE ${NCCL_INCLUDE_DIR})
  target_link_libraries(scalelab_common PUBLIC ${NCCL_LIBRARY})
  target_compile_definitions(scalelab_common PUBLIC SCALELAB_WITH_NCCL=1)
else()
  target_sources(scalelab_common PRIVATE ${CMAKE_CURRENT_LIST_DIR}/comm/backend_nccl_stub.cpp)
endif()
