// Built when NCCL is not (SCALELAB_WITH_NCCL off): the nccl backend does not exist.
#include "common/comm/op.hpp"
#include "common/errors.hpp"

namespace scalelab::comm {

bool nccl_compiled() { return false; }
int nccl_version() { return 0; }

namespace detail {
std::unique_ptr<Backend> make_nccl_backend(int, int,
                                           const std::function<void(void*, std::size_t)>&) {
  throw UsageError("backend nccl: this build has no NCCL (configure with CUDA and NCCL)");
}
}  // namespace detail

}  // namespace scalelab::comm
