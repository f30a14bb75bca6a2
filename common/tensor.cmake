# The tensor library: tensors and their allocator, ops (CPU: OpenBLAS + loops; CUDA: cuBLAS +
# kernels), layers, GPT, optimizers, data and metrics.
target_link_libraries(scalelab_common PUBLIC BLAS::BLAS)
target_include_directories(scalelab_common PUBLIC ${CBLAS_INCLUDE_DIR})
target_sources(scalelab_common PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/allocator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tensor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/scalar.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/ops.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/work.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/cpu/matmul_cpu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/cpu/pointwise_cpu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/cpu/norm_cpu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/cpu/attention_cpu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/cpu/embedding_cpu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/cpu/rows_cpu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/moe.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/cpu/moe_cpu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/cpu/optim_cpu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/flash_attention.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/cpu/flash_attention_cpu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/fused_norm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/cpu/fused_norm_cpu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/fused_linear.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/trial_kernels.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/nn/parameter.cpp
  ${CMAKE_CURRENT_LIST_DIR}/nn/linear.cpp
  ${CMAKE_CURRENT_LIST_DIR}/nn/layernorm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/nn/embedding.cpp
  ${CMAKE_CURRENT_LIST_DIR}/nn/attention.cpp
  ${CMAKE_CURRENT_LIST_DIR}/nn/mlp.cpp
  ${CMAKE_CURRENT_LIST_DIR}/nn/moe.cpp
  ${CMAKE_CURRENT_LIST_DIR}/nn/mappings.cpp
  ${CMAKE_CURRENT_LIST_DIR}/nn/block.cpp
  ${CMAKE_CURRENT_LIST_DIR}/nn/gpt.cpp
  ${CMAKE_CURRENT_LIST_DIR}/optim/optim.cpp
  ${CMAKE_CURRENT_LIST_DIR}/data/tokenizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/data/corpus.cpp
  ${CMAKE_CURRENT_LIST_DIR}/data/sampler.cpp
  ${CMAKE_CURRENT_LIST_DIR}/metrics.cpp)
# The host kernels that use ops/cpu/exp_vectorizable.hpp: without -fno-trapping-math GCC keeps a
# loop with a float compare-and-select scalar (the project uses no floating-point traps).
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/ops/cpu/pointwise_cpu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/cpu/flash_attention_cpu.cpp PROPERTIES
  COMPILE_OPTIONS $<$<COMPILE_LANGUAGE:CXX>:-fno-trapping-math>)
# data/ writes to the repository's data/ directory by default
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/data/corpus.cpp PROPERTIES
  COMPILE_DEFINITIONS SCALELAB_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
if(SCALELAB_WITH_CUDA)
  target_sources(scalelab_common PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/allocator_cuda.cu
    ${CMAKE_CURRENT_LIST_DIR}/ops/cuda/context.cu
    ${CMAKE_CURRENT_LIST_DIR}/ops/cuda/matmul_cuda.cu
    ${CMAKE_CURRENT_LIST_DIR}/ops/cuda/pointwise_cuda.cu
    ${CMAKE_CURRENT_LIST_DIR}/ops/cuda/norm_cuda.cu
    ${CMAKE_CURRENT_LIST_DIR}/ops/cuda/layernorm_backward_v2_cuda.cu
    ${CMAKE_CURRENT_LIST_DIR}/ops/cuda/layernorm_backward_v3_cuda.cu
    ${CMAKE_CURRENT_LIST_DIR}/ops/cuda/bias_backward_v2_cuda.cu
    ${CMAKE_CURRENT_LIST_DIR}/ops/cuda/attention_cuda.cu
    ${CMAKE_CURRENT_LIST_DIR}/ops/cuda/embedding_cuda.cu
    ${CMAKE_CURRENT_LIST_DIR}/ops/cuda/rows_cuda.cu
    ${CMAKE_CURRENT_LIST_DIR}/ops/cuda/moe_cuda.cu
    ${CMAKE_CURRENT_LIST_DIR}/ops/cuda/optim_cuda.cu
    ${CMAKE_CURRENT_LIST_DIR}/ops/cuda/flash_attention_cuda.cu
    ${CMAKE_CURRENT_LIST_DIR}/ops/cuda/flash_attention_tc_cuda.cu
    ${CMAKE_CURRENT_LIST_DIR}/ops/cuda/flash_attention_tc_backward_cuda.cu
    ${CMAKE_CURRENT_LIST_DIR}/ops/cuda/fused_norm_cuda.cu)
  # Flash attention on Hopper's warpgroup MMA: wgmma exists only in sm_90a code (the "a": features
  # of one architecture, not carried forward), so this file is compiled for that architecture
  # alone, whatever CMAKE_CUDA_ARCHITECTURES says, and its kernels are launched only on compute
  # capability 9.0 devices. It takes the library's include paths and definitions, not its
  # dependencies' targets (the library is what it is linked into).
  add_library(scalelab_flash_wgmma OBJECT
              ${CMAKE_CURRENT_LIST_DIR}/ops/cuda/flash_attention_wgmma_cuda.cu)
  set_target_properties(scalelab_flash_wgmma PROPERTIES CUDA_ARCHITECTURES 90a
                                                        POSITION_INDEPENDENT_CODE ON)
  target_include_directories(scalelab_flash_wgmma PRIVATE
    $<TARGET_PROPERTY:scalelab_common,INTERFACE_INCLUDE_DIRECTORIES>)
  target_compile_definitions(scalelab_flash_wgmma PRIVATE
    $<TARGET_PROPERTY:scalelab_common,INTERFACE_COMPILE_DEFINITIONS>)
  target_sources(scalelab_common PRIVATE $<TARGET_OBJECTS:scalelab_flash_wgmma>)
else()
  target_sources(scalelab_common PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/allocator_nocuda.cpp
    ${CMAKE_CURRENT_LIST_DIR}/ops/cuda/ops_nocuda.cpp
    ${CMAKE_CURRENT_LIST_DIR}/ops/cuda/fused_nocuda.cpp)
endif()

# scalelab_data [FILE] [--out DIR]: corpus preparation (./scalelab data runs it)
add_executable(scalelab_data ${CMAKE_CURRENT_LIST_DIR}/data/prep_main.cpp)
target_link_libraries(scalelab_data PRIVATE scalelab::common)
