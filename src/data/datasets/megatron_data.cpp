// Training data from Megatron indexed datasets: the samples Megatron-Core's GPTDataset (and
// BlendedDataset, for weighted lists) would give for the same prefixes, --split, --seed and
// sample counts.
#include <memory>

#include "base/error.h"
#include "data/datasets/blended_dataset.h"
#include "data/datasets/dataset.h"
#include "data/datasets/gpt_dataset.h"
#include "data/datasets/indexed_dataset.h"

namespace omni {

namespace {

// One split (train or validation) of one dataset, or a blend of several.
class SplitSamples {
 public:
  SplitSamples(std::vector<std::unique_ptr<GPTDataset>> datasets, BlendPlan plan)
      : datasets_(std::move(datasets)), plan_(std::move(plan)) {}
  int64_t size() const {
    return plan_.dataset_index.empty() ? datasets_[0]->size()
                                       : static_cast<int64_t>(plan_.dataset_index.size());
  }
  void sample(int64_t k, int32_t* tokens) const {
    if (plan_.dataset_index.empty()) return datasets_[0]->sample(k, tokens);
    datasets_[plan_.dataset_index[k]]->sample(plan_.dataset_sample_index[k], tokens);
  }
  std::string origin(int64_t k) const {
    std::string out;
    int64_t j = k;
    const GPTDataset* d = datasets_[0].get();
    if (!plan_.dataset_index.empty()) {
      j = plan_.dataset_sample_index[k];
      d = datasets_[plan_.dataset_index[k]].get();
      out = "dataset " + std::to_string(plan_.dataset_index[k]) + " sample " + std::to_string(j) +
            ", ";
    }
    const GPTDatasetIndices& ix = d->indices();
    const int64_t row = ix.shuffle_idx[j];
    return out + "shuffle_idx -> sample_idx row " + std::to_string(row) + " (doc_idx position " +
           std::to_string(ix.sample_idx[2 * row]) + ", offset " +
           std::to_string(ix.sample_idx[2 * row + 1]) + ")";
  }

 private:
  std::vector<std::unique_ptr<GPTDataset>> datasets_;
  BlendPlan plan_;
};

class MegatronData final : public TrainingData {
 public:
  MegatronData(std::string name, std::unique_ptr<SplitSamples> train,
               std::unique_ptr<SplitSamples> valid)
      : name_(std::move(name)), train_(std::move(train)), valid_(std::move(valid)) {}

  void train_samples(int64_t first, int count, int seq, int32_t* tokens,
                     int32_t* labels) const override {
    OMNI_REQUIRE(first + count <= train_->size(), name_, ": training needs sample ",
                 first + count - 1, " but the train split holds ", train_->size());
    for (int s = 0; s < count; ++s) read(*train_, first + s, seq, tokens, labels, s);
  }
  void valid_samples(int64_t first, int count, int seq, int32_t* tokens,
                     int32_t* labels) const override {
    OMNI_REQUIRE(valid_, name_,
                 ": no validation documents (--split gives none, or no --valid-data-path); set "
                 "--eval-iters 0 or give some");
    for (int s = 0; s < count; ++s) read(*valid_, (first + s) % valid_->size(), seq, tokens, labels, s);
  }
  std::string train_sample_origin(int64_t k) const override { return train_->origin(k); }
  std::string describe() const override {
    return name_ + ": Megatron indexed data, " + std::to_string(train_->size()) +
           " train samples" +
           (valid_ ? ", " + std::to_string(valid_->size()) + " validation samples" : "");
  }

