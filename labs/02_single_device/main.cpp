// Lab 02 driver (not edited by attendees): trains a GPT on one device, printing step lines with
// tokens/s, MFU and peak memory, the validation loss, a memory table (formula vs the allocator's
// measured peak) and a generated sample; writes a checkpoint that --resume continues from.
//
//   ./scalelab data                                  # the corpus, once
//   ./scalelab run 02                                # your code
//   ./scalelab run 02 --solution -- --steps 100      # the reference, shorter
#include <filesystem>
#include <string>

#include "common/cli.hpp"
#include "common/data/corpus.hpp"
#include "common/data/tokenizer.hpp"
#include "common/log.hpp"
#include "common/metrics.hpp"
#include "common/ops/ops.hpp"
#include "common/runtime.hpp"
#include "common/trace.hpp"
#include "common/train/loop.hpp"
#include "common/train/sizing.hpp"
#include "single_device.hpp"

using namespace scalelab;

namespace {

struct Corpus {
  std::vector<uint16_t> train, val;
};

// --data is a directory holding train.bin / val.bin (./scalelab data), or a text file that is
// tokenised and split 90/10 here.
Corpus load_corpus(const std::string& where) {
  Corpus c;
  const std::string ext = std::filesystem::path(where).extension().string();
  SCALELAB_REQUIRE(!(std::filesystem::is_regular_file(where) && (ext == ".bin" || ext == ".json")),
                   "--data {} is a corpus file, not a text: pass its directory (train.bin, val.bin "
                   "and meta.json are checked together)", where);
  if (std::filesystem::is_regular_file(where)) {
    auto ids = data::encode(data::read_text_file(where));
    const std::size_t n = ids.size() * 9 / 10;
    c.train.assign(ids.begin(), ids.begin() + n);
    c.val.assign(ids.begin() + n, ids.end());
  } else {
    c.train = data::load_tokens(where + "/train.bin");
    c.val = data::load_tokens(where + "/val.bin");
  }
  return c;
}

// The lecture's model state per parameter: fp32 training keeps 4 (weights) + 4 (gradients) + 8
// (AdamW m, v) = 16 bytes; mixed precision adds a 2-byte bf16 compute copy beside the 4-byte fp32
// master: 2 + 4 + 4 + 8 = 18 bytes (gradients and AdamW state stay fp32).
struct StateBytes {
  int64_t copy = 0, master = 4, grads = 4, adam = 8;
  int64_t total() const { return copy + master + grads + adam; }
};

// moe: step 5's activation formula counts dense blocks; a mixture-of-experts block keeps more
// (the router's and the experts' tensors), so its formula column is left out, and the total
// takes the measured activations.
void print_memory_table(const lab02::MemoryEstimate& e, bool bf16, int64_t n_params,
                        std::size_t measured_state, std::size_t measured_peak,
                        std::size_t measured_activations, bool moe) {
  using metrics::human_bytes;
  const StateBytes per{bf16 ? 2 : 0};
  log::info("memory (formula vs measured by the allocator), precision {}:", bf16 ? "bf16" : "fp32");
  log::info("  per parameter (lecture): fp32 4 + 4 + 8 = 16 B; mixed 2 (bf16 copy) + 4 (fp32 "
            "master) + 4 (fp32 grads) + 8 (AdamW m, v) = 18 B; this run {} B", per.total());
  auto row = [&](const char* what, int64_t bytes_per_param) {
    log::info("  {:<12} {:>10}   {} B x {} parameters", what,
              human_bytes(static_cast<double>(bytes_per_param * n_params)), bytes_per_param,
              n_params);
  };
  if (bf16) row("bf16 copy", per.copy);
  row(bf16 ? "fp32 master" : "weights", per.master);
  row("gradients", per.grads);
  row("adamw m, v", per.adam);
  log::info("  {:<12} {:>10}   measured (model + AdamW, before training): {} = {:.2f} B per "
            "parameter", "model state", human_bytes(static_cast<double>(per.total() * n_params)),
            human_bytes(static_cast<double>(measured_state)),
            static_cast<double>(measured_state) / static_cast<double>(n_params));
  const int64_t activations = moe ? static_cast<int64_t>(measured_activations) : e.activations;
  if (moe)
    log::info("  {:<12} {:>10}   measured after forward: {} (step 5's formula counts dense "
              "blocks; this model's experts keep more)", "activations", "-",
              human_bytes(static_cast<double>(measured_activations)));
  else
    log::info("  {:<12} {:>10}   measured after forward: {}", "activations",
              human_bytes(static_cast<double>(e.activations)),
              human_bytes(static_cast<double>(measured_activations)));
  log::info("  {:<12} {:>10}   measured peak: {} (+ backward's temporaries){}", "total",
            human_bytes(static_cast<double>(per.total() * n_params + activations)),
            human_bytes(static_cast<double>(measured_peak)),
            moe ? "; the activations as measured" : "");
  (void)e.weights;  // the fp32 formula's weights, gradients and moments: the rows above
}

// Step 5's estimate in the run's precision. bf16 (mixed): activations are 2-byte elements except
// the LayerNorm statistics (2 per row in each LayerNorm: 4 B T per block, 2 B T in the head),
// which stay fp32. Flash attention keeps, per block, one fp32 log-sum-exp per (head, row) instead
// of the H T x T probabilities step 5 counts.
lab02::MemoryEstimate estimate_for(const ModelConfig& c, int64_t B, int64_t T, bool bf16,
                                   bool flash) {
  lab02::MemoryEstimate e = lab02::estimate_memory(c, B, T, 4);
  if (bf16) {
    const int64_t stats = c.n_layer * 4 * B * T + 2 * B * T;
    e.activations = 2 * lab02::activation_elements(c, B, T) + 2 * stats;
  }
  if (flash) {
    const int64_t elem = bf16 ? 2 : 4;
    e.activations -= c.n_layer * c.n_head * B * T * T * elem;  // no probabilities
    e.activations += c.n_layer * c.n_head * B * T * 4;         // lse, fp32
  }
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main(argc, argv, [](int argc, char** argv) {
    auto options = cli::make_options("lab02_single_device",
                                     "Lab 02: train a GPT on one device (the baseline)");
    cli::add_run_options(options, /*mixed_precision=*/true);
    lab02::TrainConfig d;
    options.add_options("train")
        ("model", "model config: " + fmt::format("{}", fmt::join(model_config_names(), ", ")), cxxopts::value<std::string>()->default_value("small"))
        ("data", "corpus directory (train.bin, val.bin) or a text file", cxxopts::value<std::string>()->default_value(data::default_data_dir()))
        ("steps", "training steps", cxxopts::value<int64_t>()->default_value(std::to_string(d.steps)))
        ("batch", "batch size (sequences)", cxxopts::value<int64_t>()->default_value("16"))
        ("context", "context length T (-1: the model's)", cxxopts::value<int64_t>()->default_value("-1"))
        ("lr", "peak learning rate", cxxopts::value<double>()->default_value(fmt::format("{}", d.max_lr)))
        ("min-lr", "final learning rate", cxxopts::value<double>()->default_value(fmt::format("{}", d.min_lr)))
        ("warmup", "warmup steps", cxxopts::value<int64_t>()->default_value(std::to_string(d.warmup)))
        ("clip", "max gradient norm (0: off)", cxxopts::value<double>()->default_value(fmt::format("{}", d.clip)))
        ("eval-every", "evaluate every N steps (0: only at the end)", cxxopts::value<int64_t>()->default_value("100"))
        ("eval-batches", "validation batches per evaluation", cxxopts::value<int>()->default_value("8"))
        ("log-every", "print a step line every N steps (and the last step's)", cxxopts::value<int64_t>()->default_value("10"))
        ("checkpoint", "checkpoint file (written every --checkpoint-every steps and at the end)", cxxopts::value<std::string>()->default_value(data::default_data_dir() + "/lab02.ckpt"))
        ("checkpoint-every", "also write the checkpoint every N steps (0: only at the end)", cxxopts::value<int64_t>()->default_value("100"))
        ("stop-at", "stop before this step, checkpointing, as if interrupted (try --resume); 0: run every step", cxxopts::value<int64_t>()->default_value("0"))
        ("resume", "continue from --checkpoint")
        ("sample", "characters to generate at the end", cxxopts::value<int>()->default_value("300"))
        ("peak-tflops", "device peak TFLOP/s for MFU (0: the GPU data sheet; on a CPU a measured sgemm)", cxxopts::value<double>()->default_value("0"))
        ("tf32", "allow TF32 tensor cores for fp32 matmuls on CUDA")
        ("attention", "written (two matmuls and a softmax; the T x T probabilities are kept) or flash (one fused op: tiles and an online softmax, no T x T)", cxxopts::value<std::string>()->default_value("written"));
    const auto r = cli::parse(options, argc, argv);
    const auto run = cli::run_options(r);
    SCALELAB_REQUIRE(world_size() == 1, "lab 02 trains on one device: run it on 1 rank, not {}",
                     world_size());

    const ModelConfig config = model_config(r["model"].as<std::string>());
    lab02::TrainConfig tc;
    tc.steps = r["steps"].as<int64_t>();
    tc.max_lr = r["lr"].as<double>();
    tc.min_lr = r["min-lr"].as<double>();
    tc.warmup = r["warmup"].as<int64_t>();
    tc.clip = r["clip"].as<double>();
    const int64_t B = r["batch"].as<int64_t>();
    const int64_t T = r["context"].as<int64_t>() < 0 ? config.block_size : r["context"].as<int64_t>();
    SCALELAB_REQUIRE(tc.steps > 0, "--steps must be positive, got {}", tc.steps);
    SCALELAB_REQUIRE(B > 0, "--batch must be positive, got {}", B);
    SCALELAB_REQUIRE(T > 0, "--context must be positive, got {}", T);
    const std::string attention = r["attention"].as<std::string>();
    SCALELAB_REQUIRE(attention == "written" || attention == "flash",
                     "--attention must be written or flash, got '{}'", attention);
    const bool flash = attention == "flash";
    SCALELAB_REQUIRE(T <= config.block_size, "--context {} is longer than {}'s context of {}", T,
                     config.name, config.block_size);
    SCALELAB_REQUIRE(tc.max_lr > 0 && tc.min_lr >= 0, "--lr and --min-lr must be positive");
    SCALELAB_REQUIRE(tc.min_lr <= tc.max_lr,
                     "--min-lr {} is above --lr {}: the schedule would rise after warmup",
                     tc.min_lr, tc.max_lr);
    // The rules of labs 03+ (train::read_train_options) for the options they share.
    SCALELAB_REQUIRE(tc.warmup >= 0, "--warmup must not be negative, got {}", tc.warmup);
    SCALELAB_REQUIRE(tc.clip >= 0, "--clip must not be negative (0: off), got {}", tc.clip);
    SCALELAB_REQUIRE(r["peak-tflops"].as<double>() >= 0,
                     "--peak-tflops must not be negative, got {}", r["peak-tflops"].as<double>());
    const int n_sample = r["sample"].as<int>();
    SCALELAB_REQUIRE(n_sample >= 0, "--sample must not be negative (0: none), got {}", n_sample);
    const int64_t eval_every = r["eval-every"].as<int64_t>();
    const int64_t log_every = r["log-every"].as<int64_t>();
    SCALELAB_REQUIRE(log_every > 0, "--log-every must be positive, got {}", log_every);
    const int64_t stop_at_option = r["stop-at"].as<int64_t>();
    SCALELAB_REQUIRE(stop_at_option >= 0, "--stop-at must not be negative (0: run every step), "
                     "got {}", stop_at_option);
    // The corpus is read after the peak is measured: a --data that names nothing fails here, not
    // as a missing '<text>/train.bin'.
    const std::string data_path = r["data"].as<std::string>();
    SCALELAB_REQUIRE(std::filesystem::exists(data_path),
                     "--data {}: no such file or directory (a text file, or a directory holding "
                     "train.bin and val.bin: ./scalelab data)", data_path);
    const int eval_batches = r["eval-batches"].as<int>();
    SCALELAB_REQUIRE(eval_batches > 0, "--eval-batches must be positive");
    SCALELAB_REQUIRE(eval_every >= 0, "--eval-every must not be negative (0: only at the end), "
                     "got {}", eval_every);
    // Outputs are checked before the work starts, not when the run is over (issue 9).
    const std::string ckpt = r["checkpoint"].as<std::string>();
    const int64_t ckpt_every = r["checkpoint-every"].as<int64_t>();
    SCALELAB_REQUIRE(ckpt_every >= 0, "--checkpoint-every must not be negative (0: only at the "
                     "end), got {}", ckpt_every);
    SCALELAB_REQUIRE(!ckpt.empty(), "--checkpoint must name a file");
    cli::require_writable(ckpt, "--checkpoint");

    // the host, the simulated GPU or this rank's GPU, as every program picks it
    const Device device = train::rank_device(run.device);
    // A batch too large for this machine: a usage error, before the corpus, the model or a step
    // (the OOM killer, mid-step, before). A lower bound (common/train/sizing.hpp) of a step of B
    // rows of T tokens; evaluation holds one batch at a time, and less (no activations kept). On a
    // GPU the activations are the GPU's, and only the batch is host memory.
    ModelConfig step_config = config;
    step_config.block_size = T;
    train::require_host_memory(
        train::step_bytes_at_least(step_config,
                                   {.global_batch = B, .rows = device.in_host_memory() ? B : 0,
                                    .layers = config.n_layer, .attention_probabilities = !flash},
                                   run.precision),
        fmt::format("--batch {}", B), "a training step");
    ops::set_allow_tf32(r["tf32"].as<bool>());
    // the one rule of every program (metrics::peak_for): --peak-tflops, a GPU's data sheet, or
    // on a CPU the measured sgemm
    // on a GPU with --precision bf16 the data sheet's dense bf16 tensor-core peak (H100: 989
    // TFLOP/s); a CPU's measured sgemm in both precisions (its bf16 matmuls run on that sgemm)
    const metrics::Peak peak_info = metrics::peak_for(
        device, r["peak-tflops"].as<double>(),
        run.bf16() ? metrics::Precision::bf16
                   : r["tf32"].as<bool>() ? metrics::Precision::tf32 : metrics::Precision::fp32);
    const double peak = peak_info.tflops;

    const Corpus corpus = load_corpus(data_path);
    const data::Sampler train(corpus.train, B, T, run.seed);
    const data::Sampler val(corpus.val, B, T, run.seed + 1);

    const std::size_t before_model = memory_stats(device).current;
    nn::GPT model(config, {.device = device, .seed = run.seed, .compute_dtype = run.precision,
                           .flash_attention = flash});
    optim::AdamW opt(optim::groups(model.parameters()));
    const std::size_t state_measured = memory_stats(device).current - before_model;
    int64_t start = 0;
    if (r["resume"].as<bool>()) {
      start = lab02::load_checkpoint(ckpt, model, opt);
      model.params().refresh_compute();  // bf16: the checkpoint holds the fp32 master weights
      log::info("resumed from {} at step {}", ckpt, start);
    }
    log::info("model {}: {} parameters, {} layers, {} heads, {} wide; batch {} x {} tokens on {}",
              config.name, model.num_parameters(), config.n_layer, config.n_head, config.n_embd,
              B, T, device.str());
    log::info("{}", train::precision_note(run.precision));
    log::info("attention: {}", flash ? "flash (one fused op; a log-sum-exp per row kept, no T x T)"
                                     : "written out (the T x T probabilities kept for backward)");
    log::info("MFU against {}", peak_info.str());

    const double fpt = lab02::flops_per_token(config, T);
    if (config.moe.enabled())  // step 4's count is the dense one: say what the MFU counts
      log::info("mixture of experts: MFU counts every expert ({:.4g} FLOPs a token, step 4's dense "
                "count); a token runs through {} of {} experts ({:.4g}, metrics::flops_per_token)",
                fpt, config.moe.top_k, config.moe.n_expert, metrics::flops_per_token(config, T));
    std::size_t activations_measured = 0;
    reset_peak_memory(device);
    const int64_t stop_at = stop_at_option == 0 ? tc.steps : std::min(tc.steps, stop_at_option);
    for (int64_t step = start; step < stop_at; ++step) {
      const data::Batch batch = train.batch(step).to(device);
      const double lr = lab02::learning_rate(step, tc);
      metrics::Timer timer(device);
      double loss = 0;
      {
        // in a --trace, each step's one "host read" (its loss) is inside this span
        trace::Scope scope("train_step");
        loss = lab02::train_step(model, opt, batch, lr, tc.clip);
      }
      const double dt = timer.elapsed();
      if (step % log_every == 0 || step + 1 == tc.steps) {
        metrics::StepStats s;
        s.step = step;
        s.loss = loss;
        s.lr = lr;
        s.dt_s = dt;
        s.tokens_per_s = lab02::tokens_per_second(B * T, dt);
        s.mfu = lab02::mfu(s.tokens_per_s, fpt, peak);
        s.peak_bytes = memory_stats(device).peak;
        log::info("{}", metrics::step_line(s));
      }
      if ((eval_every > 0 && (step + 1) % eval_every == 0) || step + 1 == tc.steps) {
        trace::Scope scope("eval");
        log::info("step={} val_loss={:.4f}", step, lab02::evaluate(model, val, eval_batches));
      }
      // the step to resume at is step + 1; the schedule and the data depend only on the step
      if (step + 1 == stop_at || (ckpt_every > 0 && (step + 1) % ckpt_every == 0))
        lab02::save_checkpoint(ckpt, model, opt, step + 1);
    }
    if (start >= tc.steps) log::info("nothing to do: the checkpoint is at step {}", start);
    if (stop_at < tc.steps)
      log::info("stopped before step {} of {} (--stop-at): continue with --resume", stop_at, tc.steps);

    // one more forward to measure what is kept for backward, next to the formula
    {
      const data::Batch batch = train.batch(0).to(device);
      model.forward(batch.x, batch.y);
      activations_measured = model.activation_bytes();
      model.free_activations();
    }
    print_memory_table(estimate_for(config, B, T, run.bf16(), flash), run.bf16(),
                       model.num_parameters(), state_measured, memory_stats(device).peak,
                       activations_measured, config.moe.enabled());
    log::info("checkpoint: {} (continue with --resume --steps N)", ckpt);

    if (n_sample > 0) {
      auto out = nn::generate(model, {'\n'}, n_sample, 0.8, run.seed);
      log::info("sample:\n{}", data::decode(out));
    }
    return 0;
  });
}
