#pragma once
/// @file gpt.hpp
/// GPT (nanoGPT / GPT-2 shape): token + position embedding, n_layer Blocks, a final LayerNorm and a
/// LM head tied to the token embedding, trained with cross-entropy.
///
/// Built for the later labs:
///  - parameters and gradients are views into one flat buffer each (params().values()/grads()),
///    in a stable order: wte, wpe, blocks.0..., ln_f (and lm_head.weight if untied);
///  - set_backward_hook() is called as each layer's gradients become final (DDP overlap);
///  - activations belong to a forward CALL, not to the model: every forward fills a
///    GPTActivations the caller owns and backward consumes it (frees each block's activations once
///    its backward is done). A pipeline stage keeps one per micro-batch in flight; checkpointing
///    resets a block's entry and calls block(i).forward(acts.inputs[i], acts.blocks[i]) again;
///  - a GPT can hold blocks [first_block, last_block) only (a pipeline stage): the embedding lives
///    on the stage with block 0, the head on the stage with the last block;
///  - tp_size > 1 keeps a 1/tp share of every block's heads and MLP, vocab_lo/hi a share of the
///    vocabulary (tensor parallel): the caller's mappings (set_mappings, mappings.hpp) say how
///    the shares talk; a block policy (set_block_policy) what is kept or recomputed, and what
///    happens around each unit (ZeRO's gathers and gradient reductions).
///
///   nn::GPT model(model_config("tiny"), {.device = Device::cpu(), .seed = 1});
///   nn::GPTActivations acts;
///   double loss = model.forward(tokens, targets, acts);  // tokens, targets (B, T) i32
///   model.zero_grad(); model.backward(acts);              // grads in model.params().grads()
///
/// A plain training loop may use forward(tokens, targets) / backward() instead: they use one
/// GPTActivations owned by the model (activations()), for code that has one batch in flight.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "common/model_config.hpp"
#include "common/nn/block.hpp"
#include "common/nn/embedding.hpp"
#include "common/nn/layernorm.hpp"
#include "common/nn/mappings.hpp"
#include "common/scalar.hpp"

