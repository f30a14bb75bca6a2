// Lab 10, given: a plan's step and optimizer. Zero1Optimizer (ZeRO-1/2's sharded AdamW over dp,
// from lab 09's shard_groups and all_gather_parameters), check_runnable (what the 3D step runs)
// and Trainer3D (one rank's model pieces, built by your build_3d_model, with the plan's schedule,
// checkpointing and ZeRO stage: lab 09's GradientRelease / GatherRelease policies at the model's
// unit hooks, which call your lab 09 functions; your step_3d for 1F1B with ZeRO 0 and 1). Not an
// exercise: read it to see where your step 2 and step 3 are called when the program trains and
// when the planner's plans are checked.
#include "3d_parallel.hpp"

#include <algorithm>

#include "common/errors.hpp"
#include "common/train/global_loss.hpp"
#include "zero.hpp"  // lab 09: shard_groups, all_gather_parameters, the ZeRO-2/3 policies

namespace scalelab::lab10 {

// ---- given: ZeRO-1/2's sharded optimizer over dp ------------------------------------------------

Zero1Optimizer::Zero1Optimizer(nn::GPT& model, comm::Communicator& dp, optim::AdamWConfig adamw)
    : Zero1Optimizer(model, dp, Tensor(), adamw) {}

Zero1Optimizer::Zero1Optimizer(nn::GPT& model, comm::Communicator& dp, const Tensor& grad_shard,
                               optim::AdamWConfig adamw)
    : model_(model), dp_(dp) {
  nn::ParameterSet& ps = model.params();
  SCALELAB_CHECK(ps.padded_numel() % dp.size() == 0,
                 "ZeRO-1/2 over dp {} needs the model built with storage.pad_to = {}", dp.size(),
                 dp.size());
  shard_ = nn::shard_range(ps.numel(), dp.rank(), dp.size());
  const Tensor grads =
      grad_shard.defined() ? grad_shard : ps.padded_grads().flat(shard_.lo, shard_.size);
  adamw_ = std::make_unique<optim::AdamW>(lab09::shard_groups(ps, shard_, grads), adamw);
}

void Zero1Optimizer::step(double lr) {
  adamw_->step(lr);
  lab09::all_gather_parameters(model_.params(), shard_, dp_);
}

// ---- given: a plan's step and optimizer ---------------------------------------------------------

void check_runnable(const Plan& p) {
  SCALELAB_REQUIRE(p.zero_stage >= 0 && p.zero_stage <= 3, "--zero must be 0, 1, 2 or 3, got {}",
                   p.zero_stage);
  lab08::check_chunks(p.schedule, p.chunks);
  const bool interleaved = p.schedule == lab08::Kind::interleaved;
  SCALELAB_REQUIRE(!interleaved || p.micro_batches % p.grid.pp == 0, "--schedule interleaved "
                   "runs micro-batches in groups of the {} stages: --micro-batches {} is not a "
                   "multiple of {}", p.grid.pp, p.micro_batches, p.grid.pp);
}

// One model piece of this rank (chunk c of v): the groups its model keeps a reference to (g, with
// the virtual stage c * pp + stage of pp * v, so build_3d_model cuts lab08::chunk_layers' piece),
// the model, its ZeRO policy and its optimizer.
struct Trainer3D::Piece {
  Groups groups;
  std::unique_ptr<nn::GPT> model;
  std::shared_ptr<lab09::GradientRelease> release;  // ZeRO-2
  std::shared_ptr<lab09::GatherRelease> gather;     // ZeRO-3
  std::unique_ptr<Zero1Optimizer> sharded;          // ZeRO-1, 2
  std::unique_ptr<optim::AdamW> adamw;              // ZeRO 0, 3
};

Trainer3D::Trainer3D(const ModelConfig& config, Groups& g, const Plan& plan,
                     nn::GPTOptions options, optim::AdamWConfig adamw,
                     const ModelBuilder& build)
    : g_(g), plan_(plan) {
  check_runnable(plan);
  SCALELAB_CHECK(plan.grid.dp == g.shape.dp && plan.grid.tp == g.shape.tp &&
                 plan.grid.pp == g.shape.pp && plan.grid.cp == g.shape.cp,
                 "a plan for another grid than the groups'");
  // The replicas of this shard: dp, or dp x cp with context parallelism (cp_setup.cpp); ZeRO
  // shards over them (with cp > 1 like Megatron's distributed optimizer over dp x cp).
  comm::Communicator& replicas = g.replicas();
  const int v = plan.chunks, p = g.shape.pp;
  if (plan.schedule == lab08::Kind::interleaved)  // the layers split into p * v equal pieces
    lab08::chunk_layers(static_cast<int>(config.n_layer), p, v, g.coord.pp, 0);
  // ZeRO-1/2: dp equal shards of the flat layout (ZeRO-3 shards every unit on its own)
  if (plan.zero_stage == 1 || plan.zero_stage == 2) options.storage.pad_to = replicas.size();
  if (plan.zero_stage == 2) options.storage.grads = nn::Storage::per_unit;
  for (int c = 0; c < v; ++c) {
    auto piece = std::make_unique<Piece>(Piece{g});
    piece->groups.shape.pp = p * v;  // the virtual stage: the builder cuts that piece
    piece->groups.coord.pp = c * p + g.coord.pp;
    Piece& x = *piece;
    nn::GPTOptions o = options;
    if (plan.zero_stage == 3) {
      x.gather = std::make_shared<lab09::GatherRelease>(replicas);
      o = x.gather->prepare(o);
    }
    x.model = build(config, x.groups, o, plan.checkpoint);
    nn::GPT& m = *x.model;
    if (g.shape.cp > 1)  // step 2's mappings with lab 11's attention over cp (cp_setup.cpp)
      m.set_mappings(with_context_parallel(m.shared_mappings(), config, x.groups, plan.attention));
    // A tied copy (the embedding of a piece without the head, a piece's own lm_head) keeps its
    // gradient whole until sync_tied_gradients has summed it with the other copy's.
    std::vector<std::size_t> tied;
    if (m.has_embedding() && !m.has_head()) tied.push_back(m.embedding_unit());
    if (m.lm_head) tied.push_back(m.head_unit());
    switch (plan.zero_stage) {
      case 0:
        x.adamw = std::make_unique<optim::AdamW>(optim::groups(m.parameters()), adamw);
        break;
      case 1: x.sharded = std::make_unique<Zero1Optimizer>(m, replicas, adamw); break;
      case 2:
        x.release = std::make_shared<lab09::GradientRelease>(m, replicas);
        for (std::size_t u : tied) x.release->hold(u);
        m.add_block_policy(x.release);  // after the checkpointing policy, if any
        x.sharded =
            std::make_unique<Zero1Optimizer>(m, replicas, x.release->grad_shard(), adamw);
        break;
      default:
        x.gather->attach(m);
        for (std::size_t u : tied) x.gather->hold(u);
        m.add_block_policy(x.gather);
        x.adamw = std::make_unique<optim::AdamW>(x.gather->optimizer_groups(), adamw);
        break;
    }
    pieces_.push_back(std::move(piece));
  }
}

Trainer3D::~Trainer3D() = default;

nn::GPT& Trainer3D::model() { return *pieces_.front()->model; }

std::vector<nn::GPT*> Trainer3D::pieces() const {
  std::vector<nn::GPT*> out;
  for (const auto& x : pieces_) out.push_back(x->model.get());
  return out;
}

double Trainer3D::step(const data::Batch& global, lab08::ExecStats* stats) {
  const int m = plan_.micro_batches;
  if (plan_.zero_stage <= 1 && plan_.schedule == lab08::Kind::one_f_one_b && plan_.chunks == 1 &&
      g_.shape.cp == 1)
    return step_3d(model(), g_, global, m, stats);  // your step 3
  // The given driver: any schedule, any number of chunks, the ZeRO policies, the cp axis.
  for (auto& x : pieces_) {
    x->model->zero_grad();
    if (x->release) x->release->begin();
    if (x->gather) x->gather->begin();
  }
  // this replica's rows, and of them this cp rank's zig-zag tokens (all of them with cp = 1)
  const data::Batch mine = cp_columns(dp_rows(global, g_), g_);
  SCALELAB_REQUIRE(mine.batch_size() % m == 0, "{} rows do not split into {} micro-batches",
                   mine.batch_size(), m);
  const int64_t b = mine.batch_size() / m;
  std::vector<data::Batch> micro;
  for (int i = 0; i < m; ++i) micro.push_back(mine.rows(i * b, (i + 1) * b));
  const lab08::Schedule schedule =
      lab08::make_schedule(plan_.schedule, g_.shape.pp, m, plan_.chunks, g_.coord.pp);
  const std::vector<nn::GPT*> chunks = pieces();
  double loss = lab08::run_schedule(chunks, schedule, micro, g_.pp, stats);
  lab08::sync_tied_gradients(chunks, g_.pp);  // ZeRO-2/3: the held (whole) tied gradients
  for (auto& x : pieces_) {
    if (x->release) x->release->finish();  // the held units reduced, the shard averaged
    else if (x->gather) x->gather->finish();
    else g_.replicas().all_reduce(x->model->params().grads(), comm::ReduceOp::avg);
  }
  // each rank's loss is the mean over its rows and tokens: the global mean is the replicas' mean
  // (train::global_loss: one sum all-reduce of 8 bytes, as lab 10's exact one-step budget counts)
  return train::global_loss(loss, g_.replicas());
}

void Trainer3D::optimizer_step(double lr) {
  for (auto& x : pieces_) {
    if (x->sharded) x->sharded->step(lr);
    else x->adamw->step(lr);
  }
}

std::size_t Trainer3D::optimizer_state_bytes() const {
  std::size_t n = 0;
  for (const auto& x : pieces_)
    n += x->sharded ? x->sharded->state_bytes() : x->adamw->state_bytes();
  return n;
}

Tensor Trainer3D::parameters() {
  if (pieces_.size() == 1 && !pieces_[0]->gather) return model().params().values();
  std::vector<Tensor> all;
  int64_t n = 0;
  for (auto& x : pieces_) {
    all.push_back(x->gather ? x->gather->full_parameters() : x->model->params().values());
    n += all.back().numel();
  }
  Tensor out = Tensor::empty({n}, all[0].dtype(), all[0].device());
  int64_t at = 0;
  for (const Tensor& t : all) {
    Tensor dst = out.flat(at, t.numel());
    dst.copy_from(t);
    at += t.numel();
  }
  return out;
}

int Trainer3D::unit_collectives() const {
  int n = 0;
  for (const auto& x : pieces_)
    n += x->release ? x->release->reductions() : x->gather ? x->gather->gathers() : 0;
  return n;
}

}  // namespace scalelab::lab10
