# Benchmarks (not tests: they are not registered with ctest and no target of the test suite
# depends on them). scalelab_bench_adamw times AdamW::step at a model's shape; see
# labs/02_single_device/README.md "AdamW on one CPU thread vs PyTorch".
add_executable(scalelab_bench_adamw ${PROJECT_SOURCE_DIR}/tools/bench/bench_adamw.cpp)
target_link_libraries(scalelab_bench_adamw PRIVATE scalelab::common)
