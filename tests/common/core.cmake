scalelab_add_test(NAME test_runtime SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_runtime.cpp RANKS 1 2)
