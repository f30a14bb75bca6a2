#include "common/data/corpus.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <fstream>
#include <regex>
#include <sstream>

#include <fmt/format.h>

#include "common/data/tokenizer.hpp"
#include "common/errors.hpp"

#ifndef SCALELAB_SOURCE_DIR
#define SCALELAB_SOURCE_DIR "."
#endif

namespace scalelab::data {

namespace fs = std::filesystem;

std::string default_data_dir() {
  if (const char* env = std::getenv("SCALELAB_DATA_DIR")) return env;
  return std::string(SCALELAB_SOURCE_DIR) + "/data";
}

std::string read_text_file(const std::string& path) {
  // Opening a directory as a stream succeeds on Linux and reads nothing: it would be reported as
  // an empty text file.
  std::error_code ec;
  SCALELAB_REQUIRE(!fs::is_directory(path, ec), "'{}' is a directory, not a text file: give a "
                   "text file to tokenize (./scalelab data FILE), and --out DIR for where the "
                   "corpus goes", path);
  std::ifstream in(path, std::ios::binary);
  SCALELAB_REQUIRE(in.good(), "cannot read text file '{}': {}", path, std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  SCALELAB_REQUIRE(!text.empty(), "text file '{}' is empty", path);
  return text;
}

std::string strip_verse_references(const std::string& text) {
  // a reference is a book abbreviation (maybe with a leading digit), chapter:verse, one space
  static const std::regex ref(R"(^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ )");
  std::istringstream in(text);
  std::string line, out;
  out.reserve(text.size());
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, ref)) line = m.suffix().str();
    out += line;
    out += '\n';
  }
  return out;
}

std::string kjv_text() {
  // -f prints one verse per line, unwrapped, as "Ge1:1 text"
  FILE* pipe = popen("bible -f gen1:1-rev22:21 2>/dev/null", "r");
  SCALELAB_REQUIRE(pipe != nullptr, "cannot run the 'bible' program");
  std::string raw;
  char buf[1 << 16];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) raw.append(buf, n);
  const int status = pclose(pipe);
  SCALELAB_REQUIRE(status == 0 && raw.size() > 1000000,
                   "the default corpus needs Debian's bible-kjv package (apt-get install "
                   "bible-kjv), or pass a text file");
  return strip_verse_references(raw);
}

namespace {

constexpr const char* kRemake = "make it again with ./scalelab data [FILE]";
const char* const kCorpusFiles[] = {"train.bin", "val.bin", "meta.json"};

// Writes `nbytes` to `path` and syncs it to disk; UsageError naming it on failure.
void write_synced(const std::string& path, const void* data, std::size_t nbytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  SCALELAB_REQUIRE(fd >= 0, "cannot write '{}': {}", path, std::strerror(errno));
  const char* p = static_cast<const char*>(data);
  std::size_t left = nbytes;
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(path.c_str());
      throw UsageError(fmt::format("error writing '{}': {}", path, std::strerror(err)));
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!synced) {
    ::unlink(path.c_str());
    throw UsageError(fmt::format("error writing '{}': {}", path, std::strerror(err)));
  }
}

// Makes renames inside `dir` durable (best effort: some filesystems refuse fsync on a directory).
void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void rename_or_throw(const std::string& from, const std::string& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  SCALELAB_REQUIRE(!ec, "cannot rename '{}' to '{}': {}", from, to, ec.message());
}

bool process_alive(long pid) {
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

std::string json_escape(const std::string& in) {
  std::string out;
  for (char c : in) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') { out += "\\n"; continue; }
    out += c;
  }
  return out;
}

// The value of "key" in a flat JSON object written by prepare_corpus: a string (unescaped) or
// the text of a number. Empty optional when the key is absent or malformed.
std::optional<std::string> json_value(const std::string& json, const std::string& key) {
  const std::string quoted = "\"" + key + "\"";
  std::size_t i = json.find(quoted);
  if (i == std::string::npos) return std::nullopt;
  i = json.find_first_not_of(" \t\r\n", i + quoted.size());
  if (i == std::string::npos || json[i] != ':') return std::nullopt;
  i = json.find_first_not_of(" \t\r\n", i + 1);
  if (i == std::string::npos) return std::nullopt;
  std::string v;
  if (json[i] == '"') {
    for (++i; i < json.size() && json[i] != '"'; ++i) {
      if (json[i] == '\\' && i + 1 < json.size()) {
        ++i;
        v += json[i] == 'n' ? '\n' : json[i];
      } else {
        v += json[i];
      }
    }
    if (i >= json.size()) return std::nullopt;
    return v;
  }
  while (i < json.size() && (std::isdigit(static_cast<unsigned char>(json[i])) || json[i] == '-'))
    v += json[i++];
  if (v.empty()) return std::nullopt;
  return v;
}

}  // namespace