namespace scalelab::nn {

/// How to build a GPT: where and in what it lives, and which share of the single-device model it
/// holds (a pipeline stage's blocks, a tensor-parallel rank's slices, a vocabulary range). Every
/// parameter is drawn whole from (seed, name) and then cut, so any share holds exactly the
/// single-device values: every parallel technique is checked against the one-device model.
struct GPTOptions {
  DType dtype = DType::f32;        ///< parameters, gradients, optimizer state (the master copy)
  Device device = Device::cpu();   ///< where parameters and activations live
  uint64_t seed = 1337;            ///< with a parameter's name, the seed of its initial values
  int first_block = 0;             ///< the first block this model holds (a pipeline stage)
  int last_block = -1;             ///< one past the last block it holds (-1: n_layer)
  int tp_rank = 0;                 ///< this rank's index in its tensor-parallel group
  int tp_size = 1;                 ///< the group's size: blocks keep a 1/tp_size share
  /// Called on each block right after it is made and before any parameter is bound: it may set
  /// which slice of each weight the block keeps (Parameter::shard), e.g. lab 07's head_shards,
  /// column_shard and row_shard for tp_rank of tp_size. Unset: the library's even cut.
  std::function<void(Block&)> cut_block = {};
  /// The vocabulary rows [vocab_lo, vocab_hi) of wte (and of a last stage's lm_head.weight copy)
  /// this model keeps (-1: V, the whole vocabulary). Drawn whole from (seed, name) and cut, as
  /// the blocks' tp shards are. A sharded model embeds and computes its loss through
  /// vocabulary-parallel mappings (GPT::set_mappings, lab 07).
  int64_t vocab_lo = 0;
  int64_t vocab_hi = -1;  ///< one past the last vocabulary row kept (-1: V); see vocab_lo
  /// Flat buffers (default), or per-unit value / gradient storage and padding for ZeRO (see
  /// ParameterSet). Units: "embedding" (wte, wpe), "blocks.i", "head" (ln_f, and lm_head.weight
  /// on a stage without the embedding).
  StorageOptions storage = {};
  /// Called with each unit's initial values as they are drawn (per-unit values: the only time a
  /// rank holds them all; keep your shard here).
  std::function<void(const Unit&, const Tensor& values)> on_init = {};
  /// The dtype the model computes in. f32 (default): everything in `dtype`. bf16: mixed
  /// precision -- `dtype` (f32) master weights, gradients and optimizer state; a bf16 compute
  /// copy of the weights (ParameterSet::compute_values) and bf16 activations; LayerNorm
  /// statistics and the loss f32 (common/ops/ops.hpp's rules R1-R8).
  DType compute_dtype = DType::f32;
  /// Attention as one fused op (ops::flash_attention_*: one log-sum-exp per row kept instead of
  /// the (T, T) probabilities) instead of the written-out one. Same result within rounding; the
  /// activation formulas of labs 05, 06 and 10 count the written-out attention.
  bool flash_attention = false;
  /// Mixture of experts (lab 12): which blocks replace their MLP by an MoE (nn::MoE), how they
  /// route (the model config's ModelConfig::moe unless set), their routing groups and this
  /// model's experts (expert parallel: E / ep_size of them). A dense config and no
  /// moe.config.n_expert: no MoE block. Not with tp_size > 1.
  MoEOptions moe = {};
};

class GPT;
struct HeadActivations;

/// What a policy may do around each unit of the model (the embedding, each block, the head: the
/// units of params().units()) and around each block's activations. The model's own pieces call
/// it (embed, forward_blocks, head_forward, head_backward, backward_blocks, embed_backward), so
/// every driver and every pipeline schedule gets it:
///
///   embed          before_unit_forward(embedding)  ... after_unit_forward(embedding)
///   forward_blocks before_unit_forward(block i)  block i forward  after_forward(block i)
///                  after_unit_forward(block i)
///   head_forward   before_unit_forward(head)  ... after_unit_forward(head)   (a head tied to
///                  wte on the same model also reads the embedding unit's values)
///   head_backward  before_unit_backward(head)  ... after_unit_backward(head)
///   backward_blocks before_unit_backward(block i)  before_backward(block i)  block i backward
///                  after_unit_backward(block i)
///   embed_backward before_unit_backward(embedding)  ... after_unit_backward(embedding)
///
///   logits / loss  (evaluation: logits, loss, generate) the same unit hooks as a training
///                  forward, before_unit_forward(u) ... after_unit_forward(u) for the embedding,
///                  each block and the head, and no block hook: an evaluation keeps nothing for a
///                  backward, so there is nothing to drop or recompute. model.evaluating() is
///                  true inside them, so a policy can tell an evaluation pass from a training
///                  forward (no backward follows it: nothing to keep or prefetch for one).
///
/// The unit hooks come first and last, so what a unit hook provides (ZeRO-3's gathered values) is
/// there for the block hooks (checkpointing's recomputation). Activation checkpointing is a
/// block policy (drop a block's activations after its forward, recompute them from the input
/// before its backward); ZeRO-2 a unit policy (reduce a unit's gradient once its backward is
/// done), ZeRO-3 too (gather a unit before its forward and backward, free it after). Several
/// compose (PolicyList, GPT::add_block_policy). The default keeps everything and does nothing.
/// A policy may keep state: the model calls it from its const forward pieces all the same.
class BlockPolicy {
 public:
  virtual ~BlockPolicy() = default;
  /// After block `block` filled `acts` from `input`: may drop what the backward can recompute.
  virtual void after_forward(const Block& /*block*/, const Tensor& /*input*/,
                             BlockActivations& /*acts*/, int64_t /*seq_len*/) {}
  /// Right before the block's backward reads `acts`: may refill them from `input`.
  virtual void before_backward(const Block& /*block*/, const Tensor& /*input*/,
                               BlockActivations& /*acts*/, int64_t /*seq_len*/) {}
  /// Before unit `unit` of `model` computes its forward (`unit`: the index in
  /// model.params().units(): GPT::embedding_unit, block_unit, head_unit), e.g. gather it.
  virtual void before_unit_forward(const GPT& /*model*/, std::size_t /*unit*/) {}
  /// After the unit's forward, e.g. free its gathered values.
  virtual void after_unit_forward(const GPT& /*model*/, std::size_t /*unit*/) {}
  /// Before the unit's backward, e.g. gather it again.
  virtual void before_unit_backward(const GPT& /*model*/, std::size_t /*unit*/) {}
  /// After the unit's backward has made its gradients final, e.g. reduce and release them.
  virtual void after_unit_backward(const GPT& /*model*/, std::size_t /*unit*/) {}
  /// After head_forward filled `acts` (ln_f's input, output and statistics, the softmax of the
  /// logits), before its after_unit_forward: an observer's view of what the head computed
  /// (train::DivergenceRecorder records it). Training forwards only.
  virtual void after_head_forward(const GPT& /*model*/, const HeadActivations& /*acts*/) {}
};

/// Several policies as one: every hook calls each policy in the order they were added.
class PolicyList final : public BlockPolicy {
 public:
  PolicyList() = default;
  /// The policies, in the order their hooks run.
  explicit PolicyList(std::vector<std::shared_ptr<BlockPolicy>> policies)
      : list_(std::move(policies)) {}
  /// Appends `p` (its hooks run after the others').
  void add(std::shared_ptr<BlockPolicy> p) { list_.push_back(std::move(p)); }
  /// The policies, in order.
  const std::vector<std::shared_ptr<BlockPolicy>>& policies() const { return list_; }
  void after_forward(const Block& b, const Tensor& in, BlockActivations& a, int64_t t) override {
    for (auto& p : list_) p->after_forward(b, in, a, t);
  }
  void before_backward(const Block& b, const Tensor& in, BlockActivations& a,
                       int64_t t) override {
    for (auto& p : list_) p->before_backward(b, in, a, t);
  }
  void before_unit_forward(const GPT& m, std::size_t u) override {
    for (auto& p : list_) p->before_unit_forward(m, u);
  }
  void after_unit_forward(const GPT& m, std::size_t u) override {
    for (auto& p : list_) p->after_unit_forward(m, u);
  }
  void before_unit_backward(const GPT& m, std::size_t u) override {
    for (auto& p : list_) p->before_unit_backward(m, u);
  }
  void after_unit_backward(const GPT& m, std::size_t u) override {
    for (auto& p : list_) p->after_unit_backward(m, u);
  }
  void after_head_forward(const GPT& m, const HeadActivations& a) override {
    for (auto& p : list_) p->after_head_forward(m, a);
  }

