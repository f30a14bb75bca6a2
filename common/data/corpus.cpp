#include "common/data/corpus.hpp"

#include <cstdio>
#include <filesystem>
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
  std::ifstream in(path, std::ios::binary);
  SCALELAB_REQUIRE(in.good(), "cannot read text file '{}'", path);
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

void write_file_atomic(const std::string& path, const void* data, std::size_t nbytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    SCALELAB_REQUIRE(out.good(), "cannot write '{}'", tmp);
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(nbytes));
    out.flush();
    SCALELAB_REQUIRE(out.good(), "error writing '{}'", tmp);
  }
  fs::rename(tmp, path);
}

CorpusInfo prepare_corpus(const std::string& text, const std::string& out_dir,
                          const std::string& source) {
  const std::vector<uint16_t> ids = encode(text);
  SCALELAB_REQUIRE(ids.size() >= 100, "corpus '{}' has {} bytes; it needs at least 100", source,
                   ids.size());
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  SCALELAB_REQUIRE(!ec, "cannot create directory '{}': {}", out_dir, ec.message());
  const std::size_t n_train = ids.size() * 9 / 10;
  CorpusInfo info{source, static_cast<int64_t>(n_train),
                  static_cast<int64_t>(ids.size() - n_train)};
  // uint16 little-endian, as nanoGPT (this code assumes a little-endian host, as x86 and ARM are)
  write_file_atomic(out_dir + "/train.bin", ids.data(), n_train * sizeof(uint16_t));
  write_file_atomic(out_dir + "/val.bin", ids.data() + n_train,
                    (ids.size() - n_train) * sizeof(uint16_t));
  std::string source_json;
  for (char c : source) {
    if (c == '"' || c == '\\') source_json += '\\';
    source_json += c;
  }
  const std::string meta = fmt::format(
      "{{\n  \"tokenizer\": \"bytes\",\n  \"vocab_size\": {},\n  \"dtype\": \"uint16\",\n"
      "  \"source\": \"{}\",\n  \"train_tokens\": {},\n  \"val_tokens\": {}\n}}\n",
      kVocabSize, source_json, info.train_tokens, info.val_tokens);
  write_file_atomic(out_dir + "/meta.json", meta.data(), meta.size());
  return info;
}

std::vector<uint16_t> load_tokens(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  SCALELAB_REQUIRE(in.good(), "missing data file '{}' (make it with ./scalelab data [FILE])",
                   path);
  const std::streamsize bytes = in.tellg();
  SCALELAB_REQUIRE(bytes > 0 && bytes % 2 == 0, "data file '{}' is not a .bin of uint16 ids",
                   path);
  std::vector<uint16_t> ids(static_cast<std::size_t>(bytes / 2));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(ids.data()), bytes);
  return ids;
}

}  // namespace scalelab::data
