#pragma once
/// @file zero.hpp
/// Lab 09 contract: ZeRO (Rajbhandari et al., arXiv 1910.02054). Data parallelism keeps a whole
/// copy of everything on every rank: parameters, gradients and AdamW's two moments, 16 bytes per
/// parameter in fp32. ZeRO keeps the data-parallel computation and removes the redundancy, one
/// piece at a time: each of the n ranks OWNS one shard (1/n) of the flat parameter layout and
/// keeps only its shard of
///   stage 1  the optimizer state (m, v),
///   stage 2  ... and the gradients,
///   stage 3  ... and the parameters themselves (gathered unit by unit when needed).
/// Every stage takes exactly the step DDP (lab 03) takes on the same global batch.
///
/// A Trainer owns its model (built with the storage its stage needs) and its optimizer, so the
/// program and the graders drive every stage the same way:
///
///   auto t = lab09::make_trainer(2, config, {.seed = 1}, comm);
///   double loss = t->forward_backward(global_batch);  // this rank's rows, reduced gradients
///   t->step(lr);                                        // AdamW on the shard, gather back
///
/// Core steps 1-3 (about 90 minutes), optional steps 4 (ZeRO-3) and 5: README.md.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common/comm/communicator.hpp"
#include "common/data/sampler.hpp"
#include "common/model_config.hpp"
#include "common/nn/gpt.hpp"
#include "common/optim/optim.hpp"

namespace scalelab::lab09 {

// ---- Step 1: shards ----------------------------------------------------------------------------

/// Step 1. Shard `rank` of `n` of a flat layout of `numel` elements. Every shard has the SAME
/// size (all_gather and reduce_scatter move n chunks of one size): the smallest size with which
/// n shards cover numel. The layout is padded at its end to n * size elements; shard r is the
/// r-th chunk of the padded layout, back to back, and [lo, hi) are its REAL elements, indices
/// of the unpadded layout: the last shards may be partly padding, and a shard that is all
/// padding has lo = hi = numel. The padding (fewer than n elements) belongs to no parameter and
/// is kept at zero. The same as the library's nn::shard_range, which the graders use as the
/// reference. Throws scalelab::UsageError when n < 1, rank is not in [0, n) or numel < 0.
nn::ShardRange shard_range(int64_t numel, int rank, int n);

// ---- the trainers (given: the base, stage 0, the factory) ----------------------------------------

/// Bytes a rank keeps BETWEEN steps (what the paper's formulas count), by kind. Read from the
/// tensors the trainer and its model hold; the program checks the total against the allocator.
/// In mixed precision (nn::GPTOptions::compute_dtype = bf16) `params` counts, at stages 0-2, the
/// fp32 master values AND their bf16 compute copy (6 bytes per parameter); at stage 3 the fp32
/// master shards (the gathered bf16 units are gone between steps: 4 bytes per shard element).
struct Held {
  std::size_t params = 0, grads = 0, optimizer = 0;
  std::size_t total() const { return params + grads + optimizer; }
};

/// Builds the model a trainer owns from the options the trainer sets (its storage, on_init).
/// Empty: an nn::GPT of the config. Lab 10 passes its 3D stage (a subclass of nn::GPT whose ends
/// are vocabulary parallel over a tp group), so ZeRO-2/3 run over its dp group unchanged.
using ModelBuilder = std::function<std::unique_ptr<nn::GPT>(const nn::GPTOptions&)>;

class Trainer {
 public:
  virtual ~Trainer() = default;
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// 0 (DDP), 1, 2 or 3.
  virtual int stage() const = 0;
  /// Forward and backward of this rank's rows of the GLOBAL batch (lab 03's local_batch), then
  /// the gradient reduction of the stage. Returns the loss of the whole global batch (the same
  /// on every rank). Collective. (A validation loss: model().loss(x, y) on every rank, at every
  /// stage; at stage 3 it is collective, the policy gathering each unit for it.)
  virtual double forward_backward(const data::Batch& global) = 0;
  /// One AdamW step at `lr` on what this rank owns, then whatever communication puts every
  /// rank back in the state the next forward needs. Collective.
  virtual void step(double lr) = 0;
  /// Every parameter, flat, in the model's order (numel() elements): for comparisons. Stage 3
  /// gathers them (collective on every stage, so callers need not know which one they have).
  virtual Tensor full_parameters() = 0;
  /// What this rank holds between steps.
  virtual Held held() const = 0;

