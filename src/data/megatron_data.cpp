// Training data from a Megatron indexed dataset: the samples Megatron-Core's GPTDataset
// would give for the same prefix, --split, --seed and sample counts.
#include <memory>

#include "base/error.h"
#include "data/dataset.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"

namespace omni {

namespace {

class MegatronData final : public TrainingData {
 public:
  MegatronData(std::string prefix, std::unique_ptr<GPTDataset> train,
               std::unique_ptr<GPTDataset> valid)
      : prefix_(std::move(prefix)), train_(std::move(train)), valid_(std::move(valid)) {}

  void train_samples(int64_t first, int count, int seq, int32_t* tokens,
                     int32_t* labels) const override {
    OMNI_REQUIRE(first + count <= train_->size(), "--data-path ", prefix_,
                 ": training needs sample ", first + count - 1, " but the train split holds ",
                 train_->size());
    read(*train_, first, count, seq, tokens, labels);
  }
  void valid_samples(int64_t first, int count, int seq, int32_t* tokens,
                     int32_t* labels) const override {
    OMNI_REQUIRE(valid_, "--data-path ", prefix_,
                 ": --split gives no validation documents; set --eval-iters 0 or change --split");
    for (int s = 0; s < count; ++s)
      read(*valid_, (first + s) % valid_->size(), 1, seq, tokens + size_t(s) * seq,
           labels + size_t(s) * seq);
  }
  std::string describe() const override {
    return prefix_ + ": Megatron indexed dataset, " + std::to_string(train_->size()) +
           " train samples" +
           (valid_ ? ", " + std::to_string(valid_->size()) + " validation samples" : "");
  }

 private:
  static void read(const GPTDataset& d, int64_t first, int count, int seq, int32_t* tokens,
                   int32_t* labels) {
    std::vector<int32_t> buf(seq + 1);
    for (int s = 0; s < count; ++s) {
      d.sample(first + s, buf.data());
      std::copy(buf.begin(), buf.end() - 1, tokens + size_t(s) * seq);
      std::copy(buf.begin() + 1, buf.end(), labels + size_t(s) * seq);
    }
  }
  std::string prefix_;
  std::unique_ptr<GPTDataset> train_, valid_;
};

}  // namespace

std::unique_ptr<TrainingData> make_megatron_data(const std::string& prefix,
                                                 const std::string& split, int seq, uint64_t seed,
                                                 int64_t train_samples, int64_t valid_samples) {
  OMNI_REQUIRE(seed <= 0xffffffffull,
               "--seed must be in [0, 2^32) for Megatron data (numpy's "
               "RandomState takes 32-bit seeds); got ",
               seed);
  auto data = std::make_shared<const IndexedDataset>(prefix);
  const auto ranges = split_document_ranges(split, data->num_sequences());
  OMNI_REQUIRE(ranges[0], "--split ", split, " leaves no training documents in ", prefix);
  auto train = std::make_unique<GPTDataset>(data, *ranges[0], train_samples, seq,
                                            static_cast<uint32_t>(seed));
  std::unique_ptr<GPTDataset> valid;
  if (ranges[1] && valid_samples > 0)
    valid = std::make_unique<GPTDataset>(data, *ranges[1], valid_samples, seq,
                                         static_cast<uint32_t>(seed));
  return std::make_unique<MegatronData>(prefix, std::move(train), std::move(valid));
}

}  // namespace omni
