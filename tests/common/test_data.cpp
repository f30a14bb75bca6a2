// Tokenizer, corpus files and the (seed, step) sampler. Hermetic: corpora are made here.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/data/corpus.hpp"
#include "common/data/sampler.hpp"
#include "common/data/tokenizer.hpp"

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
  EXPECT_FALSE(std::filesystem::exists(dir + "/train.bin.tmp"));
  std::ifstream meta(dir + "/meta.json");
  std::string m((std::istreambuf_iterator<char>(meta)), {});
  EXPECT_NE(m.find("\"vocab_size\": 256"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(Data, MissingFilesAreUsageErrors) {
  EXPECT_THROW(data::load_tokens("/nonexistent/train.bin"), UsageError);
  EXPECT_THROW(data::read_text_file("/nonexistent/text.txt"), UsageError);
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
