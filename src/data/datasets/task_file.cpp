#include "data/datasets/task_file.h"

#include <cmath>
#include <filesystem>

#include "base/error.h"
#include "base/json.h"
#include "data/jsonl.h"

namespace omni {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

std::string strip(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, from.size(), from) == 0) {
      out += to;
      i += from.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

// Python's str.capitalize() on ASCII letters: the first upper case, the rest lower case.
std::string capitalize(std::string_view s) {
  std::string out(s);
  for (size_t i = 0; i < out.size(); ++i) {
    const char c = out[i];
    if (i == 0 && c >= 'a' && c <= 'z') out[i] = char(c - 'a' + 'A');
    if (i > 0 && c >= 'A' && c <= 'Z') out[i] = char(c - 'A' + 'a');
  }
  return out;
}

// One line's fields, with the file and line in every error.
class Row {
 public:
  Row(const json::Value& v, std::string where) : v_(v), where_(std::move(where)) {}
  const std::string& where() const { return where_; }
  bool has(std::string_view key) const { return v_.find(key) != nullptr; }
  const json::Value& get(const json::Value& v, std::string_view key) const {
    const json::Value* m = v.find(key);
    OMNI_REQUIRE(m, where_, ": no \"", key, "\" field");
    return *m;
  }
  const std::string& text(const json::Value& v, std::string_view key) const {
    const json::Value& m = get(v, key);
    OMNI_REQUIRE(m.is_string(), where_, ": \"", key, "\" must be a string");
    return m.str();
  }
  std::vector<std::string> texts(const json::Value& v, std::string_view key) const {
    const json::Value& m = get(v, key);
    OMNI_REQUIRE(m.is_array(), where_, ": \"", key, "\" must be a list of strings");
    std::vector<std::string> out;
    for (const json::Value& e : m.arr()) {
      OMNI_REQUIRE(e.is_string(), where_, ": \"", key, "\" must be a list of strings");
      out.push_back(e.str());
    }
    return out;
  }
  // An index: a whole number, or a string of digits (Hugging Face's HellaSwag has "3").
  int index(const json::Value& v, std::string_view key) const {
    const json::Value& m = get(v, key);
    if (m.is_number() && m.num() >= 0 && m.num() == std::floor(m.num())) return int(m.num());
    if (m.is_string() && !m.str().empty() &&
        m.str().find_first_not_of("0123456789") == std::string::npos && m.str().size() < 9)
      return std::stoi(m.str());
    throw UsageError(where_ + ": \"" + std::string(key) +
                     "\" must be the right choice's index (0, 1, ...)" +
                     (m.is_string() && m.str().empty() ? "; this row has none (an unlabelled "
                                                         "test split?)"
                                                       : ""));
  }
  const json::Value& root() const { return v_; }

 private:
  const json::Value& v_;
  std::string where_;
};

TaskExample hellaswag_example(const Row& r) {
  const json::Value& v = r.root();
  TaskExample e;
  const std::string ctx = r.text(v, "ctx_a") + " " + capitalize(r.text(v, "ctx_b"));
  e.context = hellaswag_preprocess(r.text(v, "activity_label") + ": " + ctx);
  for (const std::string& ending : r.texts(v, "endings"))
    e.choices.push_back(hellaswag_preprocess(ending));
  e.label = r.index(v, "label");
  return e;
}

TaskExample arc_example(const Row& r) {
  const json::Value& v = r.root();
  const json::Value& question = r.get(v, "question");
  std::string stem;
  std::vector<std::string> texts, labels;
  if (question.is_object()) {  // ARC-V1: {"stem", "choices": [{"text", "label"}, ...]}
    stem = r.text(question, "stem");
    const json::Value& choices = r.get(question, "choices");
    OMNI_REQUIRE(choices.is_array(), r.where(), ": \"question.choices\" must be a list");
    for (const json::Value& c : choices.arr()) {
      texts.push_back(r.text(c, "text"));
      labels.push_back(r.text(c, "label"));
    }
  } else {  // Hugging Face: "question" and "choices": {"text": [...], "label": [...]}
    stem = r.text(v, "question");
    const json::Value& choices = r.get(v, "choices");
    texts = r.texts(choices, "text");
    labels = r.texts(choices, "label");
  }
  OMNI_REQUIRE(texts.size() == labels.size(), r.where(), ": ", texts.size(), " choices but ",
               labels.size(), " labels");
  TaskExample e;
  e.context = "Question: " + stem + "\nAnswer:";
  e.choices = texts;
  const std::string& key = r.text(v, "answerKey");
  e.label = -1;
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] == key) e.label = int(i);
  OMNI_REQUIRE(e.label >= 0, r.where(), ": answerKey \"", key, "\" is none of the choices' labels");
  return e;
}

