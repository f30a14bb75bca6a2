#include "common/nn/gpt.hpp"

#include <algorithm>
#include <cmath>
#include <random>

#include "common/exec_log.hpp"
#include "common/ops/ops.hpp"
#include "common/trace.hpp"

namespace scalelab::nn {

GPT::GPT(const ModelConfig& config, const GPTOptions& options)
    : config_(config), options_(options) {
  first_ = options.first_block;
  last_ = options.last_block < 0 ? static_cast<int>(config.n_layer) : options.last_block;
  SCALELAB_CHECK(0 <= first_ && first_ <= last_ && last_ <= config.n_layer,
                 "blocks [{}, {}) outside a {}-layer model", first_, last_, config.n_layer);
  vocab_lo_ = options.vocab_lo;
  vocab_hi_ = options.vocab_hi < 0 ? config.vocab_size : options.vocab_hi;
  SCALELAB_CHECK(0 <= vocab_lo_ && vocab_lo_ < vocab_hi_ && vocab_hi_ <= config.vocab_size,
                 "vocabulary rows [{}, {}) outside a vocabulary of {}", vocab_lo_, vocab_hi_,
                 config.vocab_size);
  // wte and the head's copy keep rows [lo, hi) of the (V, C) tensor drawn whole (ParameterSet)
  const Shard vocab_rows = vocab_sharded() ? Shard{0, {{vocab_lo_, vocab_hi_}}} : Shard{};
  std::vector<Parameter*> order;
  std::vector<std::pair<std::string, std::size_t>> units;  // (name, number of parameters)
  if (has_embedding()) {
    embedding.emplace(config.vocab_size, config.block_size, config.n_embd);
    embedding->wte.shard = vocab_rows;
    for (Parameter* p : embedding->parameters()) order.push_back(p);
    units.emplace_back("embedding", embedding->parameters().size());
  }
  // Mixture of experts: the options' routing, else the config's; the MoE blocks as listed, else
  // every `every`-th.
  MoEOptions moe = options.moe;
  if (moe.config.n_expert == 0) moe.config = config.moe;
  options_.moe = moe;
  const auto is_moe = [&](int i) {
    if (!moe.config.enabled()) return false;
    if (!moe.blocks.empty()) return std::find(moe.blocks.begin(), moe.blocks.end(), i) != moe.blocks.end();
    return moe.config.every >= 1 && i % moe.config.every == moe.config.every - 1;
  };
  for (int i = first_; i < last_; ++i) {
    blocks_.push_back(std::make_unique<Block>(i, config.n_embd, config.n_head, config.n_layer,
                                              options.tp_rank, options.tp_size));
    blocks_.back()->attn.flash = options.flash_attention;
    if (is_moe(i)) {
      SCALELAB_CHECK(options.tp_size == 1, "block {}: a mixture of experts under tensor "
                     "parallelism (tp = {}) is not supported", i, options.tp_size);
      blocks_.back()->moe = std::make_unique<MoE>("blocks." + std::to_string(i) + ".moe",
                                                  config.n_embd, config.n_layer, moe);
    }
    if (options.cut_block) options.cut_block(*blocks_.back());
    for (Parameter* p : blocks_.back()->parameters()) order.push_back(p);
    units.emplace_back("blocks." + std::to_string(i), blocks_.back()->parameters().size());
  }
  if (has_head()) {
    ln_f.emplace("ln_f", config.n_embd);
    for (Parameter* p : ln_f->parameters()) order.push_back(p);
    units.emplace_back("head", ln_f->parameters().size());
    if (!has_embedding()) {
      // a pipeline's last stage holds its own copy of the tied weight, drawn like wte
      lm_head.emplace();
      lm_head->name = "lm_head.weight";
      lm_head->init_key = "wte.weight";
      lm_head->full_shape = {config.vocab_size, config.n_embd};
      lm_head->shard = vocab_rows;
      lm_head->weight_decay = true;
      order.push_back(&*lm_head);
      units.back().second += 1;
    }
  }
  StorageOptions storage = options.storage;
  storage.compute_dtype = options.compute_dtype;  // bf16: mixed precision (a bf16 compute copy)
  params_.bind(order, options.dtype, options.device, options.seed, units, storage,
               options.on_init);
}

std::size_t GPT::embedding_unit() const {
  SCALELAB_CHECK(has_embedding(), "this stage has no embedding");
  return 0;
}
std::size_t GPT::block_unit(int i) const {
  SCALELAB_CHECK(first_ <= i && i < last_, "block {} outside this model's [{}, {})", i, first_,
                 last_);
  return (has_embedding() ? 1 : 0) + static_cast<std::size_t>(i - first_);
}
std::size_t GPT::head_unit() const {
  SCALELAB_CHECK(has_head(), "this stage has no head");
  return params_.units().size() - 1;
}

void GPT::need_values(std::size_t u) const {
  // What the layers read: in mixed precision the bf16 compute copy (ZeRO-3 in bf16 binds that
  // alone, per unit), else the values.
  SCALELAB_CHECK(params_.compute_bound(u), "the {} of unit '{}' are released: gather them "
                 "before its forward or backward (ZeRO-3)",
                 params_.mixed() ? "bf16 compute weights" : "values", params_.units()[u].name);
}

void GPT::need_grads(std::size_t u) {
  if (!params_.grads_bound(u)) params_.bind_grads(u);
}

const Tensor& GPT::head_weight() const {
  return lm_head ? lm_head->compute_value() : embedding->wte.compute_value();
}
Tensor& GPT::head_grad() { return lm_head ? lm_head->grad : embedding->wte.grad; }

void GPT::add_block_policy(std::shared_ptr<BlockPolicy> policy) {
  if (!policy_) {
    policy_ = std::move(policy);
    return;
  }
  auto list = std::make_shared<PolicyList>();
  list->add(policy_);
  list->add(std::move(policy));
  policy_ = std::move(list);
}

void GPT::set_mappings(std::shared_ptr<const Mappings> mappings) {
  SCALELAB_CHECK(mappings != nullptr, "set_mappings(nullptr): use Mappings::single_device()");
  mappings_ = std::move(mappings);
  for (auto& b : blocks_) b->mappings = mappings_.get();
}

const Mappings& GPT::mappings() const {
  return mappings_ ? *mappings_ : Mappings::single_device();
}

void GPT::check_vocabulary_mappings() const {
  SCALELAB_CHECK(!vocab_sharded() || mappings().splits_vocabulary(),
                 "this model holds vocabulary rows [{}, {}) of {}: its embedding and head need "
                 "vocabulary-parallel mappings (set_mappings, lab 07)", vocab_lo_, vocab_hi_,
                 config_.vocab_size);
}

Tensor GPT::embed(const Tensor& tokens, GPTActivations& acts) const {
  exec_log::record_piece("embed", this);  // what a grader sees run (lab 08)
  SCALELAB_CHECK(has_embedding(), "embed() on a stage without the embedding");
  SCALELAB_CHECK(tokens.dim() == 2 && tokens.size(1) <= config_.block_size,
                 "tokens {} longer than the context of {}", tokens.str(), config_.block_size);
  check_vocabulary_mappings();
  const std::size_t u = embedding_unit();
  if (policy_) policy_->before_unit_forward(*this, u);  // e.g. ZeRO-3: gather the unit
  need_values(u);
  acts.tokens = tokens;
  acts.seq_len = tokens.size(1);
  // (B, T, C) on every rank, then the rows this rank keeps (all of them unless sequence parallel)
  const Tensor x = mappings().embedding_forward(embedding->wte.compute_value(), vocab_lo_,
                                                embedding->wpe.compute_value(), tokens);
  Tensor rows = mappings().split_rows(x);
  if (policy_) policy_->after_unit_forward(*this, u);  // e.g. ZeRO-3: free it
  return rows;
}

Tensor GPT::forward_blocks(const Tensor& x, GPTActivations& acts) const {
  exec_log::record_piece("forward_blocks", this);  // what a grader sees run (lab 08)
  if (x.dim() == 3) acts.seq_len = x.size(1);  // rows (N/tp, C): embed() said the length
  acts.inputs.assign(blocks_.size(), Tensor());
  acts.blocks.assign(blocks_.size(), BlockActivations());
  acts.aux_loss = Scalar();
  Tensor h = x;
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const std::size_t u = block_unit(first_ + static_cast<int>(i));
    if (policy_) policy_->before_unit_forward(*this, u);
    need_values(u);
    acts.inputs[i] = h;
    h = blocks_[i]->forward(h, acts.blocks[i], acts.seq_len);
    acts.aux_loss += acts.blocks[i].moe.aux;  // 0 for a dense block
    if (policy_) {  // e.g. checkpointing: drop what the block saved, keep its input
      policy_->after_forward(*blocks_[i], acts.inputs[i], acts.blocks[i], acts.seq_len);
      policy_->after_unit_forward(*this, u);
    }
  }
  return h;
}