 private:
  std::vector<std::shared_ptr<BlockPolicy>> list_;
};

/// What the head saves for backward.
struct HeadActivations {
  /// (B, T, C) input of ln_f (the last block's output); sequence parallel: this rank's rows
  /// (N/tp, C).
  Tensor x;
  Tensor lnf;       ///< ln_f's output, the shape of x
  Tensor lnf_mean;  ///< ln_f's per-row mean (the statistics dtype: fp32 for bf16)
  Tensor lnf_rstd;  ///< ln_f's per-row 1/std
  Tensor probs;     ///< (B*T, V) softmax of the logits (V: this rank's columns)
  Tensor targets;   ///< (B, T) i32
  /// Frees everything.
  void reset() { *this = HeadActivations{}; }
};

/// Everything one forward of a GPT (or of a stage: blocks [first_block, last_block)) saves for
/// its backward. Entry i of `inputs` and `blocks` belongs to block first_block + i.
struct GPTActivations {
  Tensor tokens;                         ///< (B, T) i32, saved by embed (first stage)
  int64_t seq_len = 0;                   ///< T: set by embed and by forward_blocks on (B, T, C)
  std::vector<Tensor> inputs;            ///< (B, T, C) the input of each block
  std::vector<BlockActivations> blocks;  ///< what each block saved (reset: checkpointed)
  HeadActivations head;                  ///< saved by head_forward (last stage)
  /// The MoE blocks' balancing losses (coefficients included), summed by forward_blocks on
  /// their device: forward() returns the language-model loss plus this (a host 0 for a dense
  /// model, which adds nothing).
  Scalar aux_loss;
  /// The loss scale of the backward (set by head_backward): the balancing losses' gradients
  /// in backward_blocks are scaled alike.
  double loss_scale = 1.0;
  /// Frees everything.
  void reset() { *this = GPTActivations{}; }
  /// Bytes held now: every block's activations and input, and the head's (its input, ln_f's
  /// output and statistics, the probabilities). Tokens are not counted.
  std::size_t nbytes() const;
};

/// The one GPT of every lab (GPT-2 shape, llm.c style: explicit forward and backward). Labs
/// 02-06 train it whole; labs 07-10 build a share of it (GPTOptions) and plug their technique in
/// at its hook points (set_mappings, set_block_policy, set_backward_hook) instead of copying it.
/// Not copyable: parameters live in one ParameterSet the optimizer points into.
class GPT {
 public:
  /// Draws every parameter of `config` whole from (options.seed, name) and keeps this model's
  /// share of it (options).
  explicit GPT(const ModelConfig& config, const GPTOptions& options = {});
  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;

