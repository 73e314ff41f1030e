// Megatron-Core's GPTDataset sample order: which seq + 1 tokens form training sample k.
// The indices are built exactly as Megatron builds them (same numpy RandomState stream, same
// epoch rule), so for the same data, --split, --seed and sample count we read the same tokens
// in the same order.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace omni {

class IndexedDataset;

// Sequences [begin, end) of an indexed dataset.
struct DocumentRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// --split "969,30,1" over num_sequences: train, valid and test ranges. A split of weight zero
// is absent (nullopt); a present split may round to no sequences (an empty range), which is
// only an error where that split is used (require_documents).
std::array<std::optional<DocumentRange>, 3> split_document_ranges(const std::string& split,
                                                                  int64_t num_sequences);
// The range of split `which` (0 train, 1 valid, 2 test); a UsageError naming the split and
// the dataset when it is absent or empty (where Megatron would hang).
const DocumentRange& require_documents(const std::optional<DocumentRange>& range,
                                       const std::string& split, int which,
                                       const std::string& prefix);

struct GPTDatasetIndices {
  int64_t num_epochs = 0;
  bool separate_last_epoch = false;
  std::vector<int32_t> doc_idx;      // sequence ids, num_epochs shuffled copies of the range
  std::vector<int64_t> sample_idx;   // [n + 1][2]: (position in doc_idx, token offset)
  std::vector<int64_t> shuffle_idx;  // [n]: sample k reads sample_idx row shuffle_idx[k]

  int64_t size() const { return static_cast<int64_t>(shuffle_idx.size()); }
};

// sequence_lengths covers the whole dataset (doc_idx holds its sequence ids); documents is
// the split. Holds at least num_samples samples (usually a few more: whole epochs).
GPTDatasetIndices build_gpt_dataset_indices(std::span<const int32_t> sequence_lengths,
                                            DocumentRange documents, int64_t num_samples,
                                            int seq_length, uint32_t seed);

class GPTDataset {
 public:
  // cache_dir: where the indices are cached (index_cache.h; empty: beside the data).
  GPTDataset(std::shared_ptr<const IndexedDataset> data, DocumentRange documents,
             int64_t num_samples, int seq_length, uint32_t seed, const std::string& cache_dir = {});

  int64_t size() const { return indices_.size(); }
  int seq_length() const { return seq_length_; }
  const GPTDatasetIndices& indices() const { return indices_; }
  // Writes seq_length + 1 tokens of sample k (0 <= k < size()).
  void sample(int64_t k, int32_t* tokens) const;

 private:
  std::shared_ptr<const IndexedDataset> data_;
  int seq_length_;
  GPTDatasetIndices indices_;
};

}  // namespace omni
