// Lab 07 step 1: the conjugate operators f and g. Graded on integer-valued float64 tensors, so
// every sum is exact (no tolerance): rank r contributes (r + 1) * (i + 1) at element i, and the
// sum over tp ranks is (i + 1) * tp (tp + 1) / 2. The byte counters check what is sent: f's
// forward and g's backward send nothing; f's backward and g's forward one SUM all-reduce of the
// tensor on the tp group (also with one rank, as the contract says), and nothing on any other
// communicator (the library's traffic ledger, tests/support/traffic_budget.hpp).
#include <gtest/gtest.h>

#include <functional>

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

// The check for the two reducing operators: the exact sum over ranks, one all-reduce.
::testing::AssertionResult sums_over_ranks(const Op& op) {
  Tensor t = contribution();
  const Traffic moved = traffic_of([&] { op(t, group()); });
  const double n = size();
  for (int i = 0; i < 15; ++i)
    if (t.item(i) != (i + 1) * n * (n + 1) / 2)
      return ::testing::AssertionFailure() << "element " << i << " is " << t.item(i)
                                           << ", the sum over ranks is " << (i + 1) * n * (n + 1) / 2;
  return only_all_reduces(moved, 1, static_cast<int64_t>(t.nbytes()));
}

// The check for the two identities: nothing changes, nothing is sent.
::testing::AssertionResult is_identity(const Op& op) {
  Tensor t = contribution();
  const Tensor before = t.clone();
  const Traffic moved = traffic_of([&] { op(t, group()); });
  const ::testing::AssertionResult same = labtest::bitwise(t, before);
  if (!same) return same;
  return only_all_reduces(moved, 0, 0);
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
