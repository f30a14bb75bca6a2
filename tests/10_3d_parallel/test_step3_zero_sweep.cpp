// Step 3, issue 21: every ZeRO stage composes with every pipeline schedule, checkpointing and
// micro-batches (Trainer3D: lab 09's GradientRelease / GatherRelease policies at nn::GPT's unit
// hooks, lab 08's schedules and executor). A covering sample (every pair of the factors zero
// 0-3 x schedule afab/1f1b/interleaved x m 1/2/4 x checkpointing off/on x fp32/bf16 appears in
// some case; interleaved needs m a multiple of pp = 2, so (interleaved, m = 1) is not run),
// on 4 ranks (dp 2 x tp 1 x pp 2) and 8 ranks (dp 2 x tp 2 x pp 2), each against the
// single-device twin: 3 optimizer steps from the same seed on the same global batches.
//
// The optimizer is AdamW with eps = 1, which makes its update about lr x the gradient (plain SGD
// with momentum): continuous in the gradient, so the reduction order's rounding stays rounding
// (with eps = 1e-8 the first update is lr x sign(g), and an element whose gradient rounds to
// either side of 0 moves by 2 lr). Tolerances: fp32 every step's loss within 1e-5 relative and
// the parameters after 3 steps within 1e-5 relative / 1e-6 absolute (sums over tp, dp and
// micro-batches in another order); bf16 (mixed precision: each tp rank rounds its partial sums
// to bf16) the losses within 2e-3 relative and the parameters within 1e-3 absolute. Measured:
// fp32 losses 7e-9 relative, parameters 1.5e-8 absolute; bf16 losses 2.4e-5, parameters 1.2e-4.
//
// The technique: with m micro-batches ZeRO-2 reduces every unit once per micro-batch and ZeRO-3
// gathers every unit for every micro-batch's forward and backward (the byte counters and the
// policies' counts say so), and ZeRO-3 holds one unit gathered at a time (and a tied
// embedding); one step's traffic is an exact budget on every group (fp32 1F1B at every ZeRO
// stage, and a covering handful of AFAB, interleaved, checkpointed and bf16 plans). Planted: a
// ZeRO-2 whose reduction overwrites its shard (lab 09's ZeRO-2 as it was, one batch per step:
// only the last micro-batch survives) fails the twin; a ZeRO-3 that never releases a gathered
// unit fails the bound on gathered elements; an extra activation and a bf16 plan run in fp32
// fail the budget.
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/comm/stats.hpp"
#include "common/ops/ops.hpp"
#include "common/optim/optim.hpp"
#include "grid3d_checks.hpp"
#include "tests/support/traffic_budget.hpp"

