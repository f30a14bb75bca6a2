#pragma once
/// @file collectives.hpp
/// Lab 01 contract: the collectives every later lab is built from. Use each one (step 1), then
/// build the most important one, all-reduce, yourself from send/recv on a ring (step 2), then
/// broadcast and all-gather the same way (step 3), and measure your ring against the library's
/// all-reduce the way nccl-tests does (step 4).
///
/// Everything talks through scalelab::comm::Communicator (common/comm/communicator.hpp). Every
/// function here is collective over `comm`: every rank calls it, in the same order.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/comm/communicator.hpp"
#include "common/tensor.hpp"

namespace scalelab::lab01 {

using comm::Communicator;

// ---- Step 1: each collective once ---------------------------------------------------------

/// What one collective did on this rank: what it passed in and what it got back.
struct CollectiveResult {
  std::string name;            ///< "all_reduce", "broadcast", ...
  std::vector<double> before;  ///< this rank's input (empty where the rank passes none)
  std::vector<double> after;   ///< this rank's output (empty where the rank gets none)
};

/// The collectives of step 1, in the order run_each_collective runs them. Given.
const std::vector<std::string>& step1_collectives();

/// This rank's input for `collective` in step 1 (given): every rank holds different values so
/// the results show where each number went.
///   all_reduce, reduce:   {r+1, 10(r+1)}            (2 values)
///   broadcast:            {r+1, 10(r+1)}            (root 0's values win)
///   all_gather, gather:   {r}                       (1 value)
///   reduce_scatter:       {10r + j : j < size}      (size values, one chunk per rank)
///   scatter:              {100 + j : j < size} on the root (rank 0), nothing elsewhere
std::vector<double> step1_input(const std::string& collective, int rank, int size);

/// Step 1. Runs each collective of step1_collectives() once, on f32 tensors on `device` holding
/// step1_input(name, rank, size) (on a GPU over an nccl group: NCCL's collectives), and returns
/// one result per collective, in that order:
///   all_reduce (sum)       after = the sum over ranks, on every rank
///   broadcast (root 0)     after = rank 0's input, on every rank
///   reduce (sum, root 0)   after = the sum on rank 0; empty on the other ranks
///   all_gather             after = every rank's value, in rank order (size values)
///   reduce_scatter (sum)   after = {sum over ranks of input[rank]} (1 value)
///   scatter (root 0)       after = {100 + rank} (1 value); `before` empty except on rank 0
///   gather (root 0)        after = every rank's value on rank 0 (size values); empty elsewhere
std::vector<CollectiveResult> run_each_collective(Communicator& comm,
                                                  Device device = Device::cpu());

// ---- Step 2: ring all-reduce from send/recv --------------------------------------------------

/// Chunk k of a buffer of `numel` elements cut into `n` chunks: elements
/// [chunk_begin(numel, n, k), chunk_begin(numel, n, k + 1)). The first numel % n chunks have one
/// element more than the others, so sizes differ by at most one and numel need not divide by n
/// (chunks are empty when numel < n). Given.
int64_t chunk_begin(int64_t numel, int n, int k);

/// dst[i] += src[i] for contiguous tensors of the same numel and dtype (f32 or f64), on the host
/// or (one kernel, ops::add) on the GPU they live on. Given.
void add_into(const Tensor& dst, const Tensor& src);

/// Step 2. Sum of every rank's `x`, in place, on every rank: a ring all-reduce built only from
/// comm.send / comm.recv (and their _async variants), on the buffer cut into n chunks
/// (chunk_begin): a reduce-scatter (n-1 steps) that leaves each rank with one chunk's complete
/// sum, then an all-gather (n-1 steps) of the complete chunks. What it may send (graded from the
/// communicator's ledger): no collective; messages to (r+1) % n only and from (r-1+n) % n only;
/// one chunk a step each way, 2(n-1) chunks sent and 2(n-1) received in all. Which chunk moves
/// at which step is the exercise: README step 2 and its hints.
/// Any contiguous f32/f64 tensor, any shape, numel 0 or smaller than n included; a no-op for n = 1.
/// With integer-valued floats the result equals comm.all_reduce exactly.
void ring_all_reduce(Communicator& comm, const Tensor& x);

// ---- Step 3: broadcast and all-gather on the ring ----------------------------------------

/// Step 3a. Root's `x` to every rank, in place, from send/recv only. What it may send: no
/// collective; every rank but the root receives the buffer once, from its left neighbour; every
/// rank but the one before the root sends it once, to its right neighbour; nothing else.
/// A root out of range throws std::invalid_argument.
void ring_broadcast(Communicator& comm, const Tensor& x, int root);

/// Step 3b. out = every rank's `in`, in rank order (out has size * in.numel elements), from
/// send/recv only. What it may send: no collective; n-1 chunks of `in`'s size to the right
/// neighbour, one a step, and as many received from the left; nothing else.
void ring_all_gather(Communicator& comm, const Tensor& in, const Tensor& out);

// ---- Step 4: measure it ----------------------------------------------------------------------

/// Step 4a. busbw / algbw for an all-reduce over n ranks (nccl-tests' bus bandwidth factor):
/// how many times the buffer's bytes the busiest link carries in a ring all-reduce (count them
/// in step 2's ring). 0 for n = 1. n < 1 throws std::invalid_argument.
double all_reduce_busbw_factor(int n);

/// One row of an nccl-tests style table.
struct BenchRow {
  std::size_t bytes = 0;  ///< buffer size
  int64_t count = 0;      ///< elements
  double time_us = 0;     ///< median of the iteration times, microseconds
  double algbw = 0;       ///< GB/s (1e9 bytes per second): bytes / median time
  double busbw = 0;       ///< GB/s: algbw * all_reduce_busbw_factor(ranks)
  int64_t wrong = 0;      ///< elements that differ from the expected result
};

/// Step 4b. The row for a buffer of `bytes` bytes (`count` elements) all-reduced over `ranks`
/// ranks, from the per-iteration times in seconds (any order; the median is the middle one, or
/// the mean of the two middle ones for an even number). Empty `times_s` throws
/// std::invalid_argument.
BenchRow make_bench_row(std::size_t bytes, int64_t count, int ranks, std::vector<double> times_s,
                        int64_t wrong);

/// How to run the bench (the driver's --min-bytes, --max-bytes, --iters, --warmup).
struct BenchConfig {
  std::size_t min_bytes = 4, max_bytes = 64u << 20;
  int iters = 20, warmup = 3;
  /// Where the buffers live: the host (each iteration timed alone, after a barrier), or a GPU
  /// (the iterations posted back to back and timed together, as nccl-tests does).
  Device device = Device::cpu();
};

/// The sizes the bench runs: min_bytes, 2 min_bytes, 4 min_bytes, ... up to max_bytes, each
/// rounded down to whole f32 elements (at least one). Given.
std::vector<std::size_t> bench_sizes(const BenchConfig& config);

/// Runs the bench for one all-reduce implementation (`ring` true: ring_all_reduce, false:
/// comm.all_reduce) on f32 buffers of every size of bench_sizes(config): `warmup` untimed runs,
/// then `iters` timed runs (on the host each starts after a barrier; an iteration's time is the
/// slowest rank's; on a GPU, config.device, the `iters` runs are posted back to back after one
/// barrier and their time together, divided by `iters`, is the one time: nccl-tests' way), then
/// one checked run on integer-valued data (\#wrong). Returns the same rows on every rank. Given:
/// it calls your make_bench_row.
std::vector<BenchRow> run_bench(Communicator& comm, bool ring, const BenchConfig& config);

}  // namespace scalelab::lab01