uint64_t fnv1a64(const void* data, std::size_t nbytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 14695981039346656037ull;
  for (std::size_t i = 0; i < nbytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

namespace {

// Removes FILE.tmp (the old scheme's: no owner recorded) and FILE.tmp.PID whose PID no longer
// runs, beside `file`: what a killed writer left. A running writer's temporary stays.
int remove_stale_temporaries_of(const fs::path& file) {
  int removed = 0;
  const fs::path dir = file.parent_path().empty() ? fs::path(".") : file.parent_path();
  const std::string prefix = file.filename().string() + ".tmp";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    bool stale = rest.empty();
    if (rest.size() > 1 && rest.size() < 12 && rest[0] == '.' &&
        rest.find_first_not_of("0123456789", 1) == std::string::npos)
      stale = !process_alive(std::stol(rest.substr(1)));
    std::error_code rm;
    if (stale && fs::remove(entry.path(), rm)) ++removed;
  }
  return removed;
}

}  // namespace

void write_file_atomic(const std::string& path, const void* data, std::size_t nbytes) {
  remove_stale_temporaries_of(path);  // what a writer killed before its rename left
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  write_synced(tmp, data, nbytes);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw UsageError(fmt::format("cannot write '{}': {}", path, ec.message()));
  }
  const fs::path parent = fs::path(path).parent_path();
  sync_dir(parent.empty() ? "." : parent.string());
}

int remove_stale_temporaries(const std::string& dir) {
  int removed = 0;
  for (const char* file : kCorpusFiles) removed += remove_stale_temporaries_of(fs::path(dir) / file);
  return removed;
}

CorpusInfo prepare_corpus(const std::string& text, const std::string& out_dir,
                          const std::string& source) {
  const std::vector<uint16_t> ids = encode(text);
  SCALELAB_REQUIRE(ids.size() >= 100, "corpus '{}' has {} bytes; it needs at least 100", source,
                   ids.size());
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  SCALELAB_REQUIRE(!ec, "cannot create directory '{}': {}", out_dir, ec.message());
  remove_stale_temporaries(out_dir);
  const std::size_t n_train = ids.size() * 9 / 10;
  CorpusInfo info{source, static_cast<int64_t>(n_train),
                  static_cast<int64_t>(ids.size() - n_train)};
  // uint16 little-endian, as nanoGPT (this code assumes a little-endian host, as x86 and ARM are)
  const std::size_t train_bytes = n_train * sizeof(uint16_t);
  const std::size_t val_bytes = (ids.size() - n_train) * sizeof(uint16_t);
  const auto* train_data = reinterpret_cast<const unsigned char*>(ids.data());
  const auto* val_data = train_data + train_bytes;
  const std::string meta = fmt::format(
      "{{\n  \"format\": {},\n  \"tokenizer\": \"bytes\",\n  \"vocab_size\": {},\n"
      "  \"dtype\": \"uint16\",\n  \"source\": \"{}\",\n  \"train_tokens\": {},\n"
      "  \"val_tokens\": {},\n  \"train_fnv1a64\": \"{:016x}\",\n  \"val_fnv1a64\": \"{:016x}\"\n}}\n",
      kCorpusFormat, kVocabSize, json_escape(source), info.train_tokens, info.val_tokens,
      fnv1a64(train_data, train_bytes), fnv1a64(val_data, val_bytes));

  // 1. every file complete on disk under a temporary name (a kill here leaves the old corpus and
  //    temporaries that the next run removes)
  const std::string dir = out_dir + "/";
  const std::string suffix = fmt::format(".tmp.{}", ::getpid());
  write_synced(dir + "train.bin" + suffix, train_data, train_bytes);
  write_synced(dir + "val.bin" + suffix, val_data, val_bytes);
  write_synced(dir + "meta.json" + suffix, meta.data(), meta.size());
  // 2. publish: withdraw the old commit record, move the data in, commit with meta.json last.
  //    Between the two steps the directory has no meta.json: the loaders refuse it.
  fs::remove(dir + "meta.json", ec);
  SCALELAB_REQUIRE(!ec, "cannot replace '{}meta.json': {}", dir, ec.message());
  sync_dir(out_dir);
  rename_or_throw(dir + "train.bin" + suffix, dir + "train.bin");
  rename_or_throw(dir + "val.bin" + suffix, dir + "val.bin");
  sync_dir(out_dir);
  rename_or_throw(dir + "meta.json" + suffix, dir + "meta.json");
  sync_dir(out_dir);
  return info;
}

