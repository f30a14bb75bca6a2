# Tests of the tensor library (common/tensor.cmake). Gradient checks are float64 on the host.
scalelab_add_test(NAME test_tensor SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tensor.cpp RANKS 1)
# the graders' checks on the simulated GPU (tests/support/on_sim.hpp)
scalelab_add_test(NAME test_on_sim SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_on_sim.cpp RANKS 1)
scalelab_add_test(NAME test_gradcheck_layers
                  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gradcheck_layers.cpp RANKS 1)
scalelab_add_test(NAME test_gpt SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpt.cpp RANKS 1)
# the same checks with every Tensor::empty starting as NaN (SCALELAB_POISON_EMPTY): a backward
# that reads a temporary it never wrote (a gradient "set" into uninitialised memory read back, an
# accumulation into a buffer nobody zeroed) fails them
foreach(t test_gradcheck_layers test_gpt)
  scalelab_add_mpi_test(common.${t}.poisoned ${t} RANKS 1 LABELS reference common)
  set_property(TEST common.${t}.poisoned APPEND PROPERTY ENVIRONMENT SCALELAB_POISON_EMPTY=1)
endforeach()
# flash attention and the fused residual + LayerNorm against the unfused ops (host)
scalelab_add_test(NAME test_flash_attention
                  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_flash_attention.cpp RANKS 1)
# the tensor-core flash attention's fragment index math, and the wgmma kernels' swizzled tiles and
# descriptors, replayed on the host (no GPU needed)
scalelab_add_test(NAME test_mma_fragments
                  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_mma_fragments.cpp
                          ${CMAKE_CURRENT_LIST_DIR}/test_wgmma_layout.cpp RANKS 1)
# the one-kernel flash backward's turns on dQ, whole grids replayed on the host (no GPU needed)
scalelab_add_test(NAME test_flash_turns
                  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_flash_turns.cpp RANKS 1)
scalelab_add_test(NAME test_fused_norm SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fused_norm.cpp RANKS 1)
scalelab_add_test(NAME test_fused_linear SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fused_linear.cpp RANKS 1)
# the ops' work counters (what lab 07's graders read)
scalelab_add_test(NAME test_work_counters SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_work_counters.cpp RANKS 1)
# the per-row softmax pieces and masked indexing (lab 07's vocabulary-parallel ops), whole and split
scalelab_add_test(NAME test_row_ops SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_row_ops.cpp RANKS 1)
scalelab_add_test(NAME test_optim SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_optim.cpp RANKS 1)
scalelab_add_test(NAME test_data SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_data.cpp RANKS 1)
scalelab_add_test(NAME test_metrics SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_metrics.cpp RANKS 1)
scalelab_add_test(NAME test_train SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_train.cpp RANKS 1 2)
# the divergence report: clean layouts and planted faults named where they first show (2 ranks)
scalelab_add_test(NAME test_divergence SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_divergence.cpp
                  RANKS 2)
scalelab_add_test(NAME test_ops_cuda SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops_cuda.cpp RANKS 1
                  LABELS gpu)
# issue 14's kernels (bf16 ops, cast, cuBLASLt matmul, fused AdamW, flash attention, residual +
# LayerNorm, a mixed-precision GPT step) against the host
scalelab_add_test(NAME test_ops_cuda_bf16 SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops_cuda_bf16.cpp
                  RANKS 1 LABELS gpu)
# issue 32: flash attention versions 1 and 2 (tensor cores) against the host, both layouts
scalelab_add_test(NAME test_ops_cuda_flash SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops_cuda_flash.cpp
                  RANKS 1 LABELS gpu TIMEOUT 120)
# one wgmma product of each kind the flash kernels issue, alone, against the host: where their
# test fails, these tell the descriptors and layouts from the flash logic. Its kernels are sm_90a
# code, an object library like the flash kernels' own (common/tensor.cmake); without CUDA the
# test skips and a stub stands in for them.
if(SCALELAB_WITH_CUDA)
  add_library(wgmma_products_cuda OBJECT ${CMAKE_CURRENT_LIST_DIR}/wgmma_products_cuda.cu)
  set_target_properties(wgmma_products_cuda PROPERTIES CUDA_ARCHITECTURES 90a)
  target_include_directories(wgmma_products_cuda PRIVATE
    $<TARGET_PROPERTY:scalelab_common,INTERFACE_INCLUDE_DIRECTORIES>)
  target_compile_definitions(wgmma_products_cuda PRIVATE
    $<TARGET_PROPERTY:scalelab_common,INTERFACE_COMPILE_DEFINITIONS>)
  set(wgmma_products $<TARGET_OBJECTS:wgmma_products_cuda>)
else()
  set(wgmma_products ${CMAKE_CURRENT_LIST_DIR}/wgmma_products_nocuda.cpp)
endif()
scalelab_add_test(NAME test_wgmma_products
                  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_wgmma_products.cpp ${wgmma_products}
                  RANKS 1 LABELS gpu)
