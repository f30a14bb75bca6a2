scalelab_add_lab(05 grad_accumulation SOURCES grad_accumulation.cpp GIVEN batch_plan.cpp STEPS 4 RANKS 1 2 4 LIBS lab04_ddp_overlap_solution_impl TIMEOUT 60)