CorpusMeta read_corpus_meta(const std::string& dir) {
  const std::string path = dir + "/meta.json";
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) {
    std::error_code ec;
    const bool has_bins = fs::exists(dir + "/train.bin", ec) || fs::exists(dir + "/val.bin", ec);
    SCALELAB_REQUIRE(!has_bins, "corpus '{}' is incomplete: '{}' is missing (an interrupted "
                     "./scalelab data?): {}", dir, path, kRemake);
    throw UsageError(fmt::format("missing corpus '{}' (no meta.json there): make it with "
                                 "./scalelab data [FILE]", dir));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string json = ss.str();
  CorpusMeta m;
  auto number = [&](const char* key) -> int64_t {
    const auto v = json_value(json, key);
    SCALELAB_REQUIRE(v && v->find_first_not_of("0123456789") == std::string::npos &&
                         v->size() < 19,
                     "'{}' has no valid \"{}\" (damaged, or not written by ./scalelab data): {}",
                     path, key, kRemake);
    return std::stoll(*v);
  };
  auto text = [&](const char* key) -> std::string {
    const auto v = json_value(json, key);
    SCALELAB_REQUIRE(v.has_value(), "'{}' has no \"{}\" (damaged, or not written by ./scalelab "
                     "data): {}", path, key, kRemake);
    return *v;
  };
  auto checksum = [&](const char* key) -> uint64_t {
    const std::string v = text(key);
    SCALELAB_REQUIRE(v.size() == 16 && v.find_first_not_of("0123456789abcdef") == std::string::npos,
                     "'{}': \"{}\" is not a checksum: {}", path, key, kRemake);
    return std::stoull(v, nullptr, 16);
  };
  const auto format = json_value(json, "format");
  SCALELAB_REQUIRE(format.has_value(), "'{}' is from an older ./scalelab data (no sizes and "
                   "checksums of the .bin files) or damaged: {}", path, kRemake);
  m.format = static_cast<int>(number("format"));
  SCALELAB_REQUIRE(m.format == kCorpusFormat, "'{}' has format {}, this program reads format {}: "
                   "{}", path, m.format, kCorpusFormat, kRemake);
  m.tokenizer = text("tokenizer");
  m.dtype = text("dtype");
  m.source = text("source");
  m.vocab_size = number("vocab_size");
  m.train_tokens = number("train_tokens");
  m.val_tokens = number("val_tokens");
  m.train_checksum = checksum("train_fnv1a64");
  m.val_checksum = checksum("val_fnv1a64");
  SCALELAB_REQUIRE(m.tokenizer == "bytes" && m.vocab_size == kVocabSize,
                   "'{}' describes a corpus of tokenizer '{}' with a vocabulary of {}; this "
                   "program's tokenizer is 'bytes' with {}: {}", path, m.tokenizer, m.vocab_size,
                   kVocabSize, kRemake);
  SCALELAB_REQUIRE(m.dtype == "uint16", "'{}' says dtype '{}'; the .bin files are uint16: {}",
                   path, m.dtype, kRemake);
  return m;
}

namespace {

std::vector<uint16_t> load_checked(const std::string& dir, const std::string& split,
                                   const CorpusMeta& m) {
  SCALELAB_REQUIRE(split == "train" || split == "val",
                   "no split '{}' in a corpus (train or val)", split);
  const std::string path = dir + "/" + split + ".bin";
  const int64_t want_tokens = split == "train" ? m.train_tokens : m.val_tokens;
  const uint64_t want_sum = split == "train" ? m.train_checksum : m.val_checksum;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  SCALELAB_REQUIRE(in.good(), "missing data file '{}' beside '{}/meta.json': {}", path, dir,
                   kRemake);
  const std::streamsize bytes = in.tellg();
  SCALELAB_REQUIRE(bytes == static_cast<std::streamsize>(want_tokens) * 2,
                   "data file '{}' has {} bytes, but '{}/meta.json' says {} tokens ({} bytes): "
                   "truncated, or not from the same ./scalelab data run: {}", path,
                   static_cast<int64_t>(bytes), dir, want_tokens, want_tokens * 2, kRemake);
  std::vector<uint16_t> ids(static_cast<std::size_t>(want_tokens));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(ids.data()), bytes);
  SCALELAB_REQUIRE(in.gcount() == bytes, "cannot read data file '{}'", path);
  SCALELAB_REQUIRE(fnv1a64(ids.data(), static_cast<std::size_t>(bytes)) == want_sum,
                   "data file '{}' does not match '{}/meta.json' (checksum): replaced, damaged, "
                   "or left by an interrupted ./scalelab data: {}", path, dir, kRemake);
  for (std::size_t i = 0; i < ids.size(); ++i)
    SCALELAB_REQUIRE(ids[i] < m.vocab_size, "data file '{}': token {} at position {} is outside "
                     "the vocabulary of {}: {}", path, ids[i], i, m.vocab_size, kRemake);
  return ids;
}

}  // namespace

std::vector<uint16_t> load_split(const std::string& dir, const std::string& split) {
  return load_checked(dir, split, read_corpus_meta(dir));
}

std::vector<uint16_t> load_tokens(const std::string& path) {
  const fs::path p(path);
  const std::string name = p.filename().string();
  const std::string dir = p.parent_path().empty() ? "." : p.parent_path().string();
  SCALELAB_REQUIRE(name == "train.bin" || name == "val.bin",
                   "'{}' is not a corpus file: give the directory ./scalelab data made "
                   "(train.bin, val.bin, meta.json)", path);
  std::error_code ec;
  SCALELAB_REQUIRE(fs::exists(p, ec) || fs::exists(dir + "/meta.json", ec),
                   "missing data file '{}' (make it with ./scalelab data [FILE])", path);
  return load_split(dir, name == "train.bin" ? "train" : "val");
}

CorpusMeta check_corpus(const std::string& dir) {
  const CorpusMeta m = read_corpus_meta(dir);
  load_checked(dir, "train", m);
  load_checked(dir, "val", m);
  return m;
}

}  // namespace scalelab::data
