// Lab 12 step 3: expert parallelism over ep = every rank (1, 2 and 4). Suites run in this
// order: Step3_Memory, Step3_Exchange, Step3_Layer, Step3_Model (the exchange's own check first,
// so its message is what a broken exchange shows).
//  - Step3_Memory (first in the step's run: tools.memory_first checks it): the allocator and the
//    rank's whole heap over one MoE layer's forward and backward: no rank held every expert's
//    weights at any moment, in tensors or in a std::vector; static storage at most 4 KiB; what
//    the forward kept for the backward is the experts' activations (what run_experts keeps on
//    the rows they got) and the exchange plan, nothing more (on one rank too).
//  - Step3_Exchange: the exchange alone, on rows that name their rank, expert and index:
//    exchange_counts gives every rank the rows each rank sends each of its experts;
//    send_to_experts delivers exactly them, grouped by expert (rank 0's first);
//    return_from_experts brings every row home (a failure decodes the rows: whose row arrived
//    where). The counters see three all_to_alls on the ep group and nothing else, of exactly
//    4 E (the counts) + (M + R) C 4 bytes (M rows out, R back), the formula for that routing;
//    the same rows in bf16: (M + R) C 2 bytes (rows travel in their dtype).
//  - Step3_Layer: one MoE layer under the given mappings (one routing group per rank, capacity
//    drops): the counters over its forward AND backward: five all_to_alls on the ep group of
//    4 E + 2 (M + R) C 4 bytes (the counts once: the backward reuses the forward's plan), the
//    program's formula; its output against the single-device layer on every rank's rows
//    (groups = ranks), 1e-6 relative; the work counters: the forward's GEMMs were the router on
//    this rank's tokens and ITS experts on the rows they got (moe_forward_flops), nothing more,
//    and the backward's twice that (two gradients a GEMM: nothing recomputed); two forwards
//    then their two backwards give each the gradients it gives alone (each keeps its plan).
//  - Step3_Model (needs steps 1-2 of the library only: the router and dispatch are nn::MoE's):
//    one step of the expert-parallel tiny-moe against the single-device GPT, loss and every
//    gradient this rank holds, fp32 at the all-reduce tolerances, bf16 at 2e-3 of the loss and
//    3e-2 of the largest gradient.
// Planted (solutions/12_*/planted/cheats.plant): a gather of every rank's tokens instead of
// the all-to-all fails the exchange's counters, bf16 rows sent as f32 its bf16 bytes; a
// backward that exchanges the counts again fails the layer's counters, one that runs the
// experts' forward again its backward FLOPs; every rank running every expert on its own tokens
// (the weights gathered) fails the work counters and the allocator; every expert's weights
// gathered besides into a std::vector with a raw MPI_Allgather fails the heap; copies of the
// rows kept for the backward fail what the forward kept; the plan kept outside `kept` fails
// the two forwards' gradients.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/nn/mappings.hpp"
#include "tests/12_expert_parallel/ep_checks.hpp"
#include "tests/support/on_sim.hpp"

using namespace scalelab;

