#include "data/datasets/gpt_dataset.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <utility>

#include "base/error.h"
#include "data/datasets/index_cache.h"
#include "data/datasets/indexed_dataset.h"
#include "data/datasets/numpy_random.h"

namespace omni {

namespace {

constexpr const char* kSplitNames[3] = {"train", "valid", "test"};

// Megatron: re.findall(r"[.0-9]+", split), each through float(), padded with zeros to three.
std::array<double, 3> parse_split_weights(const std::string& split) {
  std::vector<double> weights;
  size_t i = 0;
  while (i < split.size()) {
    auto in_class = [](char c) { return c == '.' || (c >= '0' && c <= '9'); };
    if (!in_class(split[i])) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < split.size() && in_class(split[end])) ++end;
    const std::string number = split.substr(i, end - i);
    char* parsed_end = nullptr;
    const double value = std::strtod(number.c_str(), &parsed_end);
    OMNI_REQUIRE(parsed_end == number.c_str() + number.size(), "--split \"", split, "\": \"",
                 number, "\" is not a number");
    weights.push_back(value);
    i = end;
  }
  OMNI_REQUIRE(weights.size() <= 3, "--split \"", split, "\" has ", weights.size(),
               " weights; expected at most three (train, valid, test)");
  std::array<double, 3> padded{0.0, 0.0, 0.0};
  for (size_t k = 0; k < weights.size(); ++k) padded[k] = weights[k];
  return padded;
}

}  // namespace

std::array<std::optional<DocumentRange>, 3> split_document_ranges(const std::string& split,
                                                                  int64_t num_sequences) {
  const std::array<double, 3> weights = parse_split_weights(split);
  const double sum = (weights[0] + weights[1]) + weights[2];
  OMNI_REQUIRE(sum > 0.0, "--split \"", split, "\": the weights sum to zero");
  // Bookends are running sums of the normalised weights, as Megatron computes them.
  std::array<double, 4> bookends{0.0, 0.0, 0.0, 0.0};
  for (int k = 0; k < 3; ++k) bookends[k + 1] = bookends[k] + weights[k] / sum;

  std::array<std::optional<DocumentRange>, 3> ranges;
  const auto n = static_cast<double>(num_sequences);
  for (int k = 0; k < 3; ++k) {
    if (bookends[k + 1] - bookends[k] <= 0.0) continue;
    // Python's round() is round-half-to-even, which nearbyint is in the default mode.
    const auto begin = static_cast<int64_t>(std::nearbyint(bookends[k] * n));
    const auto end = static_cast<int64_t>(std::nearbyint(bookends[k + 1] * n));
    ranges[k] = DocumentRange{begin, end};  // may be empty: see require_documents
  }
  return ranges;
}

const DocumentRange& require_documents(const std::optional<DocumentRange>& range,
                                        const std::string& split, int which,
                                        const std::string& prefix) {
  OMNI_REQUIRE(range && range->size() > 0, "--split \"", split, "\" gives the ",
               kSplitNames[which], " split no documents of ", prefix,
               "; give it a larger weight, or use more data");
  return *range;
}