Scalar GPT::head_forward(const Tensor& x, const Tensor& targets, GPTActivations& acts) const {
  exec_log::record_piece("head_forward", this);  // what a grader sees run (lab 08)
  SCALELAB_CHECK(has_head(), "head_forward() on a stage without the head");
  check_vocabulary_mappings();
  const int64_t C = x.size(-1), n = x.numel() / C;  // this rank's rows (n = N unless sp)
  const int64_t N = targets.numel(), V = vocab_hi_ - vocab_lo_;  // V: this rank's columns
  const DType dt = params_.compute_dtype();  // bf16 activations in mixed precision
  const Device dev = options_.device;
  if (policy_) policy_->before_unit_forward(*this, head_unit());
  need_values(head_unit());
  if (!lm_head) need_values(embedding_unit());  // the tied wte
  HeadActivations& h = acts.head;
  h.x = x;
  h.targets = targets;
  h.lnf = Tensor::empty(x.shape(), dt, dev);
  h.lnf_mean = Tensor::empty({n}, ops::stats_dtype(dt), dev);  // f32 for bf16
  h.lnf_rstd = Tensor::empty({n}, ops::stats_dtype(dt), dev);
  ln_f->forward(h.lnf, h.lnf_mean, h.lnf_rstd, x);
  // Split by vocabulary, the (tied) head is a column-parallel Linear: enter its region (f, or
  // the gather of the rows), then this rank's V columns of the logits
  const bool parallel = mappings().splits_vocabulary();
  const Tensor in = (parallel ? mappings().enter(h.lnf) : h.lnf).view({N, C});
  h.probs = Tensor::empty({N, V}, dt, dev);
  ops::matmul(h.probs, in, head_weight(), false, true);  // logits = lnf @ W^T
  // the loss; the logits become the softmax's columns (a new tensor, or in place)
  const Scalar loss = mappings().cross_entropy(h.probs, targets.view({N}), vocab_lo_);
  if (policy_) {
    policy_->after_head_forward(*this, h);  // e.g. a divergence report records it
    policy_->after_unit_forward(*this, head_unit());
  }
  return loss;
}

