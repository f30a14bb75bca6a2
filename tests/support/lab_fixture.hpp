#pragma once
/// @file lab_fixture.hpp
/// What every lab grader (tests/NN_name/*.cpp) shares: the world communicator, the model and
/// corpus a test builds on, the batches, the single-device reference, this rank's rows, and the
/// checks that give the same verdict on every rank. Linked into every lab's test binary
/// (scalelab::lab_testing, tests/support/CMakeLists.txt); nothing here is part of a lab's
/// lesson, so a step can be graded on its own with these helpers standing in for earlier steps.
///
/// ## Contract
///
/// - **Hermetic.** Nothing reads a file or the network. The corpora are generated from a seed
///   here, identically on every rank and in every run; only lab programs and the demo use the
///   default corpus (./scalelab data).
/// - **Same on every rank.** Every function returns the same value on every rank, except
///   my_rows() (this rank's share) and the `got` a test passes in. The collective ones
///   (close_on_every_rank) must be called by every rank of world(), in the same order, or the
///   job waits (the watchdog of tests/support/test_main.cpp ends it after SCALELAB_TIMEOUT).
/// - **Lifetime.** world() (not new_world()), the corpora and the configs are built once per process on first use
///   and live until exit: a data::Sampler keeps a reference to its tokens, so pass it only these
///   (or tokens that outlive it).
/// - **A Setup is one test file's data.** Every test of a file draws from the same Setup, so the
///   single-device reference and the parallel run see the same model (same seed) and the same
///   GLOBAL batch whatever the number of ranks.
///
/// ## Tolerances (state each next to its test; these are the shared ones)
///
/// The CPU kernels are deterministic (one OpenBLAS thread per rank: the ctest environment,
/// tools/mpi_env), so:
/// - a broadcast, a slice of a batch, a recomputation of the same kernels on the same inputs:
///   exact (rtol 0, atol 0, or bitwise());
/// - micro-batches of equal size in the same order (single device): 1e-6 relative;
/// - anything all-reduced across ranks (the sum runs in another order): kAllReduceRtol /
///   kAllReduceAtol per element after one step; over several steps only with plain SGD, which
///   keeps rounding differences as small as they start (AdamW amplifies them);
/// - CUDA against the CPU: fp32 with TF32 off, 1e-4 relative (the library's GPU tests).
///
/// ## Planted faults
///
/// Every check a grader relies on is shown to be able to fail, in one of two ways:
///  - a test named StepK_PlantedFault.* runs a small deliberately wrong variant, written in the
///    test file, through the same check and expects it to fail (EXPECT_FALSE(...)). Such
///    variants never call the attendee's code, so they pass on the starter too; the step's
///    other tests report it "not implemented";
///  - a fault planted into a copy of the reference solution at build time
///    (scalelab_add_planted_submissions with a lab's solutions/NN_*/planted/*.plant; ctest entries
///    labNN.planted.*): the step's own graders run against it and must fail at the check the
///    fault is for.
///
/// ## Example
///
///   constexpr labtest::Setup kLab{.seed = 1234, .global_batch = 8, .corpus_seed = 7};
///   using labtest::world;
///
///   TEST(Step3_AllReduce, GradientsEqualSingleDevice) {
///     const data::Batch global = kLab.batch(0);
///     nn::GPT model(kLab.config(), {.seed = kLab.seed});
///     ... forward/backward labtest::my_rows(global), then the attendee's all-reduce ...
///     EXPECT_TRUE(labtest::close_on_every_rank(model.params().grads(),
///                                              kLab.reference(global).grads,
///                                              labtest::kAllReduceRtol, labtest::kAllReduceAtol));
///   }
#include <cstdint>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

#include "common/comm/communicator.hpp"
#include "common/data/sampler.hpp"
#include "common/model_config.hpp"
#include "common/nn/gpt.hpp"
#include "common/tensor.hpp"
#include "common/train/divergence.hpp"
#include "common/train/reference.hpp"