  nn::GPT& model() { return *model_; }
  comm::Communicator& comm() { return comm_; }

 protected:
  explicit Trainer(comm::Communicator& comm) : comm_(comm) {}
  /// build(options), or an nn::GPT of `config` when build is empty.
  static std::unique_ptr<nn::GPT> make_model(const ModelConfig& config,
                                             const nn::GPTOptions& options,
                                             const ModelBuilder& build) {
    return build ? build(options) : std::make_unique<nn::GPT>(config, options);
  }
  comm::Communicator& comm_;
  std::unique_ptr<nn::GPT> model_;
};

/// Given. Stage 0: lab 03's DDP (one all-reduce of the flat gradient buffer, averaged) and a
/// whole AdamW on every rank. Every rank builds the model from the same seed.
class Ddp final : public Trainer {
 public:
  Ddp(const ModelConfig& config, nn::GPTOptions options, comm::Communicator& comm,
      optim::AdamWConfig adamw = {});
  int stage() const override { return 0; }
  double forward_backward(const data::Batch& global) override;
  void step(double lr) override;
  Tensor full_parameters() override;
  Held held() const override;
  const optim::AdamW& optimizer() const { return *adamw_; }

 private:
  std::unique_ptr<optim::AdamW> adamw_;
};

// ---- Step 2: ZeRO-1 ---------------------------------------------------------------------------

/// Step 2a. AdamW groups for this rank's shard `s` of `params` (flat values, padded to n): they
/// cover the shard's real elements [s.lo, s.hi) and nothing else, update the model's own values
/// of those elements in place, and read their gradients from `shard_grads` (element s.lo at
/// index 0: part of the flat gradient buffer in stage 1, the rank's own gradient shard in stage
/// 2). An AdamW over these groups has m and v for s.real() elements only.
std::vector<optim::Group> shard_groups(nn::ParameterSet& params, const nn::ShardRange& s,
                                       const Tensor& shard_grads);

/// Step 2b. Before: every rank has stepped its own shard `s` of the values (padded to n; the
/// other shards it holds are stale). After: every rank holds every rank's updated shard, the
/// whole padded layout, moved by ONE collective of n equal chunks. In mixed precision what moves
/// is the fp32 masters, and after it the bf16 compute copy the layers read equals cast(values)
/// again on every rank. Collective.
void all_gather_parameters(nn::ParameterSet& params, const nn::ShardRange& s,
                           comm::Communicator& comm);

/// Step 2c. ZeRO-1: the gradients are all-reduced (lab 03's all_reduce_gradients: every rank
/// holds the full averaged gradient), but each rank keeps AdamW state for its shard only, steps
/// its shard and all-gathers the parameters. Bitwise lab 03's DDP: the same all-reduce, the same
/// elementwise update of every element (by its owner), exact copies back.
class Zero1 final : public Trainer {
 public:
  /// Builds the model with options.storage.pad_to = comm.size() (flat values and gradients).
  Zero1(const ModelConfig& config, nn::GPTOptions options, comm::Communicator& comm,
        optim::AdamWConfig adamw = {});
  int stage() const override { return 1; }
  double forward_backward(const data::Batch& global) override;
  void step(double lr) override;
  Tensor full_parameters() override;
  Held held() const override;
  const nn::ShardRange& shard() const { return shard_; }
  const optim::AdamW& optimizer() const { return *adamw_; }

