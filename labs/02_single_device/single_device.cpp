// Starter generated from solutions/02_single_device/single_device.cpp by tools/make-labs: fill in each NotImplemented
// step (see README.md). Body hash a0885325df7c1dfb (lets make-labs see your edits).
#include "common/errors.hpp"  // scalelab::NotImplemented
// Lab 02: single_device. The training loop of one device: the baseline of every later lab.
#include "single_device.hpp"

#include <algorithm>
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

Scalar clip_gradients(nn::GPT& model, double max_norm) {
  // TODO step 2: global gradient norm over every parameter, then scale
  // HINT: the gradients are one flat buffer (model.params().grads()); ops::sum_squares_into and
  // HINT: ops::clip_scale keep the norm on the device (a double norm is a read to the host).
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
  // TODO step 4: training FLOPs of one token, attention included
  throw scalelab::NotImplemented(
      "lab 02 step 4: training FLOPs of one token, attention included (README.md#step-4)");
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

// A CUDA tensor goes to and from the file through host pieces of this many elements (16 MiB of
// f32), so neither saving nor loading holds a second copy of a whole tensor in host memory.
constexpr int64_t kPieceElements = int64_t(1) << 22;

// Appends t's bytes to `out`: a host tensor straight from its memory, a CUDA one piece by piece.
void write_tensor(std::ofstream& out, const Tensor& t) {
  SCALELAB_CHECK(t.is_contiguous(), "checkpoint: tensor {} is not contiguous", t.str());
  const Tensor flat = t.view({-1});
  const int64_t n = flat.numel();
  for (int64_t off = 0; off < n; off += kPieceElements) {
    const int64_t count = std::min(kPieceElements, n - off);
    const Tensor piece = flat.flat(off, count);
    const Tensor host = piece.device().is_cpu() ? piece : piece.to(Device::cpu());
    out.write(static_cast<const char*>(host.data_ptr()),
              static_cast<std::streamsize>(host.nbytes()));
  }
}

// Reads t's bytes from `in` into t: a host tensor in place, a CUDA one piece by piece.
bool read_tensor(std::ifstream& in, Tensor& t) {
  SCALELAB_CHECK(t.is_contiguous(), "checkpoint: tensor {} is not contiguous", t.str());
  Tensor flat = t.view({-1});
  const int64_t n = flat.numel();
  for (int64_t off = 0; off < n; off += kPieceElements) {
    const int64_t count = std::min(kPieceElements, n - off);
    Tensor piece = flat.flat(off, count);
    Tensor host = piece.device().is_cpu() ? piece : Tensor::empty({count}, piece.dtype());
    in.read(static_cast<char*>(host.data_ptr()), static_cast<std::streamsize>(host.nbytes()));
    if (!in.good()) return false;
    if (!piece.device().is_cpu()) piece.copy_from(host);
  }
  return true;
}
}  // namespace

// The file: the header, then the parameters, m and v (flat, in the model's order, raw bytes of
// the model's dtype). Written tensor by tensor (CUDA ones in pieces) to `path.tmp`, which is then
// renamed to `path`: the whole file is never built in memory, and an interrupted write never
// leaves a torn checkpoint.
void save_checkpoint(const std::string& path, nn::GPT& model, optim::AdamW& opt,
                     int64_t next_step) {
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  std::strncpy(h.config, model.config().name.c_str(), sizeof h.config - 1);
  h.next_step = next_step;
  h.adam_steps = opt.steps();
  h.n_params = model.num_parameters();
  h.dtype = static_cast<int32_t>(model.params().values().dtype());
  const auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir);
  const std::string tmp = path + ".tmp";
  try {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    SCALELAB_REQUIRE(out.good(), "cannot write '{}'", tmp);
    out.write(reinterpret_cast<const char*>(&h), sizeof h);
    for (const Tensor* t : {&model.params().values(), &opt.m(), &opt.v()}) write_tensor(out, *t);
    out.flush();
    SCALELAB_REQUIRE(out.good(), "error writing '{}'", tmp);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw;
  }
  std::filesystem::rename(tmp, path);
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
  // The size is checked before anything is read into the model, so a short file leaves it as it
  // was.
  const std::vector<Tensor*> tensors = {&model.params().values(), &opt.m(), &opt.v()};
  std::uintmax_t expected = sizeof h;
  for (const Tensor* t : tensors) expected += t->nbytes();
  const std::uintmax_t size = std::filesystem::file_size(path);
  SCALELAB_REQUIRE(size >= expected, "checkpoint '{}' is truncated ({} bytes, expected {})", path,
                   size, expected);
  SCALELAB_REQUIRE(size == expected, "checkpoint '{}' has {} bytes, expected {}", path, size,
                   expected);
  for (Tensor* t : tensors)
    SCALELAB_REQUIRE(read_tensor(in, *t), "checkpoint '{}' is truncated", path);
  opt.set_steps(h.adam_steps);
  return h.next_step;
}

}  // namespace scalelab::lab02
