#pragma once
/// @file traffic_budget.hpp
/// What a step may send, as an exact budget: per group (name AND members), operation, reduction
/// and peer, the calls and payload bytes the technique needs, and nothing else on ANY
/// communicator, including ones the code under test splits or duplicates itself (the library's
/// ledger, common/comm/stats.hpp: comm::traffic()). A max all-reduce of equal tensors is not the
/// sum the technique needs; an all-gather on a private duplicate of the group is traffic too.
///
///   const comm::Traffic moved = labtest::traffic_of([&] { y = row_parallel_forward(...); });
///   EXPECT_TRUE(labtest::exact_traffic(moved, labtest::TrafficBudget{}
///                                                 .all_reduce(tp, 1, N * out * 8)));
///
/// A failure names this rank and every offending row, on one line with "; " between the rows:
/// "traffic outside the exact budget on rank 1: all_reduce(max) on tp [0 1]: 1 call(s), 96
/// bytes, outside the budget; all_reduce(sum) on tp [0 1]: 0 call(s), 0 bytes (the budget: 1
/// call(s), 96 bytes); everything it sent: ...". Not collective: call it on every rank and let
/// the test main report the rank that failed (tests/support/test_main.cpp).
#include <cstdint>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "common/comm/communicator.hpp"
#include "common/comm/stats.hpp"

namespace scalelab::labtest {

/// Any number of calls (at least one) in a budget row: where the calls' split is the attendee's
/// choice (e.g. one all-reduce per LayerNorm gradient or one for all of them), the bytes are not.
inline constexpr int64_t kAnyCalls = -1;

class TrafficBudget {
 public:
  /// `calls` operations `op` on `group` moving `bytes` in total; `reduce` for all_reduce, reduce
  /// and reduce_scatter (default sum); `peer` a rank of `group` for send/recv and the root of a
  /// rooted collective.
  TrafficBudget& expect(const comm::Communicator& group, const std::string& op, int64_t calls,
                        int64_t bytes, comm::ReduceOp reduce = comm::ReduceOp::sum, int peer = -1);
  TrafficBudget& all_reduce(const comm::Communicator& g, int64_t calls, int64_t bytes,
                            comm::ReduceOp reduce = comm::ReduceOp::sum) {
    return expect(g, "all_reduce", calls, bytes, reduce);
  }
  TrafficBudget& all_gather(const comm::Communicator& g, int64_t calls, int64_t bytes) {
    return expect(g, "all_gather", calls, bytes);
  }
  TrafficBudget& reduce_scatter(const comm::Communicator& g, int64_t calls, int64_t bytes,
                                comm::ReduceOp reduce = comm::ReduceOp::sum) {
    return expect(g, "reduce_scatter", calls, bytes, reduce);
  }
  /// A reduce to `root` (a rank of `g`): e.g. ZeRO-2's gradient pieces, each to its owner.
  TrafficBudget& reduce(const comm::Communicator& g, int root, int64_t calls, int64_t bytes,
                        comm::ReduceOp reduce = comm::ReduceOp::sum) {
    return expect(g, "reduce", calls, bytes, reduce, root);
  }
  TrafficBudget& broadcast(const comm::Communicator& g, int root, int64_t calls, int64_t bytes) {
    return expect(g, "broadcast", calls, bytes, comm::ReduceOp::sum, root);
  }
  TrafficBudget& send(const comm::Communicator& g, int to, int64_t calls, int64_t bytes) {
    return expect(g, "send", calls, bytes, comm::ReduceOp::sum, to);
  }
  TrafficBudget& recv(const comm::Communicator& g, int from, int64_t calls, int64_t bytes) {
    return expect(g, "recv", calls, bytes, comm::ReduceOp::sum, from);
  }
  /// One pipeline piece's messages in a step of m micro-batches of `bytes` each, over `pp`: its
  /// activations to the next piece's rank `next` and their gradients back, the previous piece's
  /// (rank `prev`) activations in and their gradients out: m calls each way (-1: the model's end,
  /// no such piece). A rank with several pieces (interleaved chunks) adds each.
  TrafficBudget& pipeline_piece(const comm::Communicator& pp, int next, int prev, int64_t m,
                                int64_t bytes) {
    if (next >= 0) send(pp, next, m, m * bytes).recv(pp, next, m, m * bytes);
    if (prev >= 0) recv(pp, prev, m, m * bytes).send(pp, prev, m, m * bytes);
    return *this;
  }
  /// The rows, as the ledger keys them.
  const comm::Traffic& rows() const { return rows_; }

 private:
  comm::Traffic rows_;
};

/// Runs `fn` and returns the traffic it submitted on every communicator of this process.
comm::Traffic traffic_of(const std::function<void()>& fn);

/// `got` has exactly the budget's rows (calls and bytes; kAnyCalls: at least one call), and no
/// other: else every difference, named, with this rank. Not collective.
testing::AssertionResult exact_traffic(const comm::Traffic& got, const TrafficBudget& budget);

/// The ledger on one line, rows separated by "; ": "all_reduce(sum) on world [0 1]: 1 call(s), 96
/// bytes; ..." ("(no communication)" when empty).
std::string traffic_str(const comm::Traffic& t);

}  // namespace scalelab::labtest
