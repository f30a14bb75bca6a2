scalelab_add_lab(02 single_device SOURCES single_device.cpp STEPS 5 RANKS 1 TIMEOUT 120)
