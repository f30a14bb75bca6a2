# Shared by the training programs and graders of labs 03-10 (not a parallel technique): options,
# corpus loading and step lines (loop), sizing a run against the host's memory before it
# allocates (sizing), the single-device reference run (reference), the twin a program trains
# beside a parallel run (twin) and the comparisons of a parallel result with it (equivalence).
target_sources(scalelab_common PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/train/loop.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train/global_loss.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train/session.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train/sizing.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train/reference.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train/equivalence.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train/twin.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train/divergence.cpp)
