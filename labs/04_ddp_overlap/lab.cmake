scalelab_add_lab(04 ddp_overlap SOURCES ddp_overlap.cpp GIVEN backward_hooks.cpp STEPS 4 RANKS 1 2 4 LIBS lab03_ddp_solution_impl TIMEOUT 60)