 private:
  static void read(const SplitSamples& d, int64_t k, int seq, int32_t* tokens, int32_t* labels,
                   int row) {
    std::vector<int32_t> buf(seq + 1);
    d.sample(k, buf.data());
    std::copy(buf.begin(), buf.end() - 1, tokens + size_t(row) * seq);
    std::copy(buf.begin() + 1, buf.end(), labels + size_t(row) * seq);
  }
  std::string name_;
  std::unique_ptr<SplitSamples> train_, valid_;
};

// Builds split `which` (0 train, 1 validation) for num_samples; null when absent.
std::unique_ptr<SplitSamples> build_split(
    const std::vector<std::shared_ptr<const IndexedDataset>>& data,
    const std::vector<WeightedPrefix>& prefixes, bool weighted, const std::string& split, int which,
    int64_t num_samples, int seq, uint32_t seed, const std::string& cache_dir) {
  if (num_samples <= 0) return nullptr;
  BlendPlan plan;
  if (weighted) {
    std::vector<double> w;
    for (const WeightedPrefix& p : prefixes) w.push_back(p.weight);
    plan = plan_blend(w, num_samples);
  }
  std::vector<std::unique_ptr<GPTDataset>> datasets;
  for (size_t i = 0; i < data.size(); ++i) {
    const auto ranges = split_document_ranges(split, data[i]->num_sequences());
    if (!ranges[which] && which != 0) return nullptr;  // e.g. --split 100,0,0: no validation
    const DocumentRange& docs = require_documents(ranges[which], split, which, prefixes[i].prefix);
    const int64_t n = weighted ? plan.dataset_sizes[i] : num_samples;
    datasets.push_back(std::make_unique<GPTDataset>(data[i], docs, n, seq, seed, cache_dir));
  }
  return std::make_unique<SplitSamples>(std::move(datasets), std::move(plan));
}

// The indexed datasets of a blend, and their names joined for messages.
std::vector<std::shared_ptr<const IndexedDataset>> open_blend(const DataBlend& blend,
                                                              const std::string& flag,
                                                              std::string& name) {
  OMNI_REQUIRE(blend.weighted || blend.prefixes.size() == 1,
               "several datasets need weights: ", flag, " w1 p1 w2 p2 ...");
  std::vector<std::shared_ptr<const IndexedDataset>> data;
  for (const WeightedPrefix& p : blend.prefixes) {
    data.push_back(std::make_shared<const IndexedDataset>(p.prefix));
    name += (name.empty() ? "" : " + ") + p.prefix;
  }
  return data;
}

uint32_t data_seed(uint64_t seed) {
  OMNI_REQUIRE(seed <= 0xffffffffull,
               "--seed must be in [0, 2^32) for Megatron data (numpy's "
               "RandomState takes 32-bit seeds); got ",
               seed);
  return static_cast<uint32_t>(seed);
}

}  // namespace

std::unique_ptr<TrainingData> make_megatron_data(const std::vector<WeightedPrefix>& prefixes,
                                                 bool weighted, const std::string& split, int seq,
                                                 uint64_t seed, int64_t train_samples,
                                                 int64_t valid_samples,
                                                 const std::string& cache_dir) {
  const uint32_t s = data_seed(seed);
  std::string name;
  const auto data = open_blend({prefixes, weighted}, "--data-path", name);
  auto train = build_split(data, prefixes, weighted, split, 0, train_samples, seq, s, cache_dir);
  auto valid = build_split(data, prefixes, weighted, split, 1, valid_samples, seq, s, cache_dir);
  return std::make_unique<MegatronData>(name, std::move(train), std::move(valid));
}

std::unique_ptr<TrainingData> make_megatron_data(const DataBlend& train, const DataBlend& valid,
                                                 int seq, uint64_t seed, int64_t train_samples,
                                                 int64_t valid_samples,
                                                 const std::string& cache_dir) {
  const uint32_t s = data_seed(seed);
  // Megatron's blend_per_split: each split is the whole of its own datasets (split matrix
  // (0, 1)), which --split "1" describes.
  std::string name, valid_name;
  const auto train_data = open_blend(train, "--train-data-path", name);
  auto train_split = build_split(train_data, train.prefixes, train.weighted, "1", 0, train_samples,
                                 seq, s, cache_dir);
  std::unique_ptr<SplitSamples> valid_split;
  if (!valid.prefixes.empty()) {
    const auto valid_data = open_blend(valid, "--valid-data-path", valid_name);
    valid_split = build_split(valid_data, valid.prefixes, valid.weighted, "1", 0, valid_samples,
                              seq, s, cache_dir);
    name += " (validation: " + valid_name + ")";
  }
  return std::make_unique<MegatronData>(name, std::move(train_split), std::move(valid_split));
}

}  // namespace omni
