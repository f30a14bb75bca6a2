// scalelab_bench_adamw: times one AdamW::step over a GPT's parameters (default gpt-85m, ~86M
// floats), best and median of --repeats steps after --warmup ones. The groups have the model's
// shapes and weight-decay flags (2-d weights decay) as views of one flat parameter buffer and one
// flat gradient buffer, like the model's; nothing else of the model is built. Not a test: compare
// with PyTorch with tools/bench_adamw_torch.py (both at once: tools/bench/adamw_vs_torch.sh).
// The host update is single-threaded (as the labs run it; OPENBLAS_NUM_THREADS does not matter).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "common/allocator.hpp"
#include "common/cli.hpp"
#include "common/errors.hpp"
#include "common/model_config.hpp"
#include "common/optim/optim.hpp"
#include "common/runtime.hpp"

namespace {
using namespace scalelab;

struct Shape {
  std::vector<int64_t> dims;
  bool decay;  // weight decay: 2-d weights (nanoGPT's rule)
};

// The parameters of a GPT in model order (tied LM head counted once).
std::vector<Shape> gpt_shapes(const ModelConfig& c) {
  const int64_t C = c.n_embd;
  std::vector<Shape> s = {{{c.vocab_size, C}, true}, {{c.block_size, C}, true}};
  for (int64_t l = 0; l < c.n_layer; ++l) {
    for (auto d : std::vector<std::vector<int64_t>>{
             {C}, {C}, {3 * C, C}, {3 * C}, {C, C}, {C}, {C}, {C}, {4 * C, C}, {4 * C},
             {C, 4 * C}, {C}})
      s.push_back({d, d.size() == 2});
  }
  s.push_back({{C}, false});
  s.push_back({{C}, false});
  return s;
}
}  // namespace

int main(int argc, char** argv) {
  return scalelab::run_main(argc, argv, [](int argc, char** argv) {
    auto options = cli::make_options(
        "scalelab_bench_adamw",
        "Time AdamW::step over a GPT's parameters (one thread on the host): best and median ms.");
    options.add_options()("model", "model config (its parameter shapes)",
                          cxxopts::value<std::string>()->default_value("gpt-85m"))(
        "repeats", "timed steps", cxxopts::value<int>()->default_value("10"))(
        "warmup", "untimed steps first", cxxopts::value<int>()->default_value("2"))(
        "device", "cpu or cuda[:N]", cxxopts::value<std::string>()->default_value("cpu"));
    auto r = cli::parse(options, argc, argv);
    const ModelConfig config = model_config(r["model"].as<std::string>());
    const int repeats = r["repeats"].as<int>(), warmup = r["warmup"].as<int>();
    SCALELAB_REQUIRE(repeats >= 1 && warmup >= 0, "--repeats must be >= 1 and --warmup >= 0");
    const Device device = Device::parse(r["device"].as<std::string>());

    const std::vector<Shape> shapes = gpt_shapes(config);
    int64_t total = 0;
    for (const Shape& s : shapes) {
      int64_t n = 1;
      for (int64_t d : s.dims) n *= d;
      total += n;
    }
    SCALELAB_CHECK(total == parameter_count(config), "shapes give {} parameters, the config {}",
                   total, parameter_count(config));

    // Random values and gradients (the update's cost does not depend on them).
    std::mt19937_64 rng(1337);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    auto random_tensor = [&] {
      Tensor t = Tensor::empty({total});
      float* p = t.data<float>();
      for (int64_t i = 0; i < total; ++i) p[i] = normal(rng);
      return device.is_cpu() ? t : t.to(device);
    };
    Tensor value = random_tensor(), grad = random_tensor();

    std::vector<optim::Group> groups;
    int64_t off = 0;
    for (const Shape& s : shapes) {
      int64_t n = 1;
      for (int64_t d : s.dims) n *= d;
      groups.push_back({value.flat(off, n).view(s.dims), grad.flat(off, n).view(s.dims), s.decay});
      off += n;
    }
    optim::AdamW opt(groups);  // nanoGPT's betas (0.9, 0.95), eps 1e-8, weight decay 0.1

    std::vector<double> ms;
    for (int i = 0; i < warmup + repeats; ++i) {
      device_synchronize(device);
      const auto t0 = std::chrono::steady_clock::now();
      opt.step(6e-4);
      device_synchronize(device);
      const double dt =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (i >= warmup) ms.push_back(dt);
    }
    std::sort(ms.begin(), ms.end());
    fmt::print("scalelab AdamW  {} params={} groups={} device={} dtype=f32: best {:.1f} ms, "
               "median {:.1f} ms over {} steps\n",
               config.name, total, groups.size(), device.str(), ms.front(), ms[ms.size() / 2],
               ms.size());
    return 0;
  });
}
