#include "common/model_config.hpp"

#include <fmt/format.h>

#include "common/errors.hpp"

namespace scalelab {

namespace {
const std::vector<ModelConfig>& configs() {
  static const std::vector<ModelConfig> all = {
      {"tiny", 256, 16, 2, 2, 32},
      {"small", 256, 64, 4, 4, 128},
      {"gpt-85m", 256, 1024, 12, 12, 768},
      {"tiny-moe", 256, 16, 2, 2, 32, {.n_expert = 4, .top_k = 2}},
      {"small-moe", 256, 64, 4, 4, 128, {.n_expert = 8, .top_k = 2}},
  };
  return all;
}
}  // namespace

ModelConfig model_config(const std::string& name) {
  for (const ModelConfig& c : configs())
    if (c.name == name) return c;
  throw UsageError(fmt::format("unknown model config '{}' (known: {})", name,
                               fmt::join(model_config_names(), ", ")));
}

std::vector<std::string> model_config_names() {
  std::vector<std::string> names;
  for (const ModelConfig& c : configs()) names.push_back(c.name);
  return names;
}

int64_t parameter_count(const ModelConfig& c) {
  const int64_t C = c.n_embd;
  const int64_t per_block = 2 * C        // ln1
                            + 3 * C * C + 3 * C  // qkv
                            + C * C + C          // attn proj
                            + 2 * C              // ln2
                            + 4 * C * C + 4 * C  // fc
                            + 4 * C * C + C;     // mlp proj
  int64_t total = c.vocab_size * C + c.block_size * C + c.n_layer * per_block + 2 * C;
  if (c.moe.enabled()) {
    const int64_t mlp = 8 * C * C + 5 * C, E = c.moe.n_expert;
    const int64_t moe_blocks = c.n_layer / c.moe.every;  // i % every == every - 1
    total += moe_blocks * ((E - 1) * mlp + E * C);      // E experts instead of 1, and a router
  }
  return total;
}

}  // namespace scalelab
