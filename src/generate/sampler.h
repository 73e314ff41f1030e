// Text generation from a byte-level model: temperature and top-k sampling, one token
// at a time over a window of the last seq_length tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "model/gpt_model.h"

namespace omni {

struct SamplingOptions {
  double temperature = 0.8;
  int top_k = 40;  // 0: the whole vocabulary
  int max_new_tokens = 300;
  uint64_t seed = 1;
};

// Returns the generated continuation (without the prompt). on_token, when set, receives
// each new byte as it is produced, for streaming output.
std::string sample_bytes(GPTModel<float>& model, const std::string& prompt,
                         const SamplingOptions& opts,
                         const std::function<void(char)>& on_token = {});

}  // namespace omni
