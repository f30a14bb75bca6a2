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
#include "common/comm/gpu_sharing.hpp"
#include "common/comm/transports.hpp"
#include "common/device.hpp"
#include "common/errors.hpp"
#include "common/exec_log.hpp"
#include "common/ops/ops.hpp"
#include "common/runtime.hpp"

using namespace scalelab;
using comm::Communicator;
using comm::ReduceOp;

namespace {

Device my_gpu() { return Device::cuda(world_rank() % cuda_device_count()); }

// Whether NCCL takes this world's ranks (one node: world size ranks on cuda_device_count GPUs).
bool nccl_takes_the_world() {
  const char* env = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
  return comm::detail::nccl_accepts(
      comm::detail::ranks_per_gpu(world_size(), cuda_device_count()), comm::nccl_version(),
      env ? env : "");
}

Tensor on_gpu(std::vector<double> v, DType dt = DType::f32) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, dt).to(my_gpu());
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
  if (nccl_takes_the_world()) {
    auto world = Communicator::world("nccl");
    check_collectives(world);
  } else {
    // NCCL refuses two ranks on one GPU (before 2.30): --backend nccl says so at once, and each
    // rank exercises NCCL alone (auto: a group of one shares no GPU).
    try {
      Communicator::world("nccl");
      ADD_FAILURE() << "world(\"nccl\") accepted ranks sharing a GPU";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("share GPU 0"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("--backend mpi"), std::string::npos) << e.what();
    }
    auto world = Communicator::world("auto");
    auto alone = world.split(world.rank(), 0, "alone");
    ASSERT_EQ(alone.size(), 1);
    check_collectives(alone);
  }
}

TEST(NcclBackend, AutoPicksNcclForCudaTensorsAndMpiForHostOnes) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (!comm::nccl_compiled()) GTEST_SKIP() << "built without NCCL";
  auto world = Communicator::world("auto");
  const bool nccl = nccl_takes_the_world();  // else auto stages CUDA tensors through MPI
  Tensor host = Tensor::from_vector({1.0}, {1});
  Tensor dev = on_gpu({1.0});
  const comm::TransportTraffic before = comm::traffic_by_transport();
  world.all_reduce(host);
  world.all_reduce(dev);
  EXPECT_EQ(host.item(0), world.size());
  EXPECT_EQ(dev.to_vector()[0], world.size());
  std::vector<int> all(world.size());
  for (int r = 0; r < world.size(); ++r) all[r] = r;
  const comm::TrafficKey row{"world", all, "all_reduce", "sum", -1};
  const comm::TransportTraffic moved = comm::traffic_by_transport() - before;
  EXPECT_EQ((moved.at({row, "mpi"}).calls), nccl ? 1 : 2);
  if (nccl) EXPECT_EQ((moved.at({row, "nccl"}).calls), 1);
}

// Issue 31: on an nccl group, host tensors (a loss, a twin check) go over the group's MPI
// communicator, CUDA tensors over NCCL; the ledger and the execution log say which.
TEST(NcclBackend, HostTensorsOnNcclGroupsGoOverMpi) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (!comm::nccl_compiled()) GTEST_SKIP() << "built without NCCL";
  if (!nccl_takes_the_world()) GTEST_SKIP() << "NCCL refuses these ranks on these GPUs";
  auto world = Communicator::world("nccl");
  exec_log::Recording rec;
  Tensor loss = Tensor::from_vector({world.rank() + 1.0}, {1}, DType::f64);
  world.all_reduce(loss);
  Tensor grad = on_gpu({1.0, 2.0});
  world.all_reduce(grad, ReduceOp::avg);
  const int n = world.size();
  EXPECT_EQ(loss.item(0), n * (n + 1) / 2.0);
  EXPECT_EQ(grad.to_vector(), (std::vector<double>{1.0, 2.0}));
  std::vector<std::string> transports;
  for (const exec_log::Event& e : rec.events())
    if (e.what == "all_reduce") transports.push_back(e.transport);
  EXPECT_EQ(transports, (std::vector<std::string>{"mpi", "nccl"}));
}

// Issue 31: lab 08 on one rank (interleaved chunks send to themselves) failed in ncclGroupEnd:
// "invalid usage". A lone send to oneself, tested (which launches what is held back) before its
// recv is posted, and a recv posted before its send: each is a copy, never NCCL.
TEST(NcclBackend, MessagesToOneselfAreCopies) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (!comm::nccl_compiled()) GTEST_SKIP() << "built without NCCL";
  auto world = Communicator::world("auto");
  auto alone = world.split(world.rank(), 0, "alone");
  Communicator one = nccl_takes_the_world() && world.size() == 1 ? Communicator::world("nccl")
                                                                 : alone;
  const comm::TransportTraffic before = comm::traffic_by_transport();
  Tensor a = on_gpu({1.0, 2.0, 3.0}), got_a = Tensor::zeros({3}, DType::f32, my_gpu());
  comm::Work s = one.send_async(a, 0, 7);
  s.test();  // what lab 08's PendingSends::poll does (before each compute)
  comm::Work r = one.recv_async(got_a, 0, 7);
  r.wait();
  s.wait();
  EXPECT_EQ(got_a.to_vector(), (std::vector<double>{1.0, 2.0, 3.0}));
  Tensor got_b = Tensor::zeros({2}, DType::f32, my_gpu());
  comm::Work rb = one.recv_async(got_b, 0, 8);
  one.send(on_gpu({4.0, 5.0}), 0, 8);
  rb.wait();
  EXPECT_EQ(got_b.to_vector(), (std::vector<double>{4.0, 5.0}));
  // a collective after them still runs over NCCL
  Tensor x = on_gpu({2.0});
  one.all_reduce(x);
  EXPECT_EQ(x.to_vector()[0], 2.0);
  int self = 0, nccl = 0;
  for (const auto& [key, count] : comm::traffic_by_transport() - before) {
    if (key.transport == "self") self += static_cast<int>(count.calls);
    if (key.transport == "nccl") nccl += static_cast<int>(count.calls);
  }
  EXPECT_EQ(self, 4);
  EXPECT_EQ(nccl, 1);
}

