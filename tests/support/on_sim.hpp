#pragma once
/// @file on_sim.hpp
/// A step graded on the simulated GPU (Device::sim, common/allocator.hpp): the attendee's code
/// runs once on host tensors and once on the same tensors on sim. The ops run the same CPU
/// kernels there, and the collectives the same sums, so the two agree bit for bit. What differs
/// is what a GPU would refuse: host code may not reach a sim tensor's elements (data<T>() throws
/// outside an op), and an op refuses to mix host and sim tensors. A loop over the elements, or a
/// tensor made without the device argument, passes every host check and fails here, with the
/// tensor's own line, on the attendee's machine without a GPU. Header-only.
///
/// Collective steps: the mistakes this catches stop every rank at the same line (each rank runs
/// the same code on its own tensors), so no rank is left in a collective alone.
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/tensor.hpp"

namespace scalelab::labtest {

/// "" when `on_sim` lies on the simulated GPU and holds `host`'s shape and values bit for bit;
/// else one line naming `what`.
inline std::string same_on_sim(const std::string& what, const Tensor& host, const Tensor& on_sim) {
  if (!on_sim.defined()) return fmt::format("{} on the simulated GPU is not defined", what);
  if (on_sim.device() != Device::sim())
    return fmt::format("{} came back on {}, not on the simulated GPU its inputs are on", what,
                       on_sim.device().str());
  if (host.shape() != on_sim.shape() || host.to_vector() != on_sim.to_vector())
    return fmt::format("{} on the simulated GPU ({}) is not the host's ({}): the same kernels run "
                       "there, so the numbers should be the host's bit for bit",
                       what, on_sim.str(), host.str());
  return std::string();
}

/// Runs `run` (the attendee's calls on sim tensors): "" when it returns, else the line of the
/// CheckFailed it threw (a host read of a sim tensor, an op given host and sim tensors),
/// prefixed "on the simulated GPU (--device sim): ".
template <class Run>
std::string runs_on_sim(Run&& run) {
  try {
    run();
    return std::string();
  } catch (const CheckFailed& e) {
    return std::string("on the simulated GPU (--device sim): ") + e.what();
  }
}

/// The problems found, "; "-separated ("" if none).
inline std::string joined(const std::vector<std::string>& problems) {
  std::string all;
  for (const std::string& p : problems)
    if (!p.empty()) all += (all.empty() ? "" : "; ") + p;
  return all;
}

}  // namespace scalelab::labtest