namespace {
constexpr int64_t kE = 4, kC = 3;

// rank r's rows for expert e: (r + 2e + 1) % 4, some none
int64_t rows_of(int r, int64_t e) { return (r + 2 * e + 1) % 4; }
double code(int r, int64_t e, int64_t i, int64_t c) {
  return static_cast<double>(r * 1000 + e * 100 + i * 10 + c);
}

// Row `row` of `t` (kC columns) in words: "rank 1's row 0 for expert 2" when it is one of the
// coded rows (column c holds code(r, e, i, c)), else its values.
std::string decode(const std::vector<double>& t, int64_t row) {
  const double first = t[row * kC];
  const int64_t v = static_cast<int64_t>(first);
  bool coded = first == static_cast<double>(v) && v >= 0 && v % 10 == 0;
  const int r = static_cast<int>(v / 1000);
  const int64_t e = v / 100 % 10, i = v / 10 % 10;
  coded = coded && r < 16 && e < kE && i < rows_of(r, e);
  for (int64_t c = 0; coded && c < kC; ++c) coded = t[row * kC + c] == code(r, e, i, c);
  if (coded) return fmt::format("rank {}'s row {} for expert {}", r, i, e);
  std::string values;
  for (int64_t c = 0; c < kC; ++c) values += fmt::format("{}{}", c ? ", " : "", t[row * kC + c]);
  return fmt::format("no row that was sent ({})", values);
}

// "" when got (rows x kC) is `want` row for row, else the first row that differs, decoded; and
// when every row is there in another order, whether it is the rank-major order (`rank_major`).
std::string rows_problem(const std::vector<double>& got, const std::vector<double>& want,
                         const std::vector<double>& rank_major, const char* where) {
  const int64_t rows = static_cast<int64_t>(want.size()) / kC;
  for (int64_t q = 0; q < rows; ++q) {
    bool same = true;
    for (int64_t c = 0; c < kC; ++c) same = same && got[q * kC + c] == want[q * kC + c];
    if (same) continue;
    std::string m = fmt::format("{}: row {} is {}; {} belongs there", where, q, decode(got, q),
                                decode(want, q));
    std::vector<double> a(got), b(want);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (got == rank_major && got != want)
      m += " (every row arrived, rank by rank: not grouped by expert?)";
    else if (a == b)
      m += " (every row arrived, in another order)";
    return m;
  }
  return "";
}
}  // namespace

