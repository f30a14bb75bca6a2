// Tokenizer, corpus files and the (seed, step) sampler. Hermetic: corpora are made here.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "common/data/corpus.hpp"
#include "common/data/sampler.hpp"
#include "common/data/tokenizer.hpp"
#include "common/errors.hpp"

using namespace scalelab;

namespace {
std::string temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("scalelab_test_data_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir.string();
}
}  // namespace

TEST(Data, ByteTokenizerRoundTrips) {
  const std::string text = "In the beginning\n\xc3\xa9t\xc3\xa9";  // UTF-8 bytes too
  auto ids = data::encode(text);
  EXPECT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[0], 'I');
  EXPECT_EQ(ids[17], 0xc3);
  EXPECT_EQ(data::decode(std::vector<int32_t>(ids.begin(), ids.end())), text);
}

TEST(Data, StripsVerseReferences) {
  EXPECT_EQ(data::strip_verse_references("Ge1:1 In the beginning\n1Cor13:4 Charity suffereth\nplain\n"),
            "In the beginning\nCharity suffereth\nplain\n");
}

TEST(Data, PrepareSplitsNinetyTenAndLoadsBack) {
  const std::string dir = temp_dir("prep");
  std::string text;
  for (int i = 0; i < 100; ++i) text += "abcdefghij";  // 1000 bytes
  auto info = data::prepare_corpus(text, dir, "test");
  EXPECT_EQ(info.train_tokens, 900);
  EXPECT_EQ(info.val_tokens, 100);
  auto train = data::load_tokens(dir + "/train.bin"), val = data::load_tokens(dir + "/val.bin");
  ASSERT_EQ(train.size(), 900u);
  ASSERT_EQ(val.size(), 100u);
  EXPECT_EQ(train[1], 'b');
  EXPECT_EQ(val[0], 'a');  // the split follows the text: val is its last 10%
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos)
        << "a temporary is left: " << e.path();
  std::ifstream meta(dir + "/meta.json");
  std::string m((std::istreambuf_iterator<char>(meta)), {});
  EXPECT_NE(m.find("\"vocab_size\": 256"), std::string::npos);
  const data::CorpusMeta parsed = data::read_corpus_meta(dir);
  EXPECT_EQ(parsed.train_tokens, 900);
  EXPECT_EQ(parsed.val_tokens, 100);
  EXPECT_EQ(parsed.train_checksum, data::fnv1a64(train.data(), train.size() * 2));
  EXPECT_EQ(parsed.source, "test");
  std::filesystem::remove_all(dir);
}

TEST(Data, MissingFilesAreUsageErrors) {
  EXPECT_THROW(data::load_tokens("/nonexistent/train.bin"), UsageError);
  EXPECT_THROW(data::read_text_file("/nonexistent/text.txt"), UsageError);
}

// ---- corpus files that cannot be silently wrong (issue 9) ----------------------------------------
// Every damaged, mismatched or half-published corpus is a UsageError (exit 2) that names the
// file; planted states are made here by hand, as a kill or a stray copy would leave them.

