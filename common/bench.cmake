# Benchmarks (not tests: they are not registered with ctest and no target of the test suite
# depends on them). scalelab_bench_adamw times AdamW::step at a model's shape; see
# labs/02_single_device/README.md "AdamW on one CPU thread vs PyTorch".
add_executable(scalelab_bench_adamw ${PROJECT_SOURCE_DIR}/tools/bench/bench_adamw.cpp)
target_link_libraries(scalelab_bench_adamw PRIVATE scalelab::common)
# scalelab_bench_attention: the unfused causal attention against flash attention's versions 1
# and 2 (and PyTorch's SDPA, with --torch-python) at one shape (common/ops/flash_attention.hpp;
# default gpt-85m's heads at batch 16, bf16, on CUDA).
add_executable(scalelab_bench_attention ${PROJECT_SOURCE_DIR}/tools/bench/bench_attention.cpp)
target_link_libraries(scalelab_bench_attention PRIVATE scalelab::common)
target_compile_definitions(scalelab_bench_attention PRIVATE
                           SCALELAB_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# scalelab_bench_kernels: lab 02's kernel version pairs (LayerNorm backward v1/v2, the MLP's
# proj backward with and without the DGELU epilogue), each checked against the host and timed.
add_executable(scalelab_bench_kernels ${PROJECT_SOURCE_DIR}/tools/bench/bench_kernels.cpp)
target_link_libraries(scalelab_bench_kernels PRIVATE scalelab::common)
