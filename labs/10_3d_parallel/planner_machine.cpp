// Lab 10, given: the planner's measurement of this machine. measure_machine (the model's rate,
// one block forward and backward as the 3D step runs it; a square sgemm for comparison; an
// all-reduce's latency and bus bandwidth over every rank; whether the ranks share cores). Not an
// exercise: read it to see where the Machine figures step 4's predict() uses come from.
#include "3d_parallel.hpp"

#include <algorithm>
#include <thread>

#include "common/metrics.hpp"
#include "common/ops/ops.hpp"

namespace scalelab::lab10 {

namespace {

// The model's rate: one block forward and backward on `rows` rows, as the 3D step runs it (the
// middle block of a 3-layer copy of the config: no embedding, no head), FLOPs counted as the
// planner counts them. The MEAN over ~0.3 s, not the best: with more ranks than cores, all
// measuring at once, the best run is one that had a core to itself, while a step shares it.
double block_flops_per_s(const ModelConfig& config, int64_t rows, DType precision) {
  ModelConfig c = config;
  c.n_layer = 3;
  nn::GPT stage(c, {.dtype = master_dtype(precision), .seed = 1, .first_block = 1,
                    .last_block = 2, .compute_dtype = precision});
  const int64_t T = c.block_size, C = c.n_embd;
  Tensor x = Tensor::empty({rows, T, C}, precision), dy = Tensor::empty({rows, T, C}, precision);
  ops::fill(x, 0.5);
  ops::fill(dy, 1e-3);
  const auto once = [&] {
    nn::GPTActivations acts;
    stage.forward_blocks(x, acts);
    stage.backward_blocks(dy, acts);
  };
  once();  // warm-up (allocations, thread pools)
  int runs = 0;
  metrics::Timer timer(Device::cpu());
  while (runs < 3 || (timer.elapsed() < 0.3 && runs < 200)) {
    once();
    ++runs;
  }
  const double flops = (6.0 * static_cast<double>(stage.num_parameters()) + 12.0 * T * C) *
                       static_cast<double>(rows * T);
  return flops * runs / timer.elapsed();
}

}  // namespace

Machine measure_machine(comm::Communicator& world, const ModelConfig& config, int64_t rows,
                        DType precision, std::size_t bytes) {
  Machine m;
  // Every rank at once (they share the cores), averaged.
  world.barrier();
  Tensor f = Tensor::from_vector(
      {block_flops_per_s(config, rows, precision),
       metrics::measure_matmul_tflops(Device::cpu(), config.n_embd) * 1e12}, {2}, DType::f64);
  world.all_reduce(f, comm::ReduceOp::avg);
  m.flops = f.to_vector()[0];
  m.gemm_flops = f.to_vector()[1];
  const int n = world.size();
  // Shared cores: more ranks started than this machine has cores (one machine assumed: the
  // launcher's oversubscribed runs; a cluster job has a core or a GPU per rank).
  m.shared_cores = static_cast<unsigned>(n) > std::max(1u, std::thread::hardware_concurrency());
  if (n == 1) {  // nothing to measure: no communication is predicted either
    m.bus_bytes_per_s = 1e12;
    return m;
  }
  auto timed = [&](Tensor& t) {  // the slowest rank's time of one all-reduce, best of 3
    double best = 1e30;
    world.all_reduce(t);  // warm-up
    for (int i = 0; i < 3; ++i) {
      world.barrier();
      metrics::Timer timer(Device::cpu());
      world.all_reduce(t);
      Tensor dt = Tensor::from_vector({timer.elapsed()}, {1}, DType::f64);
      world.all_reduce(dt, comm::ReduceOp::max);
      best = std::min(best, dt.item());
    }
    return best;
  };
  Tensor one = Tensor::zeros({1});
  m.latency_s = timed(one);
  Tensor big = Tensor::zeros({static_cast<int64_t>(bytes / 4)});
  const double t = std::max(timed(big) - m.latency_s, 1e-9);
  m.bus_bytes_per_s = 2.0 * (n - 1) / n * static_cast<double>(bytes) / t;
  return m;
}

}  // namespace scalelab::lab10
