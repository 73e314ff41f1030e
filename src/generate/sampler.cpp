#include "generate/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "base/error.h"
#include "base/philox.h"

namespace omni {

std::string sample_bytes(GPTModel<float>& model, const std::string& prompt,
                         const SamplingOptions& o, const std::function<void(char)>& on_token) {
  OMNI_REQUIRE(o.temperature >= 0, "--temperature must be 0 (greedy) or positive");
  OMNI_REQUIRE(o.top_k >= 0, "--top-k must be 0 (all) or positive");
  const int seq = model.config().seq_length, V = model.config().vocab_size;
  std::vector<int32_t> tokens;
  for (unsigned char c : prompt) tokens.push_back(c);
  if (tokens.empty()) tokens.push_back('\n');
  PhiloxStream rng(o.seed, 0);
  std::string out;
  for (int i = 0; i < o.max_new_tokens; ++i) {
    const int n = std::min<int>(seq, tokens.size());
    std::vector<float> logits = model.next_token_logits(tokens.data() + tokens.size() - n, n);
    int next = 0;
    if (o.temperature == 0) {
      next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    } else {
      std::vector<int> order(V);
      std::iota(order.begin(), order.end(), 0);
      const int k = o.top_k ? std::min(o.top_k, V) : V;
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int a, int b) { return logits[a] > logits[b]; });
      std::vector<double> p(k);
      const double mx = logits[order[0]];
      double sum = 0;
      for (int j = 0; j < k; ++j) sum += p[j] = std::exp((logits[order[j]] - mx) / o.temperature);
      double u = rng.next_double() * sum;
      next = order[k - 1];
      for (int j = 0; j < k; ++j)
        if ((u -= p[j]) <= 0) {
          next = order[j];
          break;
        }
    }
    tokens.push_back(next);
    out.push_back(static_cast<char>(next));
    if (on_token) on_token(static_cast<char>(next));
  }
  return out;
}

}  // namespace omni