namespace {

using namespace scalelab;
using namespace scalelab::lab10test;
using labtest::world;

constexpr int kSteps = 3;
constexpr double kLr = 0.1;
constexpr optim::AdamWConfig kSmooth{.eps = 1.0};

struct Case {
  int zero = 0;
  lab08::Kind schedule = lab08::Kind::one_f_one_b;
  int m = 1;
  bool checkpoint = false;
  DType precision = DType::f32;
};

std::string name(const Case& c) {
  return fmt::format("ZeRO-{} {} m {}{} {}", c.zero, lab08::kind_name(c.schedule), c.m,
                     c.checkpoint ? " checkpointed" : "", dtype_name(c.precision));
}

// The covering sample (a greedy pairwise design), plus the issue's own run: ZeRO-3,
// checkpointing, 4 micro-batches, 1F1B.
std::vector<Case> cases() {
  using K = lab08::Kind;
  constexpr DType f32 = DType::f32, bf16 = DType::bf16;
  return {{2, K::one_f_one_b, 2, true, bf16},  {3, K::interleaved, 2, false, f32},
          {1, K::afab, 1, false, bf16},        {0, K::afab, 4, true, f32},
          {1, K::one_f_one_b, 1, true, f32},   {0, K::interleaved, 4, false, bf16},
          {2, K::one_f_one_b, 4, false, f32},  {3, K::one_f_one_b, 1, true, bf16},
          {1, K::interleaved, 2, true, bf16},  {0, K::one_f_one_b, 1, false, f32},
          {2, K::afab, 1, false, bf16},        {3, K::afab, 2, true, f32},
          {2, K::interleaved, 2, true, f32},   {3, K::afab, 4, false, f32},
          {1, K::afab, 4, false, f32},         {0, K::one_f_one_b, 2, false, bf16},
          {3, K::one_f_one_b, 4, true, f32}};
}

lab10::GridShape grid_shape() {
  return world().size() == 8 ? lab10::GridShape{2, 2, 2} : lab10::GridShape{2, 1, 2};
}

nn::GPTOptions options(DType precision) {
  return {.dtype = DType::f32, .seed = kLab.seed, .compute_dtype = precision};
}

// What each piece of `t` should hold: the twin's values cut as each piece's parameters are.
Tensor expected_values(lab10::Trainer3D& t, nn::GPT& twin) {
  std::vector<double> all;
  for (nn::GPT* piece : t.pieces()) {
    const std::vector<double> v = expected(*piece, twin, false).to_vector();
    all.insert(all.end(), v.begin(), v.end());
  }
  return Tensor::from_vector(all, {static_cast<int64_t>(all.size())}, DType::f64);
}

// kSteps steps of the plan against the single-device twin (every rank runs the twin: tiny).
testing::AssertionResult matches_twin(const Case& c) {
  const lab10::GridShape shape = grid_shape();
  const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
  lab10::Groups g = lab10::groups_of(grid);
  const bool interleaved = c.schedule == lab08::Kind::interleaved;
  const lab10::Plan plan{shape, c.m, c.zero, c.checkpoint, c.schedule, interleaved ? 2 : 1};
  lab10::Trainer3D t(config(), g, plan, options(c.precision), kSmooth, own_builder);
  nn::GPT twin(config(), options(c.precision));
  optim::AdamW twin_opt(optim::groups(twin.parameters()), kSmooth);
  const bool bf16 = c.precision == DType::bf16;
  const double loss_rtol = bf16 ? 2e-3 : 1e-5;
  for (int s = 0; s < kSteps; ++s) {
    const data::Batch batch = kLab.batch(s);
    const double got = t.step(batch);
    t.optimizer_step(kLr);
    twin.zero_grad();
    const double want = twin.forward(batch.x, batch.y);
    twin.backward();
    twin_opt.step(kLr);
    if (!(std::abs(got - want) <= loss_rtol * std::abs(want)))  // the same on every rank
      return testing::AssertionFailure() << name(c) << ": step " << s << " loss " << got
                                         << ", the twin's " << want << " (rtol " << loss_rtol
                                         << ")";
  }
  return labtest::close_on_every_rank(t.parameters(), expected_values(t, twin),
                                      bf16 ? 0 : 1e-5, bf16 ? 1e-3 : 1e-6)
         << " (" << name(c) << ", parameters after " << kSteps << " steps)";
}

TEST(Step3_ZeroSweep, EveryZeroStageScheduleAndCheckpointingMatchesTheTwin) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(name(c));
    EXPECT_TRUE(matches_twin(c));
  }
}

// ---- the extra cost with micro-batches, counted -----------------------------------------------

// The dp payload of one step and the units the policy reduced (2) or gathered (3).
struct Traffic {
  int64_t dp_bytes = 0;
  int unit_collectives = 0;
};
Traffic one_step(int zero, int m) {
  const lab10::GridShape shape = grid_shape();
  const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
  lab10::Groups g = lab10::groups_of(grid);
  lab10::Trainer3D t(config(), g, {shape, m, zero, false}, options(DType::f32), {},
                     own_builder);
  const comm::CommStats before = comm::comm_stats();
  t.step(kLab.batch(0));
  return {comm::comm_total(comm::comm_stats() - before, g.dp.name()).bytes - 8,  // - the loss
          t.unit_collectives()};
}

