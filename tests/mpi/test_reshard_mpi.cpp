// DESIGN.md invariant 6 across layouts: a run trained for 5 of its 10 steps at one parallel
// layout, saved, and resumed with --load at another, against the uninterrupted run on one
// process (tiny GPT-2 and Llama, trained by the omnitron binary under mpirun). The resumed
// run must start at iteration 6 with the data position the checkpoint recorded, its losses
// must be the uninterrupted run's steps 6-10 within 1e-5 relative, and its final
// checkpoint's parameters the uninterrupted run's within 1e-4 of the largest (the bound of
// test_layouts_mpi.cpp, for the same reason: Adam turns rounding-level gradient
// differences into sign-level updates). The largest differences are printed.
#ifdef OMNITRON_MPI_CHECK

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "checkpoint/checkpoint.h"
#include "checkpoint/sharded_checkpoint.h"
#include "cli/process.h"
#include "mpirun.h"
#include "tiny_models.h"

namespace omni {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 10, kSaveAt = 5;

// One line of --metrics-file.
struct Step {
  int64_t iteration;
  int64_t consumed_samples;
  double loss;
};

std::vector<Step> steps_of(const fs::path& metrics) {
  auto number = [](const std::string& line, const std::string& key) {
    const size_t at = line.find("\"" + key + "\": ");
    EXPECT_NE(at, std::string::npos) << key << " missing from " << line;
    return at == std::string::npos ? 0.0 : std::stod(line.substr(at + key.size() + 4));
  };
  std::vector<Step> steps;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);)
    if (line.find("\"lm_loss\"") != std::string::npos)
      steps.push_back({int64_t(number(line, "iteration")),
                       int64_t(number(line, "consumed_samples")), number(line, "lm_loss")});
  return steps;
}

// The parameters of the checkpoint at `iteration` under `root` (the latest): the one-rank
// model's tensors in name order, whatever layout wrote them.
std::vector<float> params_at(const fs::path& root, int64_t iteration) {
  EXPECT_EQ(latest_checkpoint_iteration(root.string()), iteration);
  std::vector<float> params;
  for (const auto& [name, values] : CheckpointReader(root.string()).read_whole())
    params.insert(params.end(), values.begin(), values.end());
  return params;
}

