#include "common/train/loop.hpp"

#include <algorithm>
#include <filesystem>

#include "common/data/corpus.hpp"
#include "common/device.hpp"
#include "common/errors.hpp"
#include "common/optim/optim.hpp"
#include "common/runtime.hpp"

namespace scalelab::train {

Device rank_device(const std::string& device) {
  // Every rank takes part in the split, whichever device it asked for (the call is collective).
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL, &node);
  int local_rank = 0;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_free(&node);
  if (device == "sim") return Device::sim();
  if (device != "cuda") return Device::cpu();
  const int gpus = cuda_device_count();
  SCALELAB_REQUIRE(gpus > 0, "--device cuda, but this rank sees no GPU (built with CUDA: {})",
                   cuda_compiled() ? "yes" : "no");
  return Device::cuda(local_rank % gpus);
}

void add_train_options(cxxopts::Options& options, const TrainOptions& d) {
  options.add_options("train")
      ("model", "model config: " + fmt::format("{}", fmt::join(model_config_names(), ", ")) +
                    " (the -moe ones have mixture-of-experts blocks: labs 02 and 12 train them)",
       cxxopts::value<std::string>()->default_value(d.model))
      ("data", "directory holding train.bin (default: ./data, made by ./scalelab data)",
       cxxopts::value<std::string>()->default_value(d.data))
      ("batch", "GLOBAL batch size in sequences, over all ranks",
       cxxopts::value<int64_t>()->default_value(std::to_string(d.batch)))
      ("steps", "training steps", cxxopts::value<int64_t>()->default_value(std::to_string(d.steps)))
      ("lr", "peak learning rate (AdamW)", cxxopts::value<double>()->default_value(fmt::format("{}", d.lr)))
      ("warmup", "warmup steps", cxxopts::value<int64_t>()->default_value(std::to_string(d.warmup)))
      ("peak-tflops", "dense peak TFLOP/s of one rank's device for MFU (0: the GPU's data sheet, "
                      "or on a CPU the sgemm every rank measures at once)",
       cxxopts::value<double>()->default_value(fmt::format("{}", d.peak_tflops)));
}

TrainOptions read_train_options(const cxxopts::ParseResult& r) {
  TrainOptions o;
  o.model = r["model"].as<std::string>();
  model_config(o.model);  // UsageError naming the known configs
  o.data = r["data"].as<std::string>();
  o.batch = r["batch"].as<int64_t>();
  o.steps = r["steps"].as<int64_t>();
  o.lr = r["lr"].as<double>();
  o.warmup = r["warmup"].as<int64_t>();
  o.peak_tflops = r["peak-tflops"].as<double>();
  SCALELAB_REQUIRE(o.batch > 0, "--batch must be positive, got {}", o.batch);
  SCALELAB_REQUIRE(o.steps > 0, "--steps must be positive, got {}", o.steps);
  SCALELAB_REQUIRE(o.lr > 0, "--lr must be positive, got {}", o.lr);
  SCALELAB_REQUIRE(o.warmup >= 0, "--warmup must not be negative, got {}", o.warmup);
  SCALELAB_REQUIRE(o.peak_tflops >= 0, "--peak-tflops must not be negative, got {}",
                   o.peak_tflops);
  return o;
}

std::vector<uint16_t> load_train_tokens(const TrainOptions& o) {
  if (o.data.empty()) return data::load_tokens(data::default_data_dir() + "/train.bin");
  // --data names a corpus directory. Say so when it names a file (a text, or one of the corpus's
  // own files) or nothing, instead of "missing data file 'FILE/train.bin'".
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(o.data);
  if (fs::is_regular_file(p, ec)) {
    const std::string name = p.filename().string();
    const std::string dir = p.parent_path().empty() ? "." : p.parent_path().string();
    SCALELAB_REQUIRE(name != "train.bin" && name != "val.bin" && name != "meta.json",
                     "--data {} is a file of a corpus: give its directory, --data {}", o.data, dir);
    throw UsageError(fmt::format("--data {} is a file: give a corpus directory (train.bin, "
                                 "val.bin, meta.json); make one from this text with ./scalelab "
                                 "data {} --out DIR, then --data DIR", o.data, o.data));
  }
  SCALELAB_REQUIRE(fs::exists(p, ec), "--data {}: no such directory (make a corpus there with "
                   "./scalelab data [FILE] --out {})", o.data, o.data);
  SCALELAB_REQUIRE(fs::is_directory(p, ec), "--data {} is not a directory: give a corpus "
                   "directory (train.bin, val.bin, meta.json)", o.data);
  return data::load_tokens(o.data + "/train.bin");
}

