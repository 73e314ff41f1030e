// Where training samples come from. A sample is seq + 1 consecutive tokens: the first
// seq are the inputs and the last seq the labels. Samples are addressed by their global
// index (consumed samples), so the order is a pure function of the seed and can resume.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/datasets/blended_dataset.h"

namespace omni {

class TrainingData {
 public:
  virtual ~TrainingData() = default;
  // Fills tokens and labels [count, seq] with training samples first..first+count-1.
  virtual void train_samples(int64_t first, int count, int seq, int32_t* tokens,
                             int32_t* labels) const = 0;
  // Validation samples are a fixed sequence; index wraps around what the split holds.
  virtual void valid_samples(int64_t first, int count, int seq, int32_t* tokens,
                             int32_t* labels) const = 0;
  virtual std::string describe() const = 0;
  // Where training sample k comes from, for `omnitron data-samples` (e.g. "dataset 1,
  // sample 12 = shuffle row 40: doc_idx 7 offset 113"); empty when there is nothing to add.
  virtual std::string train_sample_origin(int64_t k) const { return {}; }
};

// The first sample a data-parallel rank reads for micro-step `micro_step` of the step that
// starts at `consumed` samples, as Megatron's MegatronPretrainingSampler hands them out:
// each micro-step takes micro_batch x dp_size consecutive samples, and rank r reads the
// r-th micro_batch of them. With one rank this is consumed + micro_step x micro_batch.
inline int64_t micro_batch_first_sample(int64_t consumed, int micro_step, int micro_batch,
                                        int dp_rank, int dp_size) {
  return consumed + int64_t(micro_step) * micro_batch * dp_size + int64_t(dp_rank) * micro_batch;
}

// Megatron's --mock-data: documents of random tokens in [0, vocab), each closed by `eod`
// (the tokenizer's end-of-document token; -1: the last id, vocab - 1).
std::unique_ptr<TrainingData> make_mock_data(int vocab, uint64_t seed, int32_t eod = -1);

// Bytes of a text file as tokens (vocabulary 256). The file is cut into train and
// validation parts by the --split weights ("969,30,1": the first 96.9% trains).
std::unique_ptr<TrainingData> make_byte_text_data(const std::string& path, const std::string& split,
                                                  int seq, uint64_t seed);

// Megatron indexed datasets (`{prefix}.bin/.idx`) cut by --split; train and validation
// samples as Megatron-Core orders them for the same seed and sample counts: one prefix
// through GPTDataset, a weighted list through BlendedDataset's interleave.
// cache_dir: where the sample indices are cached (--data-cache-path; empty: beside the data).
std::unique_ptr<TrainingData> make_megatron_data(const std::vector<WeightedPrefix>& prefixes,
                                                 bool weighted, const std::string& split, int seq,
                                                 uint64_t seed, int64_t train_samples,
                                                 int64_t valid_samples,
                                                 const std::string& cache_dir = {});

// Megatron's --train-data-path / --valid-data-path: each split from its own datasets, each
// dataset whole (no --split); a validation blend without prefixes: no validation data.
struct DataBlend {
  std::vector<WeightedPrefix> prefixes;
  bool weighted = false;
};
std::unique_ptr<TrainingData> make_megatron_data(const DataBlend& train, const DataBlend& valid,
                                                 int seq, uint64_t seed, int64_t train_samples,
                                                 int64_t valid_samples,
                                                 const std::string& cache_dir = {});

// The demo corpus: the King James Bible from Debian's bible-kjv-text. Looks for
// $OMNITRON_DATA_DIR/kjv.txt, then data/kjv.txt beside the build directory; when absent,
// decodes it there with the package's `bible` program. Throws with what to install.
std::string demo_corpus_path();
// The demo corpus as a Megatron indexed dataset of byte tokens, one document per chapter
// (`kjv_text_document.bin/.idx` beside the text), written on first use.
std::string demo_dataset_prefix();

}  // namespace omni
