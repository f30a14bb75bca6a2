#pragma once
/// @file loop.hpp
/// What the training programs of labs 03-06 share: their command-line options (model, data,
/// batch, steps, learning rate), loading the corpus, and the step line with global and per-rank
/// tokens/s, MFU and the peak memory of the busiest rank. The parallel technique itself lives in
/// each lab; this is only the frame around it.
#include <cstdint>
#include <string>
#include <vector>

#include <cxxopts.hpp>

#include "common/comm/communicator.hpp"
#include "common/metrics.hpp"
#include "common/model_config.hpp"

namespace scalelab::train {

/// The training options the programs of labs 03-10 share (add_train_options).
struct TrainOptions {
  std::string model = "small";  ///< tiny | small | gpt-85m
  std::string data;             ///< directory with train.bin (default: the repository's data/)
  int64_t batch = 16;           ///< GLOBAL batch (rows of `block_size` tokens), over all ranks
  int64_t steps = 20;           ///< optimizer steps
  double lr = 1e-3;             ///< the peak learning rate (cosine schedule)
  int64_t warmup = 5;           ///< steps of linear warmup
  double peak_tflops = 0;       ///< per rank; 0: the GPU's data sheet, or a CPU's measured sgemm
};

/// Adds --model --data --batch --steps --lr --warmup --peak-tflops with `defaults`.
void add_train_options(cxxopts::Options& options, const TrainOptions& defaults = {});
/// Reads and validates them (UsageError on a bad value).
TrainOptions read_train_options(const cxxopts::ParseResult& result);

/// The corpus's train split: `<data>/train.bin` (UsageError naming `./scalelab data` if missing).
std::vector<uint16_t> load_train_tokens(const TrainOptions& options);
/// The corpus's validation split, `<data>/val.bin`, beside train.bin (call load_train_tokens
/// first: it says what is wrong with --data).
std::vector<uint16_t> load_val_tokens(const TrainOptions& options);

/// The device this rank computes on for `--device` (cpu or cuda): the CPU, or the GPU of its
/// node-local rank, local_rank % GPUs (lab 00's choice; the local rank comes from
/// MPI_Comm_split_type, so it is right under any launcher). Collective over MPI_COMM_WORLD.
/// --device cuda without a GPU is a usage error.
Device rank_device(const std::string& device);

/// The learning rate of `step`: linear warmup, cosine decay to lr/10 at the last step.
double learning_rate(const TrainOptions& options, int64_t step);

/// Formats step lines. Collective over `comm` (the peak memory is the max over ranks).
class StepReporter {
 public:
  /// The MFU peak follows metrics::peak_for, the rule of every program: `peak_tflops` when > 0,
  /// a GPU's data sheet, or on a CPU the sgemm every rank measures at the same time, averaged
  /// over the ranks (about 0.5 s; collective over `comm` then). `precision` (--precision) picks
  /// the data-sheet peak on a GPU: bf16 is the dense bf16 tensor-core figure (H100: 989
  /// TFLOP/s). A CPU's peak is its measured fp32 sgemm in both precisions: the CPU computes bf16
  /// matmuls with that same sgemm (ops/cpu/matmul_cpu.cpp).
  StepReporter(const ModelConfig& config, int64_t tokens_per_step, Device device,
               double peak_tflops, comm::Communicator& comm, DType precision = DType::f32);
  /// "step=3 loss=4.1234 lr=1.00e-03 dt=120ms tps=34k tps/rank=8k mfu=..% mem=3.1MiB"
  std::string line(int64_t step, double loss, double dt_s, double lr);
  /// The per-rank peak TFLOP/s used for MFU (0: unknown, MFU not printed).
  double peak_tflops() const { return peak_tflops_; }
  /// A sentence about where the MFU peak comes from (printed once by the programs).
  std::string mfu_note() const;

 private:
  ModelConfig config_;
  int64_t tokens_per_step_;
  Device device_;
  double peak_tflops_;
  std::string peak_;  // the peak and its source, for mfu_note
  comm::Communicator& comm_;
};

/// One line saying what --precision means for this run: "precision fp32", or for bf16 what is
/// bf16 (the weight copy, activations) and what stays fp32 (master weights, gradients, AdamW
/// state, the gradient all-reduce).
std::string precision_note(DType precision);

/// The max over the ranks of `comm` of this rank's allocator peak (bytes).
std::size_t max_peak_bytes(Device device, comm::Communicator& comm);

}  // namespace scalelab::train
