# The communication layer: Communicator and its backends (mpi, self, nccl), the hang watchdog,
# the Chrome trace and the bandwidth helpers. The NCCL backend is compiled only when NCCL is
# found (SCALELAB_WITH_NCCL); without it a stub says "built without NCCL".
target_sources(scalelab_common PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/trace.cpp)
