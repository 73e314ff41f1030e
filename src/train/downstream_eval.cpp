#include "train/downstream_eval.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "base/error.h"
#include "parallel/context_parallel.h"
#include "train/trainer.h"

namespace omni {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

std::string where(const MultipleChoiceTask& task, size_t example) {
  return "task " + task.name + " (" + task.path + "), example " + std::to_string(example + 1);
}

// sqrt(p (1 - p) / (n - 1)): the harness's mean_stderr of 0/1 outcomes.
double stderr_of(double p, int64_t n) {
  return n > 1 ? std::sqrt(p * (1 - p) / double(n - 1)) : 0.0;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

std::vector<ScoredSequence> task_sequences(const MultipleChoiceTask& task,
                                           const Tokenizer& tokenizer, int seq_length) {
  const std::optional<int32_t> prefix = tokenizer.bos() ? tokenizer.bos() : tokenizer.eod();
  std::vector<ScoredSequence> out;
  for (size_t i = 0; i < task.examples.size(); ++i) {
    const TaskExample& e = task.examples[i];
    size_t keep = e.context.size();
    while (keep > 0 && is_space(e.context[keep - 1])) --keep;
    const std::string context = e.context.substr(0, keep);
    for (const std::string& choice : e.choices) {
      const std::string continuation = e.context.substr(keep) + e.target_delimiter + choice;
      std::vector<int32_t> ids, tail;
      if (context.empty()) {
        OMNI_REQUIRE(prefix, where(task, i),
                     ": the context is empty and the tokenizer has no bos or eod token to "
                     "stand for it");
        ids = {*prefix};
        tail = tokenizer.encode(continuation);
      } else {
        ids = tokenizer.encode(context);
        const std::vector<int32_t> whole = tokenizer.encode(context + continuation);
        if (whole.size() > ids.size())
          tail.assign(whole.begin() + ptrdiff_t(ids.size()), whole.end());
      }
      OMNI_REQUIRE(!tail.empty(), where(task, i), ": the choice \"", choice,
                   "\" adds no tokens to the context");
      OMNI_REQUIRE(int(tail.size()) <= seq_length, where(task, i), ": the choice is ", tail.size(),
                   " tokens, more than --seq-length (", seq_length, ")");
      ids.insert(ids.end(), tail.begin(), tail.end());
      if (int(ids.size()) > seq_length + 1) ids.erase(ids.begin(), ids.end() - (seq_length + 1));
      out.push_back({std::move(ids), int(tail.size())});
    }
  }
  return out;
}

TaskScores score_task(const MultipleChoiceTask& task, const std::vector<double>& lls) {
  TaskScores s;
  s.task = task.name;
  s.examples = int64_t(task.examples.size());
  size_t k = 0;
  int64_t right = 0, right_norm = 0;
  for (const TaskExample& e : task.examples) {
    std::vector<double> ll(lls.begin() + ptrdiff_t(k),
                           lls.begin() + ptrdiff_t(k + e.choices.size()));
    k += e.choices.size();
    int best = 0, best_norm = 0;
    for (int c = 1; c < int(ll.size()); ++c) {
      const auto norm = [&](int j) {
        return ll[j] / double(std::max<size_t>(e.choices[j].size(), 1));
      };
      if (ll[c] > ll[best]) best = c;
      if (norm(c) > norm(best_norm)) best_norm = c;
    }
    right += best == e.label;
    right_norm += best_norm == e.label;
    s.log_likelihoods.push_back(std::move(ll));
    s.predicted.push_back(best);
    s.predicted_norm.push_back(best_norm);
  }
  OMNI_CHECK(k == lls.size(), "[downstream] ", lls.size(), " log-likelihoods for ", k, " choices");
  s.acc = double(right) / double(s.examples);
  s.acc_norm = double(right_norm) / double(s.examples);
  s.acc_stderr = stderr_of(s.acc, s.examples);
  s.acc_norm_stderr = stderr_of(s.acc_norm, s.examples);
  return s;
}

DownstreamEvaluation::DownstreamEvaluation(const Options& opts, const Tokenizer& tokenizer)
    : interval_(opts.eval_task_interval ? opts.eval_task_interval : opts.eval_interval),
      train_iters_(opts.train_iters),
      samples_path_(opts.eval_task_samples) {
  for (const TaskSpec& spec : parse_task_specs(opts.eval_task)) {
    tasks_.push_back(read_task_file(spec, opts.eval_task_limit));
    sequences_.push_back(task_sequences(tasks_.back(), tokenizer, opts.model.seq_length));
  }
}

DownstreamEvaluation::~DownstreamEvaluation() = default;

bool DownstreamEvaluation::due(int64_t iteration) const {
  return (interval_ > 0 && iteration % interval_ == 0) || iteration == train_iters_;
}

std::vector<TaskScores> DownstreamEvaluation::run(Trainer& trainer, MetricsSink& sink,
                                                  bool write_samples) {
  std::vector<TaskScores> all;
  if (write_samples && !samples_path_.empty() && !samples_.is_open()) {
    samples_.open(samples_path_, std::ios::out | std::ios::app);
    OMNI_REQUIRE(samples_, "--eval-task-samples: cannot write '", samples_path_, "'");
  }
  for (size_t t = 0; t < tasks_.size(); ++t) {
    TaskScores s = score_task(tasks_[t], trainer.log_likelihoods(sequences_[t]));
    TaskMetrics m;
    m.iteration = trainer.iteration(), m.consumed_samples = trainer.consumed_samples();
    m.task = s.task, m.examples = s.examples;
    m.acc = s.acc, m.acc_stderr = s.acc_stderr;
    m.acc_norm = s.acc_norm, m.acc_norm_stderr = s.acc_norm_stderr;
    sink.log_task(m);
    if (write_samples && samples_.is_open()) {
      for (size_t i = 0; i < s.log_likelihoods.size(); ++i) {
        samples_ << "{\"iteration\": " << m.iteration << ", \"task\": \"" << s.task
                 << "\", \"example\": " << i << ", \"label\": " << tasks_[t].examples[i].label
                 << ", \"log_likelihoods\": [";
        for (size_t c = 0; c < s.log_likelihoods[i].size(); ++c)
          samples_ << (c ? ", " : "") << number(s.log_likelihoods[i][c]);
        samples_ << "], \"pred\": " << s.predicted[i] << ", \"pred_norm\": " << s.predicted_norm[i]
                 << "}\n";
      }
      samples_.flush();
      OMNI_REQUIRE(samples_, "--eval-task-samples: writing '", samples_path_, "' failed");
    }
    all.push_back(std::move(s));
  }
  return all;
}

std::unique_ptr<DownstreamEvaluation> make_downstream_evaluation(const Options& opts,
                                                                 const Tokenizer* tokenizer) {
  if (opts.eval_task.empty()) return nullptr;
  if (tokenizer) return std::make_unique<DownstreamEvaluation>(opts, *tokenizer);
  OMNI_REQUIRE(opts.model.vocab_size == 256,
               "--eval-task needs the run's tokenizer "
               "(--tokenizer-type) to read the tasks' text; this model's vocabulary is ",
               opts.model.vocab_size);
  TokenizerOptions bytes;
  bytes.type = "ByteLevelTokenizer";
  return std::make_unique<DownstreamEvaluation>(opts, *make_tokenizer(bytes));
}

// Each choice is one row of a micro-batch: its tokens, the next token as the label, and a
// loss mask over the continuation, so the forward computes only the continuation's
// per-token losses. Micro-batch k goes to data-parallel rank k % dp; each rank runs its
// share through its pipeline as validation does (context-parallel ranks each take their
// part of the sequence). The last stage's first tensor-parallel rank adds its tokens'
// losses; one sum over the world gives every rank every log-likelihood.
std::vector<double> Trainer::log_likelihoods(const std::vector<ScoredSequence>& sequences) {
  const int mb = opts_.micro_batch_size, seq = opts_.model.seq_length;
  const int dp = grid_->dp_size(), cp = grid_->cp_size();
  const int64_t total = int64_t(sequences.size());
  const int64_t microbatches = (total + mb - 1) / mb;
  std::vector<int64_t> mine;
  for (int64_t k = grid_->dp_rank(); k < microbatches; k += dp) mine.push_back(k);
  struct Rows {
    std::vector<int32_t> tokens, labels;
    std::vector<float> mask, losses;
    MicroBatch full, used;
    ContextParallelBatch local;
  };
  constexpr int kPerRun = 16;  // micro-batches per pipeline run (their inputs are held)
  std::vector<Rows> rows(kPerRun);
  std::vector<double> ll(sequences.size(), 0.0);
  const bool adds = grid_->is_last_stage() && grid_->tp_rank() == 0;
  const size_t n = size_t(mb) * seq;
  for (size_t first = 0; first < mine.size(); first += kPerRun) {
    const int count = int(std::min<size_t>(kPerRun, mine.size() - first));
    for (int i = 0; i < count; ++i) {
      Rows& r = rows[i];
      r.tokens.assign(n, 0), r.labels.assign(n, 0), r.mask.assign(n, 0.0f);
      for (int b = 0; b < mb; ++b) {
        const int64_t s = mine[first + i] * mb + b;
        if (s >= total) break;
        const ScoredSequence& q = sequences[size_t(s)];
        const int L = int(q.tokens.size());
        for (int p = 0; p + 1 < L; ++p) {
          r.tokens[size_t(b) * seq + p] = q.tokens[p];
          r.labels[size_t(b) * seq + p] = q.tokens[p + 1];
          r.mask[size_t(b) * seq + p] = p + 1 >= L - q.continuation ? 1.0f : 0.0f;
        }
      }
      r.full = {r.tokens.data(), r.labels.data(), r.mask.data(), mb, seq};
      if (cp > 1) r.local.slice(r.full, cp, grid_->cp_rank());
      r.used = cp > 1 ? r.local.batch() : r.full;
      r.losses.assign(size_t(r.used.batch) * r.used.seq, 0.0f);
      r.used.token_losses = r.losses.data();
    }
    run_pipeline(
        count, [&](int m) -> const MicroBatch& { return rows[m].used; }, false, 0.0);
    if (!adds) continue;
    for (int i = 0; i < count; ++i) {
      const Rows& r = rows[i];
      for (size_t j = 0; j < r.losses.size(); ++j) {
        const int64_t s = mine[first + i] * mb + int64_t(j) / r.used.seq;
        if (s < total) ll[size_t(s)] -= double(r.losses[j]);
      }
    }
  }
  grid_->world().all_reduce(ll.data(), ll.size());
  return ll;
}

}  // namespace omni