std::vector<uint16_t> load_val_tokens(const TrainOptions& o) {
  return data::load_tokens((o.data.empty() ? data::default_data_dir() : o.data) + "/val.bin");
}

double learning_rate(const TrainOptions& o, int64_t step) {
  return optim::cosine_lr(step, o.warmup, o.steps, o.lr, o.lr / 10);
}

StepReporter::StepReporter(const ModelConfig& config, int64_t tokens_per_step, Device device,
                           double peak_tflops, comm::Communicator& comm, DType precision)
    : config_(config), tokens_per_step_(tokens_per_step), device_(device), comm_(comm) {
  // The one rule of every program (metrics::peak_for, as lab 02): --peak-tflops, a GPU's data
  // sheet, or on a CPU the measured sgemm. On a CPU every rank measures at the same time (after
  // a barrier), while the others run too, and the average over the ranks is every rank's peak
  // (the same number everywhere), so one rank that happened to run alone does not set it. With
  // more ranks than cores the figure is still above a rank's fair share (each rank keeps its
  // fastest 20 ms window, measure_matmul_tflops): MFU is then a lower bound.
  const bool measure = peak_tflops <= 0 && !device.is_cuda();
  if (measure) comm_.barrier();
  metrics::Peak peak = metrics::peak_for(
      device, peak_tflops,
      precision == DType::bf16 ? metrics::Precision::bf16 : metrics::Precision::fp32);
  if (measure) {
    Tensor t = Tensor::from_vector({peak.tflops}, {1}, DType::f64);
    comm_.all_reduce(t, comm::ReduceOp::sum);
    peak.tflops = t.item() / comm_.size();
    if (comm_.size() > 1)
      peak.source = fmt::format("this CPU's 512^3 sgemm measured by {} ranks at once, averaged; "
                                "--peak-tflops overrides", comm_.size());
  }
  peak_tflops_ = peak.tflops;
  peak_ = peak.str();
}

std::string StepReporter::mfu_note() const {
  if (peak_tflops_ > 0)
    return fmt::format("MFU against {} per rank, {:.3g} FLOPs per token", peak_,
                       metrics::flops_per_token(config_, config_.block_size));
  return fmt::format("MFU not shown: the peak of {} is unknown (pass --peak-tflops)",
                     device_.is_cuda() ? "this GPU" : "this CPU");
}

std::string StepReporter::line(int64_t step, double loss, double dt_s, double lr) {
  metrics::StepStats s;
  s.step = step;
  s.loss = loss;
  s.dt_s = dt_s;
  s.world = comm_.size();
  s.tokens_per_s = static_cast<double>(tokens_per_step_) / dt_s;
  s.mfu = metrics::mfu(s.tokens_per_s / s.world,
                       metrics::flops_per_token(config_, config_.block_size), peak_tflops_);
  s.peak_bytes = max_peak_bytes(device_, comm_);
  s.lr = lr;
  return metrics::step_line(s);
}

std::string precision_note(DType precision) {
  if (precision != DType::bf16) return "precision fp32 (weights, gradients, AdamW state, activations)";
  return "precision bf16, mixed: fp32 master weights, gradients (all-reduced in fp32) and AdamW "
         "state; a bf16 copy of the weights and bf16 activations for compute (LayerNorm "
         "statistics and the loss in fp32)";
}

std::size_t max_peak_bytes(Device device, comm::Communicator& comm) {
  Tensor peak = Tensor::from_vector({static_cast<double>(memory_stats(device).peak)}, {1},
                                    DType::f64);
  comm.all_reduce(peak, comm::ReduceOp::max);
  return static_cast<std::size_t>(peak.item());
}

}  // namespace scalelab::train