  /// The shape of the whole model (layers, heads, widths, vocabulary, context).
  const ModelConfig& config() const { return config_; }
  /// How this model was built.
  const GPTOptions& options() const { return options_; }
  /// Where its parameters and activations live.
  Device device() const { return options_.device; }
  /// True on the stage holding block 0: it embeds the tokens.
  bool has_embedding() const { return first_ == 0; }
  /// True on the stage holding the last block: ln_f, the logits and the loss.
  bool has_head() const { return last_ == config_.n_layer; }
  /// The global index of its first block.
  int first_block() const { return first_; }
  /// One past the global index of its last block.
  int last_block() const { return last_; }

  /// Its parameters: flat (or per-unit) values and gradients, and each parameter's views.
  ParameterSet& params() { return params_; }
  /// The dtype activations have: bf16 in mixed precision, else the parameters' dtype.
  DType compute_dtype() const { return params_.compute_dtype(); }
  /// Every parameter, in the stable order (wte, wpe, blocks..., ln_f, lm_head.weight).
  const std::vector<Parameter*>& parameters() const { return params_.list(); }
  /// Elements this model holds (its share only: what a rank keeps).
  int64_t num_parameters() const { return params_.numel(); }
  /// Sets every gradient to zero (backward accumulates).
  void zero_grad() { params_.zero_grad(); }
  /// Called during backward with the parameters whose gradients just became final (lab 04's
  /// overlap starts their all-reduce there; lab 09's ZeRO-2 reduces a finished unit).
  void set_backward_hook(BackwardHook hook) { hook_ = std::move(hook); }

  // ---- the whole model (a GPT holding every block) ----
  /// Mean cross-entropy of predicting targets (B, T) from tokens (B, T), plus the MoE blocks'
  /// balancing losses (acts.aux_loss; 0 for a dense model); fills `acts`. The loss stays on the
  /// model's device (a Scalar): `double loss = model.forward(x, y)` reads it to the host there,
  /// a `Scalar` keeps it until the step prints it.
  Scalar forward(const Tensor& tokens, const Tensor& targets, GPTActivations& acts);
  /// Gradients of loss_scale * (the mean loss of the forward that filled `acts`), accumulated
  /// (+=). Consumes `acts`: each part is freed as soon as its backward is done.
  void backward(GPTActivations& acts, double loss_scale = 1.0);
  /// The same with the model's own GPTActivations (activations()): one batch in flight.
  Scalar forward(const Tensor& tokens, const Tensor& targets) {
    return forward(tokens, targets, acts_);
  }
  /// The backward of forward(tokens, targets), with the model's own GPTActivations.
  void backward(double loss_scale = 1.0) { backward(acts_, loss_scale); }

