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

# Bad input to the programs: one "error:" line on stderr and exit code 2, from every
# binary. Each runs the program directly (a singleton MPI process) through a small sh check.
function(scalelab_expect_usage_error name target)
  add_test(NAME ${name}
           COMMAND sh -c "e=$(mktemp); \"$0\" \"$@\" >/dev/null 2>\"$e\"; rc=$?; cat \"$e\"; \
n=$(wc -l < \"$e\"); g=$(grep -c '^error: ' \"$e\"); rm -f \"$e\"; \
[ $rc -eq 2 ] && [ $n -eq 1 ] && [ $g -eq 1 ]"
                   $<TARGET_FILE:${target}> ${ARGN})
  set_tests_properties(${name} PROPERTIES LABELS "reference;common" TIMEOUT 30
                       ENVIRONMENT "${SCALELAB_MPI_TEST_ENV}")
endfunction()
add_dependencies(reference scalelab_data)  # './scalelab test' builds only 'reference'
scalelab_expect_usage_error(common.scalelab_data.missing_file scalelab_data /nonexistent.txt
                            --out ${CMAKE_CURRENT_BINARY_DIR}/unused)
# lab 02's program (defined later, in labs/; ctest resolves the target at generate time)
set(lab02 lab02_single_device_solution)
set(tiny_data ${PROJECT_SOURCE_DIR}/tests/data/gpt_golden.txt)  # any text file will do
scalelab_expect_usage_error(lab02.cli.unknown_model ${lab02} --model huge --data ${tiny_data})
scalelab_expect_usage_error(lab02.cli.missing_data ${lab02} --data /nonexistent/dir)
scalelab_expect_usage_error(lab02.cli.batch_zero ${lab02} --batch 0 --data ${tiny_data})
scalelab_expect_usage_error(lab02.cli.context_zero ${lab02} --context 0 --data ${tiny_data})
scalelab_expect_usage_error(lab02.cli.context_too_long ${lab02} --model tiny --context 17
                            --data ${tiny_data})
scalelab_expect_usage_error(lab02.cli.bad_option ${lab02} --no-such-option)
scalelab_add_test(NAME test_nn_tensor_parallel
                  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_nn_tensor_parallel.cpp RANKS 1 2 4
                  TIMEOUT 60)
# the program interrupted (--stop-at) and resumed (--resume) prints the uninterrupted run's lines
add_test(NAME lab02.program.resume
         COMMAND sh ${PROJECT_SOURCE_DIR}/tests/02_single_device/resume_test.sh
                 $<TARGET_FILE:lab02_single_device_solution> ${tiny_data})
set_tests_properties(lab02.program.resume PROPERTIES LABELS "reference;lab02" TIMEOUT 60
                     ENVIRONMENT "${SCALELAB_MPI_TEST_ENV}")
scalelab_add_test(NAME test_param_storage
                  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_param_storage.cpp)
