# Tests of the tensor library (common/tensor.cmake). Gradient checks are float64 on the host.
scalelab_add_test(NAME test_tensor SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tensor.cpp RANKS 1)
scalelab_add_test(NAME test_gradcheck_layers
                  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gradcheck_layers.cpp RANKS 1)
scalelab_add_test(NAME test_gpt SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpt.cpp RANKS 1)
scalelab_add_test(NAME test_optim SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_optim.cpp RANKS 1)
scalelab_add_test(NAME test_data SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_data.cpp RANKS 1)
scalelab_add_test(NAME test_metrics SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_metrics.cpp RANKS 1)
scalelab_add_test(NAME test_train SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_train.cpp RANKS 1 2)
scalelab_add_test(NAME test_ops_cuda SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops_cuda.cpp RANKS 1
                  LABELS gpu)
# the golden file is written by tools/torch_golden.py (PyTorch, not needed to run the test)
scalelab_add_test(NAME test_gpt_golden SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpt_golden.cpp RANKS 1)
target_compile_definitions(test_gpt_golden PRIVATE
                           SCALELAB_TEST_DATA="${PROJECT_SOURCE_DIR}/tests/data")
