scalelab_add_lab(09 zero SOURCES zero.cpp STEPS 5 RANKS 1 2 4 LIBS lab03_ddp_solution_impl TIMEOUT 60)
