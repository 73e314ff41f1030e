// Downstream evaluation: multiple-choice tasks scored during training (--eval-task) and by
// `omnitron evaluate --task` (train/downstream_eval.h, data/datasets/task_file.h).
#include "config/option_rows.h"

namespace omni::option_rows {

void add_evaluation_options(std::vector<OptionDef>& t) {
  const std::string G = "downstream evaluation (train, evaluate)";
  t.push_back(text("--eval-task", "[NAME=]FILE[,...]", G,
                   "multiple-choice tasks (jsonl: {context, choices, label}, HellaSwag's or "
                   "ARC's rows) scored by log-likelihood: acc and acc_norm",
                   [](Options& o) -> std::string& { return o.eval_task; }));
  add_alias(t, "--task", "--eval-task");
  t.push_back(number<int>("--eval-task-interval", "N", G,
                          "score the tasks every N iterations, at iteration 0 and at the end "
                          "(0: every --eval-interval)",
                          [](Options& o) -> int& { return o.eval_task_interval; }));
  t.push_back(number<int64_t>("--eval-task-limit", "N", G,
                              "the first N examples of each task (0: all)",
                              [](Options& o) -> int64_t& { return o.eval_task_limit; }));
  t.push_back(text("--eval-task-samples", "FILE", G,
                   "append each example's choice log-likelihoods here (jsonl)",
                   [](Options& o) -> std::string& { return o.eval_task_samples; }));
}

}  // namespace omni::option_rows
