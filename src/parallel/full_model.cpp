#include "parallel/full_model.h"

#include <algorithm>

#include "base/error.h"

namespace omni {

namespace {

// Calls f(local_element, full_element, count) for the runs of `p` inside the full tensor.
template <typename F>
void for_each_slice(const ParamInfo& p, const ParamInfo& whole, F&& f) {
  OMNI_CHECK(p.global_shape.size() == whole.shape.size(), "[full model] ", p.name, " has shape ",
             shape_str(whole.shape), " in the one-rank model, ", shape_str(p.global_shape),
             " in the layout");
  ParameterSet<float>::for_each_run(p, [&](int64_t local, int64_t global, int64_t n) {
    const int64_t fit = std::clamp<int64_t>(whole.numel - global, 0, n);  // vocabulary padding
    if (fit > 0) f(p.offset + local, whole.offset + global, fit);
  });
}

}  // namespace

void take_slices(const ParameterSet<float>& full_params, const float* full,
                 const ParameterSet<float>& local_params, float* local) {
  for (const ParamInfo& p : local_params.infos()) {
    std::fill(local + p.offset, local + p.offset + p.numel, 0.0f);
    for_each_slice(p, full_params.info(p.name), [&](int64_t l, int64_t g, int64_t n) {
      std::copy_n(full + g, n, local + l);
    });
  }
}

void put_slices(const ParameterSet<float>& local_params, const float* local,
                const ParameterSet<float>& full_params, float* full, bool skip_word_embeddings,
                bool skip_replicated) {
  for (const ParamInfo& p : local_params.infos()) {
    if (skip_word_embeddings && p.name == "embedding.word_embeddings.weight") continue;
    if (skip_replicated && p.tp_replicated) continue;
    for_each_slice(p, full_params.info(p.name), [&](int64_t l, int64_t g, int64_t n) {
      std::copy_n(local + l, n, full + g);
    });
  }
}

}  // namespace omni