# the golden file is written by tools/torch_golden.py (PyTorch, not needed to run the test)
scalelab_add_test(NAME test_gpt_golden SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpt_golden.cpp RANKS 1)
target_compile_definitions(test_gpt_golden PRIVATE
                           SCALELAB_TEST_DATA="${PROJECT_SOURCE_DIR}/tests/data")

add_dependencies(reference scalelab_data)  # './scalelab test' builds only 'reference'
# A path that can never exist: its parent is a regular file, so no program (not even a buggy one
# that creates directories) can make it exist and poison later runs, as /nonexistent/dir could.
set(tiny_data ${PROJECT_SOURCE_DIR}/tests/data/gpt_golden.txt)  # any text file will do
set(no_dir ${tiny_data}/no-such-dir)
scalelab_expect_usage_error(common.scalelab_data.missing_file scalelab_data ${no_dir}/missing.txt
                            --out ${CMAKE_CURRENT_BINARY_DIR}/unused)
# Issue 22: a directory given as the text to tokenize is named as a directory (it used to be
# "text file '...' is empty"), and the shared CLI names the option of a value that does not
# parse, with the range of its type, in every program (here the data tool and lab 02).
scalelab_expect_usage_error(common.scalelab_data.directory_as_text scalelab_data
  MATCH "^error: '.*tests/data' is a directory, not a text file"
  ARGS ${PROJECT_SOURCE_DIR}/tests/data --out ${CMAKE_CURRENT_BINARY_DIR}/unused)
scalelab_expect_usage_error(common.scalelab_data.out_is_a_file scalelab_data
  MATCH "^error: --out .*gpt_golden.txt is a file, not a directory"
  ARGS ${tiny_data} --out ${tiny_data})
# lab 02's program (defined later, in labs/; ctest resolves the target at generate time)
set(lab02 lab02_single_device_solution)
scalelab_expect_usage_error(lab02.cli.unknown_model ${lab02} --model huge --data ${tiny_data})
scalelab_expect_usage_error(lab02.cli.missing_data ${lab02} --data ${no_dir})
scalelab_expect_usage_error(lab02.cli.batch_zero ${lab02} --batch 0 --data ${tiny_data})
scalelab_expect_usage_error(lab02.cli.context_zero ${lab02} --context 0 --data ${tiny_data})
scalelab_expect_usage_error(lab02.cli.context_too_long ${lab02} --model tiny --context 17
                            --data ${tiny_data})
scalelab_expect_usage_error(lab02.cli.bad_option ${lab02} --no-such-option)
scalelab_expect_usage_error(lab02.cli.steps_not_an_integer ${lab02}
  MATCH "^error: --steps 1e21: expected a whole number, in digits .see --help."
  ARGS --steps 1e21 --data ${tiny_data})
scalelab_expect_usage_error(lab02.cli.lr_nan ${lab02}
  MATCH "^error: --lr nan: expected a finite number" ARGS --lr nan --data ${tiny_data})
# Outputs are checked before the work starts (issue 9): a checkpoint that names a directory or
# lies in a missing directory, a negative --checkpoint-every, an unwritable --trace.
scalelab_expect_usage_error(lab02.cli.checkpoint_is_directory ${lab02}
                            --checkpoint ${CMAKE_CURRENT_BINARY_DIR} --data ${tiny_data})
scalelab_expect_usage_error(lab02.cli.checkpoint_dir_missing ${lab02}
                            --checkpoint ${no_dir}/lab02.ckpt --data ${tiny_data})
scalelab_expect_usage_error(lab02.cli.checkpoint_every_negative ${lab02} --checkpoint-every -1
                            --data ${tiny_data})
scalelab_expect_usage_error(lab02.cli.trace_dir_missing ${lab02} --trace ${no_dir}/t.json
                            --data ${tiny_data})
scalelab_expect_usage_error(lab02.cli.trace_is_directory ${lab02} --trace ${CMAKE_CURRENT_BINARY_DIR}
                            --data ${tiny_data})
# A corrupt corpus (a train.bin that does not match its meta.json: what random bytes, a copy from
# another run or an interrupted ./scalelab data leave) is a usage error naming the file, never
# trained on and never an internal check (exit 1). Made at configure time; never written to.
set(corrupt_corpus ${CMAKE_CURRENT_BINARY_DIR}/corrupt_corpus)
file(WRITE ${corrupt_corpus}/train.bin "garbage!")  # 4 uint16 ids, none a byte's id
file(WRITE ${corrupt_corpus}/val.bin "ok")
file(WRITE ${corrupt_corpus}/meta.json "{\n  \"format\": 2,\n  \"tokenizer\": \"bytes\",\n\
  \"vocab_size\": 256,\n  \"dtype\": \"uint16\",\n  \"source\": \"test\",\n\
  \"train_tokens\": 4,\n  \"val_tokens\": 1,\n  \"train_fnv1a64\": \"0000000000000000\",\n\
  \"val_fnv1a64\": \"0000000000000000\"\n}\n")
