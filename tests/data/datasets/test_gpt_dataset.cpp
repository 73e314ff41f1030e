#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <unistd.h>

#include "base/error.h"
#include "data/datasets/gpt_dataset.h"
#include "data/datasets/indexed_dataset.h"
#include "data/datasets/numpy_random.h"

namespace omni {
namespace {

// ---------------------------------------------------------------------------------------------
// numpy legacy RandomState. Expected values generated with numpy 1.24.2:
//   np.random.RandomState(s).randint(0, 2**32, size=3, dtype=np.uint32)   # raw MT19937 words
//   a = np.arange(10); np.random.RandomState(1234).shuffle(a)
//   a = np.arange(1000, dtype=np.int64); np.random.RandomState(0).shuffle(a)
//   a = np.arange(1000, dtype=np.uint32); np.random.RandomState(2**32 - 1).shuffle(a)
//   a = np.arange(7, dtype=np.int32); np.random.RandomState(0).shuffle(a)
//   rs = np.random.RandomState(1234); a = np.arange(5); b = np.arange(5, 9); rs.shuffle(a);
//   rs.shuffle(b) np.random.RandomState(7).randint(0, 2**33 + 6, size=4, dtype=np.int64)
//   np.random.RandomState(7).randint(0, 11, size=6, dtype=np.int64)

TEST(NumpyRandom, SeedsLikeNumpysLegacySeeding) {
  NumpyRandomState zero(0), seed(1234), top(4294967295u);
  for (uint32_t expected : {2357136044u, 2546248239u, 3071714933u})
    EXPECT_EQ(zero.next_uint32(), expected);
  for (uint32_t expected : {822569775u, 2137449171u, 2671936806u})
    EXPECT_EQ(seed.next_uint32(), expected);
  for (uint32_t expected : {419326371u, 479346978u, 3918654476u})
    EXPECT_EQ(top.next_uint32(), expected);
}

TEST(NumpyRandom, ShufflesArangeTenLikeNumpy) {
  std::vector<int64_t> a(10);
  std::iota(a.begin(), a.end(), 0);
  NumpyRandomState(1234).shuffle(std::span<int64_t>(a));
  EXPECT_EQ(a, (std::vector<int64_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
}

TEST(NumpyRandom, ShufflesInt32ArraysLikeNumpy) {
  std::vector<int32_t> a(7);
  std::iota(a.begin(), a.end(), 0);
  NumpyRandomState(0).shuffle(std::span<int32_t>(a));
  EXPECT_EQ(a, (std::vector<int32_t>{6, 2, 1, 3, 0, 5, 4}));
}

TEST(NumpyRandom, ShufflesAThousandLikeNumpyForSeedZero) {
  std::vector<int64_t> a(1000);
  std::iota(a.begin(), a.end(), 0);
  NumpyRandomState(0).shuffle(std::span<int64_t>(a));
  EXPECT_EQ(a[0], 993);
  EXPECT_EQ(a[1], 859);
  EXPECT_EQ(a[2], 298);
  EXPECT_EQ(a[499], 375);
  EXPECT_EQ(a[998], 559);
  EXPECT_EQ(a[999], 684);
}

TEST(NumpyRandom, ShufflesAThousandUint32LikeNumpyForTheLargestSeed) {
  std::vector<uint32_t> a(1000);
  std::iota(a.begin(), a.end(), 0u);
  NumpyRandomState(4294967295u).shuffle(std::span<uint32_t>(a));
  EXPECT_EQ(a[0], 94u);
  EXPECT_EQ(a[1], 405u);
  EXPECT_EQ(a[2], 819u);
  EXPECT_EQ(a[499], 67u);
  EXPECT_EQ(a[998], 290u);
  EXPECT_EQ(a[999], 419u);
}

TEST(NumpyRandom, ConsecutiveShufflesContinueOneStream) {
  NumpyRandomState random(1234);
  std::vector<int64_t> a{0, 1, 2, 3, 4}, b{5, 6, 7, 8};
  random.shuffle(std::span<int64_t>(a));
  random.shuffle(std::span<int64_t>(b));
  EXPECT_EQ(a, (std::vector<int64_t>{4, 0, 1, 2, 3}));
  EXPECT_EQ(b, (std::vector<int64_t>{7, 6, 8, 5}));
}

TEST(NumpyRandom, BoundedDrawsMatchNumpyRandintIn32And64Bits) {
  NumpyRandomState narrow(7);
  for (uint64_t expected : {4u, 9u, 6u, 3u, 3u, 7u})
    EXPECT_EQ(narrow.random_interval(10), expected);
  NumpyRandomState wide(7);  // above 2^32 each candidate is two words, high first
  for (uint64_t expected : {5664942582ull, 1322904761ull, 372560217ull, 3731473840ull})
    EXPECT_EQ(wide.random_interval((1ull << 33) + 5), expected);
}

// ---------------------------------------------------------------------------------------------
// --split. Expected ranges from Megatron-Core's parse_and_normalize_split,
// convert_split_vector_to_split_matrix and int(round(bookend * N)).

TEST(Split, DividesByNormalisedWeights) {
  const auto ranges = split_document_ranges("969,30,1", 1000);
  ASSERT_TRUE(ranges[0] && ranges[1] && ranges[2]);
  EXPECT_EQ(ranges[0]->begin, 0);
  EXPECT_EQ(ranges[0]->end, 969);
  EXPECT_EQ(ranges[1]->begin, 969);
  EXPECT_EQ(ranges[1]->end, 999);
  EXPECT_EQ(ranges[2]->begin, 999);
  EXPECT_EQ(ranges[2]->end, 1000);
}

TEST(Split, RoundsHalfToEven) {
  const auto ranges = split_document_ranges("1,1", 5);  // 2.5 rounds to 2, not 3
  ASSERT_TRUE(ranges[0] && ranges[1]);
  EXPECT_EQ(ranges[0]->end, 2);
  EXPECT_EQ(ranges[1]->begin, 2);
  EXPECT_EQ(ranges[1]->end, 5);
  const auto quarters = split_document_ranges("2,1,1", 6);  // 4.5 rounds to 4
  EXPECT_EQ(quarters[1]->end, 4);
}

TEST(Split, PadsMissingWeightsWithZeroAndLeavesThoseSplitsAbsent) {
  const auto ranges = split_document_ranges("100", 3);
  ASSERT_TRUE(ranges[0]);
  EXPECT_EQ(ranges[0]->end, 3);
  EXPECT_FALSE(ranges[1]);
  EXPECT_FALSE(ranges[2]);
  EXPECT_FALSE(split_document_ranges("98,2,0", 12345)[2]);
}

TEST(Split, ReadsAnyNumbersBetweenSeparators) {
  const auto ranges = split_document_ranges("0.7 0.2 0.1", 7);  // 0.7 * 7 = 4.8999... -> 5
  EXPECT_EQ(ranges[0]->end, 5);
  EXPECT_EQ(ranges[1]->end, 6);
  EXPECT_EQ(ranges[2]->end, 7);
}

TEST(Split, APresentSplitWithNoDocumentsIsEmptyAndRefusedWhereUsed) {
  const auto ranges = split_document_ranges("100,1", 10);
  ASSERT_TRUE(ranges[1].has_value());
  EXPECT_EQ(ranges[1]->size(), 0);
  EXPECT_THROW(require_documents(ranges[1], "100,1", 1, "data"), UsageError);  // Megatron hangs
  EXPECT_EQ(require_documents(ranges[0], "100,1", 0, "data").size(), 10);
}

TEST(Split, RejectsMalformedStrings) {
  EXPECT_THROW(split_document_ranges("1,2,3,4", 10), UsageError);
  EXPECT_THROW(split_document_ranges("0,0,0", 10), UsageError);
  EXPECT_THROW(split_document_ranges("1.2.3", 10), UsageError);
  EXPECT_THROW(split_document_ranges("", 10), UsageError);
}

// ---------------------------------------------------------------------------------------------
// GPTDataset indices.

// The spec's golden vector, from Megatron's own helpers.
TEST(GPTDatasetIndices, MatchesMegatronsGoldenVector) {
  const std::vector<int32_t> lengths{3, 2, 4};
  const auto indices = build_gpt_dataset_indices(lengths, {0, 3}, 3, 4, 1234);
  EXPECT_EQ(indices.num_epochs, 2);
  EXPECT_FALSE(indices.separate_last_epoch);
  EXPECT_EQ(indices.doc_idx, (std::vector<int32_t>{2, 1, 2, 0, 1, 0}));
  EXPECT_EQ(indices.sample_idx, (std::vector<int64_t>{0, 0, 1, 0, 2, 2, 3, 2, 5, 1}));
  EXPECT_EQ(indices.shuffle_idx, (std::vector<int64_t>{0, 2, 1, 3}));
}

// A split that starts mid-dataset and needs a separately shuffled last epoch. Expected values
// from a transcription of Megatron-Core's GPTDataset._build_document_sample_shuffle_indices and
// helpers.build_sample_idx (numpy 1.24.2), which reproduces the golden vector above:
//   lengths = [5, 9, 1, 7, 12, 3, 8, 2, 6, 10, 4, 11]; documents 2..10; tpe = 49
//   seq 8, 20 samples, seed 7 -> 4 epochs; sans = 18, per = 6; 2 < int(0.8 * 6): separate
const std::vector<int32_t> kLengths{5, 9, 1, 7, 12, 3, 8, 2, 6, 10, 4, 11};

TEST(GPTDatasetIndices, ShufflesALastEpochUnder80PercentUsedSeparately) {
  const auto indices = build_gpt_dataset_indices(kLengths, {2, 10}, 20, 8, 7);
  EXPECT_EQ(indices.num_epochs, 4);
  EXPECT_TRUE(indices.separate_last_epoch);
  EXPECT_EQ(indices.doc_idx,
            (std::vector<int32_t>{3, 7, 5, 7, 4, 7, 3, 2, 6, 2, 8, 8, 6, 3, 9, 4,
                                  4, 2, 8, 9, 5, 5, 6, 9, 4, 6, 3, 5, 8, 2, 7, 9}));
  EXPECT_EQ(indices.sample_idx,
            (std::vector<int64_t>{0,  0, 1,  1, 4,  2, 4,  10, 6,  4,  8,  4, 10, 3, 11, 5, 12, 7,
                                  14, 0, 14, 8, 15, 6, 16, 2,  16, 10, 18, 5, 19, 7, 21, 2, 22, 7,
                                  23, 7, 24, 5, 25, 1, 26, 1,  27, 2,  30, 0, 31, 6}));
  EXPECT_EQ(indices.shuffle_idx,
            (std::vector<int64_t>{12, 16, 13, 5, 1, 10, 15, 17, 11, 3,  7,  14,
                                  4,  6,  9,  8, 2, 0,  20, 19, 21, 18, 22, 23}));
}

TEST(GPTDatasetIndices, ShufflesALastEpochAt80PercentWithTheOthers) {
  const auto indices = build_gpt_dataset_indices(kLengths, {2, 10}, 23, 8, 7);  // 5 >= 4
  EXPECT_EQ(indices.num_epochs, 4);
  EXPECT_FALSE(indices.separate_last_epoch);
  EXPECT_EQ(indices.size(), 24);
}

TEST(GPTDatasetIndices, RejectsASplitWithoutTokens) {
  const std::vector<int32_t> lengths{0, 0, 3};
  EXPECT_THROW(build_gpt_dataset_indices(lengths, {0, 2}, 1, 4, 1), UsageError);
}

class GPTDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("omnitron_gpt_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

// Token t of sequence d is 1000 d + t, so a sample's tokens say where they came from.
TEST_F(GPTDatasetTest, ReadsSamplesAcrossDocumentBoundariesInShuffledOrder) {
  const std::string prefix = (dir_ / "corpus").string();
  IndexedDatasetWriter writer(prefix, IndexedDtype::kUInt16);
  for (size_t d = 0; d < kLengths.size(); ++d) {
    std::vector<int32_t> doc(static_cast<size_t>(kLengths[d]));
    for (size_t t = 0; t < doc.size(); ++t) doc[t] = static_cast<int32_t>(1000 * d + t);
    writer.add_document(doc);
  }
  writer.finalize();
  GPTDataset dataset(std::make_shared<IndexedDataset>(prefix), {2, 10}, 20, 8, 7);
  ASSERT_EQ(dataset.size(), 24);

  std::vector<int32_t> tokens(9);
  dataset.sample(0, tokens.data());  // row 12: doc_idx[10] = 8 from offset 2
  EXPECT_EQ(tokens, (std::vector<int32_t>{4002, 4003, 4004, 4005, 4006, 4007, 4008, 4009, 4010}));
  dataset.sample(19, tokens.data());  // row 19: the end of sequence 4, then sequence 6
  EXPECT_EQ(tokens, (std::vector<int32_t>{4005, 4006, 4007, 4008, 4009, 4010, 4011, 6000, 6001}));
  EXPECT_THROW(dataset.sample(24, tokens.data()), InternalError);
}

}  // namespace
}  // namespace omni