 private:
  nn::ShardRange shard_;
  std::unique_ptr<optim::AdamW> adamw_;
};

// ---- Step 3: ZeRO-2 ---------------------------------------------------------------------------

/// Mixed precision (GPTOptions::compute_dtype = bf16), stages 0, 1 and 2: the fp32 master
/// values stay whole on every rank, the gradients and AdamW state stay fp32 (sharded as in
/// fp32), the all-gather moves fp32 values, and every rank keeps a whole bf16 compute copy,
/// recast after the gather. Stage 3: see Zero3 (the paper's way: only shards of the fp32 master
/// are kept, the 2-byte weights are gathered).

/// Step 3a. ZeRO-2's reduction of ONE unit. Before: its backward is done on every rank (its
/// gradients, ps.unit_grads(u), are final: this rank's rows' share). After: the sum over the
/// ranks of each of its elements has reached only that element's OWNER (the rank q whose
/// shard_range(ps.numel(), q, n) holds it) and been ADDED into the owner's gradient shard
/// (`grad_shard`, this rank's shard `mine`: element mine.lo at index 0), and the unit's
/// gradients are released. Adding, not copying: with micro-batches (accumulation, a pipeline's)
/// a unit is reduced once per micro-batch and the shard sums them. The sum over the ranks, not
/// the average (the caller divides the shard by n once). Collective: every rank, the same unit.
void reduce_unit_to_owners(nn::ParameterSet& ps, std::size_t u, const nn::ShardRange& mine,
                           Tensor& grad_shard, comm::Communicator& comm);

/// Given (zero_policies.cpp). ZeRO-2 as a policy at nn::GPT's unit hooks (nn::BlockPolicy), so
/// that any driver gets it: lab 09's Zero2 (one batch), lab 10's pipeline schedules (one
/// reduction per unit and micro-batch). The model must keep its gradients per unit
/// (storage.grads = per_unit) and be padded to comm.size() shards (storage.pad_to). Owns this
/// rank's gradient shard (shard_range(ps.numel(), rank, n)). After each unit's backward it calls
/// reduce_unit_to_owners, unless the unit is held (hold: a tied copy whose gradient must first
/// be summed with the other copy's, lab08::sync_tied_gradients), which finish() reduces.
class GradientRelease final : public nn::BlockPolicy {
 public:
  GradientRelease(nn::GPT& model, comm::Communicator& comm);
  void after_unit_backward(const nn::GPT& model, std::size_t unit) override;
  /// Unit u's gradient stays whole (accumulating over micro-batches) until finish().
  void hold(std::size_t u) { held_.push_back(u); }
  /// A step begins: the gradient shard is zeroed.
  void begin();
  /// The step's backwards are done (and tied copies summed): reduce the held units, then
  /// average the shard (1/n). Collective.
  void finish();
  const nn::ShardRange& shard() const { return shard_; }
  Tensor& grad_shard() { return grad_shard_; }
  /// Unit reductions (reduce_unit_to_owners calls) since begin().
  int reductions() const { return reductions_; }

 private:
  nn::GPT& model_;
  comm::Communicator& comm_;
  nn::ShardRange shard_;
  Tensor grad_shard_;
  std::vector<std::size_t> held_;
  int reductions_ = 0;
};

/// Step 3b. ZeRO-2: gradients sharded too. The model keeps its gradients per unit
/// (storage.grads = nn::Storage::per_unit): GPT binds a unit's gradient buffer when backward
/// first writes to it. As soon as backward has made a whole unit's gradients final,
/// reduce_unit_to_owners sums it on the owners and releases it (the GradientRelease policy
/// calls it at the unit's after_unit_backward hook). The full gradient never exists at once;
/// between steps a rank holds its gradient shard only. Then AdamW on the shard and the
/// all-gather, as stage 1. Equal to ZeRO-1 up to the reduction order.
class Zero2 final : public Trainer {
 public:
  /// Builds the model with storage.grads = per_unit, pad_to = comm.size().
  /// Its GradientRelease policy is added to the model (add_block_policy).
  Zero2(const ModelConfig& config, nn::GPTOptions options, comm::Communicator& comm,
        optim::AdamWConfig adamw = {}, const ModelBuilder& build = {});
  int stage() const override { return 2; }
  /// Given: begin, the model's forward and backward (the policy reduces each unit), finish.
  double forward_backward(const data::Batch& global) override;
  void step(double lr) override;
  Tensor full_parameters() override;
  Held held() const override;
  const nn::ShardRange& shard() const { return policy_->shard(); }
  const optim::AdamW& optimizer() const { return *adamw_; }
  /// This rank's averaged gradient shard (shard().size elements, element lo at index 0).
  const Tensor& grad_shard() const { return policy_->grad_shard(); }

