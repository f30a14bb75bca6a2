#include "common/background_thread.hpp"

namespace scalelab {
namespace {
// Constant-initialized: reading it runs no initializer and allocates nothing, so the counting
// malloc may ask it from inside an allocation.
thread_local bool t_background = false;
}  // namespace

void mark_background_thread() noexcept { t_background = true; }

bool is_background_thread() noexcept { return t_background; }

}  // namespace scalelab