namespace scalelab::labtest {

// ---- the world ---------------------------------------------------------------------------------

/// MPI_COMM_WORLD as a communicator on the "mpi" backend, made on first use and shared by every
/// test of the binary. Tests that need a sub-group split this one (world().split(...)).
comm::Communicator& world();

/// A new communicator over every rank (its own MPI_Comm_dup of MPI_COMM_WORLD): messages a test
/// leaves behind on one (an attendee's send that nobody receives) cannot reach the next test.
/// Labs 00 and 01, whose steps are point-to-point code, give each test its own. Collective.
comm::Communicator new_world();

// ---- corpora and models ------------------------------------------------------------------------

/// Tokens of train::synthetic_corpus(kSyntheticTokens, seed): bytes of a repeated phrase with
/// random letters mixed in (a model's loss moves on it). One corpus per seed, made on first use.
inline constexpr int64_t kSyntheticTokens = 8192;
const std::vector<uint16_t>& synthetic_corpus(uint64_t seed);

/// `sentences` of four short English sentences, drawn in a seeded order (a 64-bit LCG, seed
/// `seed`), byte-encoded: structure a tiny model learns in a few hundred steps (lab 02's
/// validation loss falls from ln 256 to below 2). One corpus per (seed, sentences).
const std::vector<uint16_t>& sentence_corpus(uint64_t seed, int sentences);

/// The model of the parallel labs' tests: `tiny` (common/model_config.hpp) with `n_layer`
/// layers (train::test_config). One per n_layer, made on first use.
const ModelConfig& test_model(int64_t n_layer = 2);

/// One test file's data: a synthetic corpus, the test model, a global batch size and a seed
/// (the model's initialisation and the sampler's). An aggregate: declare it constexpr.
struct Setup {
  uint64_t seed = 0;          ///< GPT init seed ({.seed = seed}) and the sampler's seed
  int64_t global_batch = 8;   ///< rows of the GLOBAL batch (divisible by every rank count run)
  uint64_t corpus_seed = 0;   ///< which synthetic_corpus
  int64_t n_layer = 2;        ///< layers of test_model

