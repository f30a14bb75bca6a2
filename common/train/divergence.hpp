#pragma once
/// @file divergence.hpp
/// Where a parallel run leaves its single-device twin: the first tensor, in execution order, whose
/// values differ from the twin's share of it. A loss check says *that* a run is wrong; this says
/// *where*: "blocks.0.res2 (x + attention output), forward, rank 1, micro-batch 0".
///
/// A DivergenceRecorder is a block policy that only reads: installed first on a model (watch), it
/// copies what each block's forward saved (its input, the LayerNorm outputs and statistics, q, k,
/// v, the attention probabilities or log-sum-exp, the merged heads y, the residual res2 = x +
/// attention output, the MLP's h and g) and what the head saved (ln_f's input, output and
/// statistics, the softmax of the logits), one entry per micro-batch in the order the model ran
/// them; after the step the driver adds the final gradients (record_gradients, or
/// record_gradient_shard for what a ZeRO rank owns). Each entry knows where it sits in the twin:
///   - rows: the rank's global batch rows (RowLayout::first_row, then one micro-batch after the
///     other), its sequence positions (context parallel: zig-zag chunks), its share of the token
///     rows between regions (sequence parallel);
///   - columns: read from the model itself: the heads of its qkv shard (q, k, v, probabilities,
///     y), the hidden units of its fc shard (h, g), its vocabulary range (probabilities), each
///     parameter's Shard (gradients); pipeline stages by their global block indices.
/// The twin is the same recorder on a whole model (record_twin: same seed, precision and
/// attention path, the whole global batch on one device). find_divergence compares every entry
/// with the twin's share and agrees, collectively, on the first one out of tolerance.
///
///   auto rec = std::make_shared<train::DivergenceRecorder>(train::RowLayout{.first_row = r * b});
///   train::watch(model, rec);                   // before the step
///   ... the lab's step (forward, backward, reductions) ...
///   rec->record_gradients(model);
///   auto twin = train::record_twin(config, {.seed = s}, global);
///   train::Divergence d = train::find_divergence(*rec, twin, DType::f32, world);
///   if (d.found && world.rank() == 0) std::puts(d.first_line().c_str());
///
/// Execution order: the forward first (micro-batch by micro-batch; in each, the blocks in order,
/// then the head; in a block: input, ln1, q, k, v, att/lse, y, res2, ln2, h, g), then the
/// gradients in the order backward makes them final (the head's, the blocks from the last, the
/// embedding's; in a unit, its parameters from the last). A fault shows where it is made and
/// spreads after it, so the first tensor out of tolerance is the one to look at.
///
/// Tolerances (DivergenceTolerance): an element passes when |got - twin| <= rtol |twin| + atol
/// max|twin of the tensor|: fp32 rtol 1e-4, atol 1e-5 (an all-reduce changes the order of a sum:
/// ~1e-7 relative, grown by LayerNorm's 1/std through the layers); bf16 rtol 3e-2, atol 1e-2
/// (8-bit mantissas: ~4e-3 per rounding, and ranks round partial sums before adding them). A
/// fault makes differences of the tensor's own size, far above both.
#include <cstdint>
#include <string>
#include <vector>

#include "common/comm/communicator.hpp"
#include "common/data/sampler.hpp"
#include "common/model_config.hpp"
#include "common/nn/gpt.hpp"
#include "common/tensor.hpp"

namespace scalelab::train {

/// Where this rank's token rows sit in the twin's global batch (the columns and blocks the model
/// itself says).
struct RowLayout {
  /// The global batch row of this rank's first row (data parallel: dp_rank x rows per rank).
  /// Micro-batch m of b rows holds rows [first_row + m b, first_row + (m + 1) b).
  int64_t first_row = 0;
  /// The global sequence position of each of this rank's T positions (context parallel: its
  /// zig-zag chunks, in the order its tensors hold them). Empty: 0 .. T-1.
  std::vector<int64_t> positions = {};
  /// Sequence parallel: between the regions the rank keeps token rows [N r / n, N (r + 1) / n)
  /// of its N = b T rows (r = seq_rank, n = seq_size). 1: every row.
  int seq_rank = 0;
  int seq_size = 1;  ///< see seq_rank
};

/// How far a tensor may be from the twin's (see the file's comment for the reasons).
struct DivergenceTolerance {
  double rtol;  ///< relative to the element: |got - twin| <= rtol |twin| + ...
  double atol;  ///< ... + atol x the largest |twin| of the tensor
  /// fp32 (and anything not bf16): rtol 1e-4, atol 1e-5; bf16: rtol 3e-2, atol 1e-2.
  static DivergenceTolerance for_precision(DType precision);
};

/// One tensor a recorder copied, and where its elements sit in the twin's tensor of the same key.
struct RecordedTensor {
  int64_t key = 0;              ///< execution order (see the file's comment): smaller runs first
  std::string name;             ///< "blocks.0.res2", "ln_f.bias": the twin's entry of that name
  bool backward = false;        ///< a gradient (false: a forward activation)
  int layer = -1;               ///< the block (n_layer: the head, -1: the embedding)
  int micro_batch = -1;         ///< the micro-batch it belongs to (-1: the whole step)
  std::vector<int64_t> shape;   ///< its shape on this rank
  std::vector<double> values;   ///< its elements
  /// The twin's tensor viewed with one axis per meaning (e.g. (B, NH, T, hs)): set on the twin.
  std::vector<int64_t> view;
  /// Per axis of the twin's view, the indices this tensor holds (empty: all of them).
  std::vector<std::vector<int64_t>> select;
  /// Of the selected elements (row-major), this tensor holds [flat_lo, flat_hi) (-1: all).
  int64_t flat_lo = 0;
  int64_t flat_hi = -1;  ///< see flat_lo
};

/// A read-only block policy that records what a model's forward saved and, on request, its
/// gradients (see the file's comment). One recorder per model and step; the twin uses one too.
class DivergenceRecorder : public nn::BlockPolicy {
 public:
  /// A recorder for a rank whose rows sit at `rows` in the twin's global batch.
  explicit DivergenceRecorder(RowLayout rows = {}) : rows_(std::move(rows)) {}

