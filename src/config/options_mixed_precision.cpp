// Megatron's mixed-precision group: bf16/fp16 parameters and the fp16 loss scaler.
#include "config/option_rows.h"

namespace omni::option_rows {

void add_mixed_precision_options(std::vector<OptionDef>& t) {
  const std::string MP = "mixed precision";
  t.push_back(toggle("--bf16", MP, "bf16 parameters, fp32 master weights and optimizer states",
                     [](Options& o) -> bool& { return o.bf16; }));
  t.push_back(toggle("--fp16", MP, "fp16 parameters and gradients with a loss scaler",
                     [](Options& o) -> bool& { return o.fp16; }));
  t.push_back(number<double>("--loss-scale", "X", MP,
                             "a constant loss scale (0: dynamic with --fp16)",
                             [](Options& o) -> double& { return o.loss_scale.loss_scale; }));
  t.push_back(
      number<double>("--initial-loss-scale", "X", MP, "the dynamic scale's start (2^32)",
                     [](Options& o) -> double& { return o.loss_scale.initial_loss_scale; }));
  t.push_back(number<double>("--min-loss-scale", "X", MP, "the dynamic scale's floor",
                             [](Options& o) -> double& { return o.loss_scale.min_loss_scale; }));
  t.push_back(number<int64_t>(
      "--loss-scale-window", "N", MP, "clean steps before the dynamic scale doubles",
      [](Options& o) -> int64_t& { return o.loss_scale.loss_scale_window; }));
  t.push_back(number<int64_t>("--hysteresis", "N", MP, "overflows before the dynamic scale halves",
                              [](Options& o) -> int64_t& { return o.loss_scale.hysteresis; }));
}

}  // namespace omni::option_rows
