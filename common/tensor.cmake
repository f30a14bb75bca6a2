# The tensor library: tensors and their allocator, ops (CPU: OpenBLAS + loops; CUDA: cuBLAS +
# kernels), layers, GPT, optimizers, data and metrics.
target_link_libraries(scalelab_common PUBLIC BLAS::BLAS)
target_include_directories(scalelab_common PUBLIC ${CBLAS_INCLUDE_DIR})
target_sources(scalelab_common PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/allocator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tensor.cpp)
if(SCALELAB_WITH_CUDA)
  target_sources(scalelab_common PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/allocator_cuda.cu)
else()
  target_sources(scalelab_common PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/allocator_nocuda.cpp)
endif()