// ZeRO-2 reduces each unit once per micro-batch except the tied copy it holds until the tied sum
// (one reduction per step); ZeRO-3 gathers each unit for every micro-batch's forward and
// backward (the embedding's backward reads no values) and reduce-scatters each unit once per
// micro-batch (the tied copy once per step). ZeRO-1 averages the gradient once: its dp bytes do
// not grow with m, ZeRO-2's and ZeRO-3's grow about m-fold (more than 3x from m = 1 to 4).
TEST(Step3_ZeroSweep, ZeroTwoAndThreeCostMTimesPerStep) {
  const lab10::GridShape shape = grid_shape();
  const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
  lab10::Groups g = lab10::groups_of(grid);
  const auto probe = own_builder(config(), g, options(DType::f32), false);
  const int units = static_cast<int>(probe->params().units().size());
  const int tied = probe->has_embedding() != probe->has_head() ? 1 : 0;
  for (int m : {1, 4}) {
    SCOPED_TRACE(fmt::format("m {}", m));
    const Traffic z1 = one_step(1, m), z2 = one_step(2, m), z3 = one_step(3, m);
    EXPECT_EQ(z2.unit_collectives, m * (units - tied) + tied);
    // forward: every unit (a head tied to wte on the same model: none here, pp = 2); backward:
    // every unit but the embedding
    EXPECT_EQ(z3.unit_collectives,
              m * (units + units - (probe->has_embedding() ? 1 : 0)));
    if (m == 4) {
      const Traffic z1_1 = one_step(1, 1), z2_1 = one_step(2, 1), z3_1 = one_step(3, 1);
      EXPECT_EQ(z1.dp_bytes, z1_1.dp_bytes) << "ZeRO-1 averages once per step, whatever m";
      EXPECT_GT(z2.dp_bytes, 3 * z2_1.dp_bytes) << "ZeRO-2: a reduction per micro-batch";
      EXPECT_GT(z3.dp_bytes, 3 * z3_1.dp_bytes) << "ZeRO-3: every gather and reduce-scatter x m";
    }
  }
}

// Issue 25, class 1: the dp group's part of one Trainer3D step's budget (no optimizer step;
// tests/support/traffic_budget.hpp: per group and members, operation, reduction op and root),
// for a ZeRO stage and m, of one model piece (a rank with interleaved chunks adds each), with the
// reference's reduction ops; gradients move in the master dtype (fp32: 4 bytes each, in mixed
// precision too), ZeRO-3's gathered values in the compute dtype (bf16: 2 bytes, lab 09's wire):
//   ZeRO-0/1  avg all-reduce of the piece's gradients
//   ZeRO-2    sum reduce of every unit's gradient elements to their owners per micro-batch (to
//             dp rank q the elements of q's shard), the tied copy once per step (held until the
//             tied sum), the 1/dp a scale after
//   ZeRO-3    all-gather of every unit (each padded to dp) per micro-batch's forward, and of
//             every unit but the embedding per backward; sum reduce-scatter of every padded unit
//             per micro-batch, the tied copy once
// Calls: any where the split is per unit. The loss, tp and pp rows: step_budget below.
void add_dp_budget(labtest::TrafficBudget& b, int zero, int m, nn::GPT& model,
                   const comm::Communicator& dp) {
  using labtest::kAnyCalls;
  nn::ParameterSet& ps = model.params();
  const int64_t grad = static_cast<int64_t>(dtype_size(ps.dtype()));
  const int64_t value = static_cast<int64_t>(dtype_size(ps.compute_dtype()));
  const bool tied_copy = model.has_embedding() != model.has_head();
  const std::size_t tied = !tied_copy              ? ps.units().size()  // none: a middle piece
                           : model.has_embedding() ? model.embedding_unit()
                                                   : model.head_unit();
  const int n = dp.size();
  if (zero <= 1) {
    b.all_reduce(dp, kAnyCalls, ps.numel() * grad, comm::ReduceOp::avg);
    return;
  }
  int64_t padded = 0, backward = 0, untied_padded = 0, tied_padded = 0;
  std::vector<int64_t> to_owner(n, 0);  // ZeRO-2: elements reduced to each dp rank
  for (std::size_t u = 0; u < ps.units().size(); ++u) {
    const nn::Unit& unit = ps.units()[u];
    const int64_t p = nn::shard_range(unit.numel(), 0, n).size * n;
    const int64_t times = tied_copy && u == tied ? 1 : m;
    padded += p;
    if (!(model.has_embedding() && u == model.embedding_unit())) backward += p;
    (tied_copy && u == tied ? tied_padded : untied_padded) += p;
    for (int q = 0; q < n; ++q) {
      const nn::ShardRange owner = nn::shard_range(ps.numel(), q, n);
      to_owner[q] += times * std::max<int64_t>(0, std::min(unit.hi, owner.hi) - std::max(unit.lo, owner.lo));
    }
  }
  if (zero == 2) {
    for (int q = 0; q < n; ++q)
      if (to_owner[q] > 0) b.reduce(dp, q, kAnyCalls, to_owner[q] * grad);
    return;
  }
  b.all_gather(dp, kAnyCalls, m * (padded + backward) * value)
      .reduce_scatter(dp, kAnyCalls, (m * untied_padded + tied_padded) * grad);
}

