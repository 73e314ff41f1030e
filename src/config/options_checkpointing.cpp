// Megatron's checkpointing group, with its exit conditions (which save before stopping).
#include "config/option_rows.h"

namespace omni::option_rows {

void add_checkpointing_options(std::vector<OptionDef>& t) {
  const std::string C = "checkpoints";
  t.push_back(text("--save", "DIR", C,
                   "write checkpoints to DIR/iter_NNNNNNN (every --save-interval, and at the end)",
                   [](Options& o) -> std::string& { return o.save; }));
  t.push_back(number<int64_t>("--save-interval", "N", C, "checkpoint every N steps (0: at the end)",
                              [](Options& o) -> int64_t& { return o.save_interval; }));
  add_alias(t, "--persistent-save-interval", "--save-interval");
  t.push_back(text("--load", "DIR", C,
                   "resume from DIR's latest checkpoint (latest_checkpointed_iteration.txt)",
                   [](Options& o) -> std::string& { return o.load; }));
  t.push_back(toggle("--finetune", C,
                     "--load the model only: start at iteration 0 with a fresh optimizer",
                     [](Options& o) -> bool& { return o.finetune; }));
  t.push_back(toggle("--no-load-optim", C, "--load without the optimizer state",
                     [](Options& o) -> bool& { return o.no_load_optim; }));
  t.push_back(toggle("--no-save-optim", C, "--save the model without the optimizer state",
                     [](Options& o) -> bool& { return o.no_save_optim; }));
  t.push_back(toggle("--async-save", C,
                     "write checkpoints in the background: training goes on, and a save "
                     "becomes the latest once every rank's files are on disk",
                     [](Options& o) -> bool& { return o.async_save; }));
  t.push_back(toggle("--use-checkpoint-args", C,
                     "--load DIR's model options win over the command line's",
                     [](Options& o) -> bool& { return o.use_checkpoint_args; }));
  t.push_back(toggle("--exit-on-missing-checkpoint", C,
                     "stop with an error when --load DIR holds no checkpoint",
                     [](Options& o) -> bool& { return o.exit_on_missing_checkpoint; }));
  t.push_back(number<int64_t>("--exit-interval", "N", C,
                              "save and stop when the iteration is a multiple of N",
                              [](Options& o) -> int64_t& { return o.exit_interval; }));
  t.push_back(number<double>("--exit-duration-in-mins", "X", C,
                             "save and stop after the step that passes X minutes of training",
                             [](Options& o) -> double& { return o.exit_duration_in_mins; }));
  t.push_back(toggle("--exit-signal-handler", C,
                     "on --exit-signal or SIGINT, finish the step, save and stop",
                     [](Options& o) -> bool& { return o.exit_signal_handler; }));
  t.push_back(number<int>("--exit-signal", "N", C, "the signal --exit-signal-handler waits for",
                          [](Options& o) -> int& { return o.exit_signal; }));
}

}  // namespace omni::option_rows