 private:
  std::shared_ptr<GradientRelease> policy_;
  std::unique_ptr<optim::AdamW> adamw_;
};

// ---- Step 4: ZeRO-3 ---------------------------------------------------------------------------

/// Step 4: ZeRO-3: parameters sharded too. The model keeps values and gradients per unit
/// (embedding, blocks.i, head). Every UNIT is split over the ranks with shard_range(unit
/// numel, rank, n), so gathering one unit is one all_gather and reducing it one
/// reduce_scatter. A rank keeps, per unit, its value shard, its gradient shard and AdamW's m and
/// v for them: 16 Psi / n bytes. A unit is all-gathered before its forward and again before its
/// backward and released after each; the next unit's gather is started (all_gather_async)
/// before the current one computes (prefetch); after a unit's backward its gradients are
/// reduce-scattered into the shard and released. Step 4 writes the four operations on one
/// unit (4a-4d), which the GatherRelease policy (given) calls at the model's unit hooks, and
/// Zero3::step (4e).

/// An all_gather of one unit in flight.
struct UnitGather {
  std::size_t unit = 0;
  Tensor send;    ///< what this rank sends: its fp32 shard, or its bf16 cast (kept alive here)
  Tensor buffer;  ///< n * shard size elements, of send's dtype
  comm::Work work;
};

/// Step 4a. Starts gathering unit u from every rank's shard of it (`shard`: this rank's
/// shard_range(unit numel, rank, n) of the unit's values, s.size elements, padding zero) over
/// comm, and returns at once. In mixed precision (ps.mixed()) the wire carries what the layers
/// read, the bf16 cast of the shard (2 bytes per parameter).
UnitGather start_unit_gather(const nn::ParameterSet& ps, std::size_t u, const Tensor& shard,
                             comm::Communicator& comm);
/// Step 4b. Waits for the gather and binds the unit in the model with its real elements, ready
/// for its layers: its values (ps.bind_values), or in mixed precision its bf16 compute buffer
/// (ps.bind_compute; the fp32 values stay unbound). Frees the staging buffers.
void finish_unit_gather(nn::ParameterSet& ps, UnitGather& g);
/// Step 4c. Frees a gathered unit (what finish_unit_gather bound).
void release_unit(nn::ParameterSet& ps, std::size_t u);
/// Step 4d. ZeRO-3's reduction of unit u, once its backward is done: reduce_scatter its
/// gradients (padded to n * grad_shard.numel() elements) over comm, ADD this rank's piece (the
/// sum over the ranks; the caller averages once) into grad_shard, release the unit's gradients.
/// Collective.
void reduce_scatter_unit(nn::ParameterSet& ps, std::size_t u, Tensor& grad_shard,
                         comm::Communicator& comm);

/// Given (zero_policies.cpp). ZeRO-3 as a policy at nn::GPT's unit hooks: before a unit's
/// forward or backward it is gathered (finish_unit_gather of its prefetched gather, or
/// start and finish now), and the NEXT unit's gather is started (forward: the next unit of the
/// model; backward: the previous one; not the embedding's backward, which reads no values);
/// after, it is released, and after its backward its gradient is reduce-scattered
/// (reduce_scatter_unit) unless held (a tied copy: see GradientRelease::hold). A head tied to
/// wte on the same model gathers the embedding with it. Keeps this rank's value and gradient
/// shard of every unit. Build the model with prepare(options) (per-unit storage, on_init keeping
/// the initial shards), then attach(model). An evaluation pass (GPT::logits / loss / generate,
/// model.evaluating()) runs the same forward hooks: each unit gathered (the next prefetched) and
/// freed after, nothing left in flight or gathered for a backward, on every rank (collective);
/// it counts in neither gathers() nor peak_gathered_bytes() (an evaluation is not a step).
class GatherRelease final : public nn::BlockPolicy {
 public:
  explicit GatherRelease(comm::Communicator& comm) : comm_(comm) {}
  nn::GPTOptions prepare(nn::GPTOptions options);
  void attach(nn::GPT& model);
  void before_unit_forward(const nn::GPT& model, std::size_t unit) override;
  void after_unit_forward(const nn::GPT& model, std::size_t unit) override;
  void before_unit_backward(const nn::GPT& model, std::size_t unit) override;
  void after_unit_backward(const nn::GPT& model, std::size_t unit) override;
  void hold(std::size_t u) { held_.push_back(u); }
  /// A step begins: gradient shards zeroed, the peak of gathered bytes reset.
  void begin();
  /// Reduce the held units, average the gradient shards (1/n); no gather left in flight.
  void finish();
  /// AdamW groups over every unit's value and gradient shard (m and v for them alone).
  std::vector<optim::Group> optimizer_groups();
  const nn::ShardRange& unit_shard(std::size_t u) const { return shards_.at(u); }
  /// This rank's gradient shard of unit u (unit_shard(u).size elements, its element lo first).
  const Tensor& unit_grad_shard(std::size_t u) const { return grads_.at(u); }
  /// Every parameter, flat, in the model's order: the fp32 shards all-gathered. Collective.
  Tensor full_parameters();
  /// This rank's value shards (params) and gradient shards (grads) plus units bound now.
  Held held() const;
  /// Peak of the bytes of gathered units held at once since begin(): fp32 values (4 bytes per
  /// parameter), or bf16 compute buffers in mixed precision (2). Training passes only.
  std::size_t peak_gathered_bytes() const { return peak_gathered_; }
  /// Unit gathers (start_unit_gather calls) since begin(), training passes only.
  int gathers() const { return gathers_; }