// Models of the layout Trainer3D builds for `plan` (the test's own builder, one per chunk on the
// virtual stage chunk * pp + stage of pp * v, ZeRO-1/2's padding): what the budget is computed
// from (the trainer's own pieces are not read: the budget comes from the shapes).
std::vector<std::unique_ptr<nn::GPT>> probes(const lab10::Plan& plan, lab10::Groups& g,
                                             DType precision) {
  nn::GPTOptions o = options(precision);
  if (plan.zero_stage == 1 || plan.zero_stage == 2) o.storage.pad_to = g.shape.dp;
  std::vector<std::unique_ptr<nn::GPT>> out;
  for (int c = 0; c < plan.chunks; ++c) {
    lab10::Groups x = g;
    x.shape.pp = g.shape.pp * plan.chunks;
    x.coord.pp = c * g.shape.pp + g.coord.pp;
    out.push_back(own_builder(config(), x, o, plan.checkpoint));
  }
  return out;
}

// The rest of one step, from the shapes (any schedule: AFAB and 1F1B send the same messages in
// another order; rows = this replica's B/dp rows, in m micro-batches of rows/m, T, C;
// activations and their gradients in the compute dtype, bf16 in mixed precision):
//   tp  lab 07's operators, per piece: 4 sum all-reduces of (rows, T, C) per block over the step
//       (2 forward, 2 backward; 6 with checkpointing: the recomputed forward's 2 more; its
//       ZeRO-3 gathers are the backward's own, add_dp_budget's count does not change), one for
//       the vocabulary-parallel embedding's forward and one for the head's input gradient; the
//       vocabulary-parallel loss: a max all-reduce of the row maxima and two sum all-reduces
//       (target logit, sum of exponentials) of rows x T statistics (tp_bytes)
//   pp  per piece (chunk c of v: lab 08's next_piece / prev_piece, so with interleaving the last
//       stage's chunk c feeds stage 0's chunk c + 1) and micro-batch one activation (rows/m, T,
//       C) sent to the next piece's rank and its gradient received back, one received from the
//       previous piece's rank and its gradient sent back; the two ends exchange their copy of
//       this tp rank's wte gradient once (pp > 1, master dtype); the loss broadcast from the last
//       stage (8 bytes, f64)
//   dp  add_dp_budget per piece, and the avg all-reduce of the loss (8 bytes)
// and nothing on any other communicator (the world, a duplicate).
labtest::TrafficBudget step_budget(const lab10::Plan& plan, DType precision, lab10::Groups& g) {
  using labtest::kAnyCalls;
  const int m = plan.micro_batches, v = plan.chunks, p = g.pp.size(), s = g.pp.rank();
  const ModelConfig c = config();
  const int64_t rows = kLab.batch(0).batch_size() / g.shape.dp;
  const int64_t elem = static_cast<int64_t>(dtype_size(precision));
  const int64_t msg = rows / m * c.block_size * c.n_embd * elem;  // one (rows/m, T, C) message
  labtest::TrafficBudget b;
  b.all_reduce(g.replicas(), 1, 8);  // the loss (train::global_loss: a sum, then / replicas)
  const auto pieces = probes(plan, g, precision);
  for (int chunk = 0; chunk < v; ++chunk) {
    nn::GPT& model = *pieces[chunk];
    add_dp_budget(b, plan.zero_stage, m, model, g.replicas());
    const int64_t stat = static_cast<int64_t>(dtype_size(ops::stats_dtype(model.compute_dtype())));
    const int64_t row_max = model.has_head() ? rows * c.block_size * stat : 0;  // of tp_bytes' 3
    b.all_reduce(g.tp, kAnyCalls, tp_bytes(model, rows, plan.checkpoint) - row_max);
    if (model.has_head()) b.all_reduce(g.tp, kAnyCalls, row_max, comm::ReduceOp::max);
    const lab08::Piece next = lab08::next_piece(p, v, s, chunk);
    const lab08::Piece prev = lab08::prev_piece(p, v, s, chunk);
    b.pipeline_piece(g.pp, next.exists ? next.stage : -1, prev.exists ? prev.stage : -1, m, msg);
    if (p > 1 && model.has_embedding() != model.has_head()) {  // a tied copy: one end's
      const int other = model.has_embedding() ? p - 1 : 0;
      const Tensor& grad =
          model.params().get(model.has_embedding() ? "wte.weight" : "lm_head.weight").grad;
      const int64_t wte = grad.numel() * static_cast<int64_t>(dtype_size(grad.dtype()));
      b.send(g.pp, other, 1, wte).recv(g.pp, other, 1, wte);
    }
  }
  return b.broadcast(g.pp, p - 1, 1, 8);
}