namespace {
struct EpLayer {
  Tensor y, want_y;
  int64_t flops = 0, want_flops = 0;  // the forward's matmul FLOPs; the formula's
  int64_t backward_flops = 0;         // the backward's
  std::size_t peak_extra = 0, all_experts_bytes = 0;
  labtest::MemoryUse memory;  // the forward and backward: the allocator and the rank's heap
  comm::Traffic traffic;      // the forward and backward: the ledger (raw MPI counted)
  int64_t M = 0, R = 0;       // this rank's kept pairs; the rows its experts got
  // what the forward kept for the backward (MoEActivations::kept), and what the library's
  // run_experts keeps on the R rows my experts got: the activations the backward needs
  std::size_t kept_bytes = 0, experts_kept_bytes = 0;
};

// One MoE layer (E = 4, top-1, capacity factor 1.0, width C) over ep = every rank: N rows per
// rank.
// `skewed`: every token prefers expert 0 (positive rows, router row 0 all ones) and the capacity
// takes them all: rank 0's experts get every rank's tokens, the others none (a rank that runs
// every expert on its own tokens does visibly different work).
EpLayer ep_layer(comm::Communicator& ep, int64_t N, bool skewed = false, int64_t C = 8) {
  const int n = ep.size(), me = ep.rank();
  const MoEConfig c{.n_expert = kE, .top_k = 1, .every = 1,
                    .capacity_factor = skewed ? 4.0 : 1.0, .aux_coef = 0.01};
  eptest::Layer mine(c, C, 31, DType::f32, me, n);
  const auto skew = [&](nn::MoE& moe) {
    if (skewed)
      moe.router.value.rows(0, 1).copy_from(
          Tensor::uniform({1, C}, 9, DType::f32, Device::cpu(), 1, 2));
  };
  skew(mine.moe);
  // every rank's rows, the same on every rank; mine are rows [me N, (me+1) N)
  const Tensor all_x =
      Tensor::uniform({n * N, C}, 32, DType::f32, Device::cpu(), skewed ? 0 : -1, 1);
  const Tensor x = all_x.rows(me * N, (me + 1) * N).clone();
  const auto mappings = lab12::make_ep_mappings(ep);
  EpLayer out;
  out.y = Tensor::empty({N, C}, DType::f32);
  nn::MoEActivations a;
  mine.set.zero_grad();
  Tensor dx = Tensor::zeros({N, C}, DType::f32);
  const Tensor dy = Tensor::uniform({N, C}, 33, DType::f32);
  ep.barrier();
  out.traffic = labtest::traffic_of([&] {
    out.memory = labtest::memory_use_of([&] {
      const ops::WorkCount w0 = ops::work_stats();
      mine.moe.forward(out.y, x, a, *mappings);
      out.flops = (ops::work_stats() - w0).matmul_flops;
      const ops::WorkCount w1 = ops::work_stats();
      mine.moe.backward(dx, dy, a, *mappings, 1.0);
      out.backward_flops = (ops::work_stats() - w1).matmul_flops;
    });
  });
  out.peak_extra = static_cast<std::size_t>(out.memory.tensor_peak);
  // the rows my experts got: every rank's kept pairs for them
  const std::vector<double> kept_mine(a.kept_counts.begin(), a.kept_counts.end());
  Tensor all_kept = Tensor::empty({n * kE}, DType::f64);
  ep.all_gather(Tensor::from_vector(kept_mine, {kE}, DType::f64), all_kept);
  const std::vector<double> k = all_kept.to_vector();
  const int64_t El = kE / n;
  std::vector<int64_t> rows_mine(El, 0);
  for (int s = 0; s < n; ++s)
    for (int64_t i = 0; i < El; ++i) rows_mine[i] += static_cast<int64_t>(k[s * kE + me * El + i]);
  out.want_flops = lab12::moe_forward_flops(N, C, kE, rows_mine);
  for (int64_t e = 0; e < kE; ++e) out.M += a.kept_counts[e];
  for (int64_t rows : rows_mine) out.R += rows;
  for (const Tensor& t : a.kept) out.kept_bytes += t.nbytes();
  std::vector<Tensor> experts_kept;
  mine.moe.run_experts(Tensor::zeros({out.R, C}, DType::f32), rows_mine, experts_kept);
  for (const Tensor& t : experts_kept) out.experts_kept_bytes += t.nbytes();
  // the single device: every expert, one routing group per rank
  eptest::Layer whole(c, C, 31, DType::f32);
  nn::MoE twin("moe", C, 2, {.config = c, .groups = n});
  nn::ParameterSet set;
  set.bind(twin.parameters(), DType::f32, Device::cpu(), 1);
  skew(whole.moe);
  for (std::size_t i = 0; i < twin.parameters().size(); ++i)
    twin.parameters()[i]->value.copy_from(whole.moe.parameters()[i]->value);
  Tensor y_all = Tensor::empty({n * N, C}, DType::f32);
  nn::MoEActivations ta;
  twin.forward(y_all, all_x, ta, nn::Mappings::single_device());
  out.want_y = y_all.rows(me * N, (me + 1) * N).clone();
  for (nn::Parameter* p : whole.moe.expert_parameters()) out.all_experts_bytes += p->value.nbytes();
  return out;
}
}  // namespace

