#pragma once
/// @file tokenizer.hpp
/// The byte-level "char" tokenizer: every byte of the text is one token, so the vocabulary is the
/// 256 byte values and any text file (UTF-8 included) round-trips exactly. `./scalelab data`
/// (common/data/corpus.hpp) encodes the corpus with it; lab 02's sampler prints decoded text.
#include <cstdint>
#include <string>
#include <vector>

namespace scalelab::data {

/// The number of token ids: one per byte value. Every model config's vocab_size is at least this
/// (the corpus's meta.json records it and the loaders check it).
inline constexpr int kVocabSize = 256;

/// One token per byte of `text`, in order: ids in [0, 256), stored as uint16 like train.bin.
std::vector<uint16_t> encode(const std::string& text);
/// Bytes back to text; ids >= 256 (never produced by encode) become '?'.
std::string decode(const std::vector<int32_t>& ids);

}  // namespace scalelab::data
