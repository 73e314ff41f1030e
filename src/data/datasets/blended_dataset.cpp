#include "data/datasets/blended_dataset.h"

#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>

#include "base/error.h"

namespace omni {

namespace {
bool parse_weight(const std::string& s, double* w) {
  char* end = nullptr;
  *w = std::strtod(s.c_str(), &end);
  return !s.empty() && *end == '\0';
}
}  // namespace

std::vector<WeightedPrefix> parse_data_path(const std::string& values, bool* weighted) {
  std::vector<std::string> words;
  std::istringstream in(values);
  for (std::string w; in >> w;) words.push_back(w);
  OMNI_REQUIRE(!words.empty(), "--data-path needs a dataset prefix");
  double w = 0;
  *weighted = words.size() > 1 || parse_weight(words[0], &w);
  if (!*weighted) return {{1.0, words[0]}};
  OMNI_REQUIRE(words.size() % 2 == 0, "--data-path: weights and prefixes must alternate "
               "(w1 p1 w2 p2 ...); got ", words.size(), " values");
  std::vector<WeightedPrefix> out;
  for (size_t i = 0; i < words.size(); i += 2) {
    OMNI_REQUIRE(parse_weight(words[i], &w) && w >= 0, "--data-path: '", words[i],
                 "' is not a weight (expected w1 p1 w2 p2 ...)");
    out.push_back({w, words[i + 1]});
  }
  return out;
}

std::vector<WeightedPrefix> read_data_file_list(const std::string& path) {
  std::ifstream in(path);
  OMNI_REQUIRE(in, "--data-file-list: cannot open '", path, "'");
  std::vector<WeightedPrefix> out;
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    std::istringstream fields(line);
    std::string weight, prefix;
    if (!(fields >> weight) || weight[0] == '#') continue;
    double w = 0;
    OMNI_REQUIRE(parse_weight(weight, &w) && w >= 0 && (fields >> prefix), "--data-file-list ",
                 path, ":", lineno, ": expected 'weight prefix [corpus]', got '", line, "'");
    if (prefix.size() > 4 && prefix.ends_with(".bin")) prefix.resize(prefix.size() - 4);
    out.push_back({w, prefix});
  }
  OMNI_REQUIRE(!out.empty(), "--data-file-list ", path, " names no datasets");
  return out;
}

BlendPlan plan_blend(std::span<const double> weights, int64_t num_samples) {
  const size_t n = weights.size();
  OMNI_REQUIRE(n > 0 && n <= 32767, "blending needs 1 to 32767 datasets (got ", n, ")");
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  OMNI_REQUIRE(total > 0, "the --data-path weights must not all be zero");
  BlendPlan p;
  for (size_t i = 0; i < n; ++i) {
    p.weights.push_back(weights[i] / total);
    p.targets.push_back(static_cast<int64_t>(std::ceil(double(num_samples) * p.weights[i])));
    // The 0.5% margin, in double arithmetic as Megatron writes it.
    p.dataset_sizes.push_back(static_cast<int64_t>(std::ceil(double(p.targets[i]) * 1.005)));
  }
  const int64_t size = std::accumulate(p.targets.begin(), p.targets.end(), int64_t(0));
  p.dataset_index.resize(size);
  p.dataset_sample_index.resize(size);
  std::vector<int64_t> taken(n, 0);
  for (int64_t k = 0; k < size; ++k) {
    const double scale = double(std::max<int64_t>(k, 1));
    size_t best = 0;
    double best_error = p.weights[0] * scale - double(taken[0]);
    for (size_t i = 1; i < n; ++i) {
      const double error = p.weights[i] * scale - double(taken[i]);
      if (error > best_error) best_error = error, best = i;
    }
    p.dataset_index[k] = static_cast<int16_t>(best);
    p.dataset_sample_index[k] = taken[best]++;
  }
  return p;
}

}  // namespace omni