// First in the file, its suite first, so first in step 3's run (tools.memory_first checks it): a
// buffer the code keeps in a function-local static is allocated inside this window, not by an
// earlier test.
TEST(Step3_Memory, NoRankHoldsEveryExpert) {
  comm::Communicator ep = labtest::new_world();
  if (kE % ep.size() != 0) GTEST_SKIP() << "E = 4 over " << ep.size() << " ranks";
  // C = 64: an expert's weights (8 C^2 + 5 C numbers, 132 KB) far above the few KB of records a
  // forward and backward keep on the heap beside their tensors
  const EpLayer l = ep_layer(ep, 2, /*skewed=*/false, /*C=*/64);
  // beyond what it held before the forward, a rank needs its activations (a few rows here),
  // far less than the other ranks' experts: (E - E/ep) experts' weights; in tensors, and on the
  // rank's whole heap (a copy in a std::vector too), which holds the tensors' memory as well
  // (one rank holds every expert: no bound but what it keeps, below)
  const std::size_t others = l.all_experts_bytes - l.all_experts_bytes / ep.size();
  const auto heap = static_cast<std::size_t>(std::max<int64_t>(0, l.memory.heap.peak));
  const bool one = ep.size() == 1;
  LABTEST_EXPECT(labtest::on_every_rank(
                     ::testing::AssertionResult(one || (l.peak_extra < others && heap < others))
                     << "the forward and backward allocated up to " << l.peak_extra
                     << " bytes of tensors and " << heap << " bytes of the heap at once, as "
                     << "much as the other ranks' experts' weights (" << others << ")"),
                 "");
  LABTEST_EXPECT(
      labtest::static_storage_at_most(labtest::kStaticStorageBytes, "lab 12 step 3"), "");
  // what the forward keeps until the backward: the experts' activations (run_experts') and the
  // exchange plan, a few numbers (2 ep + E of them; 8 bytes each at most, and some room); a
  // copy of the rows (C = 64: 256 bytes a row) is more than the room
  const int64_t plan_room = 8 * (2 * ep.size() + kE) + 128;
  const int64_t extra = static_cast<int64_t>(l.kept_bytes) -
                        static_cast<int64_t>(l.experts_kept_bytes);
  LABTEST_EXPECT(labtest::on_every_rank(
                     ::testing::AssertionResult(extra <= plan_room)
                     << "the forward kept " << l.kept_bytes << " bytes of tensors for the "
                     << "backward; the experts' activations on the " << l.R << " rows they got "
                     << "are " << l.experts_kept_bytes << ", and the exchange plan needs at most "
                     << plan_room << " more: keep what the backward reads, not copies of the "
                     << "rows (or anything else)"),
                 "");
}

