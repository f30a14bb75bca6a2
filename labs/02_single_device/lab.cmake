# STEP_USES: which earlier steps' code each step's graders run (measured: ctest labNN.step_uses)
scalelab_add_lab(02 single_device SOURCES single_device.cpp STEPS 5 RANKS 1 TIMEOUT 120
                 STEP_USES "2:1")
scalelab_attendee_symbols(02 single_device single_device.cpp)  # steps 2 and 4: own work
# Bad training options: exit 2 and one "error: ..." line naming the option, before the corpus is
# read (the text given as --data is never read) and before any allocation. --warmup, --clip (0 is
# off), --peak-tflops and --sample negative (trained before, with a wrong schedule or silently);
# a --batch too large for this machine (the kernel's OOM killer, mid-step, before); a --min-lr
# above --lr (the schedule rose after warmup), --log-every 0 (silently 1), a negative --stop-at
# (silently "never"), a --data that is neither a text file nor a directory (it named
# "'/nope.txt/train.bin'"). Each as "ranks|name|regex|args...".
if(SCALELAB_BUILD_TESTS)
  scalelab_expect_usage_errors(lab02.cli lab02_single_device_solution LABELS reference lab02
      ARGS --model tiny --steps 2 --data ${PROJECT_SOURCE_DIR}/tests/data/gpt_golden.txt
           --checkpoint ${CMAKE_CURRENT_BINARY_DIR}/lab02_cli.ckpt
      CASES
      "1|warmup_negative|^error: --warmup must not be negative, got -1$|--warmup|-1"
      "1|clip_negative|^error: --clip must not be negative \\(0: off\\), got -1$|--clip|-1"
      "1|peak_tflops_negative|^error: --peak-tflops must not be negative, got -1$|--peak-tflops|-1"
      "1|sample_negative|^error: --sample must not be negative \\(0: none\\), got -1$|--sample|-1"
      "1|min_lr_above_lr|^error: --min-lr 0.01 is above --lr 0.001: the schedule would rise after warmup$|--lr|1e-3|--min-lr|1e-2"
      "1|log_every_zero|^error: --log-every must be positive, got 0$|--log-every|0"
      "1|stop_at_negative|^error: --stop-at must not be negative \\(0: run every step\\), got -3$|--stop-at|-3"
      "1|data_missing|^error: --data /nope.txt: no such file or directory \\(a text file, or a directory holding train.bin and val.bin: ./scalelab data\\)$|--data|/nope.txt"
      "1|batch_too_large_for_memory|^error: --batch 100000000: a training step needs at least [0-9.]+GiB \\([0-9]+ bytes\\) of host memory on rank 0.*. the node has|--batch|100000000")
endif()
# Planted submissions (solutions/02_*/planted/cheats.plant): a train_step that never clips, or
# clips after the AdamW step, fails step 2's clipped-update check (every step-1 test runs with
# clip 0); a norm read to the host as a double fails step 2's host-read check; an estimate that
# is fp32 whatever bytes_per_element says fails step 5's 2-byte check; a learning_rate that
# forwards to optim::cosine_lr, an mfu that forwards to metrics::mfu, fail steps 2 and 4's
# own-work checks (the attendee object's calls: cmake/ScalelabOwnWork.cmake). Those calls sit in
# the planted object whichever plant is on, so the step-2 cases run one suite each.
scalelab_add_planted_submissions(02
  CASES "skip_clip:2_Clip:1:Step2_Clip.TrainStepClipsBeforeTheUpdate on rank 0: .*with clip > 0 the update must use the clipped gradients"
        "clip_after_step:2_Clip:1:Step2_Clip.TrainStepClipsBeforeTheUpdate on rank 0: .*with clip > 0 the update must use the clipped gradients"
        "norm_to_host:2_Clip:1:Step2_Clip.ClippingReadsNothingBackToTheHost on rank 0: .*clipping read numbers back to the host: a train_step read 2 number.s. with clip > 0, 1 without"
        "norm_buffer_on_host:2_Clip:1:Step2_Clip.RunsOnTheSimulatedGpuAsOnTheHost on rank 0: on the simulated GPU .--device sim.: .*(cpu.* sim|sim.* cpu)"
        "val_batch_on_host:3_Evaluate:1:Step3_Evaluate.RunsOnTheSimulatedGpuAsOnTheHost on rank 0: on the simulated GPU .--device sim.: .*(cpu.* sim|sim.* cpu)"
        "library_schedule:2_OwnWork:1:Step2_OwnWork.TheScheduleAndClippingAreYourOwn on rank 0: .*calls the library's reference, step 2 asks for your own schedule"
        "library_mfu:4_OwnWork:1:Step4_OwnWork.TheFlopCountAndMfuAreYourOwn on rank 0: .*calls the library's reference, step 4 asks for your own"
        "norm_read_always:2_Clip.ClippingReads:1:Step2_Clip.ClippingReadsNothingBackToTheHost on rank 0: .*a train_step read 2 numbers back to the host with clip > 0 .2 at clip 0."
        "norm_on_host_copy:2_Clip.RunsOn:1:Step2_Clip.RunsOnTheSimulatedGpuAsOnTheHost on rank 0: .*train_step .step 0, clip 0.05.* copied [0-9]+ bytes from the device to the host"
        "loss_forward_twice:1:1:Step1_TrainStep.DoesOneForwardAndOneBackward on rank 0: .*a second forward"
        "evaluate_with_forward:3_Evaluate.NeverHolds:1:Step3_Evaluate.NeverHoldsATrainingForwardsActivations on rank 0: .*a training forward keeps"
        "flops_from_a_model:4_Throughput.TheFlopCount:1:Step4_Throughput.TheFlopCountIsAFormula on rank 0: .*flops_per_token allocated [0-9]+ bytes"
        "activations_measured:5_Memory.TheEstimate:1:Step5_Memory.TheEstimateIsAFormula on rank 0: .*allocated [0-9]+ bytes"
        "fp32_everywhere:5:1:Step5_Memory.FormulaForWeightsGradsAndAdam on rank 0: .*2 bytes per element: one gradient per parameter")
