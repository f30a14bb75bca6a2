// The graders' checks on the simulated GPU (tests/support/on_sim.hpp), each shown failing: a
// result left on the host, a value off, a loss off, a host read of a sim tensor, and the
// collective form that ends the job instead of going on.
#include <gtest/gtest.h>

#include <string>

#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/tensor.hpp"
#include "tests/support/on_sim.hpp"

using namespace scalelab;

namespace {
bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}
}  // namespace

TEST(OnSim, SameOnSimNamesWhereTheResultIsAndWhetherItIsTheHosts) {
  const Tensor host = Tensor::from_vector({1, 2, 3}, {3});
  EXPECT_EQ(labtest::same_on_sim("x", host, host.to(Device::sim())), "");
  EXPECT_TRUE(has(labtest::same_on_sim("x", host, host), "x came back on cpu"));
  const Tensor off = Tensor::from_vector({1, 2, 4}, {3}).to(Device::sim());
  EXPECT_TRUE(has(labtest::same_on_sim("x", host, off), "x on the simulated GPU ((3) f32 sim) is "
                                                          "not the host's"));
  EXPECT_TRUE(has(labtest::same_on_sim("x", host, Tensor()), "x on the simulated GPU is not defined"));
}

TEST(OnSim, StepSameOnSimNamesTheLossAndTheOutput) {
  const Tensor host = Tensor::from_vector({1, 2}, {2});
  const Tensor same = host.to(Device::sim()), off = Tensor::zeros({2}, DType::f32, Device::sim());
  EXPECT_EQ(labtest::step_same_on_sim("bf16: ", 1.5, 1.5, "g", host, same), "");
  EXPECT_EQ(labtest::step_same_on_sim("bf16: ", 1.5, 2.5, "g", host, same),
            "bf16: the loss on the simulated GPU is 2.5 (the host's 1.5)");
  const std::string both = labtest::step_same_on_sim("bf16: ", 1.5, 2.5, "g", host, off);
  EXPECT_TRUE(has(both, "(the host's 1.5); bf16: g on the simulated GPU")) << both;
  EXPECT_EQ(labtest::joined({"", "a", "", "b"}), "a; b");
}

TEST(OnSim, AHostReadStopsTheRunWithTheTensorsLine) {
  Tensor t = Tensor::zeros({4}, DType::f32, Device::sim());
  const std::string line = labtest::runs_on_sim([&] { t.data<float>()[0] = 1; });
  EXPECT_TRUE(has(line, "on the simulated GPU (--device sim): host code reached the elements of "
                        "(4) f32 sim through data<T>()")) << line;
  EXPECT_EQ(labtest::runs_on_sim([&] { t.to_vector(); }), "") << "a copy to the host is a door";
  // an op given a host tensor beside sim ones: the line says where a host tensor comes from
  const Tensor on_host = Tensor::zeros({4});
  const std::string mixed = labtest::runs_on_sim([&] { ops::add(t, t, on_host); });
  EXPECT_TRUE(has(mixed, "made without a device argument, or not moved with .to(device)")) << mixed;
  // the collective form throws instead, with the same line
  try {
    labtest::collective_run_on_sim([&] { (void)t.data<float>(); });
    ADD_FAILURE() << "collective_run_on_sim returned after a host read of a sim tensor";
  } catch (const CheckFailed& e) {
    EXPECT_EQ(std::string(e.what()), line);
  }
}