TEST(Step3_Exchange, RowsReachTheirExpertsAndComeBackInTheFormulasBytes) {
  comm::Communicator ep = labtest::new_world();
  const int n = ep.size(), me = ep.rank();
  if (kE % n != 0) GTEST_SKIP() << "E = 4 over " << n << " ranks";
  const int64_t El = kE / n;
  std::vector<int64_t> rows(kE);
  std::vector<double> values;
  for (int64_t e = 0; e < kE; ++e) {
    rows[e] = rows_of(me, e);
    for (int64_t i = 0; i < rows[e]; ++i)
      for (int64_t c = 0; c < kC; ++c) values.push_back(code(me, e, i, c));
  }
  const int64_t M = static_cast<int64_t>(values.size()) / kC;
  const Tensor xd = Tensor::from_vector(values, {M, kC}, DType::f32);
  // what my experts must get: expert i's rows from rank 0, 1, ...
  std::vector<double> want;
  for (int64_t e = me * El; e < (me + 1) * El; ++e)
    for (int s = 0; s < n; ++s)
      for (int64_t i = 0; i < rows_of(s, e); ++i)
        for (int64_t c = 0; c < kC; ++c) want.push_back(code(s, e, i, c));
  const int64_t R = static_cast<int64_t>(want.size()) / kC;
  // the same rows in the order they arrive (rank-major): what a send_to_experts that does not
  // group them by expert would give
  std::vector<double> rank_major;
  for (int s = 0; s < n; ++s)
    for (int64_t e = me * El; e < (me + 1) * El; ++e)
      for (int64_t i = 0; i < rows_of(s, e); ++i)
        for (int64_t c = 0; c < kC; ++c) rank_major.push_back(code(s, e, i, c));
  ep.barrier();
  Tensor mine, back;
  const comm::Traffic did = labtest::traffic_of([&] {
    const lab12::Exchange x = lab12::exchange_counts(rows, ep);
    mine = lab12::send_to_experts(xd, x, ep);
    back = lab12::return_from_experts(mine, x, ep);
  });
  // what arrived, then what came home: the first wrong row, decoded
  std::string wrong;
  if (!mine.defined() || mine.numel() != R * kC)
    wrong = fmt::format("send_to_experts: my experts got {}, want {} rows of {}",
                        mine.defined() ? mine.str() : "nothing", R, kC);
  else
    wrong = rows_problem(mine.to_vector(), want, rank_major, "send_to_experts, my experts' rows");
  if (wrong.empty() && (!back.defined() || back.numel() != xd.numel()))
    wrong = fmt::format("return_from_experts gave {}, want my {} rows of {}",
                        back.defined() ? back.str() : "nothing", M, kC);
  else if (wrong.empty())
    wrong = rows_problem(back.to_vector(), values, values,
                         "return_from_experts, my dispatched layout");
  LABTEST_EXPECT(labtest::on_every_rank(::testing::AssertionResult(wrong.empty()) << wrong), "");
  const int64_t bytes = 4 * kE + (M + R) * kC * 4;
  const std::string p = eptest::only_all_to_all(did, ep.name(), 3, bytes);
  LABTEST_EXPECT(labtest::on_every_rank(::testing::AssertionResult(p.empty()) << p),
                 "the counts, the rows out and back: ");
  // the same rows in bf16: 2 bytes a number on the wire, the dtype the tensors hold
  Tensor xh = Tensor::empty({M, kC}, DType::bf16);
  ops::cast(xh, xd);
  ep.barrier();
  const comm::Traffic did_bf16 = labtest::traffic_of([&] {
    const lab12::Exchange x = lab12::exchange_counts(rows, ep);
    lab12::return_from_experts(lab12::send_to_experts(xh, x, ep), x, ep);
  });
  const int64_t bf16_bytes = 4 * kE + (M + R) * kC * 2;
  std::string q = eptest::only_all_to_all(did_bf16, ep.name(), 3, bf16_bytes);
  if (!q.empty() && eptest::only_all_to_all(did_bf16, ep.name(), 3, bytes).empty())
    q += " (bf16 rows sent as 4-byte numbers: send them in the dtype they are in)";
  LABTEST_EXPECT(labtest::on_every_rank(::testing::AssertionResult(q.empty()) << q),
                 "the same exchange of bf16 rows: ");
}

// Forward and backward of one layer: the counts once (the backward reuses the forward's plan),
// the rows out and back in each: 5 all_to_alls of 4 E + 2 (M + R) C 4 bytes, the program's
// formula.
TEST(Step3_Layer, ForwardAndBackwardExchangeTheFormulasBytes) {
  comm::Communicator ep = labtest::new_world();
  if (kE % ep.size() != 0) GTEST_SKIP() << "E = 4 over " << ep.size() << " ranks";
  const int64_t C = 8;
  const EpLayer l = ep_layer(ep, 6, /*skewed=*/false, C);
  const int64_t bytes = 4 * kE + 2 * (l.M + l.R) * C * 4;
  std::string p = eptest::only_all_to_all(l.traffic, ep.name(), 5, bytes);
  comm::CommCount a2a;
  for (const auto& [key, count] : l.traffic)
    if (key.op == "all_to_all") a2a.calls += count.calls, a2a.bytes += count.bytes;
  if (!p.empty() && a2a.calls == 6 && a2a.bytes == bytes + 4 * kE)
    p += " (one more exchange of the counts: the backward can reuse the forward's plan, kept)";
  LABTEST_EXPECT(labtest::on_every_rank(::testing::AssertionResult(p.empty()) << p),
                 "one layer's forward and backward: ");
}

TEST(Step3_Layer, EqualsTheSingleDeviceLayer) {
  comm::Communicator ep = labtest::new_world();
  if (kE % ep.size() != 0) GTEST_SKIP() << "E = 4 over " << ep.size() << " ranks";
  const EpLayer l = ep_layer(ep, 6);
  LABTEST_EXPECT(labtest::close_on_every_rank(l.y, l.want_y, 1e-6, 1e-7),
                 "the layer's output against the single-device layer's: ");
}

