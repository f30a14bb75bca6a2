// Lab 12 on a GPU (ctest lab12.gpu.*, label gpu; skipped where no GPU is visible; and on the
// simulated GPU on every machine, lab12.gpu_on_sim.*): one
// expert-parallel step (the reference's exchange in the given mappings, ep = the world: 1 or 2
// ranks; the fixture's mpi world stages CUDA tensors through the host) with its model on CUDA
// against the same step on the CPU, fp32 (TF32 off) and bf16. Tolerances:
// labtest::gpu_step_matches_cpu's (tests/support/lab_fixture.hpp).
#include <gtest/gtest.h>

#include "common/data/sampler.hpp"
#include "tests/12_expert_parallel/ep_checks.hpp"

using namespace scalelab;

TEST(Gpu_ExpertParallel, OneStepOnTheDeviceMatchesTheCpu) {
  const std::optional<Device> maybe_gpu = labtest::test_gpu();
  if (!maybe_gpu) GTEST_SKIP() << "no CUDA device";
  comm::Communicator& world = labtest::world();
  const int n = world.size();
  const ModelConfig config = model_config("tiny-moe");
  const data::Sampler sampler(labtest::synthetic_corpus(7), 2 * n, config.block_size, 99);
  const data::Batch batch = sampler.batch(0);
  lab12::EpGroups groups = lab12::make_ep_groups(world, n);
  for (DType precision : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(precision));
    const bool bf16 = precision == DType::bf16;
    nn::GPTOptions on_cpu{.seed = 1234, .compute_dtype = precision};
    nn::GPTOptions on_gpu = on_cpu;
    on_gpu.device = *maybe_gpu;
    nn::GPT host(config, lab12::ep_model_options(on_cpu, groups.ep));
    nn::GPT dev(config, lab12::ep_model_options(on_gpu, groups.ep));
    for (nn::GPT* m : {&host, &dev}) m->set_mappings(lab12::make_ep_mappings(groups.ep));
    const double want = lab12::ep_forward_backward(host, batch.x, batch.y, world, groups);
    const double got = lab12::ep_forward_backward(dev, batch.x, batch.y, world, groups);
    LABTEST_EXPECT(labtest::gpu_step_matches_cpu(got, want, dev.params().grads(),
                                                 host.params().grads(), bf16),
                   "");
  }
}