 private:
  void keep_initial_shard(const nn::Unit& unit, const Tensor& values);
  void gather(std::size_t u);     // bound now (its prefetch finished, or gathered here)
  void prefetch(std::size_t u);   // started, unless bound or in flight
  void release(std::size_t u);
  std::size_t gathered_bytes(std::size_t u) const;
  bool tied_head(std::size_t u) const;
  comm::Communicator& comm_;
  nn::GPT* model_ = nullptr;
  std::vector<nn::ShardRange> shards_;
  std::vector<Tensor> values_, grads_;  // per unit: this rank's shards
  std::vector<UnitGather> in_flight_;
  std::vector<std::size_t> held_;
  std::size_t peak_gathered_ = 0;
  int gathers_ = 0;
};

/// The ZeRO-3 trainer (given but for step 4e, its step: AdamW on the shards): the model built
/// with a GatherRelease policy's options, AdamW over the policy's shards. Equal to ZeRO-2 up to
/// the reduction order.
///
/// Mixed precision (compute_dtype bf16, mixed()): as the paper's stage 3. A rank keeps the same
/// fp32 shards (master values, gradients, m, v: 16 Psi / n); a unit's gather sends the bf16 cast
/// of each rank's master shard (2 bytes per parameter on the wire) into the unit's bf16 compute
/// buffer (ParameterSet::bind_compute; its fp32 values are never bound), for forward and again
/// for backward; the fp32 unit gradients are reduce-scattered as in fp32 and AdamW updates the
/// fp32 master shards. Not bitwise the bf16 DDP (its copy is cast from the whole master on every
/// rank: the same numbers, but the gradients are summed in another order).
class Zero3 final : public Trainer {
 public:
  /// Builds the model with the GatherRelease policy's options (values and grads per unit; each
  /// unit's initial shard kept at GPTOptions::on_init, the only time a rank sees a whole unit's
  /// values without gathering them) and sets the policy on it.
  Zero3(const ModelConfig& config, nn::GPTOptions options, comm::Communicator& comm,
        optim::AdamWConfig adamw = {}, const ModelBuilder& build = {});
  int stage() const override { return 3; }
  /// Given: begin, the model's forward and backward (the policy gathers, frees, reduces), finish.
  double forward_backward(const data::Batch& global) override;
  void step(double lr) override;
  Tensor full_parameters() override;
  Held held() const override;
  /// This rank's shard of unit u (shard_range(unit numel, rank, n)).
  const nn::ShardRange& unit_shard(std::size_t u) const { return policy_->unit_shard(u); }
  /// This rank's averaged gradient shard of unit u, after forward_backward.
  const Tensor& unit_grad_shard(std::size_t u) const { return policy_->unit_grad_shard(u); }
  const optim::AdamW& optimizer() const { return *adamw_; }
  /// Peak of the bytes of gathered units held at once during the last forward_backward.
  std::size_t peak_gathered_bytes() const { return policy_->peak_gathered_bytes(); }
  /// Mixed precision: the gathers carry bf16 into the units' compute buffers.
  bool mixed() const;

