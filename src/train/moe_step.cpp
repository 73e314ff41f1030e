#include "train/moe_step.h"

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

namespace omni {

template <typename T>
MoEStepMetrics finish_moe_step(GPTModel<T>& model, const ProcessGrid& grid, int micro_batches,
                               ParameterSet<float>* master) {
  const TransformerConfig& c = model.config();
  MoEStepMetrics out;
  if (c.mtp_num_layers > 0) {  // Megatron's "mtp_<k> loss": per micro-batch, DP-averaged
    std::vector<double> d = model.take_mtp_losses();
    grid.dp_cp().all_reduce(d.data(), d.size());
    grid.pp().all_reduce(d.data(), d.size());  // the last stage's (zeros elsewhere)
    for (size_t k = 0; k < d.size(); ++k)
      out.losses.emplace_back("mtp_" + std::to_string(k + 1) + " loss",
                              d[k] / (double(micro_batches) * grid.dp_size()));
  }
  if (c.num_moe_experts == 0) return out;
  // Multi-token prediction's layers follow the decoder's (GPTModel::MoEReport).
  const int L = c.num_layers + c.mtp_num_layers, E = c.num_moe_experts;
  if (c.moe_router_enable_expert_bias) {
    std::vector<double>& counts = model.expert_token_counts();
    grid.dp_cp().all_reduce(counts.data(), counts.size());
    model.update_expert_bias();
    if (master)
      for (const ParamInfo& p : model.params().infos())
        if (p.name.find("mlp.router.expert_bias") != std::string::npos) {
          if constexpr (std::is_same_v<T, float>)  // the CPU's --bf16/--fp16: host memory
            std::copy_n(model.params().value(p.name), p.numel, master->value(p.name));
          else  // a 16-bit model on the GPU: its master in the same device memory
            ops::to_float(model.exec(), master->value(p.name), model.params().value(p.name),
                          size_t(p.numel));
        }
  }
  typename GPTModel<T>::MoEReport r = model.take_moe_report();
  // One buffer: the two losses per layer, then the token counts.
  std::vector<double> all(r.load_balancing_loss);
  all.insert(all.end(), r.z_loss.begin(), r.z_loss.end());
  all.insert(all.end(), r.tokens_per_expert.begin(), r.tokens_per_expert.end());
  // Context-parallel ranks report their parts of the same sequences: summed with the rest.
  grid.dp_cp().all_reduce(all.data(), all.size());
  grid.pp().all_reduce(all.data(), all.size());
  std::vector<int> pattern = c.moe_layer_pattern();
  for (int k = 0; k < c.mtp_num_layers; ++k) pattern.push_back(c.is_moe_layer(c.num_layers + k));
  // Megatron's tracker counts the MTP layers among the MoE layers (moe_logging.py).
  const double moe_layers =
      double(std::count(pattern.begin(), pattern.begin() + c.num_layers, 1) + c.mtp_num_layers);
  // Megatron: the tracker's values times 1/micro-batches, averaged over data-parallel ranks,
  // summed over layers and divided by the MoE layers.
  const double scale = 1.0 / (double(micro_batches) * grid.dp_size() * moe_layers);
  auto mean = [&](int first) {
    double s = 0;
    for (int l = 0; l < L; ++l) s += all[size_t(first + l)];
    return s * scale;
  };
  if (c.moe_router_load_balancing_type != MoELoadBalancing::None && c.moe_aux_loss_coeff > 0)
    out.losses.emplace_back("load_balancing_loss", mean(0));
  if (c.moe_z_loss_coeff > 0) out.losses.emplace_back("z_loss", mean(L));
  for (int l = 0; l < L; ++l) {
    if (!pattern[l]) continue;
    const double* n = all.data() + 2 * L + size_t(l) * E;
    MoEStepMetrics::LayerTokens t;
    t.layer = l;
    t.min = *std::min_element(n, n + E);
    t.max = *std::max_element(n, n + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += n[e];
    t.mean = sum / E;
    out.tokens.push_back(t);
  }
  return out;
}

template MoEStepMetrics finish_moe_step(GPTModel<float>&, const ProcessGrid&, int,
                                        ParameterSet<float>*);
template MoEStepMetrics finish_moe_step(GPTModel<bf16>&, const ProcessGrid&, int,
                                        ParameterSet<float>*);
template MoEStepMetrics finish_moe_step(GPTModel<f16>&, const ProcessGrid&, int,
                                        ParameterSet<float>*);

}  // namespace omni
