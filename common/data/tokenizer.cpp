#include "common/data/tokenizer.hpp"

namespace scalelab::data {

std::vector<uint16_t> encode(const std::string& text) {
  std::vector<uint16_t> ids(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string decode(const std::vector<int32_t>& ids) {
  std::string text;
  text.reserve(ids.size());
  for (int32_t id : ids) text.push_back(id >= 0 && id < kVocabSize ? static_cast<char>(id) : '?');
  return text;
}

}  // namespace scalelab::data