// One Trainer3D step (no optimizer step) of `plan`, in `precision`, on the sweep's grid: its
// traffic on every communicator, and the budget from the shapes.
struct Measured {
  comm::Traffic got;
  labtest::TrafficBudget budget;
};
// `also`: a planted fault's extra traffic in the same window; `runs_in`: a planted fault's
// precision (the budget stays `precision`'s).
Measured one_step_traffic(const lab10::Plan& plan, DType precision, lab10::Groups& g,
                          const std::function<void()>& also = {},
                          std::optional<DType> runs_in = std::nullopt) {
  lab10::Trainer3D t(config(), g, plan, options(runs_in.value_or(precision)), {}, own_builder);
  Measured r;
  r.got = labtest::traffic_of([&] {
    t.step(kLab.batch(0));
    if (also) also();
  });
  r.budget = step_budget(plan, precision, g);
  return r;
}

// Every communicator's traffic of one Trainer3D step (no optimizer step) is its exact budget:
// fp32 1F1B, every ZeRO stage at m = 1 and 4 (the dp rows grow m-fold for ZeRO-2/3)...
TEST(Step3_ZeroSweep, OneStepIsAnExactBudgetOnEveryGroup) {
  const lab10::GridShape shape = grid_shape();
  const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
  lab10::Groups g = lab10::groups_of(grid);
  for (int zero = 0; zero <= 3; ++zero)
    for (int m : {1, 4}) {
      SCOPED_TRACE(fmt::format("ZeRO-{} m {}", zero, m));
      const Measured r = one_step_traffic({shape, m, zero, false}, DType::f32, g);
      EXPECT_TRUE(labtest::exact_traffic(r.got, r.budget));
    }
}

// ... and the other schedules, checkpointing and the wire dtype: AFAB, interleaved (2 chunks:
// twice the pp messages, stage pp-1's chunk 0 sending to stage 0's chunk 1, a tied copy on each
// end), checkpointing (the recomputed forwards' tp all-reduces), bf16 (2-byte activations on pp
// and tp and ZeRO-3's gathers; 4-byte gradients on dp and the tied exchange), with ZeRO-2/3 at
// m = 2 and 4. A covering handful: every ZeRO stage, schedule, checkpointing and precision
// appears, each schedule with both precisions and with and without checkpointing.
TEST(Step3_ZeroSweep, OneStepIsAnExactBudgetForEveryScheduleAndPrecision) {
  using K = lab08::Kind;
  constexpr DType f32 = DType::f32, bf16 = DType::bf16;
  const lab10::GridShape shape = grid_shape();
  const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
  lab10::Groups g = lab10::groups_of(grid);
  struct BudgetCase {
    int zero;
    K schedule;
    int m;
    bool checkpoint;
    DType precision;
  };
  for (const BudgetCase& x :
       {BudgetCase{0, K::afab, 2, true, f32}, {3, K::afab, 4, false, bf16},
        {1, K::interleaved, 2, false, bf16}, {2, K::interleaved, 4, true, f32},
        {3, K::interleaved, 2, true, bf16}, {2, K::one_f_one_b, 2, false, bf16},
        {1, K::one_f_one_b, 4, true, f32}}) {
    const int v = x.schedule == K::interleaved ? 2 : 1;
    const lab10::Plan plan{shape, x.m, x.zero, x.checkpoint, x.schedule, v};
    SCOPED_TRACE(fmt::format("ZeRO-{} {} v {} m {}{} {}", x.zero, lab08::kind_name(x.schedule), v,
                             x.m, x.checkpoint ? " checkpointed" : "", dtype_name(x.precision)));
    const Measured r = one_step_traffic(plan, x.precision, g);
    EXPECT_TRUE(labtest::exact_traffic(r.got, r.budget));
  }
}