scalelab_expect_usage_error(common.scalelab_data.check_corrupt_corpus scalelab_data --check
                            --out ${corrupt_corpus})
scalelab_expect_usage_error(lab02.cli.corrupt_corpus ${lab02} --data ${corrupt_corpus})
scalelab_expect_usage_error(lab02.cli.bin_file_as_text ${lab02} --data ${corrupt_corpus}/train.bin)
scalelab_expect_usage_error(lab03.cli.corrupt_corpus lab03_ddp_solution --data ${corrupt_corpus})
# labs 03-10 read a corpus directory: one of its files is named as such (issue 22)
scalelab_expect_usage_error(lab03.cli.data_is_a_corpus_file lab03_ddp_solution
  MATCH "^error: --data .*/train.bin is a file of a corpus: give its directory, --data .*corrupt"
  ARGS --data ${corrupt_corpus}/train.bin)
# On 2 ranks too: rank 0 checks the output, every rank exits 2 with the same one line (mpiexec
# adds its own notice about the exit code), before any work.
foreach(case "lab03_trace_dir_missing;lab03_ddp_solution;--trace;${no_dir}/t.json"
             "lab03_corrupt_corpus;lab03_ddp_solution;--data;${corrupt_corpus}")
  list(POP_FRONT case name program)
  scalelab_expect_usage_error(common.cli.${name}.np2 ${program} RANKS 2 ARGS ${case})
endforeach()
# every lab program checks --trace in cli::run_options, before it loads data or trains
foreach(program lab00_hello_dist lab01_collectives lab03_ddp lab04_ddp_overlap
                lab05_grad_accumulation lab06_activation_checkpointing)
  string(SUBSTRING ${program} 0 5 nn)
  scalelab_expect_usage_error(${nn}.cli.trace_dir_missing ${program}_solution
                              --trace ${no_dir}/t.json)
endforeach()
scalelab_add_test(NAME test_nn_tensor_parallel
                  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_nn_tensor_parallel.cpp RANKS 1 2 4
                  TIMEOUT 60)
# the program interrupted (--stop-at) and resumed (--resume) prints the uninterrupted run's lines
add_test(NAME lab02.program.resume
         COMMAND sh ${PROJECT_SOURCE_DIR}/tests/02_single_device/resume_test.sh
                 $<TARGET_FILE:lab02_single_device_solution> ${tiny_data})
set_tests_properties(lab02.program.resume PROPERTIES LABELS "reference;lab02" TIMEOUT 60
                     ENVIRONMENT "${SCALELAB_MPI_TEST_ENV}")
# in a --trace, each step holds one "host read" (its loss): tools/trace_reads --expect 1
add_test(NAME lab02.program.trace_reads
         COMMAND sh ${PROJECT_SOURCE_DIR}/tests/02_single_device/trace_reads_test.sh
                 $<TARGET_FILE:lab02_single_device_solution> ${tiny_data} ${PROJECT_SOURCE_DIR})
set_tests_properties(lab02.program.trace_reads PROPERTIES LABELS "reference;lab02" TIMEOUT 60
                     ENVIRONMENT "${SCALELAB_MPI_TEST_ENV}")
# ... and on the simulated GPU, where the loss, its sums and the clipping norm are device tensors
# as on a GPU (on the host a Scalar's arithmetic is host arithmetic): still one read a step
add_test(NAME lab02.program.trace_reads_sim
         COMMAND sh ${PROJECT_SOURCE_DIR}/tests/02_single_device/trace_reads_test.sh
                 $<TARGET_FILE:lab02_single_device_solution> ${tiny_data} ${PROJECT_SOURCE_DIR}
                 --device sim)
set_tests_properties(lab02.program.trace_reads_sim PROPERTIES LABELS "reference;lab02;sim"
                     TIMEOUT 60 ENVIRONMENT "${SCALELAB_MPI_TEST_ENV}")
# planted: the norm read back to the host (the GPU's way without "norm_on_device", which the
# simulated GPU follows): 5 reads a step, and the check must say so of every step
add_test(NAME lab02.program.trace_reads_sim_norm_read_back
         COMMAND sh ${PROJECT_SOURCE_DIR}/tests/02_single_device/trace_reads_test.sh
                 $<TARGET_FILE:lab02_single_device_solution> ${tiny_data} ${PROJECT_SOURCE_DIR}
                 --device sim)
set_tests_properties(lab02.program.trace_reads_sim_norm_read_back PROPERTIES
                     LABELS "reference;lab02;sim" TIMEOUT 60
                     PASS_REGULAR_EXPRESSION "3 of 3 steps do not hold exactly 1 host read"
                     ENVIRONMENT "${SCALELAB_MPI_TEST_ENV};SCALELAB_TRY_GPU_KERNELS=-norm_on_device")
scalelab_add_test(NAME test_param_storage
                  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_param_storage.cpp)
# the mixture of experts (lab 12's library side): routing ops, nn::MoE against the masked dense
# reference and finite differences, a GPT with MoE blocks
scalelab_add_test(NAME test_moe SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_moe.cpp RANKS 1)
