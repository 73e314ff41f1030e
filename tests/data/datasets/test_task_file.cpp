// Multiple-choice task files (data/datasets/task_file.h) and their scoring
// (train/downstream_eval.h), against lm-evaluation-harness's formatting of HellaSwag and ARC and
// its acc/acc_norm.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "data/datasets/task_file.h"
#include "data/tokenizers/tokenizer.h"
#include "train/downstream_eval.h"

namespace omni {
namespace {

std::string write_task(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "omnitron_task_" + name + ".jsonl";
  std::ofstream(path) << text;
  return path;
}

MultipleChoiceTask read(const std::string& name, const std::string& text) {
  return read_task_file({name, write_task(name, text)});
}

std::string error_of(const std::string& name, const std::string& text) {
  try {
    read(name, text);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TaskFile, ReadsOurLayoutWithItsDelimiter) {
  const MultipleChoiceTask t =
      read("plain",
           "{\"context\": \"a b\", \"choices\": [\"c\", \"d\"], \"label\": 1}\n\n"
           "{\"context\": \"x\", \"choices\": [\"y\", \"z\"], \"label\": \"0\", "
           "\"target_delimiter\": \"\"}\n");
  ASSERT_EQ(t.examples.size(), 2u);
  EXPECT_EQ(t.name, "plain");
  EXPECT_EQ(t.examples[0].context, "a b");
  EXPECT_EQ(t.examples[0].choices, (std::vector<std::string>{"c", "d"}));
  EXPECT_EQ(t.examples[0].label, 1);
  EXPECT_EQ(t.examples[0].target_delimiter, " ");
  EXPECT_EQ(t.examples[1].label, 0);
  EXPECT_EQ(t.examples[1].target_delimiter, "");
}

// lm-evaluation-harness's hellaswag/utils.py on a published validation row.
TEST(TaskFile, ReadsHellaSwagAsTheHarnessFormatsIt) {
  const MultipleChoiceTask t = read(
      "hellaswag",
      R"({"ind": 24, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he", "ctx": "A man is sitting on a roof. he", "split": "val", "split_type": "indomain", "label": 3, "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.", "is holding a rubik's cube.", "starts pulling up roofing on a roof."], "source_id": "activitynet~v_-JhWjGDPHMY"})"
      "\n");
  ASSERT_EQ(t.examples.size(), 1u);
  EXPECT_EQ(t.examples[0].context, "Roof shingle removal: A man is sitting on a roof. He");
  EXPECT_EQ(t.examples[0].choices[3], "starts pulling up roofing on a roof.");
  EXPECT_EQ(t.examples[0].label, 3);
  // Python gives the leading space too: the brackets go after strip().
  EXPECT_EQ(hellaswag_preprocess("  [header] How to X [title] Pick a  spot. [step] Go. "),
            " How to X. Pick a spot. Go.");
  EXPECT_EQ(hellaswag_preprocess("a [b\nc] d"), "a [b\nc] d");  // '.' stops at a newline
  // str.capitalize(): the first letter upper case, the rest lower case.
  const MultipleChoiceTask c = read(
      "hellaswag_cap",
      R"({"activity_label": "A", "ctx_a": "x.", "ctx_b": "tHE MAN", "endings": ["a", "b"], "label": "1"})"
      "\n");
  EXPECT_EQ(c.examples[0].context, "A: x. The man");
  EXPECT_EQ(c.examples[0].label, 1);
}

TEST(TaskFile, ReadsArcInBothPublishedLayouts) {
  const MultipleChoiceTask t = read(
      "arc",
      R"({"id": "1", "question": "Which is a gas?", "choices": {"text": ["ice", "steam"], "label": ["A", "B"]}, "answerKey": "B"})"
      "\n"
      R"({"id": "2", "question": {"stem": "Pick one.", "choices": [{"text": "x", "label": "1"}, {"text": "y", "label": "2"}, {"text": "z", "label": "3"}]}, "answerKey": "3"})"
      "\n");
  ASSERT_EQ(t.examples.size(), 2u);
  EXPECT_EQ(t.examples[0].context, "Question: Which is a gas?\nAnswer:");
  EXPECT_EQ(t.examples[0].choices, (std::vector<std::string>{"ice", "steam"}));
  EXPECT_EQ(t.examples[0].label, 1);
  EXPECT_EQ(t.examples[1].context, "Question: Pick one.\nAnswer:");
  EXPECT_EQ(t.examples[1].label, 2);
}

