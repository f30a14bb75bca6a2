# Every lab's program on a GPU (label gpu; skipped where no device is visible, as the other gpu
# tests): --device cuda on one rank over nccl and over auto, and on two ranks over mpi (the ranks
# share the node's GPUs; CUDA tensors staged through host memory). Each program exits 0 only if its
# own check holds, and must print the line of that check (the regex: its twin, equivalence or
# exactness line), so a run that skipped the check cannot pass. The tiny model on the bf16 test
# corpus, a few steps: seconds each on a GPU; on a CPU each is one probe run (gpu_probe, exit 77).
#
# The same program also runs on the simulated GPU on every machine (lab<nn>.sim_program.np<ranks>,
# label reference, the mpi run's ranks): --device sim, the host's kernels on memory that host
# code outside the ops cannot read (Device::sim, allocator.hpp). It passes only if no model path
# loops over a tensor's elements on the host and no tensor is left on the host beside the model's:
# what --device cuda needs, checked without a GPU.
add_executable(gpu_probe ${CMAKE_CURRENT_LIST_DIR}/gpu_probe.cpp)
target_link_libraries(gpu_probe PRIVATE scalelab::common)
add_dependencies(reference gpu_probe)

# scalelab_add_gpu_program(<nn> <program target> <regex> [RUNS <ranks|backend>...]
#                          [ARGS <program args...>])
# ctest lab<nn>.gpu_program.<backend>.np<ranks> for each run (default 1|nccl 1|auto 2|mpi); in
# ARGS, @BACKEND@ becomes the run's backend ("sim" in the simulated GPU's run).
function(scalelab_add_gpu_program nn target regex)
  cmake_parse_arguments(G "" "" "RUNS;ARGS" ${ARGN})
  if(NOT G_RUNS)
    set(G_RUNS "1|nccl" "1|auto" "2|mpi")
  endif()
  foreach(run ${G_RUNS})
    string(REPLACE "|" ";" run "${run}")
    list(GET run 0 ranks)
    list(GET run 1 backend)
    set(name lab${nn}.gpu_program.${backend}.np${ranks})
    string(REPLACE "@BACKEND@" ${backend} args "${G_ARGS}")
    add_test(NAME ${name}
             COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/gpu_program.sh $<TARGET_FILE:gpu_probe> "${regex}"
                     ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${MPIEXEC_PREFLAGS}
                     $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS} --device cuda
                     --backend ${backend} ${args})
    set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 PROCESSORS ${ranks} TIMEOUT 180
                         LABELS "gpu;reference;lab${nn}" FIXTURES_REQUIRED bf16_corpus
                         ENVIRONMENT "${SCALELAB_MPI_TEST_ENV}")
    if(backend STREQUAL "mpi")
      set(name lab${nn}.sim_program.np${ranks})
      string(REPLACE "@BACKEND@" sim args "${G_ARGS}")  # its own files beside the GPU runs'
      add_test(NAME ${name}
               COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/gpu_program.sh - "${regex}"
                       ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${MPIEXEC_PREFLAGS}
                       $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS} --device sim
                       --backend mpi ${args})
      set_tests_properties(${name} PROPERTIES PROCESSORS ${ranks} TIMEOUT 180
                           LABELS "reference;lab${nn};sim" FIXTURES_REQUIRED bf16_corpus
                           ENVIRONMENT "${SCALELAB_MPI_TEST_ENV}")
    endif()
  endforeach()
endfunction()

set(tiny --model tiny --steps 3 --batch 8 --data ${bf16_corpus})
scalelab_add_gpu_program(00 lab00_hello_dist_solution
  "all-reduce of rank ids: [0-9]+ \\(expected [0-9]+\\) on every rank: OK")
scalelab_add_gpu_program(01 lab01_collectives_solution
  "ring all-reduce of [0-9]+ floats vs library: equal")
# lab 02 trains on one device: one rank over each backend
scalelab_add_gpu_program(02 lab02_single_device_solution "step=2 val_loss=[0-9]"
  RUNS "1|nccl" "1|auto" "1|mpi"
  ARGS ${tiny} --eval-every 1 --checkpoint ${CMAKE_CURRENT_BINARY_DIR}/lab02_gpu_@BACKEND@.ckpt)
scalelab_add_gpu_program(03 lab03_ddp_solution
  "\\|ddp - single\\|=@@over [0-9]+ ranks? = 0 \\(identical replicas\\)" ARGS ${tiny} --verify-steps 2)
scalelab_add_gpu_program(04 lab04_ddp_overlap_solution
  "max \\|p - p on rank 0\\| over [0-9]+ ranks? = 0$" ARGS ${tiny} --reps 1 --sweep 0.0625)
scalelab_add_gpu_program(05 lab05_grad_accumulation_solution
  "as 1 batch vs 4 micro-batches of [0-9]+: gradients max \\|diff\\|" ARGS ${tiny} --accum 4 --batch 32)
scalelab_add_gpu_program(06 lab06_activation_checkpointing_solution
  "estimate == measured for every policy: yes" ARGS ${tiny} --reps 1)
scalelab_add_gpu_program(07 lab07_tensor_parallel_solution
  "largest \\|loss - single-device loss\\| over the first 3 steps: .* \\(within " ARGS ${tiny} --twin-steps 3 --reps 1)
scalelab_add_gpu_program(08 lab08_pipeline_parallel_solution
  "single-device twin step=2 loss=[0-9.]+ \\(pipeline - twin: " ARGS ${tiny} --micro-batches 4 --reps 1)
scalelab_add_gpu_program(09 lab09_zero_solution
  "\\|zero - single\\|=@@val_loss=.*, within @@= 0 \\(identical replicas\\)" ARGS ${tiny} --stage 2 --verify-steps 2)
scalelab_add_gpu_program(10 lab10_3d_parallel_solution
  "single-device twin step=2 loss=[0-9.]+ \\(3D - twin: " ARGS ${tiny} --twin-steps 3)
scalelab_add_gpu_program(11 lab11_context_parallel_solution
  "\\|cp - single\\|=" ARGS --model tiny --steps 2 --batch 2 --twin-steps 2 --attention ring
                             --data ${bf16_corpus})
scalelab_add_gpu_program(12 lab12_expert_parallel_solution
  "\\|ep - single\\|=" ARGS --model tiny-moe --steps 3 --batch 8 --twin-steps 2
                            --data ${bf16_corpus})
