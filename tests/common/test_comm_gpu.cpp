// The communication layer on CUDA tensors (label gpu; every test skips without a GPU):
// - the nccl backend, on as many ranks as it can: one rank per GPU, or 2 ranks on one GPU from
//   NCCL 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1 (set by tests/common/comm.cmake); otherwise each
//   rank alone in a world of one (split by rank);
// - CUDA tensors over the mpi backend (staged through host memory) at any rank count.
// Values are small integers, so every result is exact (compared with ==).
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "common/comm/communicator.hpp"
#include "common/device.hpp"
#include "common/runtime.hpp"

using namespace scalelab;
using comm::Communicator;
using comm::ReduceOp;

namespace {

Device my_gpu() { return Device::cuda(world_rank() % cuda_device_count()); }

bool nccl_can_share_a_gpu() {
  const char* env = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
  return comm::nccl_version() >= 23000 && env && std::string(env) == "1";
}

Tensor on_gpu(std::vector<double> v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).to(my_gpu());
}

// Runs every collective on CUDA tensors over `c` and checks the results on the host.
void check_collectives(Communicator& c) {
  const int r = c.rank(), n = c.size();
  double sum = 0;
  for (int k = 0; k < n; ++k) sum += k + 1;

  Tensor x = on_gpu({r + 1.0, 2.0 * (r + 1)});
  c.all_reduce(x);
  EXPECT_EQ(x.to_vector(), (std::vector<double>{sum, 2 * sum}));
  Tensor a = on_gpu({r + 1.0});
  c.all_reduce(a, ReduceOp::avg);
  EXPECT_EQ(a.to_vector()[0], sum / n);
  Tensor m = on_gpu({r + 1.0});
  c.all_reduce(m, ReduceOp::max);
  EXPECT_EQ(m.to_vector()[0], n);

  Tensor b = on_gpu({r * 1.0, 7.0});
  c.broadcast(b, n - 1);
  EXPECT_EQ(b.to_vector(), (std::vector<double>{n - 1.0, 7.0}));

  Tensor red = on_gpu({r + 1.0});
  c.reduce(red, 0);
  if (r == 0) EXPECT_EQ(red.to_vector()[0], sum);

  Tensor g = Tensor::zeros({n}, DType::f32, my_gpu());
  c.all_gather(on_gpu({r * 10.0}), g);
  for (int k = 0; k < n; ++k) EXPECT_EQ(g.to_vector()[k], 10.0 * k);

  std::vector<double> chunks(n);
  for (int k = 0; k < n; ++k) chunks[k] = 100.0 * k + r;
  Tensor rs = Tensor::zeros({1}, DType::f32, my_gpu());
  c.reduce_scatter(on_gpu(chunks), rs);
  double want = 0;
  for (int k = 0; k < n; ++k) want += 100.0 * r + k;
  EXPECT_EQ(rs.to_vector()[0], want);

  Tensor sc = Tensor::zeros({1}, DType::f32, my_gpu());
  c.scatter(r == 0 ? on_gpu(chunks) : Tensor(), sc, 0);
  EXPECT_EQ(sc.to_vector()[0], 100.0 * r + 0);

  Tensor ga = r == 0 ? Tensor::zeros({n}, DType::f32, my_gpu()) : Tensor();
  c.gather(on_gpu({r + 0.5}), ga, 0);
  if (r == 0)
    for (int k = 0; k < n; ++k) EXPECT_EQ(ga.to_vector()[k], k + 0.5);

  // Ring step: recv from the left posted first, then send to the right.
  Tensor in = Tensor::zeros({3}, DType::f32, my_gpu());
  comm::Work w = c.recv_async(in, (r - 1 + n) % n);
  c.send(on_gpu({r * 1.0, r * 2.0, r * 3.0}), (r + 1) % n);
  w.wait();
  const int left = (r - 1 + n) % n;
  EXPECT_EQ(in.to_vector(), (std::vector<double>{left * 1.0, left * 2.0, left * 3.0}));
  // The same step as one batch (send_recv_async: on nccl one group, launched when posted).
  Tensor in2 = Tensor::zeros({3}, DType::f32, my_gpu());
  std::vector<comm::Work> step = c.send_recv_async(
      {comm::P2POp::recv(in2, left), comm::P2POp::send(on_gpu({r * 4.0, r * 5.0, r * 6.0}), (r + 1) % n)});
  comm::wait_all(step);
  EXPECT_EQ(in2.to_vector(), (std::vector<double>{left * 4.0, left * 5.0, left * 6.0}));

  // Two outstanding works, waited in reverse order.
  Tensor p = on_gpu({1.0}), q = on_gpu({2.0});
  comm::Work wp = c.all_reduce_async(p), wq = c.all_reduce_async(q);
  wq.wait();
  wp.wait();
  EXPECT_EQ(p.to_vector()[0], n);
  EXPECT_EQ(q.to_vector()[0], 2.0 * n);
  c.barrier();
}

}  // namespace

TEST(NcclBackend, EveryCollective) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (!comm::nccl_compiled()) GTEST_SKIP() << "built without NCCL";
  auto world = Communicator::world("nccl");
  if (world.size() == 1 || cuda_device_count() >= world.size() || nccl_can_share_a_gpu()) {
    check_collectives(world);
  } else {
    // NCCL < 2.30 refuses two ranks on one GPU: each rank exercises NCCL alone.
    auto alone = world.split(world.rank(), 0, "alone");
    ASSERT_EQ(alone.size(), 1);
    check_collectives(alone);
  }
}

TEST(NcclBackend, AutoPicksNcclForCudaTensorsAndMpiForHostOnes) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (!comm::nccl_compiled()) GTEST_SKIP() << "built without NCCL";
  auto world = Communicator::world("auto");
  if (world.size() > 1 && cuda_device_count() < world.size() && !nccl_can_share_a_gpu())
    GTEST_SKIP() << "NCCL cannot put " << world.size() << " ranks on " << cuda_device_count()
                 << " GPU(s) (version " << comm::nccl_version() << ")";
  Tensor host = Tensor::from_vector({1.0}, {1});
  Tensor dev = on_gpu({1.0});
  world.all_reduce(host);
  world.all_reduce(dev);
  EXPECT_EQ(host.item(0), world.size());
  EXPECT_EQ(dev.to_vector()[0], world.size());
}

TEST(MpiBackend, CudaTensorsAreStagedThroughHost) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto world = Communicator::world("mpi");
  check_collectives(world);
}