TEST(Step3_Layer, EachRankComputesOnlyItsExpertsTokens) {
  comm::Communicator ep = labtest::new_world();
  if (kE % ep.size() != 0) GTEST_SKIP() << "E = 4 over " << ep.size() << " ranks";
  const EpLayer l = ep_layer(ep, 6, /*skewed=*/true);
  LABTEST_EXPECT(labtest::close_on_every_rank(l.y, l.want_y, 1e-6, 1e-7),
                 "the layer's output against the single-device layer's: ");
  LABTEST_EXPECT(labtest::on_every_rank(
                     ::testing::AssertionResult(l.flops == l.want_flops)
                     << "the MoE forward's GEMMs did " << l.flops << " FLOPs; the router on its "
                     << "tokens and its experts on the rows they received do " << l.want_flops),
                 "");
  // the backward: each GEMM's two gradients (input and weight), on the same rows, once
  LABTEST_EXPECT(labtest::on_every_rank(
                     ::testing::AssertionResult(l.backward_flops == 2 * l.want_flops)
                     << "the MoE backward's GEMMs did " << l.backward_flops << " FLOPs; the "
                     << "gradients of the router on its tokens and of its experts on the rows "
                     << "they received do " << 2 * l.want_flops << " (the forward kept what "
                     << "they need: nothing is computed again)"),
                 "");
}

// Two forwards, then their backwards (as a model with two MoE blocks, or activation
// checkpointing, runs them): each backward exchanges its own forward's rows. The routing is
// set so that both forwards send the same number of rows to each rank and each expert, from
// different ranks: a plan kept anywhere but in the forward's `kept` gives the second's
// plan to the first's backward, and wrong gradients (no error, no hang).
TEST(Step3_Layer, TwoForwardsThenTwoBackwardsKeepTheirOwnPlans) {
  comm::Communicator ep = labtest::new_world();
  const int n = ep.size(), me = ep.rank();
  if (kE % n != 0) GTEST_SKIP() << "E = 4 over " << n << " ranks";
  const int64_t C = 8, N = 6;  // a rank's rows: 1 or 2 for each expert, 6 in all
  const MoEConfig c{.n_expert = kE, .top_k = 1, .every = 1,
                    .capacity_factor = static_cast<double>(kE), .aux_coef = 0.01};
  eptest::Layer l(c, C, 41, DType::f64, me, n);
  // the router reads column e for expert e (x 8): a token goes where its row holds its 1
  std::vector<double> w(kE * C, 0.0);
  for (int64_t e = 0; e < kE; ++e) w[e * C + e] = 8;
  l.moe.router.value.copy_from(Tensor::from_vector(w, {kE, C}, DType::f64));
  const auto mappings = lab12::make_ep_mappings(ep);
  struct Pass {
    Tensor x, y, dy, dx;
    nn::MoEActivations a;
  };
  // forward `shift`: rank s sends 1 + (s + shift + e) % 2 rows to expert e
  const auto pass = [&](int shift) {
    Pass p;
    std::vector<double> x = scalelab::testing::uniform({N, C}, 50 + me * 2 + shift).to_vector();
    int64_t t = 0;
    for (int64_t e = 0; e < kE; ++e)
      for (int64_t i = 0; i < 1 + (me + shift + e) % 2; ++i) x[t++ * C + e] += 2;
    p.x = Tensor::from_vector(x, {N, C}, DType::f64);
    p.y = Tensor::empty({N, C}, DType::f64);
    p.dy = scalelab::testing::uniform({N, C}, 60 + me * 2 + shift);
    p.dx = Tensor::zeros({N, C}, DType::f64);
    return p;
  };
  const auto forward = [&](Pass& p) { l.moe.forward(p.y, p.x, p.a, *mappings); };
  const auto backward = [&](Pass& p) { l.moe.backward(p.dx, p.dy, p.a, *mappings, 1.0); };
  const auto grads = [&] {
    std::vector<double> g;
    for (nn::Parameter* q : l.moe.parameters()) {
      const std::vector<double> v = q->grad.to_vector();
      g.insert(g.end(), v.begin(), v.end());
    }
    return Tensor::from_vector(g, {static_cast<int64_t>(g.size())}, DType::f64);
  };
  // each forward followed by its backward: the gradients to match
  Pass a1 = pass(0), b1 = pass(1);
  l.set.zero_grad();
  forward(a1), backward(a1), forward(b1), backward(b1);
  const Tensor want = grads();
  Pass a2 = pass(0), b2 = pass(1);
  l.set.zero_grad();
  forward(a2), forward(b2), backward(a2), backward(b2);
  const char* what = "forward A, forward B, backward A, backward B: ";
  LABTEST_EXPECT(labtest::close_on_every_rank(a2.dx, a1.dx, 1e-12, 1e-12),
                 fmt::format("{}A's dx against A's own forward and backward (B's exchange plan "
                             "in A's backward? each forward keeps its plan in its `kept`): ",
                             what));
  LABTEST_EXPECT(labtest::close_on_every_rank(grads(), want, 1e-12, 1e-12),
                 fmt::format("{}the weights' gradients: ", what));
}

