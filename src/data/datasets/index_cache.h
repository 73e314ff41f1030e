// GPTDataset indices cached beside the data, as Megatron caches its .npy indices: building
// them shuffles every document and sample, which for a large corpus takes minutes; a
// second run with the same data and options reads them back instead.
#pragma once

#include <cstdint>
#include <functional>

#include "data/datasets/gpt_dataset.h"

namespace omni {

// The indices for (data, documents, num_samples, seq_length, seed): read from
// `{prefix}.{key}.gptidx` when that file exists and was made for exactly these inputs (and
// this .bin/.idx pair, by size and modification time); otherwise built with `build` and
// written there (temporary name, then rename). A cache that cannot be written or read is
// rebuilt silently: it only ever saves time.
// `cache_dir` (Megatron's --data-cache-path) holds the file instead of the data's own folder
// (`{cache_dir}/{prefix's file name}.{key}.gptidx`), for data on a read-only file system; it
// is created when missing.
GPTDatasetIndices cached_gpt_indices(const IndexedDataset& data, DocumentRange documents,
                                     int64_t num_samples, int seq_length, uint32_t seed,
                                     const std::function<GPTDatasetIndices()>& build,
                                     const std::string& cache_dir = {});

// The file a given configuration is cached in (for tests and tools).
std::string gpt_index_cache_path(const IndexedDataset& data, DocumentRange documents,
                                 int64_t num_samples, int seq_length, uint32_t seed,
                                 const std::string& cache_dir = {});

}  // namespace omni
