scalelab_add_lab(03 ddp SOURCES ddp.cpp STEPS 4 RANKS 1 2 4 TIMEOUT 60)
