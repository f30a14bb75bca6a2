// Given code of lab 11 (not an exercise): the context-parallel GPT is nn::GPT with these
// mappings plugged into its hook points (common/nn/mappings.hpp): the embedding at the global
// positions of this rank's rows, and attention's core by the ring (steps 2-3) or the all-to-all
// (step 4) you write. Everything else (LayerNorms, the MLP, the loss) is row-wise: each rank runs
// it on its own rows unchanged. One copy, in both builds.
#include <mutex>

#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/trace.hpp"
#include "common/train/global_loss.hpp"
#include "context_parallel.hpp"

namespace scalelab::lab11 {

Attention parse_attention(const std::string& text) {
  if (text == "ring") return Attention::ring;
  if (text == "all-to-all") return Attention::all_to_all;
  throw UsageError(fmt::format("--attention {}: ring or all-to-all", text));
}

const char* attention_name(Attention a) { return a == Attention::ring ? "ring" : "all-to-all"; }

void check_cp(int cp, int world, int64_t T, int64_t n_head, Attention attention) {
  SCALELAB_REQUIRE(cp == world, "--cp {}: context parallelism here runs on every rank, so cp "
                   "must be the number of ranks ({})", cp, world);
  SCALELAB_REQUIRE(T % (2 * cp) == 0, "--context {}: the zig-zag split cuts the sequence into "
                   "2 cp = {} equal chunks: give a multiple of {}", T, 2 * cp, 2 * cp);
  SCALELAB_REQUIRE(attention != Attention::all_to_all || n_head % cp == 0,
                   "--attention all-to-all: the model's {} heads do not split over cp = {} ranks",
                   n_head, cp);
}

namespace {

class ContextParallel final : public nn::Mappings {
 public:
  ContextParallel(comm::Communicator& cp, std::vector<int64_t> positions, Attention attention,
                  int64_t n_head)
      : cp_(cp), positions_(std::move(positions)), attention_(attention), n_head_(n_head) {}

  bool replaces_attention() const override { return true; }

  Tensor attention_forward(Tensor& y, const Tensor& q, const Tensor& k, const Tensor& v,
                           double scale, std::vector<Tensor>& kept) const override {
    if (attention_ == Attention::all_to_all)
      return all_to_all_attention_forward(y, q, k, v, n_head_, scale, cp_, kept);
    const Tensor qc = to_chunks(q), kv = pack_kv(k, v);  // (2, BH, c, hs), (2, 2, BH, c, hs)
    Tensor yc = Tensor::empty(qc.shape(), qc.dtype(), qc.device());
    // --trace: the ring as one span, its blocks' flash attention and the waits inside it
    // (compute track), its sends and recvs on the comm tracks.
    trace::Scope span("ring_attention_forward");
    Tensor lse = ring_attention_forward(yc, qc, kv, scale, cp_);
    from_chunks(y, yc);
    return lse;
  }

  void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dy, const Tensor& q,
                          const Tensor& k, const Tensor& v, const Tensor& y, const Tensor& lse,
                          const std::vector<Tensor>& kept, double scale) const override {
    if (attention_ == Attention::all_to_all) {
      all_to_all_attention_backward(dq, dk, dv, dy, lse, kept, n_head_, scale, cp_);
      return;
    }
    const Tensor qc = to_chunks(q), kv = pack_kv(k, v), yc = to_chunks(y), dyc = to_chunks(dy);
    Tensor dqc = Tensor::empty(qc.shape(), qc.dtype(), qc.device());
    Tensor dkv = Tensor::empty(kv.shape(), kv.dtype(), kv.device());
    trace::Scope span("ring_attention_backward");
    ring_attention_backward(dqc, dkv, dyc, qc, kv, yc, lse, scale, cp_);
    from_chunks(dq, dqc);
    from_chunks(dk, kv_part(dkv, 0));
    from_chunks(dv, kv_part(dkv, 1));
  }

  // wte[tokens] + wpe[the rows' global positions]: gather_rows of both tables, one add.
  Tensor embedding_forward(const Tensor& wte, int64_t lo, const Tensor& wpe,
                           const Tensor& tokens) const override {
    const int64_t B = tokens.size(0), T = tokens.size(1), N = B * T, C = wte.size(1);
    Tensor tok = Tensor::empty({N, C}, wte.dtype(), wte.device());
    ops::gather_rows(tok, wte, tokens.view({N}), lo);
    Tensor pos = Tensor::empty({N, C}, wpe.dtype(), wpe.device());
    ops::gather_rows(pos, wpe, position_ids(B, T, wte.device()), 0);
    Tensor out = Tensor::empty({B, T, C}, wte.dtype(), wte.device());
    Tensor o = out.view({N, C});
    ops::add(o, tok, pos);
    return out;
  }

  void embedding_backward(Tensor& dwte, int64_t lo, Tensor& dwpe, const Tensor& dout,
                          const Tensor& tokens) const override {
    const int64_t B = tokens.size(0), T = tokens.size(1), N = B * T, C = dout.size(-1);
    const Tensor d = dout.view({N, C});
    ops::index_add_rows(dwte, d, tokens.view({N}), lo);
    ops::index_add_rows(dwpe, d, position_ids(B, T, dout.device()), 0);
  }

 private:
  // The global position of each of the B*T rows (i32, on the device), made once per shape.
  const Tensor& position_ids(int64_t B, int64_t T, Device device) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ids_.defined() || ids_.numel() != B * T || ids_.device() != device) {
      SCALELAB_CHECK(static_cast<int64_t>(positions_.size()) == T,
                     "context parallel: {} positions for rows of {} tokens", positions_.size(), T);
      std::vector<double> ids;
      ids.reserve(B * T);
      for (int64_t b = 0; b < B; ++b) ids.insert(ids.end(), positions_.begin(), positions_.end());
      ids_ = Tensor::from_vector(ids, {B * T}, DType::i32).to(device);
    }
    return ids_;
  }

  comm::Communicator& cp_;
  std::vector<int64_t> positions_;
  Attention attention_;
  int64_t n_head_;
  mutable std::mutex mu_;
  mutable Tensor ids_;
};

}  // namespace

std::shared_ptr<const nn::Mappings> make_cp_mappings(comm::Communicator& cp,
                                                     std::vector<int64_t> positions,
                                                     Attention attention, int64_t n_head) {
  return std::make_shared<ContextParallel>(cp, std::move(positions), attention, n_head);
}

double cp_forward_backward(nn::GPT& model, const Tensor& x, const Tensor& y,
                           comm::Communicator& cp,
                           const std::function<Tensor(const Tensor&)>& shard) {
  const Tensor xs = shard(x).to(model.device()), ys = shard(y).to(model.device());
  model.zero_grad();
  // Every rank's rows are 1/cp of the tokens: the whole batch's mean loss is the mean of the
  // ranks' means, and its gradient the sum of theirs, each scaled by 1/cp.
  const Scalar local = model.forward(xs, ys);  // read once, by the caller
  model.backward(1.0 / cp.size());
  cp.all_reduce(model.params().grads());
  return train::global_loss(local, cp);
}

}  // namespace scalelab::lab11
