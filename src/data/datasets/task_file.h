// Multiple-choice tasks for downstream evaluation (train --eval-task, omnitron evaluate),
// read from JSON lines in one of three layouts, told apart line by line:
//   ours       {"context": "...", "choices": ["...", ...], "label": 0}, optionally with
//              "target_delimiter" (default " ", what goes between context and choice)
//   HellaSwag  the published hellaswag_{train,val}.jsonl (rowanz/hellaswag) or Hugging
//              Face's rows: activity_label, ctx_a, ctx_b, endings, label; turned into a
//              query and choices as lm-evaluation-harness's hellaswag task does
//              ("{activity_label}: {ctx_a} {ctx_b.capitalize()}", both through its
//              preprocess(): strip, " [title]" -> ". ", "[...]" removed, "  " -> " ")
//   ARC        Hugging Face's allenai/ai2_arc rows {question, choices: {text, label},
//              answerKey} or the original ARC-V1 files {question: {stem, choices: [{text,
//              label}]}, answerKey}; "Question: {question}\nAnswer:" with the choices'
//              texts, as lm-evaluation-harness's arc_easy/arc_challenge.
// Each choice is scored as the continuation target_delimiter + choice of the context.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace omni {

struct TaskExample {
  std::string context;
  std::vector<std::string> choices;
  int label = 0;  // index of the right choice
  std::string target_delimiter = " ";
};

struct MultipleChoiceTask {
  std::string name;  // in logs and metrics
  std::string path;
  std::vector<TaskExample> examples;
};

// --eval-task's value: FILE or NAME=FILE, several separated by commas. A task without a
// name is named by its file's stem (hellaswag_val.jsonl: "hellaswag_val"). Names hold
// letters, digits, '_', '.' and '-' only (they become metric names).
struct TaskSpec {
  std::string name, path;
};
std::vector<TaskSpec> parse_task_specs(const std::string& value);

// Reads every example of `spec.path` (the first `limit` when limit > 0). A line in no known
// layout, a label outside the choices or an example with fewer than two choices is a
// UsageError naming the file and line.
MultipleChoiceTask read_task_file(const TaskSpec& spec, int64_t limit = 0);

// lm-evaluation-harness's HellaSwag preprocess() (tasks/hellaswag/utils.py).
std::string hellaswag_preprocess(std::string_view text);

}  // namespace omni