TaskExample plain_example(const Row& r) {
  const json::Value& v = r.root();
  TaskExample e;
  e.context = r.text(v, "context");
  e.choices = r.texts(v, "choices");
  e.label = r.index(v, "label");
  if (r.has("target_delimiter")) e.target_delimiter = r.text(v, "target_delimiter");
  return e;
}

}  // namespace

std::string hellaswag_preprocess(std::string_view text) {
  std::string s = replace_all(strip(text), " [title]", ". ");
  std::string out;  // re.sub("\\[.*?\\]", "", s): '.' stops at a newline
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '[') {
      size_t j = i + 1;
      while (j < s.size() && s[j] != ']' && s[j] != '\n') ++j;
      if (j < s.size() && s[j] == ']') {
        i = j;
        continue;
      }
    }
    out += s[i];
  }
  return replace_all(out, "  ", " ");
}

std::vector<TaskSpec> parse_task_specs(const std::string& value) {
  std::vector<TaskSpec> specs;
  size_t start = 0;
  while (start <= value.size()) {
    const size_t comma = std::min(value.find(',', start), value.size());
    const std::string item = value.substr(start, comma - start);
    start = comma + 1;
    if (item.empty()) continue;
    TaskSpec s;
    const size_t eq = item.find('=');
    if (eq != std::string::npos) {
      s.name = item.substr(0, eq);
      s.path = item.substr(eq + 1);
      OMNI_REQUIRE(!s.name.empty() && !s.path.empty(), "--eval-task: '", item,
                   "' is neither FILE nor NAME=FILE");
    } else {
      s.path = item;
      s.name = std::filesystem::path(item).stem().string();
    }
    OMNI_REQUIRE(!s.name.empty() && s.name.find_first_not_of("abcdefghijklmnopqrstuvwxyz"
                                                             "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                             "0123456789_.-") == std::string::npos,
                 "--eval-task: the task name '", s.name,
                 "' may hold only letters, digits, '_', '.' and '-' (name it: NAME=FILE)");
    for (const TaskSpec& other : specs)
      OMNI_REQUIRE(other.name != s.name, "--eval-task: two tasks are named '", s.name,
                   "' (name them: NAME=FILE)");
    specs.push_back(s);
  }
  OMNI_REQUIRE(!specs.empty(), "--eval-task: no task file in '", value, "'");
  return specs;
}

MultipleChoiceTask read_task_file(const TaskSpec& spec, int64_t limit) {
  OMNI_REQUIRE(std::filesystem::is_regular_file(spec.path), "--eval-task: '", spec.path,
               "' is not a file");
  MultipleChoiceTask task;
  task.name = spec.name, task.path = spec.path;
  LineReader lines(spec.path);
  for (std::string_view line; lines.next(line);) {
    if (strip(line).empty()) continue;
    if (limit > 0 && int64_t(task.examples.size()) >= limit) break;
    const std::string where = spec.path + ":" + std::to_string(lines.line_number());
    const json::Value v = json::parse(line, where);
    OMNI_REQUIRE(v.is_object(), where, ": expected a JSON object");
    const Row row(v, where);
    TaskExample e;
    if (row.has("ctx_a") && row.has("endings"))
      e = hellaswag_example(row);
    else if (row.has("answerKey"))
      e = arc_example(row);
    else if (row.has("context") && row.has("choices"))
      e = plain_example(row);
    else
      throw UsageError(where +
                       ": not a task example: expected {\"context\", \"choices\", \"label\"}, "
                       "HellaSwag's {\"ctx_a\", \"ctx_b\", \"endings\", \"label\"} or ARC's "
                       "{\"question\", \"choices\", \"answerKey\"}");
    OMNI_REQUIRE(e.choices.size() >= 2, where, ": ", e.choices.size(),
                 " choice(s); a multiple-choice example needs at least two");
    OMNI_REQUIRE(e.label >= 0 && e.label < int(e.choices.size()), where, ": label ", e.label,
                 " is outside the ", e.choices.size(), " choices");
    task.examples.push_back(std::move(e));
  }
  OMNI_REQUIRE(!task.examples.empty(), "--eval-task: '", spec.path, "' holds no examples");
  return task;
}

}  // namespace omni