Tensor GPT::head_backward(GPTActivations& acts, double loss_scale) {
  exec_log::record_piece("head_backward", this);  // what a grader sees run (lab 08)
  HeadActivations& h = acts.head;
  SCALELAB_CHECK(h.probs.defined(), "head_backward() without head_forward()");
  acts.loss_scale = loss_scale;  // the blocks' balancing losses are scaled alike
  const int64_t C = h.x.size(-1), N = h.targets.numel();
  const DType dt = params_.compute_dtype();
  const Device dev = options_.device;
  if (policy_) policy_->before_unit_backward(*this, head_unit());
  need_values(head_unit());
  need_grads(head_unit());
  if (!lm_head) {  // the head writes the tied wte's gradient first
    need_values(embedding_unit());
    need_grads(embedding_unit());
  }
  // the probabilities become the logits' gradient (N, V): in place, or a new tensor
  mappings().cross_entropy_backward(h.probs, h.targets.view({N}), vocab_lo_, loss_scale);
  const bool parallel = mappings().splits_vocabulary();
  Tensor dlnf = Tensor::empty({N, C}, dt, dev);  // set by the matmul below (beta 0)
  {
    // sequence parallel: gathered again
    const Tensor in = (parallel ? mappings().enter(h.lnf) : h.lnf).view({N, C});
    ops::matmul(dlnf, h.probs, head_weight());                       // dlnf = dlogits @ W
    ops::matmul(head_grad(), h.probs, in, true, false, 1.0, 1.0);    // dW += dlogits^T lnf
  }
  h.probs = Tensor();  // used up: the (N, V) logits' gradient is the biggest tensor here
  if (lm_head) fire({&*lm_head});
  // f's backward: every rank's vocabulary columns contribute to dlnf (or the reduce-scatter)
  const Tensor dlnf_rows = (parallel ? mappings().enter_backward(dlnf) : dlnf).view(h.x.shape());
  Tensor dx = Tensor::zeros(h.x.shape(), dt, dev);
  mappings().layernorm_backward(*ln_f, dx, dlnf_rows, h.x, h.lnf_mean, h.lnf_rstd, Tensor());
  fire(ln_f->parameters());
  h.reset();
  if (policy_) policy_->after_unit_backward(*this, head_unit());  // e.g. ZeRO-2: reduce it
  return dx;
}

