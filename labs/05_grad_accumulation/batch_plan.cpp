// Lab 05, given: BatchPlan::str(), the line the program prints for step 3's plan ("global batch
// 32 = micro-batch 2 x accum 4 x dp 4"). Not an exercise: read it to see what the program shows
// of your plan_batch().
#include "grad_accumulation.hpp"

#include <fmt/format.h>

namespace scalelab::lab05 {

std::string BatchPlan::str() const {
  return fmt::format("global batch {} = micro-batch {} x accum {} x dp {}", global, micro, accum,
                     dp);
}

}  // namespace scalelab::lab05