  /// Copies what block `block` saved (and its input) as the next micro-batch of that block.
  void after_forward(const nn::Block& block, const Tensor& input, nn::BlockActivations& acts,
                     int64_t seq_len) override;
  /// Copies what the head saved as its next micro-batch.
  void after_head_forward(const nn::GPT& model, const nn::HeadActivations& acts) override;

  /// Records every gradient `model` holds (its parameters' shards; released units skipped):
  /// call after the step's reductions, when they are what the optimizer would apply.
  void record_gradients(const nn::GPT& model);
  /// Records the gradient elements [lo, hi) of `model`'s flat layout that `shard` holds (shard
  /// element 0 is element lo; padding past the last parameter is ignored): a ZeRO-2/3 rank's
  /// reduced shard.
  void record_gradient_shard(const nn::GPT& model, const Tensor& shard, int64_t lo, int64_t hi);

  /// Records no more forwards from now on (a test that trains on after the step it explains).
  void stop() { stopped_ = true; }
  /// What was recorded, in the order it was.
  const std::vector<RecordedTensor>& entries() const { return entries_; }

 private:
  friend void watch(nn::GPT& model, std::shared_ptr<DivergenceRecorder> recorder);
  void add(RecordedTensor e, const Tensor& t);
  void param_entry(const nn::GPT& model, std::size_t i, const Tensor& values, int64_t lo,
                   int64_t hi);
  RowLayout rows_;
  int64_t n_layer_ = 0;
  std::vector<int> forwards_;  // per block (and the head, last): forwards recorded so far
  bool stopped_ = false;
  std::vector<RecordedTensor> entries_;
};

/// Puts `recorder` first among `model`'s policies (before checkpointing drops what a block
/// saved, before ZeRO releases anything). One recorder may watch several models of a rank (a
/// pipeline rank's chunks). The model keeps the recorder alive.
void watch(nn::GPT& model, std::shared_ptr<DivergenceRecorder> recorder);

/// The twin's recording: one forward and backward of a whole GPT(config, options) (options'
/// seed, compute dtype, attention path and device as the parallel run's: a GPU run's twin runs
/// on its GPU, as the programs' loss twins do) on the whole global `batch`, its activations and
/// gradients recorded (copied to the host).
DivergenceRecorder record_twin(const ModelConfig& config, nn::GPTOptions options,
                               const data::Batch& batch);

/// The verdict, the same on every rank.
struct Divergence {
  bool found = false;          ///< some tensor is out of tolerance
  std::string tensor;          ///< its name, "blocks.0.res2 (x + attention output)"
  bool backward = false;       ///< a gradient
  int layer = -1;              ///< its block (n_layer: the head, -1: embedding or whole step)
  int rank = -1;               ///< the lowest rank where it is first out of tolerance
  std::vector<int> ranks;      ///< every rank whose first divergence it is
  int micro_batch = -1;        ///< its micro-batch (-1: the whole step, gradients)
  std::vector<int64_t> index;  ///< the worst element's index on that rank (empty: shapes differ)
  std::vector<int64_t> twin_index;  ///< the same element's index in the twin's view
  double got = 0;              ///< its value on that rank
  double want = 0;             ///< the twin's
  double allowed = 0;          ///< the tolerance at that element
  int64_t numel = 0;           ///< elements the rank holds (shape mismatch: != expected)
  int64_t expected = 0;        ///< elements of the twin's share
  int64_t matched = 0;         ///< tensors (over every rank) before it in order, within tolerance
  int64_t compared = 0;        ///< tensors compared (over every rank)
  /// tensors each rank compared (its own share of each; a pipeline stage its own layers)
  std::vector<int64_t> compared_by_rank;
  DivergenceTolerance tolerance{0, 0};  ///< what was applied
  /// "first divergence: blocks.0.res2 (x + attention output), forward, ranks 0, 1 (rank 0
  /// shown), micro-batch 0: element (0, 5, 12) = 0.61 where the twin has 0.42 at (0, 5, 12)
  /// (|diff| 0.19 > 3.1e-05); 14 tensors before it matched (60 compared)", or "no divergence:
  /// N tensors within tolerance of the single-device twin" ("(33 on each of 2 ranks)", or "(40 on
  /// rank 0, 59 on rank 1)" after N where more than one rank compared its share).
  std::string first_line() const;
  /// first_line() and the tolerance applied.
  std::string str() const;
};

/// Compares `mine` (this rank's recording) with `twin` and agrees over `comm` (every rank of it
/// calls this, whatever it recorded: a rank with no entries, or one whose shapes differ, still
/// takes part) on the first tensor out of tolerance. Three all-reduces of a few doubles.
Divergence find_divergence(const DivergenceRecorder& mine, const DivergenceRecorder& twin,
                           DType precision, comm::Communicator& comm);

}  // namespace scalelab::train