fs::path run_dir(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("omnitron_reshard_" + std::to_string(getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

struct Layout {
  const char* name;
  int ranks;
  const char* flags;
};

const Layout kOne{"one", 1, ""};
const Layout kOneDistOpt{"one_distributed_optimizer", 1, "--use-distributed-optimizer"};

// Trains `model` at `layout` with the extra arguments; returns the steps it logged.
std::vector<Step> train(const std::string& model, const Layout& layout, const fs::path& metrics,
                        const std::string& extra) {
  const std::string args = "train " + tiny_model_flags(model, kSteps) + " " + layout.flags + " --metrics-file " +
                           metrics.string() + " " + extra;
  if (layout.ranks == 1) {
    const ProcessResult r = run_omnitron_env("OMP_NUM_THREADS=1", args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
  } else {
    const MpiRun r =
        mpirun(layout.ranks, std::string(OMNITRON_BINARY) + " " + args, "-x OMP_NUM_THREADS=1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
  return steps_of(metrics);
}

struct Reference {
  std::vector<Step> steps;
  std::vector<float> params;
};

// The uninterrupted run on one process (once per model).
const Reference& reference(const std::string& model) {
  static std::map<std::string, Reference> cache;
  auto it = cache.find(model);
  if (it == cache.end()) {
    const fs::path dir = run_dir(model + "_reference");
    std::vector<Step> steps =
        train(model, kOne, dir / "metrics.jsonl", "--save " + (dir / "ckpt").string());
    it = cache.emplace(model, Reference{steps, params_at(dir / "ckpt", kSteps)}).first;
    fs::remove_all(dir);
  }
  return it->second;
}

struct Case {
  Layout saved, resumed;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.saved.name << " -> " << c.resumed.name;
}

class Reshard : public ::testing::TestWithParam<std::tuple<std::string, Case>> {};

TEST_P(Reshard, ResumesTheUninterruptedRun) {
  const auto& [model, c] = GetParam();
  const Reference& ref = reference(model);
  ASSERT_EQ(ref.steps.size(), size_t(kSteps));
  ASSERT_FALSE(ref.params.empty());
  const fs::path dir = run_dir(model + "_" + c.saved.name + "_to_" + c.resumed.name);
  const std::string ckpt = (dir / "ckpt").string();

  const std::vector<Step> first =
      train(model, c.saved, dir / "first.jsonl",
            "--save " + ckpt + " --exit-interval " + std::to_string(kSaveAt));
  ASSERT_EQ(first.size(), size_t(kSaveAt));
  ASSERT_EQ(latest_checkpoint_iteration(ckpt), kSaveAt);

  const std::vector<Step> resumed =
      train(model, c.resumed, dir / "resumed.jsonl", "--save " + ckpt + " --load " + ckpt);
  ASSERT_EQ(resumed.size(), size_t(kSteps - kSaveAt));
  double worst_loss = 0;
  for (size_t i = 0; i < resumed.size(); ++i) {
    const Step& want = ref.steps[kSaveAt + i];
    EXPECT_EQ(resumed[i].iteration, want.iteration);
    EXPECT_EQ(resumed[i].consumed_samples, want.consumed_samples);
    worst_loss = std::max(worst_loss, std::abs(resumed[i].loss - want.loss) / want.loss);
  }

  ASSERT_EQ(latest_checkpoint_iteration(ckpt), kSteps);
  const std::vector<float> params = params_at(ckpt, kSteps);
  ASSERT_EQ(params.size(), ref.params.size());
  double worst_param = 0, largest = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    worst_param = std::max(worst_param, double(std::abs(params[i] - ref.params[i])));
    largest = std::max(largest, double(std::abs(ref.params[i])));
  }
  std::printf(
      "%s %s -> %s: largest loss difference %.3g (relative), parameter %.3g "
      "(of max |p| %.3g)\n",
      model.c_str(), c.saved.name, c.resumed.name, worst_loss, worst_param, largest);
  EXPECT_LE(worst_loss, 1e-5);
  EXPECT_LE(worst_param, 1e-4 * largest);
  if (!HasFailure()) fs::remove_all(dir);  // kept to look into otherwise
}

const Layout kTp2{"tp2", 2, "--tensor-model-parallel-size 2"};
const Layout kTp2Sp{"tp2_sequence_parallel", 2,
                    "--tensor-model-parallel-size 2 --sequence-parallel"};
const Layout kTp4{"tp4", 4, "--tensor-model-parallel-size 4"};
const Layout kPp2{"pp2", 2, "--pipeline-model-parallel-size 2"};
const Layout kPp4Virtual{
    "pp4_virtual", 4, "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 1"};
const Layout kDp2{"dp2", 2, ""};
const Layout kDp2DistOpt{"dp2_distributed_optimizer", 2, "--use-distributed-optimizer"};
const Layout kTp2Pp2{"tp2_pp2", 4,
                     "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"};
const Layout kCp2{"cp2", 2, "--context-parallel-size 2"};

const Case kCases[] = {
    {kTp2, kOne},
    {kOne, kTp2Sp},
    {kPp2, kTp2},
    {kDp2DistOpt, kPp2},
    {kTp2Pp2, kDp2},
    {kCp2, kTp4},
    {kPp4Virtual, kDp2DistOpt},
    {kTp4, kOneDistOpt},
    {kTp2Pp2, kOne},  // sharded: four ranks' files read by one
    {kOne, kTp2Pp2},  // and one rank's files read in parts by four
};

std::string case_name(const ::testing::TestParamInfo<Reshard::ParamType>& info) {
  const Case& c = std::get<1>(info.param);
  return std::get<0>(info.param) + "_" + c.saved.name + "_to_" + c.resumed.name;
}

INSTANTIATE_TEST_SUITE_P(Mpi, Reshard,
                         ::testing::Combine(::testing::Values("gpt2", "llama"),
                                            ::testing::ValuesIn(kCases)),
                         case_name);

const Case kPaddedVocabularyCases[] = {{kTp2Pp2, kTp4}, {kTp4, kOne}};

INSTANTIATE_TEST_SUITE_P(MpiPaddedVocabulary, Reshard,
                         ::testing::Combine(::testing::Values("gpt2_vocab70"),
                                            ::testing::ValuesIn(kPaddedVocabularyCases)),
                         case_name);

}  // namespace
}  // namespace omni

#endif  // OMNITRON_MPI_CHECK
