// Multi-latent attention's rows (Megatron's --multi-latent-attention and its mla group;
// model/mla.h builds it): the latent ranks and head dims, and its rope (--rope-type, YaRN's
// --rotary-scaling-factor and mscales). Stored with a checkpoint's weights (group "model").
#include "base/error.h"
#include "config/option_rows.h"

namespace omni::option_rows {

void finalize_mla(Options& o) {
  OMNI_REQUIRE(o.model.mtp_num_layers >= 0, "--mtp-num-layers must be 0 or more (got ",
               o.model.mtp_num_layers, ")");
  // Primus's llama_base.yaml sets 40 for every Llama, where Megatron ignores it too.
  if (!o.model.multi_latent_attention && o.model.rotary_scaling_factor != 1.0)
    o.notes.push_back(
        "note: --rotary-scaling-factor has no effect here: only multi-latent attention reads it "
        "(YaRN's factor); Llama 3.1's scaling is --use-rope-scaling");
}

void add_mla_options(std::vector<OptionDef>& t) {
  const std::string M = "model";
  t.push_back(toggle("--multi-latent-attention", M,
                     "multi-latent attention (DeepSeek-V2/V3): queries, keys and values from "
                     "low-rank latents, a decoupled rope key shared by the heads",
                     [](Options& o) -> bool& { return o.model.multi_latent_attention; }));
  t.push_back(number<int>("--q-lora-rank", "N", M,
                          "MLA: rank of the query latent (0 or unset: queries from the hidden "
                          "state)",
                          [](Options& o) -> int& { return o.model.q_lora_rank; }));
  t.push_back(number<int>("--kv-lora-rank", "N", M, "MLA: rank of the key/value latent",
                          [](Options& o) -> int& { return o.model.kv_lora_rank; }));
  t.push_back(number<int>("--qk-head-dim", "N", M, "MLA: query/key channels per head without rope",
                          [](Options& o) -> int& { return o.model.qk_head_dim; }));
  t.push_back(number<int>("--qk-pos-emb-head-dim", "N", M,
                          "MLA: query/key channels per head with rope (the shared rope key's)",
                          [](Options& o) -> int& { return o.model.qk_pos_emb_head_dim; }));
  t.push_back(number<int>("--v-head-dim", "N", M, "MLA: value channels per head",
                          [](Options& o) -> int& { return o.model.v_head_dim; }));
  t.push_back(OptionDef{
      "--rope-type", "rope|yarn", M, "MLA's rope: yarn (Megatron's default for MLA) or plain rope",
      [](Options& o, const std::string& v) {
        if (v != "rope" && v != "yarn")
          throw UsageError("--rope-type: '" + v + "' is not one of rope, yarn");
        o.model.yarn = v == "yarn";
      },
      [](const Options& o) { return std::string(o.model.yarn ? "yarn" : "rope"); }});
  // Megatron reads it for YaRN and MLA's softmax scale only (finalize_mla notes it elsewhere).
  t.push_back(number<double>("--rotary-scaling-factor", "X", M,
                             "MLA: YaRN's scaling factor (also in its softmax scale)",
                             [](Options& o) -> double& { return o.model.rotary_scaling_factor; }));
  t.push_back(number<double>("--mscale", "X", M, "MLA: YaRN's mscale",
                             [](Options& o) -> double& { return o.model.mscale; }));
  t.push_back(number<double>("--mscale-all-dim", "X", M,
                             "MLA: YaRN's mscale_all_dim (the softmax scale's factor)",
                             [](Options& o) -> double& { return o.model.mscale_all_dim; }));
  t.push_back(number<int>("--mtp-num-layers", "N", M,
                          "multi-token prediction (DeepSeek-V3): N depths after the main model, "
                          "depth k predicting the token k+1 ahead (0: off)",
                          [](Options& o) -> int& { return o.model.mtp_num_layers; }));
  t.push_back(
      number<double>("--mtp-loss-scaling-factor", "X", M,
                     "multi-token prediction: weight of the depths' mean loss",
                     [](Options& o) -> double& { return o.model.mtp_loss_scaling_factor; }));
  add_noted(t, "an inference cache of MLA's latents; training computes the same without it",
            {{"--cache-mla-latents", ""}, {"--mla-down-proj-fusion", ""}});
}

}  // namespace omni::option_rows