  // ---- the pieces (pipeline stages, checkpointing, tensor parallel drivers) ----
  // The drivers (forward/backward above, lab 08's executor, lab 09's trainers) call these; what
  // crosses ranks inside them is the mappings' (set_mappings), what is kept or recomputed the
  // block policy's (set_block_policy).
  /// The embeddings of tokens (B, T): (B, T, C), or this rank's rows of them (the mappings'
  /// split_rows: sequence parallel); saves the tokens in acts. Needs has_embedding().
  Tensor embed(const Tensor& tokens, GPTActivations& acts) const;
  /// Runs blocks [first, last) on x (this rank's rows of (B, T, C)), saving each block's input
  /// and activations in acts (as the block policy says); returns the output of the last one.
  Tensor forward_blocks(const Tensor& x, GPTActivations& acts) const;
  /// ln_f, logits, loss: the mean cross-entropy; saves the head's activations. Needs has_head().
  Scalar head_forward(const Tensor& x, const Tensor& targets, GPTActivations& acts) const;
  /// Returns the gradient w.r.t. the head's input x of loss_scale * mean loss; accumulates the
  /// head's gradients and frees acts.head.
  Tensor head_backward(GPTActivations& acts, double loss_scale = 1.0);
  /// Back through blocks [first, last) from the gradient of their output, freeing each block's
  /// activations and input after its backward; returns the gradient w.r.t. their input.
  Tensor backward_blocks(const Tensor& dout, GPTActivations& acts);
  /// Accumulates wte/wpe gradients from the gradient of the embeddings.
  void embed_backward(const Tensor& dx, GPTActivations& acts);

  // ---- hook points: where parallel techniques plug in ----
  /// The operators the blocks, the embedding and the head call where a parallel technique
  /// communicates (mappings.hpp): lab 07's tensor and sequence parallelism. A model whose
  /// vocabulary is sharded (GPTOptions::vocab_lo/hi) needs vocabulary-parallel ones.
  void set_mappings(std::shared_ptr<const Mappings> mappings);
  /// The mappings in use (the one-device default until set_mappings).
  const Mappings& mappings() const;
  /// The mappings set_mappings gave (null: the single device's), to wrap them in others'.
  std::shared_ptr<const Mappings> shared_mappings() const { return mappings_; }
  /// What the pieces do around each unit and block (BlockPolicy): e.g. checkpointing, ZeRO-2/3.
  /// set_block_policy replaces the policy (nullptr: none); add_block_policy appends one to it
  /// (the policies run in the order added: PolicyList).
  void set_block_policy(std::shared_ptr<BlockPolicy> policy) { policy_ = std::move(policy); }
  /// Appends `policy` to the policy in use (a PolicyList when there are several).
  void add_block_policy(std::shared_ptr<BlockPolicy> policy);
  /// The block policy in use (null: keep everything).
  BlockPolicy* block_policy() const { return policy_.get(); }
  /// The policy set_block_policy gave (null: none), to put another before it in a PolicyList.
  std::shared_ptr<BlockPolicy> shared_block_policy() const { return policy_; }

  // ---- units (ZeRO) ----
  /// Unit index of the embedding / of block i / of the head in params().units().
  std::size_t embedding_unit() const;
  /// Unit index of block i (global index) in params().units().
  std::size_t block_unit(int i) const;
  /// Unit index of the head (ln_f, and a last stage's lm_head.weight).
  std::size_t head_unit() const;

