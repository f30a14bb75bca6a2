// Built without CUDA: every CUDA request is an error that says so.
#include "common/allocator.hpp"
#include "common/errors.hpp"

namespace scalelab::detail {
namespace {
[[noreturn]] void no_cuda() {
  throw UsageError("a CUDA tensor was requested but scalelab was built without CUDA "
                   "(reconfigure with -DSCALELAB_CUDA=ON on a machine with nvcc)");
}
}  // namespace
void* cuda_malloc(std::size_t, int) { no_cuda(); }
void cuda_free(void*, int) { no_cuda(); }
void cuda_copy(void*, Device, const void*, Device, std::size_t) { no_cuda(); }
void cuda_synchronize(int) { no_cuda(); }
void cuda_fill_bytes(void*, std::size_t, unsigned char, int) { no_cuda(); }
}  // namespace scalelab::detail
