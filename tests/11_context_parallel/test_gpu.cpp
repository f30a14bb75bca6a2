// Lab 11 on a GPU (ctest lab11.gpu.*, label gpu; skipped where no GPU is visible; and on the
// simulated GPU on every machine, lab11.gpu_on_sim.*): one
// context-parallel step (the reference's ring and all-to-all attention in the given mappings)
// with its model on CUDA against the same step on the CPU, cp = the world (1 or 2 ranks; the
// fixture's mpi world stages CUDA tensors through the host), fp32 (TF32 off) and bf16.
// Tolerances: labtest::gpu_step_matches_cpu's (tests/support/lab_fixture.hpp).
#include <gtest/gtest.h>

#include "common/data/sampler.hpp"
#include "tests/11_context_parallel/cp_checks.hpp"
#include "tests/support/expect.hpp"

using namespace scalelab;

TEST(Gpu_ContextParallel, OneStepOnTheDeviceMatchesTheCpu) {
  const std::optional<Device> maybe_gpu = labtest::test_gpu();
  if (!maybe_gpu) GTEST_SKIP() << "no CUDA device";
  comm::Communicator& cp = labtest::world();
  const int n = cp.size();
  ModelConfig config = labtest::test_model(2);
  config.n_embd = 64, config.n_head = 4;  // head size 16 (the CUDA flash kernel's sizes), 4 heads
  const int64_t T = 4 * config.block_size;
  config.block_size = T;
  const data::Sampler sampler(labtest::synthetic_corpus(7), 2, T, 99);
  const data::Batch batch = sampler.batch(0);
  const auto shard = [&](const Tensor& t) { return cptest::zigzag_rows(t, n, cp.rank()); };
  for (lab11::Attention attention : {lab11::Attention::ring, lab11::Attention::all_to_all})
    for (DType precision : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(::testing::Message() << lab11::attention_name(attention) << ", "
                                        << dtype_name(precision));
      const bool bf16 = precision == DType::bf16;
      nn::GPTOptions on_cpu{.seed = 1234, .compute_dtype = precision, .flash_attention = true};
      nn::GPTOptions on_gpu = on_cpu;
      on_gpu.device = *maybe_gpu;
      nn::GPT host(config, on_cpu), dev(config, on_gpu);
      for (nn::GPT* m : {&host, &dev})
        m->set_mappings(lab11::make_cp_mappings(cp, cptest::zigzag_positions(T, n, cp.rank()),
                                                attention, config.n_head));
      const double want = lab11::cp_forward_backward(host, batch.x, batch.y, cp, shard);
      const double got = lab11::cp_forward_backward(dev, batch.x, batch.y, cp, shard);
      LABTEST_EXPECT(labtest::gpu_step_matches_cpu(got, want, dev.params().grads(),
                                                   host.params().grads(), bf16),
                     "");
    }
}
