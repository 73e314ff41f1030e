#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "base/error.h"
#include "data/datasets/indexed_dataset.h"

namespace omni {
namespace {

// A fresh directory per test, removed afterwards.
class IndexedDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("omnitron_idx_" + std::to_string(::getpid()) + "_" + info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string prefix() const { return (dir_ / "corpus").string(); }

  static std::vector<uint8_t> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  static void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }

  // Three documents [1 2 3] [4] [5 6] as uint16: .idx is 34 + 3*12 + 4*8 = 102 bytes.
  void write_small() {
    IndexedDatasetWriter writer(prefix(), IndexedDtype::kUInt16);
    writer.add_document(std::vector<int32_t>{1, 2, 3});
    writer.add_document(std::vector<int32_t>{4});
    writer.add_document(std::vector<int32_t>{5, 6});
    writer.finalize();
  }

  // Loading must fail with a UsageError whose message names the file and contains `what`.
  void expect_rejected(const std::string& file, const std::string& what) {
    try {
      IndexedDataset data(prefix());
      ADD_FAILURE() << "loaded a corrupted dataset; expected an error containing: " << what;
    } catch (const UsageError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(file), std::string::npos) << message;
      EXPECT_NE(message.find(what), std::string::npos) << message;
    }
  }

  // Little-endian patch of an .idx field.
  template <typename T>
  void patch_idx(size_t at, T value) {
    auto bytes = read_bytes(prefix() + ".idx");
    std::memcpy(bytes.data() + at, &value, sizeof(T));
    write_bytes(prefix() + ".idx", bytes);
  }

  std::filesystem::path dir_;
};

std::vector<int32_t> read_sequence(const IndexedDataset& data, int64_t seq) {
  std::vector<int32_t> out(static_cast<size_t>(data.sequence_length(seq)));
  data.read(seq, 0, data.sequence_length(seq), out.data());
  return out;
}

