#pragma once
/// @file session.hpp
/// The frame every training program of labs 03-12 shares, so that a lab's main() shows only what
/// the lab is about: the command line (the shared run and train options plus the lab's own), the
/// world communicator, this rank's device, the model config, the corpus and its sampler of global
/// batches, and the step reporter with its notes.
///
///   train::Session session("lab03_ddp", "Lab 03: data-parallel training (DDP)", {.steps = 50});
///   session.add_options("lab 03")("verify-steps", "...", cxxopts::value<int64_t>()->default_value("3"));
///   const auto& parsed = session.parse(argc, argv);     // UsageError on a bad value: exit 2
///   nn::GPT model(session.config(), session.model_options(session.run().seed + session.comm().rank()));
///   session.announce("lab 03 ddp: ...");                 // collective: the reporter measures a peak
///   for (int64_t step = 0; step < session.opt().steps; ++step) {
///     ... session.sampler().batch(step) ...
///     log::info("{}", session.step_line(step, loss, dt));
///   }
///
/// Two hooks for the labs whose set-up needs more than that:
/// - a lab that must refuse some input before a device is picked (lab 10's --plan refuses
///   --device cuda: picking a GPU where there is none would fail first, with another error)
///   parses with DevicePick::by_lab and calls pick_device() after its checks;
/// - a lab that trains at another context than the model's (lab 11's long sequences) calls
///   set_context(T) before the sampler and the reporter are made.
///
/// --diverge (every program that uses it): the run is one step (--steps 1) with the divergence
/// report (common/train/divergence.hpp): the lab watches its model(s) and, after the step, hands
/// the recording in; the program prints the first tensor that left the single-device twin and
/// exits 1, or 0 when none did:
///
///   auto rec = session.watch_divergence(model, {.first_row = rank * rows});  // null without
///   for (step ...) { ... }                                                   // one step
///   if (rec) {
///     rec->record_gradients(model);   // or record_gradient_shard: what this rank owns
///     return session.divergence_exit(*rec, session.model_options(run.seed));
///   }
///
/// Lab 02's single-device program does not use it: it has no communicator (and so no hang
/// watchdog), reads a corpus directory or a text file with its validation split, trains at a
/// --context up to the model's (the model keeps its positions), and its step line is made by the
/// attendee's own functions (tokens/s, MFU) every --log-every steps.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <cxxopts.hpp>

#include "common/cli.hpp"
#include "common/comm/communicator.hpp"
#include "common/errors.hpp"
#include "common/data/sampler.hpp"
#include "common/model_config.hpp"
#include "common/nn/gpt.hpp"
#include "common/train/divergence.hpp"
#include "common/train/loop.hpp"
#include "common/train/sizing.hpp"

namespace scalelab::train {

/// One training program's frame (see the file's example): options, communicator, device,
/// config, corpus and step reporter, built in that order by parse() and announce().
class Session {
 public:
  /// Declares the shared options (cli::add_run_options with --precision, and add_train_options
  /// with this program's `defaults`).
  Session(const std::string& program, const std::string& description,
          const TrainOptions& defaults);

  /// Where the lab declares its own options, before parse().
  cxxopts::OptionAdder add_options(const std::string& group) {
    return options_.add_options(group);
  }

  /// When parse() picks this rank's device.
  enum class DevicePick {
    at_parse,  ///< parse() picks it, right after making the world communicator
    by_lab,    ///< the lab calls pick_device() itself, after checks that must come first
  };

  /// Parses argv, reads the shared options (UsageError on a bad value, every rank), makes the
  /// world communicator and, with DevicePick::at_parse, picks this rank's device (collective over
  /// the world). Returns the parse result, for the lab's own options.
  const cxxopts::ParseResult& parse(int argc, char** argv, DevicePick pick = DevicePick::at_parse);

  /// Picks this rank's device for --device (train::rank_device: collective over the world;
  /// --device cuda without a GPU is a UsageError). Once, after parse(DevicePick::by_lab) and
  /// before device(), model_options() or announce(); parse() calls it otherwise.
  void pick_device();

  /// Trains on sequences of `tokens` tokens instead of the model's block size: config()'s
  /// block_size becomes `tokens` (a model made from it has positions for all of them), the
  /// sampler draws rows of that many tokens and the step line counts their FLOPs. After parse(),
  /// before sampler() and announce(); `tokens` must be positive (the lab checks its own limits).
  void set_context(int64_t tokens);

  /// For a program (or a configuration of one) whose technique takes dense blocks only: with a
  /// mixture-of-experts --model (tiny-moe, small-moe), a UsageError naming the model, `why` and
  /// the dense models (one line, exit 2 on every rank). After parse().
  void require_dense(const std::string& why) const;

