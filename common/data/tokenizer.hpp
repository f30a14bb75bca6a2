#pragma once
// The byte-level "char" tokenizer: every byte of the text is one token, so the vocabulary is the
// 256 byte values and any text file (UTF-8 included) round-trips exactly.
#include <cstdint>
#include <string>
#include <vector>

namespace scalelab::data {

inline constexpr int kVocabSize = 256;

std::vector<uint16_t> encode(const std::string& text);
/// Bytes back to text; ids >= 256 (never produced by encode) become '?'.
std::string decode(const std::vector<int32_t>& ids);

}  // namespace scalelab::data
