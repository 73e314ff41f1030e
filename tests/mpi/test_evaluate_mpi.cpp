// omnitron evaluate under mpirun: the tiny Hugging Face models scored on the fixture tasks
// in every layout give the one-rank run's log-likelihoods (within 1e-5) and choices.
#ifdef OMNITRON_MPI_CHECK

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "base/json.h"
#include "cli/process.h"
#include "mpirun.h"

namespace {

namespace fs = std::filesystem;

const std::string kFixtures = std::string(OMNITRON_FIXTURE_DIR) + "/";

struct Model {
  const char* name;
  const char* flags;  // model directory, task, tokenizer
};

const Model kGpt2{"gpt2",
                  "--load hf/gpt2_tiny --task tasks/bytes_tiny.jsonl --tokenizer-type "
                  "ByteLevelTokenizer"};
const Model kLlama{"llama",
                   "--load hf/llama_tiny --task tasks/ids_tiny.jsonl --tokenizer-type "
                   "NullTokenizer --vocab-size 60"};

std::string with_fixture_paths(std::string flags) {
  for (const char* key : {"hf/", "tasks/"}) {
    const size_t at = flags.find(key);
    if (at != std::string::npos) flags.insert(at, kFixtures);
  }
  return flags;
}

// Each example's (log-likelihoods, pred, pred_norm), from --eval-task-samples.
struct Sample {
  std::vector<double> ll;
  int pred, pred_norm;
};

std::vector<Sample> evaluate(const Model& m, int ranks, const std::string& layout) {
  std::string name = std::string(m.name) + "_" + std::to_string(ranks) + layout;
  name.erase(std::remove(name.begin(), name.end(), ' '), name.end());
  const fs::path dir =
      fs::temp_directory_path() / ("omnitron_evaluate_mpi_" + std::to_string(getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string samples = (dir / "samples.jsonl").string();
  const std::string cmd = std::string(OMNITRON_BINARY) + " evaluate " +
                          with_fixture_paths(m.flags) +
                          " --micro-batch-size 2 --global-batch-size " + std::to_string(2 * ranks) +
                          " " + layout + " --eval-task-samples " + samples;
  const MpiRun r = mpirun(ranks, cmd, "-x OMP_NUM_THREADS=1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<Sample> out;
  std::ifstream in(samples);
  for (std::string line; std::getline(in, line);) {
    const omni::json::Value v = omni::json::parse(line, samples);
    Sample s{{}, int(v.find("pred")->num()), int(v.find("pred_norm")->num())};
    for (const omni::json::Value& x : v.find("log_likelihoods")->arr()) s.ll.push_back(x.num());
    out.push_back(s);
  }
  return out;
}

const std::vector<Sample>& one_rank(const Model& m) {
  static std::map<std::string, std::vector<Sample>> cache;
  auto it = cache.find(m.name);
  if (it == cache.end()) it = cache.emplace(m.name, evaluate(m, 1, "")).first;
  return it->second;
}

struct Case {
  const char* name;
  int ranks;
  const char* flags;
};

class EvaluateLayouts : public ::testing::TestWithParam<std::tuple<int, Case>> {};

TEST_P(EvaluateLayouts, ScoreAsOneRankDoes) {
  const Model& m = std::get<0>(GetParam()) == 0 ? kGpt2 : kLlama;
  const Case& c = std::get<1>(GetParam());
  const std::vector<Sample>& ref = one_rank(m);
  const std::vector<Sample> got = evaluate(m, c.ranks, c.flags);
  ASSERT_FALSE(ref.empty());
  ASSERT_EQ(got.size(), ref.size());
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(got[i].ll.size(), ref[i].ll.size());
    for (size_t k = 0; k < ref[i].ll.size(); ++k)
      worst = std::max(worst, std::abs(got[i].ll[k] - ref[i].ll[k]));
    EXPECT_EQ(got[i].pred, ref[i].pred) << "example " << i;
    EXPECT_EQ(got[i].pred_norm, ref[i].pred_norm) << "example " << i;
  }
  std::printf("%s %s: largest log-likelihood difference from one rank %.3g\n", m.name, c.name,
              worst);
  EXPECT_LE(worst, 1e-5);
}

const Case kCases[] = {
    {"dp2", 2, ""},
    {"tp2", 2, "--tensor-model-parallel-size 2"},
    {"tp2_sequence_parallel", 2, "--tensor-model-parallel-size 2 --sequence-parallel"},
    {"pp2", 2, "--pipeline-model-parallel-size 2"},
    {"cp2", 2, "--context-parallel-size 2"},
    {"tp2_pp2_dp2", 8, "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"},
};

INSTANTIATE_TEST_SUITE_P(Mpi, EvaluateLayouts,
                         ::testing::Combine(::testing::Values(0, 1), ::testing::ValuesIn(kCases)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == 0 ? "gpt2" : "llama") +
                                  "_" + std::get<1>(info.param).name;
                         });

}  // namespace

#endif  // OMNITRON_MPI_CHECK