// Every element type NCCL is handed besides f32 (bf16, f64, i32: sum, max, min, a gather, a
// reduce-scatter, an all-to-all of equal chunks and one of per-peer counts, whose chunk to
// oneself NCCL moves inside the group), and the order with compute: a buffer written by kernels
// on the compute stream, with no host sync before the non-blocking all-gather that reads it
// (NCCL's stream waits for the event recorded at submission; without it the gather would read
// the buffer half written). On one rank the values come back as they went, and the calls still
// go through NCCL (counted).
TEST(NcclBackend, EveryTypeAndTheKernelsBeforeIt) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (!comm::nccl_compiled()) GTEST_SKIP() << "built without NCCL";
  auto world = Communicator::world("auto");
  Communicator c = nccl_takes_the_world() ? Communicator::world("nccl")
                                          : world.split(world.rank(), 0, "alone");
  const int r = c.rank(), n = c.size();
  const comm::TransportTraffic before = comm::traffic_by_transport();
  for (DType dt : {DType::bf16, DType::f64, DType::i32}) {
    const std::string what = dtype_name(dt);
    Tensor s = on_gpu({r + 1.0, 2.0}, dt);
    c.all_reduce(s);
    EXPECT_EQ(s.to_vector(), (std::vector<double>{n * (n + 1) / 2.0, 2.0 * n})) << what;
    for (ReduceOp op : {ReduceOp::max, ReduceOp::min}) {
      Tensor m = on_gpu({r + 1.0}, dt);
      c.all_reduce(m, op);
      EXPECT_EQ(m.to_vector()[0], op == ReduceOp::max ? n : 1.0) << what;
    }
    Tensor g = Tensor::zeros({n}, dt, my_gpu());
    c.all_gather(on_gpu({r * 3.0}, dt), g);
    for (int k = 0; k < n; ++k) EXPECT_EQ(g.to_vector()[k], 3.0 * k) << what;
    std::vector<double> chunks(n), a2a(n);
    for (int k = 0; k < n; ++k) chunks[k] = k + r, a2a[k] = 10.0 * r + k;
    Tensor rs = Tensor::zeros({1}, dt, my_gpu());
    c.reduce_scatter(on_gpu(chunks, dt), rs);
    EXPECT_EQ(rs.to_vector()[0], n * r + n * (n - 1) / 2.0) << what;
    Tensor out = Tensor::zeros({n}, dt, my_gpu());
    c.all_to_all(on_gpu(a2a, dt), out);  // rank k's chunk r, 10 k + r
    for (int k = 0; k < n; ++k) EXPECT_EQ(out.to_vector()[k], 10.0 * k + r) << what;
    // per-peer counts: rank r sends k + 1 copies of 10 r + k to rank k
    std::vector<double> v;
    std::vector<int64_t> send_counts(n), recv_counts(n);
    for (int k = 0; k < n; ++k) {
      send_counts[k] = k + 1;
      recv_counts[k] = r + 1;
      v.insert(v.end(), k + 1, 10.0 * r + k);
    }
    Tensor varied = Tensor::zeros({n * (r + 1)}, dt, my_gpu());
    c.all_to_all(on_gpu(v, dt), send_counts, varied, recv_counts);
    const std::vector<double> got = varied.to_vector();
    for (int k = 0; k < n; ++k)
      for (int j = 0; j <= r; ++j) EXPECT_EQ(got[k * (r + 1) + j], 10.0 * k + r) << what;
  }
  const int64_t N = 1 << 22;  // 16 MiB of f32, written 100 times: ~1 ms of kernels on an H100
  Tensor big = Tensor::zeros({N}, DType::f32, my_gpu());
  for (int i = 1; i <= 100; ++i) ops::fill(big, i);
  Tensor gathered = Tensor::zeros({N * n}, DType::f32, my_gpu());
  comm::Work w = c.all_gather_async(big, gathered);
  w.wait();
  const std::vector<double> got = gathered.to_vector();
  int64_t wrong = 0;
  for (double x : got) wrong += x != 100.0;
  EXPECT_EQ(wrong, 0) << "the all-gather read the buffer before the kernels that wrote it ended";
  int64_t nccl_calls = 0;
  for (const auto& [key, count] : comm::traffic_by_transport() - before)
    if (key.transport == "nccl") nccl_calls += count.calls;
  EXPECT_EQ(nccl_calls, 3 * 7 + 1);  // 7 calls a type, then the gather
}

TEST(MpiBackend, CudaTensorsAreStagedThroughHost) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto world = Communicator::world("mpi");
  check_collectives(world);
}
