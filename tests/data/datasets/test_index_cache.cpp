// GPTDataset indices are cached beside the data and read back identically.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "data/datasets/gpt_dataset.h"
#include "data/datasets/index_cache.h"
#include "data/datasets/indexed_dataset.h"

namespace omni {
namespace {

std::shared_ptr<const IndexedDataset> small_dataset(const std::string& name) {
  const std::string prefix = ::testing::TempDir() + name;
  IndexedDatasetWriter w(prefix, IndexedDtype::kUInt16);
  for (int d = 0; d < 20; ++d) w.add_document(std::vector<int32_t>(5 + d % 4, d));
  w.finalize();
  return std::make_shared<const IndexedDataset>(prefix);
}

void expect_same(const GPTDatasetIndices& a, const GPTDatasetIndices& b) {
  EXPECT_EQ(a.num_epochs, b.num_epochs);
  EXPECT_EQ(a.separate_last_epoch, b.separate_last_epoch);
  EXPECT_EQ(a.doc_idx, b.doc_idx);
  EXPECT_EQ(a.sample_idx, b.sample_idx);
  EXPECT_EQ(a.shuffle_idx, b.shuffle_idx);
}

TEST(IndexCache, SecondDatasetReadsTheFirstOnesIndicesBack) {
  auto data = small_dataset("omnitron_cache_a");
  const DocumentRange docs{0, 18};
  const std::string path = gpt_index_cache_path(*data, docs, 30, 8, 99);
  std::filesystem::remove(path);
  GPTDataset first(data, docs, 30, 8, 99);
  ASSERT_TRUE(std::filesystem::exists(path));
  int builds = 0;
  const GPTDatasetIndices cached = cached_gpt_indices(*data, docs, 30, 8, 99, [&] {
    ++builds;
    return GPTDatasetIndices{};
  });
  EXPECT_EQ(builds, 0);
  expect_same(cached, first.indices());
  expect_same(cached, build_gpt_dataset_indices(data->sequence_lengths(), docs, 30, 8, 99));
}

TEST(IndexCache, OtherOptionsGetTheirOwnFile) {
  auto data = small_dataset("omnitron_cache_b");
  const DocumentRange docs{0, 18};
  EXPECT_NE(gpt_index_cache_path(*data, docs, 30, 8, 99),
            gpt_index_cache_path(*data, docs, 30, 8, 100));
  EXPECT_NE(gpt_index_cache_path(*data, docs, 30, 8, 99),
            gpt_index_cache_path(*data, docs, 31, 8, 99));
  EXPECT_NE(gpt_index_cache_path(*data, docs, 30, 8, 99),
            gpt_index_cache_path(*data, {1, 18}, 30, 8, 99));
}

TEST(IndexCache, ACorruptOrTruncatedCacheIsRebuilt) {
  auto data = small_dataset("omnitron_cache_c");
  const DocumentRange docs{0, 18};
  const std::string path = gpt_index_cache_path(*data, docs, 30, 8, 7);
  GPTDataset first(data, docs, 30, 8, 7);
  const auto size = std::filesystem::file_size(path);
  for (auto cut : {size - 1, size / 2, uintmax_t{3}}) {
    std::filesystem::resize_file(path, cut);
    GPTDataset again(data, docs, 30, 8, 7);
    expect_same(again.indices(), first.indices());
    EXPECT_EQ(std::filesystem::file_size(path), size);  // rewritten whole
  }
}

}  // namespace
}  // namespace omni
