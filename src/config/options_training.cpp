// Megatron's training and regularization groups: batches, length of training, the
// optimizer and activation recompute.
#include "config/option_rows.h"

namespace omni::option_rows {

void add_training_options(std::vector<OptionDef>& t) {
  const std::string T = "training", O = "optimizer";
  t.push_back(number<int>("--micro-batch-size", "N", T, "samples per forward/backward",
                          [](Options& o) -> int& { return o.micro_batch_size; }));
  t.push_back(number<int>(
      "--global-batch-size", "N", T,
      "samples per optimizer step (a multiple of the micro batch: gradient accumulation)",
      [](Options& o) -> int& { return o.global_batch_size; }));
  t.push_back(number<int64_t>("--train-iters", "N", T, "optimizer steps",
                              [](Options& o) -> int64_t& { return o.train_iters; }));
  t.push_back(number<int64_t>("--seed", "N", T, "seed of initialisation and data order",
                              [](Options& o) -> int64_t& { return o.seed; }));
  t.push_back(text("--optimizer", "NAME", O, "adamw, adam or sgd",
                   [](Options& o) -> std::string& { return o.optimizer; }));
  t.push_back(number<double>("--weight-decay", "X", O,
                             "decoupled weight decay (not on biases and norms)",
                             [](Options& o) -> double& { return o.optim.weight_decay; }));
  t.push_back(number<double>("--adam-beta1", "X", O, "Adam beta1",
                             [](Options& o) -> double& { return o.optim.adam_beta1; }));
  t.push_back(number<double>("--adam-beta2", "X", O, "Adam beta2",
                             [](Options& o) -> double& { return o.optim.adam_beta2; }));
  t.push_back(number<double>("--adam-eps", "X", O, "Adam epsilon",
                             [](Options& o) -> double& { return o.optim.adam_eps; }));
  t.push_back(number<double>("--sgd-momentum", "X", O, "SGD momentum",
                             [](Options& o) -> double& { return o.optim.sgd_momentum; }));
  t.push_back(number<double>("--clip-grad", "X", O, "clip the global gradient norm to X (0: off)",
                             [](Options& o) -> double& { return o.optim.clip_grad; }));

  const std::string RC = "activation recompute";
  t.push_back(OptionDef{"--checkpoint-activations", "", RC,
                        "old name of --recompute-granularity full --recompute-method uniform",
                        [](Options& o, const std::string&) {
                          o.recompute_granularity = "full", o.recompute_method = "uniform";
                          o.recompute_num_layers = 1;
                        },
                        [](const Options&) { return std::string(); }});
  t.push_back(
      OptionDef{"--recompute-activations", "", RC,
                "recompute the attention probabilities (--recompute-granularity selective)",
                [](Options& o, const std::string&) { o.recompute_granularity = "selective"; },
                [](const Options&) { return std::string(); }});
  t.push_back(text("--recompute-granularity", "full|selective", RC,
                   "full: keep only layer inputs; selective: no attention probabilities",
                   [](Options& o) -> std::string& { return o.recompute_granularity; }));
  t.push_back(text("--recompute-method", "uniform|block", RC,
                   "with full: every layer (uniform 1), or the first N of each stage (block N)",
                   [](Options& o) -> std::string& { return o.recompute_method; }));
  t.push_back(number<int>("--recompute-num-layers", "N", RC, "N for --recompute-method",
                          [](Options& o) -> int& { return o.recompute_num_layers; }));
}

}  // namespace omni::option_rows