// ---- planted faults ---------------------------------------------------------------------------

// ZeRO-2 that also all-reduces a gradient-sized buffer over dp (the given step plus the planted
// all-reduce, in the same window): the numbers stay right, the m-fold growth above still holds,
// the budget fails it.
TEST(Step3_PlantedFault, Zero2WithAnExtraDpAllReduceFailsTheBudget) {
  const lab10::GridShape shape = grid_shape();
  const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
  lab10::Groups g = lab10::groups_of(grid);
  const int64_t n = probes({shape, 2, 2, false}, g, DType::f32)[0]->num_parameters();
  const Measured r = one_step_traffic({shape, 2, 2, false}, DType::f32, g,
                                      [&] { g.dp.all_reduce(Tensor::zeros({n})); });
  EXPECT_FALSE(labtest::exact_traffic(r.got, r.budget));
}

// An interleaved bf16 step (ZeRO-1, m 2, 2 chunks) whose last stage sends its chunk 0's output
// of the last micro-batch to stage 0 a second time, and stage 0 receives it (the message its
// chunk 1 already got: the numbers stay right, the per-kind checks above do not look at pp): one
// activation more than the interleaved schedule implies, in bf16's bytes. The extended budget
// fails it on the two end stages (one call and one message's bytes more from stage pp-1 to 0).
TEST(Step3_PlantedFault, InterleavedExtraActivationFailsTheBudget) {
  const lab10::GridShape shape = grid_shape();
  const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
  lab10::Groups g = lab10::groups_of(grid);
  const lab10::Plan plan{shape, 2, 1, false, lab08::Kind::interleaved, 2};
  const int p = g.pp.size(), s = g.pp.rank();
  const int64_t rows = kLab.batch(0).batch_size() / shape.dp / plan.micro_batches;
  const ModelConfig c = config();
  Tensor again = Tensor::zeros({rows, c.block_size, c.n_embd}, DType::bf16);
  const Measured r = one_step_traffic(plan, DType::bf16, g, [&] {
    if (s == p - 1) g.pp.send(again, 0, 999);
    if (s == 0) g.pp.recv(again, p - 1, 999);
  });
  const testing::AssertionResult ok = labtest::exact_traffic(r.got, r.budget);
  if (s == 0 || s == p - 1) EXPECT_FALSE(ok) << "the end stages move one activation too many";
  else EXPECT_TRUE(ok) << "the middle stages are unchanged";
}

// A bf16 plan (ZeRO-3, AFAB, m 2) whose step runs and sends fp32: the activations on pp and tp
// and ZeRO-3's gathers in 4 bytes where the plan's wire carries 2. The bf16 budget fails it on
// every rank.
TEST(Step3_PlantedFault, BfloatPlanRunInFloat32FailsTheBudget) {
  const lab10::GridShape shape = grid_shape();
  const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
  lab10::Groups g = lab10::groups_of(grid);
  const lab10::Plan plan{shape, 2, 3, false, lab08::Kind::afab, 1};
  const Measured r = one_step_traffic(plan, DType::bf16, g, {}, DType::f32);
  EXPECT_FALSE(labtest::exact_traffic(r.got, r.budget));
}

// ZeRO-3's working set: at every unit hook, the units bound in the model (ParameterSet's bound
// values: what the allocator holds for gathered units, besides the prefetch's staging buffer)
// are at most the largest unit, plus the embedding where the head is tied to it on the same
// model. A probe appended after the ZeRO policy sees the model's state at each hook.
class GatheredProbe final : public nn::BlockPolicy {
 public:
  explicit GatheredProbe(nn::GPT& m) : m_(m) {}
  void before_unit_forward(const nn::GPT&, std::size_t) override { note(); }
  void after_unit_forward(const nn::GPT&, std::size_t) override { note(); }
  void before_unit_backward(const nn::GPT&, std::size_t) override { note(); }
  void after_unit_backward(const nn::GPT&, std::size_t) override { note(); }
  int64_t peak = 0;

 private:
  void note() {
    const nn::ParameterSet& ps = m_.params();
    int64_t now = 0;
    for (std::size_t u = 0; u < ps.units().size(); ++u)
      if (ps.compute_bound(u)) now += ps.units()[u].numel();
    peak = std::max(peak, now);
  }
  nn::GPT& m_;
};