 private:
  std::shared_ptr<GatherRelease> policy_;
  std::unique_ptr<optim::AdamW> adamw_;
};

/// Given. The trainer of `stage` (0..3); anything else is a UsageError.
std::unique_ptr<Trainer> make_trainer(int stage, const ModelConfig& config,
                                      nn::GPTOptions options, comm::Communicator& comm,
                                      optim::AdamWConfig adamw = {});

// ---- Step 5: the paper's formulas --------------------------------------------------------------

/// Step 5a. Bytes per rank the paper's model of memory predicts for `stage` with `psi`
/// parameters over `n` ranks. `precision` f32: mapped to this fp32 model: parameters 4 Psi,
/// gradients 4 Psi, AdamW's m and v 8 Psi (K = 8: no fp32 master copy, the parameters are
/// fp32), so DDP holds 16 Psi; stage 1 shards the 8 Psi of state, stage 2 the gradients too,
/// stage 3 everything. `precision` bf16: the paper's own mixed-precision count: 2 Psi of 16-bit
/// parameters, 2 Psi of 16-bit gradients, K Psi = 12 Psi of optimizer state (fp32 master, m,
/// v), sharded the same way (16 Psi at stage 0, 4 Psi + 12 Psi / n at stage 1). (Padding and
/// stage 3's gathered working set are not in the formula.)
Held paper_memory(int stage, int64_t psi, int n, DType precision = DType::f32);

/// Given. What THIS library's trainers hold per rank (without padding): in fp32 the paper's
/// formula above. In bf16 our layout differs from the paper's: the gradients stay fp32 (4 Psi,
/// sharded at stage 2), the fp32 master stays whole on every rank in stages 0-2 (4 Psi, not
/// sharded with the optimizer state), m and v 8 Psi (sharded from stage 1) and the bf16 copy
/// 2 Psi comes on top: 18 Psi at stage 0. Stage 3 in bf16 keeps no bf16 copy between steps and
/// shards the rest: 4 Psi / n master + 4 Psi / n gradients + 8 Psi / n m and v = 16 Psi / n, the
/// paper's (2 + 2 + 12) Psi / n total with the bytes in other places.
Held layout_memory(int stage, int64_t psi, int n, DType precision = DType::f32);

/// Step 5b. Payload bytes per step by the library's byte counters (common/comm/stats.hpp) that
/// the paper's data movement predicts for this library's trainers: DDP one all_reduce of the
/// gradients; stage 1 that all-reduce plus the all_gather of the parameters; stage 2 the
/// gradients reduced to their owners plus the all_gather; stage 3 two all_gathers of the
/// parameters (forward and backward) and one reduce_scatter of the gradients. The counters
/// count payload: an all_reduce its tensor, an all_gather its output, a reduce_scatter its
/// input, a reduce its tensor. `precision` bf16: stages 0-2 move fp32 gradients and values;
/// stage 3 gathers 2-byte weights and reduce-scatters 4-byte gradients.
std::size_t paper_comm_bytes(int stage, int64_t psi, DType precision = DType::f32);

}  // namespace scalelab::lab09