  const ModelConfig& config() const { return test_model(n_layer); }
  const std::vector<uint16_t>& corpus() const { return synthetic_corpus(corpus_seed); }
  /// Global batches of global_batch x block_size tokens, drawn from (seed, step).
  data::Sampler sampler() const;
  /// The global batch of `step`: the same on every rank and for every rank count.
  data::Batch batch(int64_t step = 0) const { return sampler().batch(step); }
  /// The single-device run on `b`: loss and flat gradients of one forward + backward of a fresh
  /// GPT(config(), {.seed = seed}) (train::single_device_step).
  train::Reference reference(const data::Batch& b) const;
};

// ---- this rank's rows (a reference, not an attendee's answer) -----------------------------------

/// Rows [rank*b, (rank+1)*b) of `global`, b = B / world: a view. What a test uses where the
/// slicing is not the step being graded. Throws UsageError if world does not divide B.
data::Batch rank_rows(const data::Batch& global, int rank, int world);
/// rank_rows(global, world().rank(), world().size()).
data::Batch my_rows(const data::Batch& global);

// ---- checks --------------------------------------------------------------------------------------

/// Gradients (or parameters after SGD steps) that went through an all-reduce.
inline constexpr double kAllReduceRtol = 1e-5, kAllReduceAtol = 1e-6;

/// Elementwise |got - want| <= atol + rtol * |want| on EVERY rank of world() (collective: every
/// rank calls it). Success or failure is the same on every rank; a failure says the tolerance
/// and each failing rank's worst element (train::Diff::str), as on_every_rank does.
testing::AssertionResult close_on_every_rank(const Tensor& got, const Tensor& want, double rtol,
                                             double atol);

/// `ok` on every rank of world() (collective: every rank calls it, in the same order). On
/// failure EVERY rank gets the same message: each failing rank's own cause, "rank 1: <its
/// message>" (the first three, each cut to 400 characters), so whichever rank the report shows
/// names the rank where it happened and why, not "failed on another rank". Goes over
/// MPI_COMM_WORLD directly: it is not counted in the byte counters or the traffic ledger, so a
/// grader may call it inside a measured window.
testing::AssertionResult on_every_rank(const testing::AssertionResult& ok);

// ---- where a twin check fails: the divergence report ------------------------------------------

/// One step of a parallel model, explained against its single-device twin when a check fails
/// (common/train/divergence.hpp). Made before the step, it watches `model` (this rank's share;
/// its rows of the global batch at `rows`); after the step, step_done(global) records the
/// gradients the model holds (a ZeRO test records its shard through recorder() first and passes
/// gradients = false) and stops recording, so later steps of the test change nothing. The
/// checks that take it (on_every_rank, close_on_every_rank) put the report's first line before
/// their own message when they fail on every rank:
///
///   labtest::Explain why(model, {.seed = 1234, .flash_attention = true}, {.positions = mine});
///   ... the step ...
///   why.step_done(global);
///   EXPECT_TRUE(labtest::close_on_every_rank(got, want, rtol, atol, why));
///   // "rank 1: first divergence: blocks.0.attn.lse, forward, ranks 1, 2 (rank 1 shown), ...;
///   //  not within rtol ..."
///
/// The twin: a GPT(model.config(), twin) on twin.device on the whole global batch, compared at
/// the tolerance of twin.compute_dtype (fp32 rules for f32 and f64). Declare it after the model.
class Explain {
 public:
  /// Watches `model` (train::watch) from now on.
  Explain(nn::GPT& model, nn::GPTOptions twin, train::RowLayout rows = {});
  ~Explain();
  Explain(const Explain&) = delete;
  Explain& operator=(const Explain&) = delete;
  /// After the step's backward and reductions on `global`: records the model's gradients
  /// (unless `gradients` is false) and stops recording.
  void step_done(const data::Batch& global, bool gradients = true);
  /// The recording (for record_gradient_shard).
  train::DivergenceRecorder& recorder() { return *recorder_; }
  /// The report's first line, or "" before step_done. Collective over world(): call it where
  /// every rank does (the checks below call it when a check failed on every rank).
  std::string first_line() const;

 private:
  nn::GPT& model_;
  nn::GPTOptions twin_;
  std::shared_ptr<train::DivergenceRecorder> recorder_;
  std::optional<data::Batch> global_;
  mutable std::optional<std::string> first_;  // computed once: several checks may fail
};

/// on_every_rank(ok); when it fails, every failing rank's message starts with `why`'s first line.
testing::AssertionResult on_every_rank(const testing::AssertionResult& ok, const Explain& why);
/// close_on_every_rank(got, want, rtol, atol), its failure led by `why`'s first line.
testing::AssertionResult close_on_every_rank(const Tensor& got, const Tensor& want, double rtol,
                                             double atol, const Explain& why);

/// Every element identical, on this rank (not collective).
testing::AssertionResult bitwise(const Tensor& got, const Tensor& want);

/// The largest |element| of t (on any device): the scale of a "within x of the largest" bound.
double max_abs(const Tensor& t);

/// This rank's GPU (cuda:rank % devices) with TF32 off for fp32 matmuls, or nothing where no GPU
/// is visible (the tests labelled gpu then GTEST_SKIP). With SCALELAB_TEST_DEVICE=sim in the
/// environment: the simulated GPU (Device::sim), on any machine.
std::optional<Device> test_gpu();

/// One training step on a GPU against the same step on the CPU (every lab's test_gpu.cpp): the
/// losses within 1e-5 relative and the gradients within 1e-4 of the largest |gradient| in fp32
/// (the CUDA kernels sum in another order), 2e-3 and 3e-2 in bf16. `got_grads` may be on the
/// GPU. Collective (close_on_every_rank); a failure names the loss or the gradients.
testing::AssertionResult gpu_step_matches_cpu(double got_loss, double want_loss,
                                              const Tensor& got_grads, const Tensor& want_grads,
                                              bool bf16);

}  // namespace scalelab::labtest