  /// Refuses a training step this rank's host memory cannot hold (require_host_memory: one line
  /// naming --batch, exit 2 on every rank), before the batch is drawn. `rows`: the rows one
  /// forward runs on this rank (its share, or the whole batch where it runs the twin); `shape`
  /// the rest (checkpointing, tp, ...): its global batch is --batch, its layers default to the
  /// model's, and on a GPU its rows count 0 (the activations are the GPU's; only the batch is host
  /// memory). Collective over the world; after the device is picked.
  void require_step_memory(int64_t rows, StepShape shape = {}) const;

  /// The shared run options (--device, --backend, --seed, --timeout, --trace, --precision).
  /// After parse().
  const cli::RunOptions& run() const { return run_; }
  /// The shared training options (--model, --batch, --steps, --lr, --warmup, --peak-tflops,
  /// --data). After parse().
  const TrainOptions& opt() const { return opt_; }
  /// The model config --model names (its block_size set_context()'s, if called). After parse().
  const ModelConfig& config() const { return config_; }
  /// The world communicator (every rank), on the backend --backend picks. After parse().
  comm::Communicator& comm() { return *comm_; }
  /// This rank's device (--device; with CUDA one GPU per rank on a node). After the device is
  /// picked (parse(), or pick_device() with DevicePick::by_lab).
  Device device() const;

  /// The sampler of global batches of the run's corpus, seeded by --seed. The corpus is read on
  /// the first call, so a program can refuse a run (sizing, bad shapes) before reading data.
  data::Sampler& sampler();
  /// The sampler of validation batches (the corpus's val.bin, seeded by --seed + 1, as lab 02's),
  /// read on the first call.
  data::Sampler& val_sampler();

  /// A model on this rank's device in the run's precision, drawn from `seed`.
  nn::GPTOptions model_options(uint64_t seed) const {
    return {.device = device(), .seed = seed, .compute_dtype = run_.precision};
  }

  /// The learning rate of `step` (warmup, cosine decay).
  double lr(int64_t step) const { return learning_rate(opt_, step); }

  /// Logs `headline`, the precision note and, with `mfu_note`, where the MFU peak comes from, and
  /// makes the step reporter. Collective over the world (on a CPU every rank measures its sgemm
  /// peak at once). Labs 10 and 11 pass `mfu_note` false: their output has never had the line.
  void announce(const std::string& headline, bool mfu_note = true);

  /// The step line (loss, dt, tokens/s, MFU, the peak memory of the busiest rank) of one global
  /// batch. Collective. Needs announce() first.
  std::string step_line(int64_t step, double loss, double dt_s);

  /// True with --diverge: one step (opt().steps is 1) and the divergence report.
  bool diverge() const { return diverge_; }
  /// With --diverge: a DivergenceRecorder for this rank's `rows`, watching `model` (call again
  /// with the recorder for a rank's other models: train::watch). Null without --diverge.
  std::shared_ptr<DivergenceRecorder> watch_divergence(nn::GPT& model, RowLayout rows = {});
  /// With --diverge, after the step and the recorder's gradients: records the single-device
  /// twin of step 0's global batch (a GPT(config(), twin); `twin`: the run's seed, precision and
  /// device, and flash_attention where the run keeps log-sum-exps), finds the first
  /// divergence over the world (collective), logs it on rank 0 and returns kExitFailed when
  /// there is one, else kExitOk.
  ExitCode divergence_exit(const DivergenceRecorder& recording, const nn::GPTOptions& twin) {
    return divergence_exit(recording, twin, config_);
  }
  /// divergence_exit with the twin a GPT(`config`, twin): a lab that changes the model's config
  /// from its own options (lab 12's --top-k, --capacity-factor) hands in the config it trained.
  ExitCode divergence_exit(const DivergenceRecorder& recording, const nn::GPTOptions& twin,
                           const ModelConfig& config);

 private:
  cxxopts::Options options_;
  cxxopts::ParseResult parsed_;
  cli::RunOptions run_;
  TrainOptions opt_;
  ModelConfig config_;
  std::optional<comm::Communicator> comm_;
  Device device_ = Device::cpu();
  bool device_picked_ = false;
  bool diverge_ = false;
  std::vector<uint16_t> tokens_;
  std::optional<data::Sampler> sampler_;
  std::vector<uint16_t> val_tokens_;
  std::optional<data::Sampler> val_sampler_;
  std::unique_ptr<StepReporter> reporter_;
};

}  // namespace scalelab::train
