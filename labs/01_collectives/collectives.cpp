// Starter generated from solutions/01_collectives/collectives.cpp by tools/make-labs: fill in each NotImplemented
// step (see README.md). Body hash 48a7be7359585b6d (lets make-labs see your edits).
// Lab 01: collectives. See README.md for the steps and collectives.hpp for the contract.
#include "collectives.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "common/errors.hpp"
#include "common/metrics.hpp"
#include "common/ops/ops.hpp"

namespace scalelab::lab01 {

namespace {

// An f32 tensor of `values` on `device`.
Tensor tensor_of(const std::vector<double>& values, Device device) {
  return Tensor::from_vector(values, {static_cast<int64_t>(values.size())}).to(device);
}

}  // namespace

const std::vector<std::string>& step1_collectives() {
  static const std::vector<std::string> names = {"all_reduce", "broadcast",      "reduce",
                                                 "all_gather", "reduce_scatter", "scatter",
                                                 "gather"};
  return names;
}

std::vector<double> step1_input(const std::string& collective, int rank, int size) {
  const double r = rank;
  if (collective == "all_reduce" || collective == "reduce" || collective == "broadcast")
    return {r + 1, 10 * (r + 1)};
  if (collective == "all_gather" || collective == "gather") return {r};
  std::vector<double> v;
  if (collective == "reduce_scatter")
    for (int j = 0; j < size; ++j) v.push_back(10 * r + j);
  if (collective == "scatter" && rank == 0)
    for (int j = 0; j < size; ++j) v.push_back(100 + j);
  return v;
}

std::vector<CollectiveResult> run_each_collective(Communicator& comm, Device device) {
  const int rank = comm.rank(), size = comm.size();
  std::vector<CollectiveResult> results;
  for (const std::string& name : step1_collectives()) {
    CollectiveResult res{name, step1_input(name, rank, size), {}};
    // TODO step 1: call each collective once and record what this rank got back
    // HINT: in-place collectives (all_reduce, broadcast, reduce) work on one tensor; the others
    // HINT: read `in` and write `out` (size * n or n / size elements: see communicator.hpp).
    // HINT: tensor_of(values, device) makes a tensor there, t.to_vector() reads one back; make
    // HINT: the outputs on `device` too (on a GPU the collectives are NCCL's).
    throw scalelab::NotImplemented(
        "lab 01 step 1: call each collective once and record what this rank got back (README.md#step-1)");
    results.push_back(res);
  }
  return results;
}

int64_t chunk_begin(int64_t numel, int n, int k) {
  const int64_t base = numel / n, extra = numel % n;
  return k * base + std::min<int64_t>(k, extra);
}

void add_into(const Tensor& dst, const Tensor& src) {
  SCALELAB_CHECK(dst.numel() == src.numel() && dst.dtype() == src.dtype(),
                 "add_into: {} += {}", dst.str(), src.str());
  Tensor d = dst;  // a handle to the same memory
  const int64_t n = d.numel();
  if (n == 0) return;
  if (!d.device().is_cpu()) {  // on a GPU (or the simulated one): one elementwise kernel
    ops::add(d, d, src);
    return;
  }
  if (d.dtype() == DType::f32) {
    float* a = d.data<float>();
    const float* b = src.data<float>();
    for (int64_t i = 0; i < n; ++i) a[i] += b[i];
  } else {
    SCALELAB_CHECK(d.dtype() == DType::f64, "add_into: f32 or f64 only, got {}", d.str());
    double* a = d.data<double>();
    const double* b = src.data<double>();
    for (int64_t i = 0; i < n; ++i) a[i] += b[i];
  }
}

void ring_all_reduce(Communicator& comm, const Tensor& x) {
  const int n = comm.size(), rank = comm.rank();
  const int64_t numel = x.numel();
  const Tensor buf = x.flat(0, numel);  // 1-d view of x: chunk k is buf.flat(begin, length)
  const int right = (rank + 1) % n, left = (rank - 1 + n) % n;
  auto begin = [&](int k) { return chunk_begin(numel, n, k); };
  auto length = [&](int k) { return chunk_begin(numel, n, k + 1) - chunk_begin(numel, n, k); };
  // TODO step 2: reduce-scatter then all-gather around the ring, n-1 steps each
  // HINT: only comm's send/recv and their _async variants, to `right` and from `left`; it must
  // HINT: not deadlock at any size. Stuck? `./scalelab hint 01 2`, one hint at a time.
  throw scalelab::NotImplemented(
      "lab 01 step 2: reduce-scatter then all-gather around the ring, n-1 steps each (README.md#step-2)");
}

void ring_broadcast(Communicator& comm, const Tensor& x, int root) {
  const int n = comm.size(), rank = comm.rank();
  if (root < 0 || root >= n)
    throw std::invalid_argument(
        fmt::format("ring_broadcast: root {} is not a rank of the communicator, [0, {})", root, n));
  if (n == 1) return;
  // TODO step 3: pass root's buffer along the ring
  // HINT: only send/recv, along the ring from the root. Stuck? `./scalelab hint 01 3`.
  throw scalelab::NotImplemented(
      "lab 01 step 3: pass root's buffer along the ring (README.md#step-3)");
}

void ring_all_gather(Communicator& comm, const Tensor& in, const Tensor& out) {
  const int n = comm.size(), rank = comm.rank();
  const int64_t m = in.numel();
  SCALELAB_CHECK(out.numel() == m * n, "ring_all_gather: out {} must hold {} x {} elements",
                 out.str(), n, m);
  const Tensor buf = out.flat(0, out.numel());
  // TODO step 3: own chunk in place, then n-1 steps around the ring
  throw scalelab::NotImplemented(
      "lab 01 step 3: own chunk in place, then n-1 steps around the ring (README.md#step-3)");
}

double all_reduce_busbw_factor(int n) {
  if (n < 1) throw std::invalid_argument("all_reduce_busbw_factor: n must be >= 1");
  // TODO step 4: the all-reduce busbw factor
  // HINT: count the bytes one rank sends in step 2's ring, relative to the buffer size.
  throw scalelab::NotImplemented(
      "lab 01 step 4: the all-reduce busbw factor (README.md#step-4)");
}

BenchRow make_bench_row(std::size_t bytes, int64_t count, int ranks, std::vector<double> times_s,
                        int64_t wrong) {
  if (times_s.empty()) throw std::invalid_argument("make_bench_row: no times");
  BenchRow row;
  row.bytes = bytes;
  row.count = count;
  row.wrong = wrong;
  // TODO step 4: median time, algbw = bytes / time (GB/s), busbw = algbw * factor
  throw scalelab::NotImplemented(
      "lab 01 step 4: median time, algbw = bytes / time (GB/s), busbw = algbw * factor (README.md#step-4)");
  return row;
}

std::vector<std::size_t> bench_sizes(const BenchConfig& config) {
  std::vector<std::size_t> sizes;
  for (std::size_t b = config.min_bytes; b <= config.max_bytes; b *= 2) {
    sizes.push_back(std::max<std::size_t>(b / 4, 1) * 4);
    if (b == 0) break;
  }
  return sizes;
}

std::vector<BenchRow> run_bench(Communicator& comm, bool ring, const BenchConfig& config) {
  using Clock = std::chrono::steady_clock;
  const int n = comm.size();
  auto all_reduce = [&](const Tensor& t) {
    if (ring) ring_all_reduce(comm, t);
    else comm.all_reduce(t);
  };
  std::vector<BenchRow> rows;
  for (std::size_t bytes : bench_sizes(config)) {
    const int64_t count = static_cast<int64_t>(bytes / 4);
    Tensor x = Tensor::zeros({count}, DType::f32, config.device);
    for (int i = 0; i < config.warmup; ++i) all_reduce(x);
    const bool gpu = config.device.is_cuda();
    // Host: each iteration alone after a barrier. GPU: nccl-tests' way, the iterations posted
    // back to back (the library's as async all-reduces) and timed together up to the device's
    // end, one time per size: the time of the whole loop / iters.
    Tensor times = Tensor::zeros({gpu ? 1 : config.iters}, DType::f64);
    if (gpu) {
      comm.barrier();
      metrics::Timer timer(config.device);  // elapsed() waits for the device
      std::vector<comm::Work> posted;
      for (int i = 0; i < config.iters; ++i) {
        if (ring) ring_all_reduce(comm, x);
        else posted.push_back(comm.all_reduce_async(x));
      }
      comm::wait_all(posted);
      times.data<double>()[0] = timer.elapsed() / config.iters;
    } else {
      for (int i = 0; i < config.iters; ++i) {
        comm.barrier();
        const auto t0 = Clock::now();
        all_reduce(x);
        times.data<double>()[i] = std::chrono::duration<double>(Clock::now() - t0).count();
      }
    }
    comm.all_reduce(times, comm::ReduceOp::max);  // an iteration lasts as long as its slowest rank
    // Checked run: rank r holds (i % 251) + r, integers, so the sum is exact in f32.
    Tensor h = Tensor::empty({count});
    float* p = h.data<float>();
    for (int64_t i = 0; i < count; ++i) p[i] = static_cast<float>(i % 251 + comm.rank());
    x.copy_from(h);
    all_reduce(x);
    h = x.to(Device::cpu());
    p = h.data<float>();
    Tensor wrong = Tensor::zeros({1}, DType::f64);
    for (int64_t i = 0; i < count; ++i)
      if (p[i] != static_cast<float>(n * (i % 251) + n * (n - 1) / 2)) wrong.data<double>()[0] += 1;
    comm.all_reduce(wrong, comm::ReduceOp::max);
    const double* t = times.data<double>();
    rows.push_back(make_bench_row(bytes, count, n,
                                  std::vector<double>(t, t + times.numel()),
                                  static_cast<int64_t>(wrong.item(0))));
  }
  return rows;
}

}  // namespace scalelab::lab01