GPTDatasetIndices build_gpt_dataset_indices(std::span<const int32_t> sequence_lengths,
                                            DocumentRange documents, int64_t num_samples,
                                            int seq_length, uint32_t seed) {
  OMNI_REQUIRE(seq_length >= 1, "sequence length must be positive, got ", seq_length);
  OMNI_REQUIRE(num_samples >= 0, "number of samples must be non-negative, got ", num_samples);
  OMNI_CHECK(documents.begin >= 0 && documents.begin <= documents.end &&
                 documents.end <= static_cast<int64_t>(sequence_lengths.size()),
             "documents ", documents.begin, "..", documents.end, " of ", sequence_lengths.size());
  OMNI_REQUIRE(documents.end <= std::numeric_limits<int32_t>::max(),
               "the dataset has more sequences than Megatron's int32 document index holds");
  const int64_t seq = seq_length;

  int64_t tokens_per_epoch = 0;
  for (int64_t d = documents.begin; d < documents.end; ++d)
    tokens_per_epoch += sequence_lengths[static_cast<size_t>(d)];
  OMNI_REQUIRE(tokens_per_epoch > 0, "the split's ", documents.size(), " documents hold no tokens");

  // Megatron adds the extra label token once, to the whole request.
  GPTDatasetIndices out;
  const int64_t tokens_requested = num_samples * seq + 1;
  out.num_epochs = (tokens_requested + tokens_per_epoch - 1) / tokens_per_epoch;
  const int64_t epochs = out.num_epochs;

  int64_t samples_sans_last_epoch = 0;
  if (epochs > 1) {
    samples_sans_last_epoch = ((epochs - 1) * tokens_per_epoch - 1) / seq;
    const int64_t from_last_epoch = num_samples - samples_sans_last_epoch;
    const int64_t per_epoch = (tokens_per_epoch - 1) / seq;
    OMNI_CHECK(from_last_epoch >= 0 && from_last_epoch <= per_epoch + 1,
               "samples from the last epoch ", from_last_epoch, ", per epoch ", per_epoch);
    // Megatron's threshold: a last epoch that would contribute under 80% of its samples is
    // shuffled on its own, so its unused documents do not crowd out earlier epochs'.
    const auto threshold = static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
    out.separate_last_epoch = from_last_epoch < threshold;
  }

  // doc_idx: epoch-major copies of the ids, shuffled together or as (first e-1) + (last).
  NumpyRandomState random(seed);
  const int64_t docs = documents.size();
  out.doc_idx.resize(static_cast<size_t>(epochs * docs));
  for (int64_t e = 0; e < epochs; ++e)
    for (int64_t d = 0; d < docs; ++d)
      out.doc_idx[static_cast<size_t>(e * docs + d)] = static_cast<int32_t>(documents.begin + d);
  std::span<int32_t> doc_idx(out.doc_idx);
  if (out.separate_last_epoch) {
    const auto first = static_cast<size_t>((epochs - 1) * docs);
    random.shuffle(doc_idx.first(first));
    random.shuffle(doc_idx.subspan(first));
  } else {
    random.shuffle(doc_idx);
  }

  // sample_idx: walk doc_idx's token stream with stride seq; each sample takes seq + 1 tokens
  // and the next one starts on its last token.
  const int64_t n = (epochs * tokens_per_epoch - 1) / seq;
  out.sample_idx.assign(static_cast<size_t>(2 * (n + 1)), 0);
  int64_t position = 0;
  int64_t offset = 0;
  const auto doc_idx_len = static_cast<int64_t>(out.doc_idx.size());
  for (int64_t s = 1; s <= n; ++s) {
    int64_t remaining = seq + 1;
    while (remaining != 0) {
      const int64_t doc_length =
          sequence_lengths[static_cast<size_t>(out.doc_idx[static_cast<size_t>(position)])] -
          offset;
      remaining -= doc_length;
      if (remaining <= 0) {
        offset += remaining + doc_length - 1;
        remaining = 0;
      } else {
        if (position == doc_idx_len - 1) {
          OMNI_CHECK(s == n, "ran out of documents at sample ", s, " of ", n);
          offset =
              sequence_lengths[static_cast<size_t>(out.doc_idx[static_cast<size_t>(position)])] - 1;
          break;
        }
        ++position;
        offset = 0;
      }
    }
    out.sample_idx[static_cast<size_t>(2 * s)] = position;
    out.sample_idx[static_cast<size_t>(2 * s + 1)] = offset;
  }

  // shuffle_idx: arange(0, first) shuffled, then arange(first, n) shuffled.
  const int64_t first = out.separate_last_epoch ? samples_sans_last_epoch : n;
  out.shuffle_idx.resize(static_cast<size_t>(n));
  std::iota(out.shuffle_idx.begin(), out.shuffle_idx.end(), int64_t{0});
  std::span<int64_t> shuffle_idx(out.shuffle_idx);
  random.shuffle(shuffle_idx.first(static_cast<size_t>(first)));
  if (first < n) random.shuffle(shuffle_idx.subspan(static_cast<size_t>(first)));
  return out;
}

GPTDataset::GPTDataset(std::shared_ptr<const IndexedDataset> data, DocumentRange documents,
                       int64_t num_samples, int seq_length, uint32_t seed,
                       const std::string& cache_dir)
    : data_(std::move(data)), seq_length_(seq_length) {
  OMNI_CHECK(data_ != nullptr, "GPTDataset needs an indexed dataset");
  OMNI_REQUIRE(documents.begin >= 0 && documents.begin < documents.end &&
                   documents.end <= data_->num_sequences(),
               "[GPTDataset] documents ", documents.begin, "..", documents.end,
               " are not a non-empty range of the ", data_->num_sequences(), " sequences of ",
               data_->prefix());
  indices_ = cached_gpt_indices(
      *data_, documents, num_samples, seq_length, seed,
      [&] {
        return build_gpt_dataset_indices(data_->sequence_lengths(), documents, num_samples,
                                         seq_length, seed);
      },
      cache_dir);
}

void GPTDataset::sample(int64_t k, int32_t* tokens) const {
  OMNI_CHECK(k >= 0 && k < size(), "sample ", k, " of ", size());
  const int64_t row = indices_.shuffle_idx[static_cast<size_t>(k)];
  const auto at = [&](int64_t r, int c) {
    return indices_.sample_idx[static_cast<size_t>(2 * r + c)];
  };
  const int64_t begin = at(row, 0), begin_offset = at(row, 1);
  const int64_t end = at(row + 1, 0), end_offset = at(row + 1, 1);
  int64_t written = 0;
  for (int64_t i = begin; i <= end; ++i) {
    const int64_t doc = indices_.doc_idx[static_cast<size_t>(i)];
    const int64_t from = i == begin ? begin_offset : 0;
    // The last piece ends on the next sample's first token (the extra label token).
    const int64_t to = i == end ? end_offset + 1 : data_->sequence_length(doc);
    OMNI_CHECK(written + (to - from) <= seq_length_ + 1, "sample ", k, " overflows");
    data_->read(doc, from, to - from, tokens + written);
    written += to - from;
  }
  OMNI_CHECK(written == seq_length_ + 1, "sample ", k, " has ", written, " tokens");
}

}  // namespace omni
