// Starter generated from solutions/02_single_device/single_device.cpp by tools/make-labs: fill in each NotImplemented
// step (see README.md). Body hash c805bd71e987a2d9 (lets make-labs see your edits).
#include "common/errors.hpp"  // scalelab::NotImplemented
// Lab 02: single_device. The training loop of one device: the baseline of every later lab.
#include "single_device.hpp"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numbers>

#include "common/data/corpus.hpp"
#include "common/ops/ops.hpp"

namespace scalelab::lab02 {

double train_step(nn::GPT& model, optim::AdamW& opt, const data::Batch& batch, double lr,
                  double clip) {
  // TODO step 1: zero grads, forward, backward, (clip), AdamW step
  // HINT: backward ACCUMULATES (+=) into the gradients: what must happen before it?
  throw scalelab::NotImplemented(
      "lab 02 step 1: zero grads, forward, backward, (clip), AdamW step (README.md#step-1)");
}

double learning_rate(int64_t step, const TrainConfig& c) {
  // TODO step 2: linear warmup, then cosine decay to min_lr
  throw scalelab::NotImplemented(
      "lab 02 step 2: linear warmup, then cosine decay to min_lr (README.md#step-2)");
}

double clip_gradients(nn::GPT& model, double max_norm) {
  // TODO step 2: global gradient norm over every parameter, then scale
  // HINT: ops::sum_squares and ops::scale; the gradients are also one flat buffer
  // HINT: (model.params().grads()).
  throw scalelab::NotImplemented(
      "lab 02 step 2: global gradient norm over every parameter, then scale (README.md#step-2)");
}

double evaluate(nn::GPT& model, const data::Sampler& val, int n_batches) {
  // TODO step 3: mean loss over validation batches 0 .. n-1
  // HINT: GPT::loss keeps no activations; batches live on the host (Batch::to).
  throw scalelab::NotImplemented(
      "lab 02 step 3: mean loss over validation batches 0 .. n-1 (README.md#step-3)");
}

double tokens_per_second(int64_t tokens, double seconds) {
  // TODO step 4: tokens per second
  throw scalelab::NotImplemented(
      "lab 02 step 4: tokens per second (README.md#step-4)");
}

double flops_per_token(const ModelConfig& c, int64_t T) {
  // TODO step 4: 6N + 12 L H Q T
  throw scalelab::NotImplemented(
      "lab 02 step 4: 6N + 12 L H Q T (README.md#step-4)");
}

double mfu(double tokens_per_s, double flops_per_token, double peak_tflops) {
  // TODO step 4: achieved FLOP/s over the peak
  throw scalelab::NotImplemented(
      "lab 02 step 4: achieved FLOP/s over the peak (README.md#step-4)");
}

int64_t activation_elements(const ModelConfig& c, int64_t B, int64_t T) {
  // TODO step 5: the activations forward keeps for backward
  throw scalelab::NotImplemented(
      "lab 02 step 5: the activations forward keeps for backward (README.md#step-5)");
}

MemoryEstimate estimate_memory(const ModelConfig& c, int64_t B, int64_t T,
                               int64_t bytes_per_element) {
  MemoryEstimate m;
  // TODO step 5: weights, gradients, AdamW moments, activations
  throw scalelab::NotImplemented(
      "lab 02 step 5: weights, gradients, AdamW moments, activations (README.md#step-5)");
  return m;
}

// ---- given: checkpoints ------------------------------------------------------------------------

namespace {
constexpr char kMagic[8] = {'S', 'C', 'L', 'B', 'C', 'K', 'P', '1'};

struct Header {
  char magic[8];
  char config[24];
  int64_t next_step, adam_steps, n_params;
  int32_t dtype;
};

void append(std::string& out, const Tensor& t) {
  const Tensor host = t.to(Device::cpu());
  out.append(static_cast<const char*>(host.data_ptr()), host.nbytes());
}
}  // namespace

void save_checkpoint(const std::string& path, nn::GPT& model, optim::AdamW& opt,
                     int64_t next_step) {
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  std::strncpy(h.config, model.config().name.c_str(), sizeof h.config - 1);
  h.next_step = next_step;
  h.adam_steps = opt.steps();
  h.n_params = model.num_parameters();
  h.dtype = static_cast<int32_t>(model.params().values().dtype());
  std::string bytes(reinterpret_cast<const char*>(&h), sizeof h);
  append(bytes, model.params().values());
  append(bytes, opt.m());
  append(bytes, opt.v());
  const auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir);
  data::write_file_atomic(path, bytes.data(), bytes.size());
}

int64_t load_checkpoint(const std::string& path, nn::GPT& model, optim::AdamW& opt) {
  std::ifstream in(path, std::ios::binary);
  SCALELAB_REQUIRE(in.good(), "cannot read checkpoint '{}' (train without --resume first)", path);
  Header h{};
  in.read(reinterpret_cast<char*>(&h), sizeof h);
  SCALELAB_REQUIRE(in.good() && std::memcmp(h.magic, kMagic, sizeof kMagic) == 0,
                   "'{}' is not a scalelab checkpoint", path);
  SCALELAB_REQUIRE(model.config().name == h.config && h.n_params == model.num_parameters() &&
                       h.dtype == static_cast<int32_t>(model.params().values().dtype()),
                   "checkpoint '{}' is for model '{}' ({} parameters), not '{}' ({})", path,
                   h.config, h.n_params, model.config().name, model.num_parameters());
  for (Tensor* t : {&model.params().values(), &opt.m(), &opt.v()}) {
    Tensor host = Tensor::empty(t->shape(), t->dtype());
    in.read(static_cast<char*>(host.data_ptr()), static_cast<std::streamsize>(host.nbytes()));
    SCALELAB_REQUIRE(in.good(), "checkpoint '{}' is truncated", path);
    t->copy_from(host);
  }
  opt.set_steps(h.adam_steps);
  return h.next_step;
}

}  // namespace scalelab::lab02
