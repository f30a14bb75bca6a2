// Built without CUDA: the wgmma products cannot run (their tests skip before calling these).
#include "common/errors.hpp"
#include "tests/common/wgmma_products.hpp"

namespace scalelab::testing {
void wgmma_ss_product(Tensor&, const Tensor&, const Tensor&) {
  throw UsageError("wgmma products: scalelab was built without CUDA");
}
void wgmma_rs_product(Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  throw UsageError("wgmma products: scalelab was built without CUDA");
}
}  // namespace scalelab::testing
