// The shared lab-test fixture: see lab_fixture.hpp for the contract.
#include "tests/support/lab_fixture.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include <mpi.h>

#include <fmt/format.h>

#include "common/data/tokenizer.hpp"
#include "common/device.hpp"
#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/runtime.hpp"
#include "common/train/equivalence.hpp"
#include "tests/support/raw_mpi.hpp"

namespace scalelab::labtest {

namespace {
// Objects made on first use and kept until exit (std::map nodes never move, so the references
// handed out stay valid). Tests are single-threaded; the mutex only guards against surprises.
std::mutex g_mutex;
}  // namespace

comm::Communicator& world() {
  static comm::Communicator c = comm::Communicator::world("mpi");
  return c;
}

comm::Communicator new_world() { return comm::Communicator::world("mpi"); }

const std::vector<uint16_t>& synthetic_corpus(uint64_t seed) {
  static std::map<uint64_t, std::vector<uint16_t>> cache;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = cache.find(seed);
  if (it == cache.end()) it = cache.emplace(seed, train::synthetic_corpus(kSyntheticTokens, seed)).first;
  return it->second;
}

const std::vector<uint16_t>& sentence_corpus(uint64_t seed, int sentences) {
  static std::map<std::pair<uint64_t, int>, std::vector<uint16_t>> cache;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = cache.find({seed, sentences});
  if (it == cache.end()) {
    const char* s[] = {"the cat sat on the mat. ", "a dog ran in the park. ",
                       "we like to eat bread. ", "birds fly over the sea. "};
    std::string text;
    uint64_t x = seed;
    for (int i = 0; i < sentences; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      text += s[(x >> 33) % 4];
    }
    it = cache.emplace(std::pair{seed, sentences}, data::encode(text)).first;
  }
  return it->second;
}

const ModelConfig& test_model(int64_t n_layer) {
  static std::map<int64_t, ModelConfig> cache;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = cache.find(n_layer);
  if (it == cache.end()) it = cache.emplace(n_layer, train::test_config(n_layer)).first;
  return it->second;
}

data::Sampler Setup::sampler() const {
  return data::Sampler(corpus(), global_batch, config().block_size, seed);
}

train::Reference Setup::reference(const data::Batch& b) const {
  return train::single_device_step(config(), seed, b);
}

data::Batch rank_rows(const data::Batch& global, int rank, int world) {
  const int64_t B = global.batch_size();
  SCALELAB_REQUIRE(world > 0 && B % world == 0 && rank >= 0 && rank < world,
                   "test fixture: rank {} of {} cannot take an equal share of {} rows", rank,
                   world, B);
  const int64_t b = B / world;
  return global.rows(rank * b, (rank + 1) * b);
}

data::Batch my_rows(const data::Batch& global) {
  return rank_rows(global, world().rank(), world().size());
}

testing::AssertionResult on_every_rank(const testing::AssertionResult& ok) {
  // Every rank's message (empty when it passed), gathered to every rank: lengths, then bytes.
  constexpr std::size_t kMaxMessage = 400;
  std::string mine = ok ? std::string() : std::string(ok.message());
  if (!ok && mine.empty()) mine = "failed";
  if (mine.size() > kMaxMessage) mine = mine.substr(0, kMaxMessage) + "...";
  const int size = world_size();
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(size), offsets(size, 0);
  const LibraryMpi harness;  // the grader's own exchange, not a raw call of the code under test
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD);
  for (int r = 1; r < size; ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::string all(static_cast<std::size_t>(offsets[size - 1] + lengths[size - 1]), '\0');
  MPI_Allgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(),
                 MPI_CHAR, MPI_COMM_WORLD);
  std::string causes;
  int failing = 0;
  for (int r = 0; r < size; ++r) {
    if (lengths[r] == 0) continue;
    if (++failing <= 3)
      causes += fmt::format("{}rank {}: {}", causes.empty() ? "" : "; ", r,
                            all.substr(static_cast<std::size_t>(offsets[r]), lengths[r]));
  }
  if (failing == 0) return testing::AssertionSuccess();
  if (failing > 3) causes += fmt::format("; and {} more rank(s)", failing - 3);
  return testing::AssertionFailure() << causes;
}