Tensor GPT::backward_blocks(const Tensor& dout, GPTActivations& acts) {
  exec_log::record_piece("backward_blocks", this);  // what a grader sees run (lab 08)
  SCALELAB_CHECK(acts.blocks.size() == blocks_.size() && acts.inputs.size() == blocks_.size(),
                 "backward_blocks() with activations of {} blocks; this model has {} (run "
                 "forward_blocks first)", acts.blocks.size(), blocks_.size());
  const BackwardHook* hook = hook_ ? &hook_ : nullptr;
  Tensor d = dout;
  for (int i = static_cast<int>(blocks_.size()) - 1; i >= 0; --i) {
    const std::size_t u = block_unit(first_ + i);
    if (policy_) policy_->before_unit_backward(*this, u);  // e.g. ZeRO-3: gather the unit
    need_values(u);
    need_grads(u);
    if (policy_)  // e.g. checkpointing: recompute what the block's backward reads
      policy_->before_backward(*blocks_[i], acts.inputs[i], acts.blocks[i], acts.seq_len);
    d = blocks_[i]->backward(d, acts.inputs[i], acts.blocks[i], hook, acts.seq_len,
                             acts.loss_scale);
    acts.blocks[i].reset();  // used up: memory falls as backward proceeds
    acts.inputs[i] = Tensor();
    if (policy_) policy_->after_unit_backward(*this, u);  // e.g. ZeRO-2/3: reduce its gradient
  }
  acts.blocks.clear();
  acts.inputs.clear();
  return d;
}

void GPT::embed_backward(const Tensor& dx, GPTActivations& acts) {
  exec_log::record_piece("embed_backward", this);  // what a grader sees run (lab 08)
  SCALELAB_CHECK(acts.tokens.defined(), "embed_backward() without embed()");
  const std::size_t u = embedding_unit();
  if (policy_) policy_->before_unit_backward(*this, u);
  need_grads(u);
  const Tensor& tokens = acts.tokens;
  // every row's gradient (sequence parallel: all-gathered), as (B, T, C)
  const Tensor d = mappings().split_rows_backward(dx).view(
      {tokens.size(0), tokens.size(1), config_.n_embd});
  mappings().embedding_backward(embedding->wte.grad, vocab_lo_, embedding->wpe.grad, d, tokens);
  acts.tokens = Tensor();
  fire(embedding->parameters());  // wte is final only now: the head wrote to it first
  if (policy_) policy_->after_unit_backward(*this, u);
}

Scalar GPT::forward(const Tensor& tokens, const Tensor& targets, GPTActivations& acts) {
  SCALELAB_CHECK(has_embedding() && has_head(), "forward() needs the whole model; a stage "
                 "runs embed / forward_blocks / head_forward");
  SCALELAB_CHECK(targets.shape() == tokens.shape(), "targets {} vs tokens {}", targets.str(),
                 tokens.str());
  trace::Scope scope("forward");
  acts.reset();  // a second forward into the same object replaces the first
  const Scalar lm = head_forward(forward_blocks(embed(tokens, acts), acts), targets, acts);
  // a dense model adds nothing (its aux_loss is a host 0, never a tensor: asked without a read)
  return acts.aux_loss.tensor().defined() ? lm + acts.aux_loss : lm;
}

void GPT::backward(GPTActivations& acts, double loss_scale) {
  trace::Scope scope("backward");
  Tensor dx = backward_blocks(head_backward(acts, loss_scale), acts);
  embed_backward(dx, acts);
}