TEST_F(IndexedDatasetTest, RoundTripsUint16IdsAtTheDtypeLimits) {
  const std::vector<std::vector<int32_t>> docs = {{0, 65535, 1}, {}, {65535}, {7, 0}};
  IndexedDatasetWriter writer(prefix(), IndexedDtype::kUInt16);
  for (const auto& doc : docs) writer.add_document(doc);
  writer.finalize();

  IndexedDataset data(prefix());
  EXPECT_EQ(data.dtype(), IndexedDtype::kUInt16);
  ASSERT_EQ(data.num_sequences(), 4);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(read_sequence(data, i), docs[static_cast<size_t>(i)]);
  EXPECT_EQ(data.document_boundaries(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST_F(IndexedDatasetTest, RoundTripsInt32IdsAtTheDtypeLimits) {
  constexpr int32_t kMin = std::numeric_limits<int32_t>::min();
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  const std::vector<std::vector<int32_t>> docs = {{kMax, 0, kMin}, {65536, 123456789}};
  IndexedDatasetWriter writer(prefix(), IndexedDtype::kInt32);
  for (const auto& doc : docs) writer.add_document(doc);
  writer.finalize();

  IndexedDataset data(prefix());
  EXPECT_EQ(data.dtype(), IndexedDtype::kInt32);
  EXPECT_EQ(read_sequence(data, 0), docs[0]);
  EXPECT_EQ(read_sequence(data, 1), docs[1]);
  int32_t middle[2];
  data.read(0, 1, 2, middle);
  EXPECT_EQ(middle[0], 0);
  EXPECT_EQ(middle[1], kMin);
}

TEST_F(IndexedDatasetTest, WriterRejectsIdsOutsideUint16) {
  IndexedDatasetWriter writer(prefix(), IndexedDtype::kUInt16);
  EXPECT_THROW(writer.add_document(std::vector<int32_t>{1, 65536}), UsageError);
  EXPECT_THROW(writer.add_document(std::vector<int32_t>{-1}), UsageError);
}

TEST_F(IndexedDatasetTest, WriterOnlyWritesUint16OrInt32) {
  EXPECT_THROW(IndexedDatasetWriter(prefix(), IndexedDtype::kInt64), UsageError);
}

TEST_F(IndexedDatasetTest, PicksMegatronsDtypeForTheVocabulary) {
  EXPECT_EQ(indexed_dtype_for_vocab(50257), IndexedDtype::kUInt16);
  EXPECT_EQ(indexed_dtype_for_vocab(65500), IndexedDtype::kInt32);
}

// Expected bytes written out by hand from the spec's .idx table (specs/megatron-data.md).
TEST_F(IndexedDatasetTest, WritesTheMegatronByteLayout) {
  IndexedDatasetWriter writer(prefix(), IndexedDtype::kUInt16);
  writer.add_document(std::vector<int32_t>{1, 2, 3});
  writer.add_document(std::vector<int32_t>{0x1234});
  writer.finalize();

  const std::vector<uint8_t> expected_idx = {
      'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0,  // magic
      1,   0,   0,   0,   0,   0,   0,   0,     // version 1
      8,                                        // dtype code 8 = uint16
      2,   0,   0,   0,   0,   0,   0,   0,     // N = 2 sequences
      3,   0,   0,   0,   0,   0,   0,   0,     // M = 3 document boundaries
      3,   0,   0,   0,   1,   0,   0,   0,     // lengths int32 [3, 1]
      0,   0,   0,   0,   0,   0,   0,   0,     // byte offsets int64 [0,
      6,   0,   0,   0,   0,   0,   0,   0,     //                     6]
      0,   0,   0,   0,   0,   0,   0,   0,     // document boundaries int64 [0,
      1,   0,   0,   0,   0,   0,   0,   0,     //                            1,
      2,   0,   0,   0,   0,   0,   0,   0,     //                            2]
  };
  EXPECT_EQ(read_bytes(prefix() + ".idx"), expected_idx);
  EXPECT_EQ(read_bytes(prefix() + ".bin"), (std::vector<uint8_t>{1, 0, 2, 0, 3, 0, 0x34, 0x12}));
  EXPECT_FALSE(std::filesystem::exists(prefix() + ".idx.tmp"));
}

// Megatron also writes other integer dtypes; build such an index by hand: one sequence of
// two int64 tokens [7, 2^40].
TEST_F(IndexedDatasetTest, WidensInt64TokensAndRejectsThoseOutsideInt32) {
  std::vector<uint8_t> idx = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  const auto put = [&idx](uint64_t value, int bytes) {
    for (int b = 0; b < bytes; ++b) idx.push_back(static_cast<uint8_t>(value >> (8 * b)));
  };
  put(1, 8);  // version
  put(5, 1);  // int64
  put(1, 8);  // N
  put(2, 8);  // M
  put(2, 4);  // length
  put(0, 8);  // offset
  put(0, 8);  // boundaries 0, 1
  put(1, 8);
  write_bytes(prefix() + ".idx", idx);
  std::vector<uint8_t> bin;
  for (uint64_t token : {uint64_t{7}, uint64_t{1} << 40})
    for (int b = 0; b < 8; ++b) bin.push_back(static_cast<uint8_t>(token >> (8 * b)));
  write_bytes(prefix() + ".bin", bin);

  IndexedDataset data(prefix());
  EXPECT_EQ(data.dtype(), IndexedDtype::kInt64);
  int32_t out[2];
  data.read(0, 0, 1, out);
  EXPECT_EQ(out[0], 7);
  EXPECT_THROW(data.read(0, 0, 2, out), UsageError);
}

TEST_F(IndexedDatasetTest, ReadBoundsChecksItsArguments) {
  write_small();
  IndexedDataset data(prefix());
  int32_t out[4];
  EXPECT_THROW(data.read(3, 0, 1, out), InternalError);
  EXPECT_THROW(data.read(0, 2, 2, out), InternalError);
  EXPECT_THROW(data.read(0, -1, 1, out), InternalError);
  data.read(0, 3, 0, out);  // an empty read at the end is fine
}

TEST_F(IndexedDatasetTest, RejectsAMissingFile) {
  expect_rejected("corpus.idx", "cannot open");
}

TEST_F(IndexedDatasetTest, RejectsWrongMagic) {
  write_small();
  patch_idx<uint8_t>(0, 'X');
  expect_rejected("corpus.idx", "magic");
}

TEST_F(IndexedDatasetTest, RejectsWrongVersion) {
  write_small();
  patch_idx<uint64_t>(9, 2);
  expect_rejected("corpus.idx", "expected version 1, found 2");
}

TEST_F(IndexedDatasetTest, RejectsUnknownDtypeCodes) {
  write_small();
  patch_idx<uint8_t>(17, 9);
  expect_rejected("corpus.idx", "found 9");
  patch_idx<uint8_t>(17, 0);
  expect_rejected("corpus.idx", "found 0");
}

TEST_F(IndexedDatasetTest, RejectsFloatDtypes) {
  write_small();
  patch_idx<uint8_t>(17, 7);
  expect_rejected("corpus.idx", "float32");
}

TEST_F(IndexedDatasetTest, RejectsATruncatedIdx) {
  write_small();
  auto bytes = read_bytes(prefix() + ".idx");
  bytes.pop_back();
  write_bytes(prefix() + ".idx", bytes);
  expect_rejected("corpus.idx", "the file has 101");
  bytes.resize(20);
  write_bytes(prefix() + ".idx", bytes);
  expect_rejected("corpus.idx", "truncated");
}

TEST_F(IndexedDatasetTest, RejectsATruncatedBin) {
  write_small();
  auto bytes = read_bytes(prefix() + ".bin");
  bytes.pop_back();
  write_bytes(prefix() + ".bin", bytes);
  expect_rejected("corpus.bin", "has 11 bytes");
}

TEST_F(IndexedDatasetTest, RejectsOffsetsPastTheBin) {
  write_small();
  patch_idx<int64_t>(34 + 12 + 8 * 2, 1000);  // offset of sequence 2
  expect_rejected("corpus.bin", "sequence 2");
  patch_idx<int64_t>(34 + 12 + 8 * 2, -2);
  expect_rejected("corpus.bin", "sequence 2");
  patch_idx<int64_t>(34 + 12 + 8 * 2, std::numeric_limits<int64_t>::max());
  expect_rejected("corpus.bin", "sequence 2");
}

TEST_F(IndexedDatasetTest, RejectsNegativeLengths) {
  write_small();
  patch_idx<int32_t>(34 + 4, -1);
  expect_rejected("corpus.idx", "negative length");
}

TEST_F(IndexedDatasetTest, RejectsCountsInconsistentWithTheFileSize) {
  write_small();
  patch_idx<uint64_t>(18, 4);
  expect_rejected("corpus.idx", "N = 4");
  patch_idx<uint64_t>(18, std::numeric_limits<uint64_t>::max());
  expect_rejected("corpus.idx", "N = 18446744073709551615");
  patch_idx<uint64_t>(18, 3);
  patch_idx<uint64_t>(26, 5);
  expect_rejected("corpus.idx", "M = 5");
}

TEST_F(IndexedDatasetTest, RejectsDocumentBoundariesThatDoNotRunFromZeroToN) {
  write_small();
  const size_t boundaries = 34 + 3 * 12;
  patch_idx<int64_t>(boundaries + 8 * 3, 2);  // last must be N = 3
  expect_rejected("corpus.idx", "document boundary 3");
  patch_idx<int64_t>(boundaries + 8 * 3, 3);
  patch_idx<int64_t>(boundaries + 8 * 2, 0);  // decreasing
  expect_rejected("corpus.idx", "document boundary 2");
}

// Every single-byte corruption or truncation of a valid index either loads (and then reads
// within bounds) or throws UsageError: never a crash or another exception.
TEST_F(IndexedDatasetTest, SurvivesRandomCorruptionsOfTheIdx) {
  write_small();
  const auto original = read_bytes(prefix() + ".idx");
  std::mt19937 rng(20261122);
  int loaded = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    auto bytes = original;
    if (trial % 4 == 3) {
      bytes.resize(rng() % bytes.size());
    } else {
      bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
    }
    write_bytes(prefix() + ".idx", bytes);
    try {
      IndexedDataset data(prefix());
      for (int64_t s = 0; s < data.num_sequences(); ++s) read_sequence(data, s);
      ++loaded;
    } catch (const UsageError&) {
    }
  }
  EXPECT_GT(loaded, 0);  // some corruptions (a token length shrinking, say) are still valid
}

}  // namespace
}  // namespace omni
