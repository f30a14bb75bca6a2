// Lab 07 step 1: the conjugate operators f and g. Graded on integer-valued float64 tensors, so
// every sum is exact (no tolerance): rank r contributes (r + 1) * (i + 1) at element i, and the
// sum over tp ranks is (i + 1) * tp (tp + 1) / 2. The byte counters check what is sent: f's
// forward and g's backward send nothing; f's backward and g's forward one SUM all-reduce of the
// tensor on the tp group (also with one rank, as the contract says), and nothing on any other
// communicator (the library's traffic ledger, tests/support/traffic_budget.hpp). All four work in
// place: the allocator's peak does not rise during the call and the tensor keeps its storage.
#include <gtest/gtest.h>

#include <functional>

#include "common/allocator.hpp"
#include "tensor_parallel.hpp"
#include "tp_test_support.hpp"

using namespace scalelab;
using namespace lab07test;

namespace {

using Op = std::function<void(Tensor&, comm::Communicator&)>;

// This rank's contribution: (rank + 1) * (i + 1), shape (3, 5).
Tensor contribution() {
  std::vector<double> v(15);
  for (int i = 0; i < 15; ++i) v[i] = (rank() + 1) * (i + 1);
  return Tensor::from_vector(v, {3, 5}, DType::f64);
}

// What an operator held besides its tensor: the allocator's peak above the start of the call,
// and whether the tensor handed back is still the one handed in (f and g work in place: a copy
// is a second activation-sized tensor at every region's edge).
struct Held {
  std::size_t extra_peak = 0;
  bool same_storage = true;
};
::testing::AssertionResult holds_nothing(const Held& h) {
  if (h.extra_peak != 0)
    return ::testing::AssertionFailure()
           << "the operator allocated " << h.extra_peak << " bytes at its peak (the allocator's "
           << "statistics); f and g work on the tensor they are given, in place";
  if (!h.same_storage)
    return ::testing::AssertionFailure()
           << "the tensor came back on other storage than it went in with: the operator works "
           << "in place on the tensor it is given";
  return ::testing::AssertionSuccess();
}
Traffic run_op(const Op& op, Tensor& t, Held& held) {
  const void* before = t.data_ptr();
  reset_peak_memory(Device::cpu());
  const std::size_t start = memory_stats(Device::cpu()).current;
  const Traffic moved = traffic_of([&] { op(t, group()); });
  held.extra_peak = memory_stats(Device::cpu()).peak - start;
  held.same_storage = t.data_ptr() == before;
  return moved;
}

// The check for the two reducing operators: the exact sum over ranks, one all-reduce, in place.
::testing::AssertionResult sums_over_ranks(const Op& op) {
  Tensor t = contribution();
  Held held;
  const Traffic moved = run_op(op, t, held);
  const double n = size();
  for (int i = 0; i < 15; ++i)
    if (t.item(i) != (i + 1) * n * (n + 1) / 2)
      return ::testing::AssertionFailure() << "element " << i << " is " << t.item(i)
                                           << ", the sum over ranks is " << (i + 1) * n * (n + 1) / 2;
  if (auto ok = only_all_reduces(moved, 1, static_cast<int64_t>(t.nbytes())); !ok) return ok;
  return holds_nothing(held);
}

// The check for the two identities: nothing changes, nothing is sent, nothing is allocated.
::testing::AssertionResult is_identity(const Op& op) {
  Tensor t = contribution();
  const Tensor before = t.clone();
  Held held;
  const Traffic moved = run_op(op, t, held);
  const ::testing::AssertionResult same = labtest::bitwise(t, before);
  if (!same) return same;
  if (auto ok = only_all_reduces(moved, 0, 0); !ok) return ok;
  return holds_nothing(held);
}

}  // namespace

TEST(Step1_Operators, FForwardIsTheIdentityAndSendsNothing) { EXPECT_TRUE(is_identity(lab07::f_forward)); }

TEST(Step1_Operators, FBackwardSumsThePartialGradientsOverRanks) {
  EXPECT_TRUE(sums_over_ranks(lab07::f_backward));
}

TEST(Step1_Operators, GForwardSumsThePartialOutputsOverRanks) {
  EXPECT_TRUE(sums_over_ranks(lab07::g_forward));
}

TEST(Step1_Operators, GBackwardIsTheIdentityAndSendsNothing) { EXPECT_TRUE(is_identity(lab07::g_backward)); }

// f's backward without its all-reduce: every rank keeps its own partial gradient. With one rank
// the values are even right; the counters show the missing all-reduce.
TEST(Step1_PlantedFault, FBackwardWithoutAllReduceIsCaught) {
  const Op missing = [](Tensor&, comm::Communicator&) {};
  EXPECT_FALSE(sums_over_ranks(missing)) << "the check of FBackwardSums... must fail";
}

// f and g swapped (an all-reduce in f's forward): the identity check catches it.
TEST(Step1_PlantedFault, AllReduceInFForwardIsCaught) {
  const Op reduces = [](Tensor& t, comm::Communicator& c) { c.all_reduce(t); };
  EXPECT_FALSE(is_identity(reduces)) << "the check of FForwardIsTheIdentity must fail";
}

// The sum made on a private communicator (a split of the tp group under a name of its own: an
// all-gather and a local sum), behind a max all-reduce of the now equal tensors on the tp group:
// right numbers, and the tp group shows "one all-reduce of the tensor" as the byte counters'
// (group, op) totals used to. The traffic ledger sees the max and the private all-gather.
TEST(Step1_PlantedFault, SumOnAPrivateCommunicatorBehindAMaxAllReduceIsCaught) {
  const Op hidden = [](Tensor& t, comm::Communicator& c) {
    comm::Communicator mine = c.split(0, c.rank(), "private");
    Tensor all = Tensor::empty({c.size() * t.numel()}, t.dtype());
    mine.all_gather(t.view({t.numel()}), all);
    Tensor flat = t.view({t.numel()});
    for (int64_t i = 0; i < t.numel(); ++i) {
      double sum = 0;
      for (int r = 0; r < c.size(); ++r) sum += all.item(r * t.numel() + i);
      flat.data<double>()[i] = sum;
    }
    c.all_reduce(t, comm::ReduceOp::max);  // equal on every rank: changes nothing
  };
  EXPECT_FALSE(sums_over_ranks(hidden)) << "the check of FBackwardSums... must fail";
}

// g's backward hands on a copy of the gradient: the numbers are right and nothing is sent; the
// allocator sees the copy and the tensor comes back on other storage.
TEST(Step1_PlantedFault, ACopyInAnIdentityIsCaught) {
  const Op copies = [](Tensor& t, comm::Communicator&) { t = t.clone(); };
  EXPECT_FALSE(is_identity(copies)) << "the check of GBackwardIsTheIdentity must fail";
}
