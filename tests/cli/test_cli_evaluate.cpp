// omnitron evaluate and train --eval-task end to end: the scores of Hugging Face models
// loaded with --load against a plain-PyTorch scoring of the same tasks
// (tests/fixtures/score_hf_tasks.py -> tasks/hf_tasks.reference.json), and a tiny model
// that learns its task during training.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/json.h"
#include "cli/process.h"

namespace {

namespace fs = std::filesystem;

const std::string kFixtures = std::string(OMNITRON_FIXTURE_DIR) + "/";

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "omnitron_cli_evaluate_" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::vector<omni::json::Value> read_jsonl(const std::string& path) {
  std::vector<omni::json::Value> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(omni::json::parse(line, path));
  return out;
}

// The reference for `model` from hf_tasks.reference.json.
omni::json::Value reference(const std::string& model) {
  const omni::json::Value all =
      omni::json::parse(read_text(kFixtures + "tasks/hf_tasks.reference.json"), "reference");
  for (const omni::json::Value& r : all.arr())
    if (r.find("model")->str() == model) return r;
  ADD_FAILURE() << "no reference for " << model;
  return {};
}

// evaluate's samples against the PyTorch reference: every log-likelihood within 1e-5, the
// same choices picked, and the printed acc and acc_norm.
void expect_matches_pytorch(const std::string& model, const std::string& task,
                            const std::string& flags) {
  const std::string dir = fresh_dir(model);
  const std::string samples = dir + "/samples.jsonl", metrics = dir + "/metrics.jsonl";
  const ProcessResult r =
      run_omnitron("evaluate --load " + kFixtures + "hf/" + model + " --task " + kFixtures +
                   "tasks/" + task + " " + flags + " --micro-batch-size 2 --eval-task-samples " +
                   samples + " --metrics-file " + metrics);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const omni::json::Value ref = reference(model);
  const omni::json::Array& examples = ref.find("examples")->arr();
  const std::vector<omni::json::Value> got = read_jsonl(samples);
  ASSERT_EQ(got.size(), examples.size()) << r.output;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const omni::json::Array& want = examples[i].find("log_likelihoods")->arr();
    const omni::json::Array& have = got[i].find("log_likelihoods")->arr();
    ASSERT_EQ(have.size(), want.size()) << "example " << i;
    for (size_t c = 0; c < want.size(); ++c) {
      worst = std::max(worst, std::abs(have[c].num() - want[c].num()));
      EXPECT_NEAR(have[c].num(), want[c].num(), 1e-5)
          << model << " example " << i << " choice " << c;
    }
    EXPECT_EQ(got[i].find("pred")->num(), examples[i].find("pred")->num()) << "example " << i;
    EXPECT_EQ(got[i].find("pred_norm")->num(), examples[i].find("pred_norm")->num())
        << "example " << i;
    EXPECT_EQ(got[i].find("label")->num(), examples[i].find("label")->num()) << "example " << i;
  }
  std::printf("%s on %s: largest log-likelihood difference from PyTorch %.3g\n", model.c_str(),
              task.c_str(), worst);
  const std::vector<omni::json::Value> m = read_jsonl(metrics);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].find("task")->str(), fs::path(task).stem().string());
  EXPECT_DOUBLE_EQ(m[0].find("acc")->num(), ref.find("acc")->num());
  EXPECT_DOUBLE_EQ(m[0].find("acc_norm")->num(), ref.find("acc_norm")->num());
  EXPECT_EQ(m[0].find("examples")->num(), double(examples.size()));
  EXPECT_NE(r.output.find("downstream task " + fs::path(task).stem().string() + " at iteration 0"),
            std::string::npos)
      << r.output;
}

TEST(CliEvaluate, Gpt2FromHuggingFaceScoresAsPyTorchDoes) {
  // Our rows, HellaSwag's and ARC's (both layouts), bytes as tokens, contexts cut to the
  // model's 16 positions.
  expect_matches_pytorch("gpt2_tiny", "bytes_tiny.jsonl", "--tokenizer-type ByteLevelTokenizer");
}

TEST(CliEvaluate, LlamaFromHuggingFaceScoresAsPyTorchDoes) {
  // Token ids as text (NullTokenizer), an empty context (the eod token stands for it).
  expect_matches_pytorch("llama_tiny", "ids_tiny.jsonl",
                         "--tokenizer-type NullTokenizer --vocab-size 60");
}

