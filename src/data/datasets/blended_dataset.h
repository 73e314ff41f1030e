// Megatron's blending of several datasets (--data-path w1 p1 w2 p2 ..., or a
// Megatron-DeepSpeed data-file list): per-dataset sample counts and the greedy interleave,
// as Megatron-Core's BlendedDataset and BlendedMegatronDatasetBuilder compute them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace omni {

struct WeightedPrefix {
  double weight = 1.0;
  std::string prefix;
};

// Parses "--data-path" values: "P" (one prefix, no weight), "w1 p1 w2 p2 ..." (weighted).
// Returns the prefixes and whether weights were given.
std::vector<WeightedPrefix> parse_data_path(const std::string& values, bool* weighted);
// Reads a Megatron-DeepSpeed data-file list: one "weight prefix [corpus]" line per dataset;
// a trailing ".bin" on the prefix is dropped; blank lines and '#' comments are skipped.
std::vector<WeightedPrefix> read_data_file_list(const std::string& path);

struct BlendPlan {
  std::vector<double> weights;               // normalised
  std::vector<int64_t> targets;              // ceil(S * w_i): samples the blend takes from i
  std::vector<int64_t> dataset_sizes;        // ceil(t_i * 1.005): samples each dataset is built for
  std::vector<int16_t> dataset_index;        // [sum t_i]: which dataset blend sample k reads
  std::vector<int64_t> dataset_sample_index; // [sum t_i]: and which of its samples
};

// For S requested samples: the blend holds sum(targets) samples (not S), interleaved by
// picking, for k = 0, 1, ..., the dataset with the largest w_i * max(k, 1) - taken_i (ties
// go to the lower index).
BlendPlan plan_blend(std::span<const double> weights, int64_t num_samples);

}  // namespace omni