TEST(TaskFile, ErrorsNameTheFileLineAndWhatIsWrong) {
  EXPECT_NE(error_of("e1", "{\"context\": \"a\", \"choices\": [\"b\", \"c\"], \"label\": 2}\n")
                .find("omnitron_task_e1.jsonl:1: label 2 is outside the 2 choices"),
            std::string::npos);
  EXPECT_NE(error_of("e2", "\n{\"text\": \"a\"}\n").find(".jsonl:2: not a task example"),
            std::string::npos);
  EXPECT_NE(error_of("e3", "{\"context\": \"a\", \"choices\": [\"b\"], \"label\": 0}\n")
                .find("1 choice(s)"),
            std::string::npos);
  EXPECT_NE(
      error_of(
          "e4",
          R"({"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "E"})"
          "\n")
          .find("answerKey \"E\" is none of the choices' labels"),
      std::string::npos);
  EXPECT_NE(
      error_of(
          "e5",
          R"({"activity_label": "A", "ctx_a": "x", "ctx_b": "y", "endings": ["a", "b"], "label": ""})"
          "\n")
          .find("unlabelled"),
      std::string::npos);
  EXPECT_NE(error_of("e6", "").find("holds no examples"), std::string::npos);
}

TEST(TaskFile, TaskSpecsAreNamedByStemOrByName) {
  const std::vector<TaskSpec> s = parse_task_specs("dir/hellaswag_val.jsonl,kjv=/x/y.jsonl");
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].name, "hellaswag_val");
  EXPECT_EQ(s[0].path, "dir/hellaswag_val.jsonl");
  EXPECT_EQ(s[1].name, "kjv");
  EXPECT_EQ(s[1].path, "/x/y.jsonl");
  EXPECT_THROW(parse_task_specs("a/t.jsonl,b/t.jsonl"), UsageError);  // two named t
  EXPECT_THROW(parse_task_specs("my task=t.jsonl"), UsageError);
}

TEST(TaskScoring, SequencesAreTheHarnessEncodedPairs) {
  TokenizerOptions bytes;
  bytes.type = "ByteLevelTokenizer";
  const std::unique_ptr<Tokenizer> tok = make_tokenizer(bytes);
  MultipleChoiceTask t;
  t.name = "t";
  t.examples.push_back({"ab ", {"c", "dd"}, 0, " "});
  const std::vector<ScoredSequence> s = task_sequences(t, *tok, 4);
  ASSERT_EQ(s.size(), 2u);
  // The context's trailing space joins the continuation: "ab" + "  c".
  EXPECT_EQ(s[0].tokens, (std::vector<int32_t>{'a', 'b', ' ', ' ', 'c'}));
  EXPECT_EQ(s[0].continuation, 3);
  // "ab" + "  dd" is 6 tokens: the first one goes (at most --seq-length + 1 are kept).
  EXPECT_EQ(s[1].tokens, (std::vector<int32_t>{'b', ' ', ' ', 'd', 'd'}));
  EXPECT_EQ(s[1].continuation, 4);
  t.examples[0].choices[1] = "ddddd";
  EXPECT_THROW(task_sequences(t, *tok, 4), UsageError);  // a 7-token continuation
}

TEST(TaskScoring, AccAndAccNormAsTheHarnessCountsThem) {
  MultipleChoiceTask t;
  t.name = "t";
  t.examples.push_back({"c", {"a", "bbbb"}, 1, " "});
  t.examples.push_back({"c", {"x", "y", "z"}, 2, " "});
  // Example 1: "a" has the larger sum, "bbbb" the larger per-byte value.
  // Example 2: a tie between y and z goes to y (the first), as numpy's argmax.
  const TaskScores s = score_task(t, {-2.0, -4.0, -5.0, -1.0, -1.0});
  EXPECT_EQ(s.predicted, (std::vector<int>{0, 1}));
  EXPECT_EQ(s.predicted_norm, (std::vector<int>{1, 1}));
  EXPECT_DOUBLE_EQ(s.acc, 0.0);
  EXPECT_DOUBLE_EQ(s.acc_norm, 0.5);
  EXPECT_DOUBLE_EQ(s.acc_norm_stderr, std::sqrt(0.25 / 1.0));
}

}  // namespace
}  // namespace omni
