// Megatron's learning-rate group: the peak, the warm-up and the decay.
#include "config/option_rows.h"

namespace omni::option_rows {

void add_learning_rate_options(std::vector<OptionDef>& t) {
  const std::string L = "learning rate";
  t.push_back(number<double>("--lr", "X", L, "peak learning rate",
                             [](Options& o) -> double& { return o.lr; }));
  t.push_back(number<double>("--min-lr", "X", L, "learning rate at the end of the decay",
                             [](Options& o) -> double& { return o.min_lr; }));
  t.push_back(text("--lr-decay-style", "STYLE", L,
                   "constant, linear, cosine, inverse-square-root or WSD",
                   [](Options& o) -> std::string& { return o.lr_decay_style; }));
  t.push_back(number<int64_t>("--lr-warmup-iters", "N", L, "linear warm-up steps",
                              [](Options& o) -> int64_t& { return o.lr_warmup_iters; }));
  t.push_back(number<double>("--lr-warmup-fraction", "X", L,
                             "warm-up as a fraction of --lr-decay-iters",
                             [](Options& o) -> double& { return o.lr_warmup_fraction; }));
  t.push_back(number<int64_t>("--lr-decay-iters", "N", L,
                              "iteration where the decay ends (0: --train-iters)",
                              [](Options& o) -> int64_t& { return o.lr_decay_iters; }));
  t.push_back(number<int64_t>("--lr-wsd-decay-iters", "N", L, "WSD: length of the final decay",
                              [](Options& o) -> int64_t& { return o.lr_wsd_decay_iters; }));
  t.push_back(number<int64_t>("--lr-warmup-samples", "N", L,
                              "with --train-samples: linear warm-up over N samples",
                              [](Options& o) -> int64_t& { return o.lr_warmup_samples; }));
  t.push_back(number<int64_t>("--lr-decay-samples", "N", L,
                              "with --train-samples: sample where the decay ends (0: all)",
                              [](Options& o) -> int64_t& { return o.lr_decay_samples; }));
  t.push_back(number<int64_t>("--lr-wsd-decay-samples", "N", L,
                              "with --train-samples, WSD: samples of the final decay",
                              [](Options& o) -> int64_t& { return o.lr_wsd_decay_samples; }));
  t.push_back(text("--lr-wsd-decay-style", "STYLE", L,
                   "WSD decay: linear, cosine, exponential, minus_sqrt",
                   [](Options& o) -> std::string& { return o.lr_wsd_decay_style; }));
  t.push_back(number<double>("--lr-warmup-init", "X", L, "learning rate the warm-up starts from",
                             [](Options& o) -> double& { return o.lr_warmup_init; }));
  // The schedule here is always the command line's (Megatron's "override" behaviour).
  for (const char* flag : {"--override-opt-param-scheduler", "--override-opt_param-scheduler"})
    t.push_back(OptionDef{flag, "", L,
                          "the schedule comes from the command line, not a checkpoint (always)",
                          [](Options&, const std::string&) {}, nullptr});
  t.push_back(OptionDef{"--weight-decay-incr-style", "constant|linear|cosine", L,
                        "constant: --weight-decay throughout (the one built)",
                        [](Options&, const std::string& v) {
                          if (v == "linear" || v == "cosine")
                            throw NotBuiltError("--weight-decay-incr-style " + v,
                                                "weight-decay schedules");
                          if (v != "constant")
                            throw UsageError("--weight-decay-incr-style: '" + v +
                                             "' is not one of constant, linear, cosine");
                        },
                        nullptr});
}

}  // namespace omni::option_rows
