scalelab_add_lab(01 collectives SOURCES collectives.cpp STEPS 4 RANKS 1 2 3 4 STEP_RANKS "4:1,2" TIMEOUT 90)
