# Mixed precision (bf16) on the CPU: the conversion and the ops' rules R1-R8 (common/ops/ops.hpp).
scalelab_add_test(NAME test_bf16_ops SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_bf16_ops.cpp RANKS 1)
# the mixed-precision model against fp32 from the same seed, and the loss band (~5 s)
scalelab_add_test(NAME test_bf16_model SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_bf16_model.cpp
                  RANKS 1 TIMEOUT 60)
target_compile_definitions(test_bf16_model PRIVATE
                           SCALELAB_TEST_DATA="${PROJECT_SOURCE_DIR}/tests/data")
# bf16 reductions over MPI (user-defined MPI_Ops): activations all-reduced in tensor parallel
scalelab_add_test(NAME test_comm_bf16 SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_comm_bf16.cpp
                  RANKS 1 2 TIMEOUT 60)
