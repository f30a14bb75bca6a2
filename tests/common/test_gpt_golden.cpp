// The GPT's loss and every parameter gradient against PyTorch (float64), from a golden file
// written by tools/torch_golden.py (tests/data/gpt_golden.txt; PyTorch is not needed to run
// this test). Tolerance: loss within 1e-10 relative; each gradient element within 1e-8 of the
// largest |gradient| of its parameter (float64; the two differ only in summation order).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "common/nn/gpt.hpp"

#ifndef SCALELAB_TEST_DATA
#define SCALELAB_TEST_DATA "tests/data"
#endif

using namespace scalelab;

namespace {
struct Golden {
  ModelConfig config;
  Tensor tokens, targets;
  double loss = 0;
  std::map<std::string, std::vector<double>> params, grads;
};

Tensor read_ids(std::istringstream& in) {
  int64_t B, T;
  in >> B >> T;
  Tensor t = Tensor::empty({B, T}, DType::i32);
  for (int64_t i = 0; i < B * T; ++i) in >> t.data<int32_t>()[i];
  return t;
}

Golden load(const std::string& path) {
  std::ifstream file(path);
  if (!file.good()) throw std::runtime_error("cannot read " + path);
  Golden g;
  g.config.name = "golden";
  std::string line;
  while (std::getline(file, line)) {
    std::istringstream in(line);
    std::string kind;
    in >> kind;
    if (kind == "config") {
      in >> g.config.vocab_size >> g.config.block_size >> g.config.n_layer >> g.config.n_head >>
          g.config.n_embd;
    } else if (kind == "tokens") {
      g.tokens = read_ids(in);
    } else if (kind == "targets") {
      g.targets = read_ids(in);
    } else if (kind == "loss") {
      in >> g.loss;
    } else if (kind == "param" || kind == "grad") {
      std::string name;
      int64_t n;
      in >> name >> n;
      std::vector<double> v(n);
      for (double& x : v) in >> x;
      (kind == "param" ? g.params : g.grads)[name] = v;
    }
  }
  return g;
}
}  // namespace

TEST(GPTGolden, LossAndEveryGradientMatchPyTorch) {
  const Golden g = load(std::string(SCALELAB_TEST_DATA) + "/gpt_golden.txt");
  ASSERT_GT(g.config.n_layer, 0);
  nn::GPTOptions o;
  o.dtype = DType::f64;
  nn::GPT model(g.config, o);
  ASSERT_EQ(g.params.size(), model.parameters().size()) << "every parameter is in the file";
  for (nn::Parameter* p : model.parameters()) {
    auto it = g.params.find(p->name);
    ASSERT_NE(it, g.params.end()) << p->name;
    ASSERT_EQ(static_cast<int64_t>(it->second.size()), p->numel()) << p->name;
    for (int64_t i = 0; i < p->numel(); ++i) p->value.data<double>()[i] = it->second[i];
  }
  model.zero_grad();
  const double loss = model.forward(g.tokens, g.targets);
  EXPECT_NEAR(loss, g.loss, 1e-10 * g.loss);
  model.backward();
  for (nn::Parameter* p : model.parameters()) {
    const std::vector<double>& want = g.grads.at(p->name);
    double scale = 0;
    for (double w : want) scale = std::max(scale, std::abs(w));
    ASSERT_GT(scale, 0) << p->name << " has an all-zero golden gradient: a useless check";
    for (int64_t i = 0; i < p->numel(); ++i)
      ASSERT_NEAR(p->grad.item(i), want[i], 1e-8 * scale) << p->name << " element " << i;
  }
}
