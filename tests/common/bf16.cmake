# Mixed precision (bf16) on the CPU: the conversion and the ops' rules R1-R8 (common/ops/ops.hpp).
scalelab_add_test(NAME test_bf16_ops SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_bf16_ops.cpp RANKS 1)
