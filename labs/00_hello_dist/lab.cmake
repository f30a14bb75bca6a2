scalelab_add_lab(00 hello_dist SOURCES hello_dist.cpp STEPS 3 RANKS 1 2 4 TIMEOUT 60)