int64_t working_set_bound(nn::GPT& m) {
  int64_t largest = 0;
  for (const nn::Unit& u : m.params().units()) largest = std::max(largest, u.numel());
  const bool tied = m.has_embedding() && m.has_head() && !m.lm_head;
  return largest + (tied ? m.params().units()[m.embedding_unit()].numel() : 0);
}

// A ZeRO-3 written here that gathers each unit when first needed and never releases it (the
// forward's numbers are right; only the working set is checked).
class NeverReleases final : public nn::BlockPolicy {
 public:
  NeverReleases(nn::GPT& m, comm::Communicator& dp, std::vector<Tensor>& shards)
      : m_(m), dp_(dp), shards_(shards) {}
  void before_unit_forward(const nn::GPT&, std::size_t u) override { gather(u); }
  void before_unit_backward(const nn::GPT&, std::size_t u) override { gather(u); }

 private:
  void gather(std::size_t u) {
    nn::ParameterSet& ps = m_.params();
    if (ps.values_bound(u)) return;  // fault: kept from its first use on
    Tensor all = Tensor::empty({shards_[u].numel() * dp_.size()});
    dp_.all_gather(shards_[u], all);
    ps.bind_values(u).copy_from(all.flat(0, ps.units()[u].numel()));
    if (m_.has_embedding() && !m_.lm_head && m_.has_head() && u == m_.head_unit())
      gather(m_.embedding_unit());
  }
  nn::GPT& m_;
  comm::Communicator& dp_;
  std::vector<Tensor>& shards_;
};

// One 1F1B step, m = 4, of a ZeRO-3 model on the sweep's grid with the given policy (and the
// probe after it); returns the probe's peak against the bound, on every rank.
testing::AssertionResult gathers_one_unit_at_a_time(bool plant) {
  const lab10::GridShape shape = grid_shape();
  const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
  lab10::Groups g = lab10::groups_of(grid);
  std::vector<Tensor> shards;  // the planted one's value shards
  auto real = std::make_shared<lab09::GatherRelease>(g.dp);
  nn::GPTOptions o = real->prepare(options(DType::f32));
  if (plant)
    o.on_init = [&](const nn::Unit& u, const Tensor& v) {
      const nn::ShardRange s = nn::shard_range(u.numel(), g.dp.rank(), g.dp.size());
      Tensor mine = Tensor::zeros({s.size});
      if (s.real() > 0) mine.flat(0, s.real()).copy_from(v.flat(s.lo, s.real()));
      shards.push_back(mine);
    };
  auto model = own_model(g, 1, false, o);
  if (plant) {
    model->add_block_policy(std::make_shared<NeverReleases>(*model, g.dp, shards));
  } else {
    real->attach(*model);
    model->add_block_policy(real);
    real->begin();
  }
  auto probe = std::make_shared<GatheredProbe>(*model);
  model->add_block_policy(probe);
  constexpr int m = 4;
  const data::Batch mine = lab10::dp_rows(kLab.batch(0), g);
  std::vector<data::Batch> micro;
  for (int i = 0; i < m; ++i) micro.push_back(mine.rows(i * mine.batch_size() / m,
                                                        (i + 1) * mine.batch_size() / m));
  lab08::run_schedule({model.get()}, lab08::schedule_1f1b(shape.pp, m, g.coord.pp), micro, g.pp);
  if (!plant) real->finish();
  const int64_t bound = working_set_bound(*model);
  Tensor worst = Tensor::from_vector({static_cast<double>(probe->peak - bound)}, {1}, DType::f64);
  world().all_reduce(worst, comm::ReduceOp::max);
  if (worst.item() > 0)
    return testing::AssertionFailure() << "gathered up to " << probe->peak << " elements at once "
                                       << "on this rank (bound " << bound << ": the largest "
                                       << "unit, and a tied embedding)";
  return testing::AssertionSuccess() << "peak " << probe->peak << " <= " << bound;
}

TEST(Step3_ZeroSweep, ZeroThreeHoldsOneUnitGatheredAtATime) {
  EXPECT_TRUE(gathers_one_unit_at_a_time(false));
}

