#include "common/train/session.hpp"

#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/log.hpp"

namespace scalelab::train {

Session::Session(const std::string& program, const std::string& description,
                 const TrainOptions& defaults)
    : options_(cli::make_options(program, description)) {
  cli::add_run_options(options_, /*mixed_precision=*/true);
  add_train_options(options_, defaults);
  options_.add_options("check")(
      "diverge", "run one step, compare every activation and gradient with the single-device "
                 "twin's and name the first that differs (exit 1), or exit 0");
}

const cxxopts::ParseResult& Session::parse(int argc, char** argv, DevicePick pick) {
  parsed_ = cli::parse(options_, argc, argv);
  run_ = cli::run_options(parsed_);
  opt_ = read_train_options(parsed_);
  diverge_ = parsed_["diverge"].as<bool>();  // --diverge=false too
  if (diverge_) opt_.steps = 1;  // the report compares one step
  config_ = model_config(opt_.model);
  comm_.emplace(comm::Communicator::world(run_.backend));
  if (pick == DevicePick::at_parse) pick_device();
  return parsed_;
}

void Session::pick_device() {
  SCALELAB_CHECK(comm_.has_value(), "Session::pick_device before parse()");
  SCALELAB_CHECK(!device_picked_, "Session::pick_device: the device is picked already");
  device_ = rank_device(run_.device);
  device_picked_ = true;
}

Device Session::device() const {
  SCALELAB_CHECK(device_picked_, "Session::device before the device is picked (parse with "
                                 "DevicePick::by_lab needs pick_device())");
  return device_;
}

void Session::require_dense(const std::string& why) const {
  if (!config_.moe.enabled()) return;
  std::vector<std::string> dense;
  for (const std::string& name : model_config_names())
    if (!model_config(name).moe.enabled()) dense.push_back(name);
  throw UsageError(fmt::format("--model {}: {}; its mixture-of-experts blocks are lab 12's (dense "
                               "models: {})", opt_.model, why, fmt::join(dense, ", ")));
}

void Session::require_step_memory(int64_t rows, StepShape shape) const {
  shape.global_batch = opt_.batch;
  shape.rows = device().in_host_memory() ? rows : 0;
  if (shape.layers == 0) shape.layers = config_.n_layer;
  require_host_memory(step_bytes_at_least(config_, shape, run_.precision),
                      fmt::format("--batch {}", opt_.batch), "a training step");
}

void Session::set_context(int64_t tokens) {
  SCALELAB_CHECK(comm_.has_value(), "Session::set_context before parse()");
  SCALELAB_CHECK(!sampler_ && !reporter_, "Session::set_context after sampler() or announce(): "
                                          "they drew and counted the model's context");
  SCALELAB_CHECK(tokens > 0, "Session::set_context({}): a context is at least one token", tokens);
  config_.block_size = tokens;
}

data::Sampler& Session::sampler() {
  if (!sampler_) {
    tokens_ = load_train_tokens(opt_);
    sampler_.emplace(tokens_, opt_.batch, config_.block_size, run_.seed);
  }
  return *sampler_;
}

data::Sampler& Session::val_sampler() {
  if (!val_sampler_) {
    sampler();  // the train split first: it says what is wrong with --data
    val_tokens_ = load_val_tokens(opt_);
    val_sampler_.emplace(val_tokens_, opt_.batch, config_.block_size, run_.seed + 1);
  }
  return *val_sampler_;
}

void Session::announce(const std::string& headline, bool mfu_note) {
  log::info("{}", headline);
  log::info("{}", precision_note(run_.precision));
  reporter_ = std::make_unique<StepReporter>(config_, opt_.batch * config_.block_size, device(),
                                             opt_.peak_tflops, *comm_, run_.precision);
  if (mfu_note) log::info("{}", reporter_->mfu_note());
}

std::string Session::step_line(int64_t step, double loss, double dt_s) {
  SCALELAB_CHECK(reporter_ != nullptr, "Session::step_line before announce()");
  return reporter_->line(step, loss, dt_s, lr(step));
}

std::shared_ptr<DivergenceRecorder> Session::watch_divergence(nn::GPT& model, RowLayout rows) {
  if (!diverge_) return nullptr;
  auto rec = std::make_shared<DivergenceRecorder>(std::move(rows));
  watch(model, rec);
  return rec;
}

ExitCode Session::divergence_exit(const DivergenceRecorder& recording,
                                  const nn::GPTOptions& twin, const ModelConfig& config) {
  SCALELAB_CHECK(diverge_, "Session::divergence_exit without --diverge");
  const DivergenceRecorder twin_run = record_twin(config, twin, sampler().batch(0));
  const Divergence d = find_divergence(recording, twin_run, run_.precision, *comm_);
  log::info("{}", d.str());  // rank 0
  return d.found ? kExitFailed : kExitOk;
}

}  // namespace scalelab::train