testing::AssertionResult close_on_every_rank(const Tensor& got, const Tensor& want, double rtol,
                                             double atol) {
  const train::Diff d = train::compare(got, want);
  testing::AssertionResult mine = testing::AssertionSuccess();
  if (!d.within(rtol, atol))
    mine = testing::AssertionFailure() << fmt::format("not within rtol {:g} atol {:g}: ", rtol, atol)
                                       << d.str();
  return on_every_rank(mine);
}

Explain::Explain(nn::GPT& model, nn::GPTOptions twin, train::RowLayout rows)
    : model_(model), twin_(std::move(twin)),
      recorder_(std::make_shared<train::DivergenceRecorder>(std::move(rows))) {
  train::watch(model_, recorder_);
}

Explain::~Explain() { recorder_->stop(); }  // the model may run on: it records nothing more

void Explain::step_done(const data::Batch& global, bool gradients) {
  recorder_->stop();
  if (gradients) recorder_->record_gradients(model_);
  global_ = global;
}

std::string Explain::first_line() const {
  if (!global_) return "";
  if (!first_) {
    const train::DivergenceRecorder twin = train::record_twin(model_.config(), twin_, *global_);
    first_ = train::find_divergence(*recorder_, twin, twin_.compute_dtype, world()).first_line();
  }
  return *first_;
}

testing::AssertionResult on_every_rank(const testing::AssertionResult& ok, const Explain& why) {
  testing::AssertionResult all = on_every_rank(ok);
  if (all) return all;
  // the same verdict on every rank: each takes part in the report's collectives
  const std::string first = why.first_line();
  if (first.empty()) return all;
  return testing::AssertionFailure() << first << "; " << all.message();
}

testing::AssertionResult close_on_every_rank(const Tensor& got, const Tensor& want, double rtol,
                                             double atol, const Explain& why) {
  const train::Diff d = train::compare(got, want);
  testing::AssertionResult mine = testing::AssertionSuccess();
  if (!d.within(rtol, atol))
    mine = testing::AssertionFailure() << fmt::format("not within rtol {:g} atol {:g}: ", rtol, atol)
                                       << d.str();
  return on_every_rank(mine, why);
}

testing::AssertionResult bitwise(const Tensor& got, const Tensor& want) {
  const train::Diff d = train::compare(got, want);
  if (d.bitwise) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "not bitwise equal: " << d.str();
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to(Device::cpu()).to_vector()) m = std::max(m, std::abs(v));
  return m;
}

std::optional<Device> test_gpu() {
  if (const char* d = std::getenv("SCALELAB_TEST_DEVICE"); d && std::string(d) == "sim")
    return Device::sim();
  const int gpus = cuda_device_count();
  if (gpus == 0) return std::nullopt;
  ops::set_allow_tf32(false);  // fp32 stays fp32: CUDA vs CPU at 1e-4
  return Device::cuda(world_rank() % gpus);
}

testing::AssertionResult gpu_step_matches_cpu(double got_loss, double want_loss,
                                              const Tensor& got_grads, const Tensor& want_grads,
                                              bool bf16) {
  // both checks on every rank, whatever the first gives: each is collective
  const testing::AssertionResult loss = close_on_every_rank(
      Tensor::from_vector({got_loss}, {1}, DType::f64),
      Tensor::from_vector({want_loss}, {1}, DType::f64), bf16 ? 2e-3 : 1e-5, 0);
  const testing::AssertionResult grads =
      close_on_every_rank(got_grads.to(Device::cpu()), want_grads, 0,
                          (bf16 ? 3e-2 : 1e-4) * max_abs(want_grads));
  if (loss && grads) return testing::AssertionSuccess();
  testing::AssertionResult failed = testing::AssertionFailure();
  if (!loss) failed << "the GPU step's loss against the CPU step's: " << loss.message();
  if (!grads)
    failed << (loss ? "" : "; ") << "the GPU step's gradients against the CPU step's: "
           << grads.message();
  return failed;
}

}  // namespace scalelab::labtest
