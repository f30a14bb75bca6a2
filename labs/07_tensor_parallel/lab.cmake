scalelab_add_lab(07 tensor_parallel SOURCES tensor_parallel.cpp STEPS 6 RANKS 1 2 4 TIMEOUT 60)
