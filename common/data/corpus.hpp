#pragma once
// Corpus preparation (nanoGPT style): a text becomes train.bin and val.bin (the first 90% and the
// last 10% of its tokens, as little-endian uint16 ids) and meta.json (vocabulary and sizes).
// The default corpus is the King James Bible from Debian's bible-kjv package: the `bible` program
// dumps every verse, one per line, and the verse references ("Ge1:1 ") are stripped.
#include <cstdint>
#include <string>
#include <vector>

namespace scalelab::data {

struct CorpusInfo {
  std::string source;
  int64_t train_tokens = 0, val_tokens = 0;
};

/// The repository's data/ directory (where `./scalelab data` writes by default).
std::string default_data_dir();

/// The whole text of a file; UsageError if it cannot be read or is empty.
std::string read_text_file(const std::string& path);

/// "Ge1:1 In the beginning" -> "In the beginning", line by line (lines without a reference are
/// kept as they are).
std::string strip_verse_references(const std::string& text);

/// The King James Bible as text, one verse per line, from the `bible` program (bible-kjv);
/// UsageError naming the package if it is not installed.
std::string kjv_text();

/// Writes out_dir/{train.bin, val.bin, meta.json} from `text` (90/10 split). The files are written
/// under temporary names and renamed, so a reader never sees half a file.
CorpusInfo prepare_corpus(const std::string& text, const std::string& out_dir,
                          const std::string& source);

/// Reads a .bin of uint16 ids; UsageError (naming `./scalelab data`) if it is missing.
std::vector<uint16_t> load_tokens(const std::string& path);

/// Writes bytes to `path` via `path.tmp` + rename (checkpoints use it too).
void write_file_atomic(const std::string& path, const void* data, std::size_t nbytes);

}  // namespace scalelab::data
