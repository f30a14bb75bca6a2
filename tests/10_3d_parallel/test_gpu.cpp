// Lab 10 on a GPU (ctest lab10.gpu.*, label gpu; skipped where no GPU is visible; and on the
// simulated GPU on every machine, lab10.gpu_on_sim.*): the 3D step
// (Trainer3D: lab 07's operators, lab 08's 1F1B, the dp average) with its models on CUDA against
// the same step on the CPU, on every grid of the world (1 or 2 ranks: the fixture's mpi world
// stages CUDA tensors through the host, so 2 ranks may share one GPU), with and without
// checkpointing, fp32 (TF32 off) and bf16 mixed precision.
// Tolerances: labtest::gpu_step_matches_cpu's (tests/support/lab_fixture.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "common/device.hpp"
#include "common/ops/ops.hpp"
#include "common/runtime.hpp"
#include "grid3d_checks.hpp"
#include "tests/support/expect.hpp"

using namespace scalelab;
using namespace scalelab::lab10test;

TEST(Gpu_Step3D, OneStepOnTheDeviceMatchesTheCpu) {
  const std::optional<Device> maybe_gpu = labtest::test_gpu();
  if (!maybe_gpu) GTEST_SKIP() << "no CUDA device";
  const Device gpu = *maybe_gpu;
  const data::Batch global = kLab.batch(0);
  for (const lab10::GridShape& shape : grids_for(labtest::world().size()))
    for (DType precision : {DType::f32, DType::bf16})
      for (bool checkpoint : {false, true}) {
        SCOPED_TRACE(::testing::Message() << name(shape) << ", " << dtype_name(precision)
                                          << (checkpoint ? ", checkpointed" : ""));
        const bool bf16 = precision == DType::bf16;
        const comm::ProcessGrid grid(labtest::world(), shape.dp, shape.tp, shape.pp, shape.order);
        lab10::Groups g = lab10::groups_of(grid);
        const lab10::Plan plan{shape, 2, 0, checkpoint};
        const nn::GPTOptions on_cpu{.seed = kLab.seed, .compute_dtype = precision};
        nn::GPTOptions on_gpu = on_cpu;
        on_gpu.device = gpu;
        lab10::Trainer3D host(config(), g, plan, on_cpu), dev(config(), g, plan, on_gpu);
        const double want = host.step(global), got = dev.step(global);
        LABTEST_EXPECT(labtest::gpu_step_matches_cpu(got, want, dev.model().params().grads(),
                                                     host.model().params().grads(), bf16),
                       "");
      }
}
