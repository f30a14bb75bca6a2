// scalelab_data [FILE] [--out DIR]: makes train.bin, val.bin and meta.json from a text file, or
// from the King James Bible (Debian's bible-kjv) when no file is given. `./scalelab data` runs it.
// The three files are published together (common/data/corpus.hpp: prepare_corpus); --check only
// verifies a corpus directory (exit 0, or 2 naming what is wrong).
#include <filesystem>

#include "common/cli.hpp"
#include "common/data/corpus.hpp"
#include "common/log.hpp"
#include "common/runtime.hpp"

int main(int argc, char** argv) {
  return scalelab::run_main(argc, argv, [](int argc, char** argv) {
    using namespace scalelab;
    auto options = cli::make_options(
        "scalelab_data", "Prepare a byte-level corpus: train.bin / val.bin (uint16 ids, 90/10 "
                         "split) and meta.json. Without FILE: the King James Bible (bible-kjv).");
    options.add_options()("out", "output directory",
                          cxxopts::value<std::string>()->default_value(data::default_data_dir()))(
        "check", "only check the corpus in --out (sizes, checksums, vocabulary against "
                 "meta.json): exit 0 if it is complete, 2 with the reason if not")(
        "file", "text file (default: the King James Bible)",
        cxxopts::value<std::vector<std::string>>());
    options.parse_positional({"file"});
    options.positional_help("[FILE]");
    auto r = cli::parse(options, argc, argv);
    // --out names a directory (made if missing): say so when it is empty or names a file,
    // instead of "cannot create directory" or "missing corpus (no meta.json there)".
    const std::string out_dir = r["out"].as<std::string>();
    SCALELAB_REQUIRE(!out_dir.empty(), "--out is empty: give the corpus directory");
    std::error_code ec;
    SCALELAB_REQUIRE(!std::filesystem::exists(out_dir, ec) ||
                         std::filesystem::is_directory(out_dir, ec),
                     "--out {} is a file, not a directory: give the corpus directory (train.bin, "
                     "val.bin and meta.json go there)", out_dir);
    if (r["check"].as<bool>()) {
      SCALELAB_REQUIRE(r.count("file") == 0, "--check takes no text file");
      const data::CorpusMeta m = data::check_corpus(r["out"].as<std::string>());
      log::info("{}: {} train + {} val tokens, checksums match meta.json ({})",
                r["out"].as<std::string>(), m.train_tokens, m.val_tokens, m.source);
      return 0;
    }
    std::string source = "King James Bible (bible-kjv)", text;
    if (r.count("file")) {
      const auto files = r["file"].as<std::vector<std::string>>();
      SCALELAB_REQUIRE(files.size() == 1, "give at most one text file, got {}", files.size());
      source = files[0];
      text = data::read_text_file(files[0]);
    } else {
      text = data::kjv_text();
    }
    const std::string out = r["out"].as<std::string>();
    if (world_rank() == 0) {
      data::CorpusInfo info = data::prepare_corpus(text, out, source);
      log::info("{}: {} train + {} val tokens (bytes, vocab 256) -> {}/{{train,val}}.bin",
                info.source, info.train_tokens, info.val_tokens, out);
    }
    return 0;
  });
}