TEST(Step3_ZeroSweepPlantedFault, ZeroThreeThatNeverReleasesIsCaught) {
  EXPECT_FALSE(gathers_one_unit_at_a_time(true));
}

// A ZeRO-2 written here whose reduction COPIES the owners' sums into the shard (lab 09's first
// ZeRO-2, one batch per step): with micro-batches each reduction overwrites the last, so only
// the last micro-batch's gradient is stepped. The twin check catches it.
class OverwritingRelease final : public nn::BlockPolicy {
 public:
  OverwritingRelease(nn::GPT& m, comm::Communicator& dp) : m_(m), dp_(dp) {
    s_ = nn::shard_range(m.params().numel(), dp.rank(), dp.size());
    shard = Tensor::zeros({s_.size}, m.params().dtype());
  }
  void after_unit_backward(const nn::GPT&, std::size_t u) override {
    nn::ParameterSet& ps = m_.params();
    const nn::Unit& unit = ps.units()[u];
    const Tensor grads = ps.unit_grads(u);
    for (int q = 0; q < dp_.size(); ++q) {
      const nn::ShardRange o = nn::shard_range(ps.numel(), q, dp_.size());
      const int64_t b = std::max(unit.lo, o.lo), e = std::min(unit.hi, o.hi);
      if (b < e) dp_.reduce(grads.flat(b - unit.lo, e - b), q);
    }
    const int64_t b = std::max(unit.lo, s_.lo), e = std::min(unit.hi, s_.hi);
    if (b < e) shard.flat(b - s_.lo, e - b).copy_from(grads.flat(b - unit.lo, e - b));  // fault
    ps.release_grads(u);
  }
  Tensor shard;
  nn::ShardRange s_;

 private:
  nn::GPT& m_;
  comm::Communicator& dp_;
};

// One 1F1B step, m = 4, on a pipeline of dp 2 (pp 1 keeps the tied embedding in one unit), of
// a ZeRO-2 with the given policy: its gradient shard against the twin's gradient on the shard's
// elements (fp32, 1e-5 / 1e-6).
testing::AssertionResult zero2_shard_matches(bool plant) {
  const lab10::GridShape shape = world().size() == 8 ? lab10::GridShape{2, 4, 1}
                                                      : lab10::GridShape{2, 2, 1};
  const comm::ProcessGrid grid(world(), shape.dp, shape.tp, shape.pp, shape.order);
  lab10::Groups g = lab10::groups_of(grid);
  nn::GPTOptions o = options(DType::f32);
  o.storage.grads = nn::Storage::per_unit;
  auto model = own_model(g, shape.dp, false, o);
  std::shared_ptr<lab09::GradientRelease> real;
  std::shared_ptr<OverwritingRelease> bad;
  if (plant) {
    bad = std::make_shared<OverwritingRelease>(*model, g.dp);
    model->add_block_policy(bad);
  } else {
    real = std::make_shared<lab09::GradientRelease>(*model, g.dp);
    model->add_block_policy(real);
    real->begin();
  }
  constexpr int m = 4;
  const data::Batch global = kLab.batch(0);
  const data::Batch mine = lab10::dp_rows(global, g);
  std::vector<data::Batch> micro;
  for (int i = 0; i < m; ++i) micro.push_back(mine.rows(i * mine.batch_size() / m,
                                                        (i + 1) * mine.batch_size() / m));
  lab08::run_schedule({model.get()}, lab08::schedule_1f1b(1, m, 0), micro, g.pp);
  Tensor got;
  nn::ShardRange s;
  if (plant) {
    got = bad->shard;
    ops::scale(got, 1.0 / g.dp.size());
    s = bad->s_;
  } else {
    real->finish();
    got = real->grad_shard();
    s = real->shard();
  }
  auto twin = reference_model(global, options(DType::f32));
  const Tensor want = expected(*model, *twin, true);
  return labtest::close_on_every_rank(got.flat(0, s.real()), want.flat(s.lo, s.real()), 1e-5,
                                      1e-6);
}

TEST(Step3_ZeroSweep, ZeroTwoShardSumsEveryMicroBatch) { EXPECT_TRUE(zero2_shard_matches(false)); }

TEST(Step3_ZeroSweepPlantedFault, ZeroTwoKeepingOnlyTheLastMicroBatchIsCaught) {
  EXPECT_FALSE(zero2_shard_matches(true));
}

}  // namespace

