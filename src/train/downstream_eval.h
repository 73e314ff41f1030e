// Downstream evaluation: multiple-choice tasks (data/datasets/task_file.h) scored by the model's
// log-likelihood of each choice given its context, as lm-evaluation-harness scores its
// multiple_choice tasks:
//   acc       the fraction of examples whose right choice has the largest summed
//             log-likelihood of its tokens;
//   acc_norm  the same with each log-likelihood divided by the choice's length in bytes
//             (lm-evaluation-harness divides by len(choice), the characters of a Python
//             str: the same for ASCII text);
// each with the standard error of the mean, sqrt(p (1 - p) / (n - 1)), as the harness
// reports. Ties go to the first choice (numpy's argmax).
//
// A choice's tokens are those of lm-evaluation-harness's _encode_pair: the context's
// trailing whitespace moves to the front of the continuation (target_delimiter + choice),
// the continuation's tokens are those of tokenize(context + continuation) after the
// context's own; an empty context is the tokenizer's bos (else eod) token. A sequence
// longer than --seq-length + 1 loses its first tokens.
//
// The log-likelihoods come from the trainer's own forward, the one validation runs
// (Trainer::log_likelihoods), so every parallel layout gives the same scores.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/options.h"
#include "data/datasets/task_file.h"
#include "data/tokenizers/tokenizer.h"
#include "train/metrics.h"

namespace omni {

class Trainer;

// One choice to score: its context's tokens then its continuation's; the log-likelihood
// is that of the last `continuation` tokens, each given every token before it.
struct ScoredSequence {
  std::vector<int32_t> tokens;
  int continuation = 0;
};

// Every choice of every example, in order. Throws UsageError naming the task and example
// when a continuation is empty or longer than seq_length tokens.
std::vector<ScoredSequence> task_sequences(const MultipleChoiceTask& task,
                                           const Tokenizer& tokenizer, int seq_length);

struct TaskScores {
  std::string task;
  int64_t examples = 0;
  double acc = 0, acc_stderr = 0, acc_norm = 0, acc_norm_stderr = 0;
  // [example][choice] log-likelihoods; the chosen indices.
  std::vector<std::vector<double>> log_likelihoods;
  std::vector<int> predicted, predicted_norm;
};

// `log_likelihoods` holds one value per task_sequences() entry.
TaskScores score_task(const MultipleChoiceTask& task, const std::vector<double>& log_likelihoods);

class DownstreamEvaluation {
 public:
  // Reads and tokenises opts.eval_task's tasks (opts.eval_task_limit examples each).
  DownstreamEvaluation(const Options& opts, const Tokenizer& tokenizer);
  ~DownstreamEvaluation();
  // Every --eval-task-interval iterations (0: every --eval-interval) and at --train-iters.
  bool due(int64_t iteration) const;
  // Scores every task with the trainer's model (collective: every rank calls it), reports
  // each to `sink` and appends the examples to --eval-task-samples (when `write_samples`).
  std::vector<TaskScores> run(Trainer& trainer, MetricsSink& sink, bool write_samples = true);
  const std::vector<MultipleChoiceTask>& tasks() const { return tasks_; }

 private:
  std::vector<MultipleChoiceTask> tasks_;
  std::vector<std::vector<ScoredSequence>> sequences_;  // per task
  int interval_ = 0;
  int64_t train_iters_ = 0;
  std::string samples_path_;
  std::ofstream samples_;
};

// --eval-task's evaluation with the run's tokenizer; a run without one (--train-text)
// reads tasks as bytes, which its byte-level model (vocabulary 256) reads. Null without
// --eval-task.
std::unique_ptr<DownstreamEvaluation> make_downstream_evaluation(const Options& opts,
                                                                 const Tokenizer* tokenizer);

}  // namespace omni
