#pragma once
/// @file corpus.hpp
/// Corpus preparation (nanoGPT style): a text becomes train.bin and val.bin (the first 90% and the
/// last 10% of its tokens, as little-endian uint16 ids) and meta.json (vocabulary and sizes).
/// The default corpus is the King James Bible from Debian's bible-kjv package: the `bible` program
/// dumps every verse, one per line, and the verse references ("Ge1:1 ") are stripped.
/// `./scalelab data` writes it (and `./scalelab run` when it is missing); every training program
/// from lab 02 on reads train.bin through load_tokens.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace scalelab::data {

/// What prepare_corpus wrote, for `./scalelab data` to report.
struct CorpusInfo {
  /// Where the text came from: "King James Bible (bible-kjv)", or the file's path.
  std::string source;
  int64_t train_tokens = 0;  ///< tokens (= bytes of text) in train.bin: the first 90%
  int64_t val_tokens = 0;    ///< tokens in val.bin: the last 10%
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

/// What meta.json says about a corpus directory. It is the corpus's commit record: written last,
/// it carries the size and a checksum of both .bin files, so a loader can tell a complete,
/// matching corpus from a truncated, replaced or half-published one.
struct CorpusMeta {
  int format = 0;  ///< kCorpusFormat; older meta.json files (no checksums) have none: 0
  std::string tokenizer;  ///< "bytes": common/data/tokenizer.hpp's one token per byte
  std::string dtype;      ///< "uint16": how each id is stored in the .bin files (little-endian)
  std::string source;     ///< where the text came from, as CorpusInfo::source
  int64_t vocab_size = 0;    ///< kVocabSize (256); a loader refuses any other
  int64_t train_tokens = 0;  ///< ids in train.bin: its size is 2 bytes per id
  int64_t val_tokens = 0;    ///< ids in val.bin
  uint64_t train_checksum = 0;  ///< fnv1a64 of train.bin's bytes
  uint64_t val_checksum = 0;    ///< fnv1a64 of val.bin's bytes
};
/// The meta.json format this code writes and reads (2: sizes and checksums of both splits).
inline constexpr int kCorpusFormat = 2;

/// 64-bit FNV-1a of `nbytes` bytes: the corpus checksum.
uint64_t fnv1a64(const void* data, std::size_t nbytes);

/// Writes out_dir/{train.bin, val.bin, meta.json} from `text` (90/10 split) so that a reader
/// never uses a mixture: the three files are written under temporary names (NAME.tmp.PID, synced
/// to disk), then published: meta.json is removed, train.bin and val.bin are renamed into place,
/// and meta.json (carrying both files' sizes and checksums) is renamed last. A run killed at any
/// point leaves either the old corpus, or files that the loaders reject with a UsageError
/// (no meta.json, or a .bin that does not match it). Temporaries left by killed runs (of a
/// process that no longer exists) are removed first.
CorpusInfo prepare_corpus(const std::string& text, const std::string& out_dir,
                          const std::string& source);

/// Removes NAME.tmp and NAME.tmp.PID (PID no longer running) for NAME in train.bin, val.bin,
/// meta.json in `dir`: what a killed `./scalelab data` leaves. Returns how many were removed.
int remove_stale_temporaries(const std::string& dir);

/// Reads and validates dir/meta.json: UsageError naming the file (and `./scalelab data`) when it
/// is missing (then the corpus is incomplete: an interrupted ./scalelab data), unreadable, of an
/// older format, or names another tokenizer, vocabulary or dtype than this code's.
CorpusMeta read_corpus_meta(const std::string& dir);

/// Loads dir/SPLIT.bin (split: "train" or "val") and checks it against dir/meta.json: its size
/// (token count), its checksum and every id inside the vocabulary. Any mismatch is a UsageError
/// naming the file: a truncated, replaced, random or half-published .bin is never used.
std::vector<uint16_t> load_split(const std::string& dir, const std::string& split);

/// Loads DIR/train.bin or DIR/val.bin with load_split (checked against DIR/meta.json); UsageError
/// (naming `./scalelab data`) if it is missing, or for any other name.
std::vector<uint16_t> load_tokens(const std::string& path);

/// Checks both splits of dir (as load_split does); returns the meta. UsageError on any problem.
CorpusMeta check_corpus(const std::string& dir);

/// Writes bytes to `path` via a temporary beside it (PATH.tmp.PID, synced) + rename: a reader sees
/// the old file or the new one, never half of one. The temporary is removed when the write fails,
/// and those of killed writers (PATH.tmp, PATH.tmp.PID of a dead process) before it starts. (Lab
/// 02's save_checkpoint streams its own PATH.tmp, overwritten by the next save.)
void write_file_atomic(const std::string& path, const void* data, std::size_t nbytes);

}  // namespace scalelab::data