TEST(CliEvaluate, ErrorsNameTheFlagOrTheFile) {
  const ProcessResult none = run_omnitron("evaluate --load " + kFixtures + "hf/gpt2_tiny");
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_NE(none.output.find("evaluate needs --task FILE"), std::string::npos) << none.output;
  const ProcessResult missing =
      run_omnitron("evaluate --load " + kFixtures + "hf/gpt2_tiny --task /nonexistent/t.jsonl");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("'/nonexistent/t.jsonl' is not a file"), std::string::npos)
      << missing.output;
  // Continuations longer than the model's 16 positions.
  const std::string dir = fresh_dir("errors");
  std::ofstream(dir + "/long.jsonl")
      << "{\"context\": \"a\", \"choices\": [\"bbbbbbbbbbbbbbbbbbbbbbbb\", \"c\"], \"label\": 1}\n";
  const ProcessResult long_choice = run_omnitron("evaluate --load " + kFixtures +
                                                 "hf/gpt2_tiny --tokenizer-type "
                                                 "ByteLevelTokenizer --task " +
                                                 dir + "/long.jsonl");
  EXPECT_EQ(long_choice.exit_code, 2) << long_choice.output;
  EXPECT_NE(long_choice.output.find("task long (" + dir +
                                    "/long.jsonl), example 1: the choice is 25 tokens, more "
                                    "than --seq-length (16)"),
            std::string::npos)
      << long_choice.output;
}

// A byte-level model trained on a text of a few repeated sentences: at iteration 0 it picks
// among the endings at chance, after training it knows them. The scores reach the console,
// the metrics file and TensorBoard.
TEST(CliEvaluate, TrainingScoresTheTaskAtIterationZeroAndAsItLearns) {
  const std::string dir = fresh_dir("train");
  const std::vector<std::pair<std::string, std::string>> sentences = {
      {"the cat sat on", "the mat."},  {"the dog ran to", "the log."},
      {"a bird sang in", "the tree."}, {"the fish swam in", "the sea."},
      {"a frog sat on", "a stone."},   {"the cow ate the", "green grass."}};
  {
    std::ofstream text(dir + "/corpus.txt");
    for (int i = 0; i < 400; ++i) {
      const auto& s = sentences[(i * 7) % sentences.size()];
      text << s.first << " " << s.second << "\n";
    }
    std::ofstream task(dir + "/endings.jsonl");
    for (size_t i = 0; i < sentences.size(); ++i) {
      task << "{\"context\": \"" << sentences[i].first << "\", \"choices\": [";
      for (size_t c = 0; c < 3; ++c)
        task << (c ? ", " : "") << "\"" << sentences[(i + c) % sentences.size()].second << "\"";
      task << "], \"label\": 0}\n";
    }
  }
  const ProcessResult r = run_omnitron(
      "train --train-text " + dir +
      "/corpus.txt --num-layers 2 --hidden-size 64 "
      "--num-attention-heads 4 --seq-length 32 --micro-batch-size 8 --train-iters 200 --lr 1e-2 "
      "--lr-warmup-iters 10 --log-interval 100 --eval-interval 100 --eval-iters 1 "
      "--max-new-tokens 0 --no-progress --position-embedding-type rope --seed 3 "
      "--eval-task ends=" +
      dir + "/endings.jsonl --eval-task-interval 100 --metrics-file " + dir +
      "/metrics.jsonl --tensorboard-dir " + dir + "/tb");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::pair<double, double>> acc;  // (iteration, acc)
  for (const omni::json::Value& v : read_jsonl(dir + "/metrics.jsonl"))
    if (v.find("task")) {
      EXPECT_EQ(v.find("task")->str(), "ends");
      acc.emplace_back(v.find("iteration")->num(), v.find("acc")->num());
    }
  ASSERT_EQ(acc.size(), 3u) << r.output;
  EXPECT_EQ(acc[0].first, 0);
  EXPECT_EQ(acc[1].first, 100);
  EXPECT_EQ(acc[2].first, 200);
  EXPECT_LE(acc[0].second, 0.67) << r.output;  // 6 examples of 3 choices: chance is 1/3
  EXPECT_DOUBLE_EQ(acc[2].second, 1.0) << r.output;
  EXPECT_NE(r.output.find("downstream task ends at iteration 200 | examples: 6 | acc: 1.0000"),
            std::string::npos)
      << r.output;
  bool tensorboard = false;
  for (const fs::directory_entry& e : fs::directory_iterator(dir + "/tb"))
    tensorboard =
        tensorboard || read_text(e.path().string()).find("ends acc_norm") != std::string::npos;
  EXPECT_TRUE(tensorboard) << "no \"ends acc_norm\" scalar in the event file";
}

}  // namespace
