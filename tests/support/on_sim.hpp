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
/// Collective steps run there through collective_run_on_sim: a mistake may stop one rank and not
/// another (a loop only the owner of a shard runs), and a rank that went on would wait in a
/// collective the stopped one never joins.
#include <string>
#include <utility>
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

/// A step's loss and its `out` (gradients, an output) on the simulated GPU against the host's:
/// "" or the problems, each led by `what` ("bf16: "; "" for none).
inline std::string step_same_on_sim(const std::string& what, double want_loss, double got_loss,
                                    const std::string& out_name, const Tensor& want_out,
                                    const Tensor& got_out) {
  std::string problems;
  if (got_loss != want_loss)
    problems = fmt::format("{}the loss on the simulated GPU is {} (the host's {}); ", what,
                           got_loss, want_loss);
  const std::string out = same_on_sim(what + out_name, want_out, got_out);
  return out.empty() && !problems.empty() ? problems.substr(0, problems.size() - 2)
                                          : problems + out;
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
    const std::string what = e.what();
    // An op given host and sim tensors names both devices; say where a host one comes from.
    const bool mixed = what.find("data<T>()") == std::string::npos &&
                       what.find(" cpu") != std::string::npos &&
                       what.find(" sim") != std::string::npos;
    return "on the simulated GPU (--device sim): " + what +
           (mixed ? " (the tensor on cpu was made without a device argument, or not moved with "
                    ".to(device): on a GPU it would be in host memory beside device tensors)"
                  : "");
  }
}

/// runs_on_sim for code that communicates: the CheckFailed is thrown again with runs_on_sim's
/// line, and escapes the test; the test main then ends the job on every rank with that line
/// ("verdict: error: exception in <test> on rank r: on the simulated GPU ..."), instead of this
/// rank going on to its next collective while another still waits in the last one.
template <class Run>
void collective_run_on_sim(Run&& run) {
  const std::string stopped = runs_on_sim(std::forward<Run>(run));
  if (!stopped.empty()) throw CheckFailed(stopped);
}

/// The bytes `run` copied between the host and a device (host_device_copies(), tensor.hpp:
/// Tensor::to and copy_from; not the MPI backend's staging). A step that moves its numbers to
/// the host and back is right on the simulated GPU too; these say it crossed PCIe on a GPU.
template <class Run>
HostDeviceCopies copies_of(Run&& run) {
  const HostDeviceCopies before = host_device_copies();
  run();
  const HostDeviceCopies after = host_device_copies();
  return {after.to_host - before.to_host, after.to_device - before.to_device};
}

/// "" when `who` copied nothing between the host and the device (`moved`, copies_of), else one
/// line naming the bytes each way beside `owned` (the tensor's bytes the step works on, e.g.
/// the gradients) and telling the attendee to compute where the numbers are.
inline std::string copies_problem(const std::string& who, const HostDeviceCopies& moved,
                                  std::size_t owned) {
  if (moved.to_host == 0 && moved.to_device == 0) return std::string();
  return fmt::format("{} copied {} bytes from the device to the host and {} to the device (the "
                     "tensors it works on are {} bytes): on a GPU each step would send them over "
                     "PCIe; compute where they are (an op on the device, or the collective's own "
                     "reduction)", who, moved.to_host, moved.to_device, owned);
}

/// The problems found, "; "-separated ("" if none).
inline std::string joined(const std::vector<std::string>& problems) {
  std::string all;
  for (const std::string& p : problems)
    if (!p.empty()) all += (all.empty() ? "" : "; ") + p;
  return all;
}

}  // namespace scalelab::labtest
