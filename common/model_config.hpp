#pragma once
/// @file model_config.hpp
/// Named GPT configurations. All are byte-level (vocab 256).
///   tiny     the tests: 2 layers, 2 heads, 32 wide, context 16 (~34k parameters)
///   small    the CPU demo: 4 layers, 4 heads, 128 wide, context 64 (~0.8M parameters)
///   gpt-85m  the workshop's GPU run: 12 layers, 12 heads, 768 wide, context 1024 (~86M)
#include <cstdint>
#include <string>
#include <vector>

namespace scalelab {

/// The shape of a GPT: what every lab's model, formula and planner is computed from.
struct ModelConfig {
  std::string name;          ///< "tiny", "small", "gpt-85m"
  int64_t vocab_size = 256;  ///< V: token ids (bytes here)
  int64_t block_size = 0;    ///< T at most: the longest context (positions in wpe)
  int64_t n_layer = 0;       ///< L: transformer blocks
  int64_t n_head = 0;        ///< NH: attention heads per block
  int64_t n_embd = 0;        ///< C: the width of the residual stream
};

/// The config named `name`; throws UsageError naming the known ones otherwise.
ModelConfig model_config(const std::string& name);

/// "tiny, small, gpt-85m"
std::vector<std::string> model_config_names();

/// Number of parameters of the full model (tied LM head counted once).
int64_t parameter_count(const ModelConfig& c);

}  // namespace scalelab