namespace {

namespace fs = std::filesystem;

std::string text_of(char first, int n = 100) {
  std::string text;
  for (int i = 0; i < n; ++i)
    for (char c = first; c < first + 10; ++c) text += c;  // 10 * n bytes
  return text;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Passes when `f` throws a UsageError whose message contains every one of `names`.
testing::AssertionResult usage_error_naming(const std::function<void()>& f,
                                            std::vector<std::string> names) {
  try {
    f();
  } catch (const UsageError& e) {
    const std::string what = e.what();
    for (const std::string& n : names)
      if (what.find(n) == std::string::npos)
        return testing::AssertionFailure() << "the error does not name '" << n << "': " << what;
    return testing::AssertionSuccess() << what;
  } catch (const std::exception& e) {
    return testing::AssertionFailure() << "not a UsageError: " << e.what();
  }
  return testing::AssertionFailure() << "no error: the corpus was used";
}

// A pid that no process has (above any pid_max).
constexpr long kDeadPid = 0x7ffffff0;

}  // namespace

TEST(CorpusFiles, TruncatedTrainBinIsAUsageErrorNamingIt) {
  const std::string dir = temp_dir("truncated");
  data::prepare_corpus(text_of('a'), dir, "test");
  const std::string bin = dir + "/train.bin";
  fs::resize_file(bin, fs::file_size(bin) - 2);  // one token short
  EXPECT_TRUE(usage_error_naming([&] { data::load_tokens(bin); }, {bin, "bytes"}));
  fs::resize_file(bin, 3);  // not even whole uint16s
  EXPECT_TRUE(usage_error_naming([&] { data::load_tokens(bin); }, {bin}));
  EXPECT_NO_THROW(data::load_tokens(dir + "/val.bin")) << "the other split is intact";
  fs::remove_all(dir);
}

TEST(CorpusFiles, TrainBinOfAnotherCorpusIsAUsageError) {
  // the same size, other content: only the checksum tells
  const std::string a = temp_dir("mismatch_a"), b = temp_dir("mismatch_b");
  data::prepare_corpus(text_of('a'), a, "a");
  data::prepare_corpus(text_of('k'), b, "b");
  fs::copy_file(b + "/train.bin", a + "/train.bin", fs::copy_options::overwrite_existing);
  EXPECT_TRUE(usage_error_naming([&] { data::load_tokens(a + "/train.bin"); },
                                 {a + "/train.bin", "checksum"}));
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(CorpusFiles, RandomBytesAreAUsageErrorNotAnInternalCheck) {
  const std::string dir = temp_dir("random");
  data::prepare_corpus(text_of('a'), dir, "test");
  const std::string bin = dir + "/train.bin";
  std::string bytes(fs::file_size(bin), '\0');
  std::mt19937 rng(9);
  for (char& c : bytes) c = static_cast<char>(rng());
  write_all(bin, bytes);
  EXPECT_TRUE(usage_error_naming([&] { data::load_tokens(bin); }, {bin}));
  fs::remove_all(dir);
}

TEST(CorpusFiles, TokenOutsideTheVocabularyIsAUsageError) {
  // a meta.json that matches the file (size and checksum) but a token >= 256 inside: the last
  // line of defence, for a corpus written by something else
  const std::string dir = temp_dir("vocab");
  data::prepare_corpus(text_of('a'), dir, "test");
  const std::string bin = dir + "/val.bin";
  std::vector<uint16_t> ids = data::load_tokens(bin);
  ids[7] = 300;
  write_all(bin, std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 2));
  std::string meta = read_all(dir + "/meta.json");
  const std::size_t at = meta.find("\"val_fnv1a64\": \"") + 16;
  meta.replace(at, 16, fmt::format("{:016x}", data::fnv1a64(ids.data(), ids.size() * 2)));
  write_all(dir + "/meta.json", meta);
  EXPECT_TRUE(usage_error_naming([&] { data::load_tokens(bin); }, {bin, "300", "vocabulary"}));
  fs::remove_all(dir);
}

TEST(CorpusFiles, MissingMetaIsAUsageErrorNamingIt) {
  const std::string dir = temp_dir("nometa");
  data::prepare_corpus(text_of('a'), dir, "test");
  fs::remove(dir + "/meta.json");
  EXPECT_TRUE(usage_error_naming([&] { data::load_tokens(dir + "/train.bin"); },
                                 {dir + "/meta.json", "incomplete"}));
  fs::remove_all(dir);
}

TEST(CorpusFiles, MetaOfAnOlderFormatOrAnotherVocabularyIsAUsageError) {
  const std::string dir = temp_dir("oldmeta");
  data::prepare_corpus(text_of('a'), dir, "test");
  const std::string good = read_all(dir + "/meta.json");
  // what ./scalelab data wrote before sizes and checksums were recorded
  write_all(dir + "/meta.json",
            "{\n  \"tokenizer\": \"bytes\",\n  \"vocab_size\": 256,\n  \"dtype\": \"uint16\",\n"
            "  \"source\": \"test\",\n  \"train_tokens\": 900,\n  \"val_tokens\": 100\n}\n");
  EXPECT_TRUE(usage_error_naming([&] { data::load_tokens(dir + "/train.bin"); },
                                 {dir + "/meta.json", "older"}));
  std::string other = good;
  other.replace(other.find("\"vocab_size\": 256"), 17, "\"vocab_size\": 300");
  write_all(dir + "/meta.json", other);
  EXPECT_TRUE(usage_error_naming([&] { data::load_tokens(dir + "/train.bin"); },
                                 {dir + "/meta.json", "300"}));
  write_all(dir + "/meta.json", "garbage");
  EXPECT_TRUE(usage_error_naming([&] { data::load_tokens(dir + "/train.bin"); },
                                 {dir + "/meta.json"}));
  write_all(dir + "/meta.json", good);
  EXPECT_NO_THROW(data::check_corpus(dir));
  fs::remove_all(dir);
}

TEST(CorpusFiles, EveryInterruptedPublishIsRefusedOrTheOldCorpus) {
  // Corpus A is in place; ./scalelab data of text B is killed at each point of its publish. A
  // loader must get either all of A or a UsageError, never a mixture.
  const std::string a = temp_dir("publish_a"), b = temp_dir("publish_b");
  data::prepare_corpus(text_of('a'), a, "a");
  data::prepare_corpus(text_of('k', 120), b, "b");  // the new files (other sizes too)
  const auto old_train = data::load_tokens(a + "/train.bin");
  const std::string pid = fmt::format(".tmp.{}", kDeadPid);
  const auto reset = [&] {
    fs::remove_all(a);
    data::prepare_corpus(text_of('a'), a, "a");
  };
  // killed while writing the temporaries: the old corpus, intact
  fs::copy_file(b + "/train.bin", a + "/train.bin" + pid);
  write_all(a + "/val.bin" + pid, "half");
  EXPECT_EQ(data::load_tokens(a + "/train.bin"), old_train);
  EXPECT_NO_THROW(data::check_corpus(a));
  // killed after meta.json was withdrawn and train.bin moved in
  reset();
  fs::remove(a + "/meta.json");
  fs::copy_file(b + "/train.bin", a + "/train.bin", fs::copy_options::overwrite_existing);
  EXPECT_TRUE(usage_error_naming([&] { data::load_tokens(a + "/train.bin"); },
                                 {a + "/meta.json"}));
  EXPECT_TRUE(usage_error_naming([&] { data::load_tokens(a + "/val.bin"); }, {a + "/meta.json"}));
  // after both .bin files moved in, before the new meta.json
  fs::copy_file(b + "/val.bin", a + "/val.bin", fs::copy_options::overwrite_existing);
  EXPECT_TRUE(usage_error_naming([&] { data::check_corpus(a); }, {a + "/meta.json"}));
  // what the old code left (a new train.bin beside the old val.bin and meta.json): refused
  reset();
  fs::copy_file(b + "/train.bin", a + "/train.bin", fs::copy_options::overwrite_existing);
  EXPECT_TRUE(usage_error_naming([&] { data::load_tokens(a + "/train.bin"); },
                                 {a + "/train.bin"}));
  // a meta.json of another run beside these .bin files: refused
  reset();
  fs::copy_file(b + "/meta.json", a + "/meta.json", fs::copy_options::overwrite_existing);
  EXPECT_TRUE(usage_error_naming([&] { data::check_corpus(a); }, {a + "/"}));
  // the next run publishes a consistent corpus and removes what killed runs left
  write_all(a + "/train.bin" + pid, "stale");
  write_all(a + "/meta.json.tmp", "stale, from the old scheme");
  const data::CorpusInfo info = data::prepare_corpus(text_of('k', 120), a, "b");
  EXPECT_EQ(data::check_corpus(a).train_tokens, info.train_tokens);
  EXPECT_FALSE(fs::exists(a + "/train.bin" + pid));
  EXPECT_FALSE(fs::exists(a + "/meta.json.tmp"));
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(CorpusFiles, StaleTemporariesOfDeadProcessesOnlyAreRemoved) {
  const std::string dir = temp_dir("stale");
  const std::string dead = fmt::format("{}/train.bin.tmp.{}", dir, kDeadPid);
  const std::string live = fmt::format("{}/val.bin.tmp.{}", dir, ::getppid());  // our parent
  const std::string legacy = dir + "/meta.json.tmp";
  const std::string other = dir + "/notes.tmp.1";
  for (const std::string& f : {dead, live, legacy, other}) write_all(f, "x");
  EXPECT_EQ(data::remove_stale_temporaries(dir), 2);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_FALSE(fs::exists(legacy));
  EXPECT_TRUE(fs::exists(live)) << "a running ./scalelab data's temporary is left alone";
  EXPECT_TRUE(fs::exists(other)) << "not a corpus file";
  fs::remove_all(dir);
}

TEST(CorpusFiles, AtomicWritesRemoveTheTemporariesOfKilledWriters) {
  // a writer killed before its rename leaves PATH.tmp.PID; the next write removes it (and the
  // old scheme's PATH.tmp), not a live writer's
  const std::string dir = temp_dir("atomic");
  const std::string path = dir + "/lab02.ckpt";
  const std::string dead = fmt::format("{}.tmp.{}", path, kDeadPid);
  const std::string live = fmt::format("{}.tmp.{}", path, ::getppid());
  for (const std::string& f : {dead, live, path + ".tmp"}) write_all(f, "partial");
  data::write_file_atomic(path, "new", 3);
  EXPECT_EQ(read_all(path), "new");
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_FALSE(fs::exists(fmt::format("{}.tmp.{}", path, ::getpid()))) << "its own is renamed";
  fs::remove_all(dir);
}

TEST(CorpusFiles, AnythingButACorpusFileIsAUsageError) {
  EXPECT_TRUE(usage_error_naming([] { data::load_tokens("/nonexistent/train.bin"); },
                                 {"/nonexistent/train.bin"}));
  EXPECT_TRUE(usage_error_naming([] { data::load_tokens("/etc/hostname"); }, {"/etc/hostname"}));
}

TEST(Data, SamplerIsAFunctionOfSeedAndStep) {
  std::vector<uint16_t> tokens(5000);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 251);
  data::Sampler s(tokens, 8, 16, 42), same(tokens, 8, 16, 42), other(tokens, 8, 16, 43);
  data::Batch b = s.batch(3);
  EXPECT_EQ(b.x.shape(), (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(b.x.to_vector(), same.batch(3).x.to_vector());    // same (seed, step)
  EXPECT_NE(b.x.to_vector(), s.batch(4).x.to_vector());       // another step
  EXPECT_NE(b.x.to_vector(), other.batch(3).x.to_vector());   // another seed
  // drawing step 3 after other steps changes nothing: no hidden stream position
  s.batch(0);
  EXPECT_EQ(b.x.to_vector(), s.batch(3).x.to_vector());
  // targets are the inputs shifted by one token
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t t = 0; t + 1 < 16; ++t) EXPECT_EQ(b.y.item(i * 16 + t), b.x.item(i * 16 + t + 1));
}

TEST(Data, RowsOfTheGlobalBatchAreViews) {
  // what a rank's slice (lab 03) and a micro-batch (lab 05) are made of
  std::vector<uint16_t> tokens(3000);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7) % 256);
  data::Sampler s(tokens, 8, 4, 1);
  data::Batch global = s.batch(0);
  data::Batch rank1 = global.rows(2, 4);  // rank 1 of 4
  EXPECT_EQ(rank1.batch_size(), 2);
  EXPECT_TRUE(rank1.x.shares_storage_with(global.x));
  for (int t = 0; t < 8; ++t) EXPECT_EQ(rank1.x.item(t), global.x.item(2 * 4 + t));
  data::Batch micro = rank1.rows(1, 2);  // global row 3
  for (int t = 0; t < 4; ++t) EXPECT_EQ(micro.x.item(t), global.x.item(3 * 4 + t));
}

TEST(Data, SamplerRejectsBadSizes) {
  std::vector<uint16_t> tokens(100, 1);
  EXPECT_THROW(data::Sampler(tokens, 0, 8, 1), UsageError);
  EXPECT_THROW(data::Sampler(tokens, 4, 0, 1), UsageError);
  EXPECT_THROW(data::Sampler(tokens, 4, 200, 1), UsageError);
}
