#pragma once
/// @file host_values.hpp
/// Rows moved on the tensors' device, not by a loop on the host: the bytes a call passes through
/// the Tensor API's doors to host numbers (to_vector, item, from_vector: host_value_bytes() of
/// common/tensor.hpp). Moving rows on the device passes a few indices at most; a loop over the
/// rows on the host passes every row, right numbers on a laptop and a host round trip on a GPU.
/// A loop through data<T>() passes no door and is not seen here; the simulated GPU refuses it
/// (Device::sim, allocator.hpp: the graded steps that run there). Header-only.
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "common/tensor.hpp"

namespace scalelab::labtest {

/// The bytes `f` passed through the doors, both ways.
template <class F>
int64_t host_bytes_of(F&& f) {
  const int64_t before = host_value_bytes().total();
  f();
  return host_value_bytes().total() - before;
}

/// "" when `what` passed fewer `bytes` through the doors than `rows` hold; else what it did,
/// ending with `instead` (what to do).
inline std::string rows_through_host(const std::string& what, int64_t bytes, const Tensor& rows,
                                     const std::string& instead) {
  if (bytes < static_cast<int64_t>(rows.nbytes())) return "";
  return fmt::format("{} passed {} bytes of tensor values through the host (to_vector, item, "
                     "from_vector), at least what {} holds ({} bytes): a loop over the rows on the "
                     "host, a round trip a step on a GPU. {}",
                     what, bytes, rows.str(), rows.nbytes(), instead);
}

}  // namespace scalelab::labtest