Tensor GPT::logits(const Tensor& tokens) {
  SCALELAB_CHECK(has_embedding() && has_head() && !vocab_sharded(),
                 "logits() needs the whole model and vocabulary");
  const int64_t B = tokens.size(0), T = tokens.size(1), C = config_.n_embd,
                V = config_.vocab_size;
  // An evaluation pass: every unit is run between the policy's unit hooks, as in a training
  // forward (a ZeRO-3 policy gathers each unit before it and frees it after, so a sharded model
  // can be evaluated), with evaluating() true so that a policy can tell it from a training
  // forward. No block hook: each block's activations are dropped as soon as it is done, so there
  // is nothing for a checkpointing policy to drop or recompute.
  struct Evaluating {  // restored on the way out, an exception included
    bool& flag;
    const bool was;
    ~Evaluating() { flag = was; }
  } evaluating{evaluating_, evaluating_};
  evaluating_ = true;
  GPTActivations scratch;
  Tensor x = embed(tokens, scratch);  // the embedding unit's hooks run inside
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const std::size_t u = block_unit(first_ + static_cast<int>(i));
    if (policy_) policy_->before_unit_forward(*this, u);  // e.g. ZeRO-3: gather the unit
    need_values(u);
    {
      BlockActivations a;  // freed here, not kept for a backward
      x = blocks_[i]->forward(x, a);
    }
    if (policy_) policy_->after_unit_forward(*this, u);  // e.g. ZeRO-3: free it
  }
  if (policy_) policy_->before_unit_forward(*this, head_unit());
  need_values(head_unit());
  if (!lm_head) need_values(embedding_unit());  // the tied wte
  const DType dt = params_.compute_dtype();
  Tensor lnf = Tensor::empty({B, T, C}, dt, options_.device);
  Tensor mean = Tensor::empty({B * T}, ops::stats_dtype(dt), options_.device);
  Tensor rstd = Tensor::empty({B * T}, ops::stats_dtype(dt), options_.device);
  ln_f->forward(lnf, mean, rstd, x);
  Tensor out = Tensor::empty({B, T, V}, dt, options_.device);
  Tensor out2 = out.view({B * T, V});
  ops::matmul(out2, lnf.view({B * T, C}), head_weight(), false, true);
  if (policy_) policy_->after_unit_forward(*this, head_unit());
  return out;
}

Scalar GPT::loss(const Tensor& tokens, const Tensor& targets) {
  const int64_t N = tokens.numel(), V = config_.vocab_size;
  Tensor lg = logits(tokens).view({N, V});
  Tensor probs = Tensor::empty({N, V}, lg.dtype(), options_.device);
  Tensor losses = Tensor::empty({N}, ops::stats_dtype(lg.dtype()), options_.device);
  ops::cross_entropy_forward(losses, probs, lg, targets.view({N}));
  Tensor mean = Tensor::empty({1}, DType::f64, options_.device);
  ops::sum_into(mean, losses, static_cast<double>(N));  // the bits of ops::sum(losses) / N
  return Scalar(mean);
}

std::size_t GPTActivations::nbytes() const {
  std::size_t n = 0;
  for (const BlockActivations& b : blocks) n += b.nbytes();
  for (const Tensor& t : inputs)
    if (t.defined()) n += t.nbytes();
  for (const Tensor* t : {&head.x, &head.lnf, &head.lnf_mean, &head.lnf_rstd, &head.probs})
    if (t->defined()) n += t->nbytes();
  return n;
}

std::vector<int32_t> generate(GPT& model, std::vector<int32_t> prompt, int n, double temperature,
                              uint64_t seed) {
  SCALELAB_CHECK(!prompt.empty(), "generate() needs a prompt of at least one token");
  std::mt19937_64 rng(seed);
  const int64_t ctx = model.config().block_size, V = model.config().vocab_size;
  for (int i = 0; i < n; ++i) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(prompt.size()) - ctx);
    const int64_t T = static_cast<int64_t>(prompt.size()) - start;
    Tensor tokens = Tensor::empty({1, T}, DType::i32);
    for (int64_t t = 0; t < T; ++t) tokens.data<int32_t>()[t] = prompt[start + t];
    Tensor lg = model.logits(tokens.to(model.device())).to(Device::cpu());
    std::vector<double> row(V);
    for (int64_t v = 0; v < V; ++v) row[v] = lg.item((T - 1) * V + v);
    int32_t next = 0;
    if (temperature <= 0) {
      next = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    } else {
      const double mx = *std::max_element(row.begin(), row.end());
      double total = 0;
      for (double& r : row) total += (r = std::exp((r - mx) / temperature));
      double u = std::uniform_real_distribution<double>(0.0, total)(rng);
      next = static_cast<int32_t>(V - 1);
      for (int64_t v = 0; v < V; ++v) {
        if ((u -= row[v]) <= 0) {
          next = static_cast<int32_t>(v);
          break;
        }
      }
    }
    prompt.push_back(next);
  }
  return prompt;
}

}  // namespace scalelab::nn