  /// Logits (B, T, V) of tokens (B, T), keeping no activations (generation, evaluation). An
  /// evaluation pass: the policy's unit hooks run around each unit as in a training forward
  /// (ZeRO-3 gathers a unit before it and frees it after; collective there), with evaluating()
  /// true; the block hooks do not run (no activations are kept for a backward).
  Tensor logits(const Tensor& tokens);
  /// Mean loss of tokens -> targets without keeping activations (evaluation): logits(), then the
  /// cross-entropy. On the model's device, as forward's: an evaluation over several batches
  /// adds them there and reads the sum once.
  Scalar loss(const Tensor& tokens, const Tensor& targets);
  /// True while logits() / loss() (and so generate()) run: the hooks a policy sees then belong
  /// to an evaluation pass, which no backward follows; false in the six training pieces.
  bool evaluating() const { return evaluating_; }

  /// Block by global index (first_block() <= i < last_block()).
  Block& block(int i) { return *blocks_.at(i - first_); }
  /// The model's own activations: filled by forward(tokens, targets), used by backward().
  GPTActivations& activations() { return acts_; }
  /// Releases the model's own activations.
  void free_activations() { acts_.reset(); }
  /// Bytes of the model's own activations held right now (GPTActivations::nbytes).
  std::size_t activation_bytes() const { return acts_.nbytes(); }

  std::optional<Embedding> embedding;           ///< wte, wpe: only with has_embedding()
  std::vector<std::unique_ptr<Block>> blocks_;  ///< blocks [first_block, last_block)
  std::optional<LayerNorm> ln_f;                ///< only with has_head()
  /// The tied head's own copy of wte, only on a head stage without the embedding.
  std::optional<Parameter> lm_head;

  /// The vocabulary rows [lo, hi) of wte / lm_head.weight this model keeps (GPTOptions).
  int64_t vocab_lo() const { return vocab_lo_; }
  /// One past the last vocabulary row this model keeps.
  int64_t vocab_hi() const { return vocab_hi_; }
  /// True when it keeps only part of the vocabulary (vocabulary parallel).
  bool vocab_sharded() const { return vocab_hi_ - vocab_lo_ != config_.vocab_size; }

 private:
  /// The head's weight (V, C) (or this model's vocabulary rows): the tied wte or lm_head.weight.
  const Tensor& head_weight() const;
  Tensor& head_grad();
  void fire(const std::vector<Parameter*>& done) {
    if (hook_) hook_(done);
  }
  /// Checks what the layers read of unit u is there (ZeRO-3 gathers it before use): its values,
  /// or in mixed precision its bf16 compute copy (ParameterSet::compute_bound).
  void need_values(std::size_t u) const;
  /// Binds unit u's gradients (zeroed) if the set keeps them per unit and they are released.
  void need_grads(std::size_t u);
  /// A vocabulary-sharded model refuses the single-device mappings.
  void check_vocabulary_mappings() const;

 private:
  ModelConfig config_;
  GPTOptions options_;
  int first_ = 0, last_ = 0;
  int64_t vocab_lo_ = 0, vocab_hi_ = 0;
  ParameterSet params_;
  BackwardHook hook_;
  std::shared_ptr<const Mappings> mappings_;  // null: Mappings::single_device()
  std::shared_ptr<BlockPolicy> policy_;  // null: keep every block's activations, do nothing
  GPTActivations acts_;  // for forward(tokens, targets) / backward() only
  bool evaluating_ = false;  // inside logits() / loss(): see evaluating()
};

/// Generates `n` tokens after `prompt` by sampling from softmax(logits / temperature) with a
/// seeded generator (temperature 0: greedy). The model needs both ends (embedding and head).
std::vector<int32_t> generate(GPT& model, std::vector<int32_t> prompt, int n,
                              double temperature, uint64_t seed);

}  // namespace scalelab::nn
