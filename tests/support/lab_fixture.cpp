// The shared lab-test fixture: see lab_fixture.hpp for the contract.
#include "tests/support/lab_fixture.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "common/data/tokenizer.hpp"
#include "common/device.hpp"
#include "common/errors.hpp"
#include "common/ops/ops.hpp"
#include "common/runtime.hpp"
#include "common/train/equivalence.hpp"

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

testing::AssertionResult close_on_every_rank(const Tensor& got, const Tensor& want, double rtol,
                                             double atol) {
  const train::Diff d = train::compare(got, want);
  if (train::on_every_rank(d.within(rtol, atol), world())) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "not within rtol " << rtol << " atol " << atol
                                     << " on every rank; on this rank: " << d.str();
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
  const int gpus = cuda_device_count();
  if (gpus == 0) return std::nullopt;
  ops::set_allow_tf32(false);  // fp32 stays fp32: CUDA vs CPU at 1e-4
  return Device::cuda(world_rank() % gpus);
}

}  // namespace scalelab::labtest
