scalelab_add_test(NAME test_runtime SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_runtime.cpp RANKS 1 2)
# A process that owns a watchdog run directory and sleeps: test_watchdog SIGKILLs it and checks
# that the next start removes what it left (looked up beside the test binary).
add_executable(watchdog_owner ${CMAKE_CURRENT_LIST_DIR}/watchdog_owner.cpp)
target_link_libraries(watchdog_owner PRIVATE scalelab::common)
add_dependencies(reference watchdog_owner)
# The counting malloc of the test binaries counts the rank's threads only (tests/support/heap.hpp).
scalelab_add_test(NAME test_heap_hook SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_heap_hook.cpp RANKS 1)