TEST(Step3_Model, LossAndGradientsEqualSingleDeviceF32) {
  if (4 % labtest::world().size() != 0) GTEST_SKIP();
  eptest::model_matches_single_device(DType::f32, labtest::world().size(), 2, 1.0);
}
TEST(Step3_Model, LossAndGradientsEqualSingleDeviceBf16) {
  if (4 % labtest::world().size() != 0) GTEST_SKIP();
  eptest::model_matches_single_device(DType::bf16, labtest::world().size(), 1, 1.25);
}

// The expert-parallel model (your steps 1-3 in its MoE layers) on the simulated GPU
// (tests/support/on_sim.hpp), fp32 and bf16: the host's loss and gradients bit for bit. A tensor
// made without its device (a receive buffer, the counts), or a loop over a tensor's elements,
// stops with the op's or the tensor's own line, as it would on a GPU.
TEST(Step3_Model, RunsOnTheSimulatedGpuAsOnTheHost) {
  if (4 % labtest::world().size() != 0) GTEST_SKIP();
  comm::Communicator world = labtest::new_world();
  const int n = world.size();
  const ModelConfig config = model_config("tiny-moe");
  const data::Sampler sampler(labtest::synthetic_corpus(3), 2 * n, config.block_size, 12);
  const data::Batch batch = sampler.batch(0);
  lab12::EpGroups groups = lab12::make_ep_groups(world, n);
  std::vector<std::string> problems;
  for (DType dt : {DType::f32, DType::bf16}) {
    const nn::GPTOptions host_options{.seed = 77, .compute_dtype = dt};
    nn::GPTOptions sim_options = host_options;
    sim_options.device = Device::sim();
    nn::GPT host(config, lab12::ep_model_options(host_options, groups.ep));
    nn::GPT sim(config, lab12::ep_model_options(sim_options, groups.ep));
    for (nn::GPT* m : {&host, &sim}) m->set_mappings(lab12::make_ep_mappings(groups.ep));
    const double want = lab12::ep_forward_backward(host, batch.x, batch.y, world, groups);
    labtest::collective_run_on_sim([&] {
      const double got = lab12::ep_forward_backward(sim, batch.x, batch.y, world, groups);
      problems.push_back(labtest::step_same_on_sim(fmt::format("{}: ", dtype_name(dt)), want, got,
                                                   "the gradients", host.params().grads(),
                                                   sim.params().grads()));
    });
  }
  const std::string all = labtest::joined(problems);
  if (!all.empty()) LABTEST_FAIL() << all;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}
