// Lab 10, given: the 4th axis. check_4d (the usage errors of a dp x cp x tp x pp grid),
// with_context_parallel (lab 07's tensor-parallel mappings that step 2 set, with lab 11's
// attention core and zig-zag positions: one model, both techniques) and cp_columns (this rank's
// tokens of a batch). Not an exercise: read it to see how the two labs' operators share a model.
#include "3d_parallel.hpp"

#include <mutex>

#include "common/errors.hpp"
#include "common/nn/layernorm.hpp"
#include "common/ops/ops.hpp"

namespace scalelab::lab10 {

void check_4d(const ModelConfig& config, const GridShape& shape, int world_size,
              int64_t global_batch, int micro_batches, lab11::Attention attention) {
  check_3d(config, shape, world_size, global_batch, micro_batches);  // dp*tp*pp*cp == world
  const int64_t T = config.block_size;
  SCALELAB_REQUIRE(T % (2 * shape.cp) == 0, "--cp {}: the zig-zag split cuts the sequence of {} "
                   "tokens into 2 cp = {} equal chunks: the model's block_size must be a multiple "
                   "of {}", shape.cp, T, 2 * shape.cp, 2 * shape.cp);
  SCALELAB_REQUIRE(shape.cp == 1 || attention != lab11::Attention::all_to_all ||
                       config.n_head % (static_cast<int64_t>(shape.cp) * shape.tp) == 0,
                   "--attention all-to-all: the model's {} heads do not split over cp {} x tp {} "
                   "= {} ranks (each tp rank's heads are split again over cp)",
                   config.n_head, shape.cp, shape.tp, shape.cp * shape.tp);
}

namespace {

// lab 07's regions and ends (`regions_`), lab 11's attention core (`core_`), the position
// embedding at this rank's global positions. Every hook but attention's and the embedding's is
// the regions' unchanged: the LayerNorms, the MLP and the loss are row-wise, so a rank runs
// them on its T/cp rows as on all T.
class ContextOverRegions final : public nn::Mappings {
 public:
  ContextOverRegions(std::shared_ptr<const nn::Mappings> regions,
                     std::shared_ptr<const nn::Mappings> core, std::vector<int64_t> positions)
      : regions_(std::move(regions)), core_(std::move(core)), positions_(std::move(positions)) {}

  Tensor enter(const Tensor& x) const override { return r().enter(x); }
  Tensor enter_backward(const Tensor& dx) const override { return r().enter_backward(dx); }
  Tensor leave(const Tensor& y) const override { return r().leave(y); }
  Tensor leave_backward(const Tensor& dy) const override { return r().leave_backward(dy); }
  void layernorm_backward(nn::LayerNorm& ln, Tensor& din, const Tensor& dout, const Tensor& in,
                          const Tensor& mean, const Tensor& rstd,
                          const Tensor& dresidual) const override {
    r().layernorm_backward(ln, din, dout, in, mean, rstd, dresidual);
  }

  bool replaces_attention() const override { return true; }
  Tensor attention_forward(Tensor& y, const Tensor& q, const Tensor& k, const Tensor& v,
                           double scale, std::vector<Tensor>& kept) const override {
    return core_->attention_forward(y, q, k, v, scale, kept);
  }
  void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dy, const Tensor& q,
                          const Tensor& k, const Tensor& v, const Tensor& y, const Tensor& lse,
                          const std::vector<Tensor>& kept, double scale) const override {
    core_->attention_backward(dq, dk, dv, dy, q, k, v, y, lse, kept, scale);
  }

  bool splits_vocabulary() const override { return r().splits_vocabulary(); }
  // The regions' embedding adds wpe[0..T) to T rows: hand it the rows of wpe at this rank's
  // positions (T/cp of them), so its row t gets position positions_[t].
  Tensor embedding_forward(const Tensor& wte, int64_t lo, const Tensor& wpe,
                           const Tensor& tokens) const override {
    const Tensor& ids = position_ids(tokens.size(1), wpe.device());
    Tensor mine = Tensor::empty({ids.numel(), wpe.size(1)}, wpe.dtype(), wpe.device());
    ops::gather_rows(mine, wpe, ids, 0);
    return r().embedding_forward(wte, lo, mine, tokens);
  }
  // ... and its gradient of those rows goes back to their positions.
  void embedding_backward(Tensor& dwte, int64_t lo, Tensor& dwpe, const Tensor& dout,
                          const Tensor& tokens) const override {
    const Tensor& ids = position_ids(tokens.size(1), dwpe.device());
    Tensor dmine = Tensor::zeros({ids.numel(), dwpe.size(1)}, dwpe.dtype(), dwpe.device());
    r().embedding_backward(dwte, lo, dmine, dout, tokens);
    ops::index_add_rows(dwpe, dmine, ids, 0);
  }
  Tensor split_rows(const Tensor& x) const override { return r().split_rows(x); }
  Tensor split_rows_backward(const Tensor& dx) const override {
    return r().split_rows_backward(dx);
  }
  // The mean over this rank's rows: the step averages the cp ranks' means (Groups::replicas).
  Scalar cross_entropy(Tensor& logits, const Tensor& targets, int64_t lo) const override {
    return r().cross_entropy(logits, targets, lo);
  }
  void cross_entropy_backward(Tensor& probs, const Tensor& targets, int64_t lo,
                              double scale) const override {
    r().cross_entropy_backward(probs, targets, lo, scale);
  }

 private:
  const nn::Mappings& r() const { return regions_ ? *regions_ : Mappings::single_device(); }
  // positions_ as i32 on `device`, made once (the same T/cp rows every micro-batch).
  const Tensor& position_ids(int64_t T, Device device) const {
    std::lock_guard<std::mutex> lock(mu_);
    SCALELAB_CHECK(static_cast<int64_t>(positions_.size()) == T,
                   "context parallel: {} positions for rows of {} tokens", positions_.size(), T);
    if (!ids_.defined() || ids_.device() != device) {
      const std::vector<double> ids(positions_.begin(), positions_.end());
      ids_ = Tensor::from_vector(ids, {T}, DType::i32).to(device);
    }
    return ids_;
  }

  std::shared_ptr<const nn::Mappings> regions_, core_;
  std::vector<int64_t> positions_;
  mutable std::mutex mu_;
  mutable Tensor ids_;
};

}  // namespace

std::shared_ptr<const nn::Mappings> with_context_parallel(
    std::shared_ptr<const nn::Mappings> regions, const ModelConfig& config, Groups& g,
    lab11::Attention attention) {
  std::vector<int64_t> positions =
      lab11::zigzag_positions(config.block_size, g.shape.cp, g.coord.cp);
  // lab 11's core on this rank's heads: tp already split them, all-to-all splits them again
  auto core = lab11::make_cp_mappings(g.cp, positions, attention, config.n_head / g.shape.tp);
  return std::make_shared<ContextOverRegions>(std::move(regions), std::move(core),
                                              std::move(positions));
}

data::Batch cp_columns(const data::Batch& batch, const Groups& g) {
  if (g.shape.cp == 1) return batch;
  return {lab11::shard_sequence(batch.x, g.shape.cp, g.coord.cp),
          lab11::shard_sequence(batch.y, g.shape.cp, g.coord.cp)};
}

}  // namespace scalelab::lab10
