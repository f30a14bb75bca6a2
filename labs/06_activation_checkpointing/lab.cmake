scalelab_add_lab(06 activation_checkpointing SOURCES activation_checkpointing.cpp GIVEN policy_text.cpp held_bytes.cpp STEPS 4 RANKS 1 2 4 LIBS lab03_ddp_solution_impl TIMEOUT 60)
