// ZeRO stages under mpirun: a stage 3 run killed with SIGKILL (both ranks) and resumed at
// stage 2 logs the losses and ends with the parameters and optimizer states of an
// uninterrupted run without sharding (stage 0), bit for bit. (One micro-batch per rank and no
// clipping: then every stage sums each gradient element in the same order. With accumulation,
// stages 2 and 3 add each micro-batch's reduced gradient to the shard, another rounding order:
// parallel/test_zero_sharding.cpp bounds that.)
#ifdef OMNITRON_MPI_CHECK

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/options.h"
#include "model/gpt_model.h"
#include "mpirun.h"
#include "optim/optimizer.h"
#include "tiny_models.h"

namespace omni {
namespace {

namespace fs = std::filesystem;

const std::string kFlags =
    tiny_model_flags("gpt2", 20) + " --global-batch-size 4 --clip-grad 0 --save-interval 1";

// The one-rank model and AdamW states of the latest checkpoint under `dir`.
std::vector<float> model_and_states(const fs::path& dir) {
  Options o;
  std::vector<std::string> args;
  std::istringstream in(kFlags);
  for (std::string a; in >> a;) args.push_back(a);
  parse_options(args, o);
  finalize(o);
  GPTModel<float> m(o.model, 1, 1);
  Optimizer<float> opt(o.optim, m.params());
  load_checkpoint(dir.string(), m.params(), &opt);
  const size_t n = size_t(m.params().size());
  std::vector<float> all(m.params().values(), m.params().values() + n);
  for (const std::string& name : opt.state_names())
    all.insert(all.end(), opt.state_buffer(name), opt.state_buffer(name) + n);
  return all;
}

// The two ranks' processes (their command lines hold `marker`).
std::vector<pid_t> ranks_of(const std::string& marker) {
  std::vector<pid_t> pids;
  for (const fs::directory_entry& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmdline.substr(0, cmdline.find('\0')) == OMNITRON_BINARY &&
        cmdline.find(marker) != std::string::npos)
      pids.push_back(std::stoi(name));
  }
  return pids;
}

TEST(MpiZero, KilledAtStage3AndResumedAtStage2EqualsPlainDataParallelBitForBit) {
  const fs::path base = fs::temp_directory_path() / ("omnitron_zero_" + std::to_string(getpid()));
  fs::remove_all(base);
  fs::create_directories(base);
  const std::string run = std::string(OMNITRON_BINARY) + " train " + kFlags;
  const fs::path straight = base / "straight", killed = base / "killed";
  MpiRun r = mpirun(2,
                    run + " --zero-stage 0 --save " + straight.string() + " --metrics-file " +
                        (base / "straight.jsonl").string(),
                    "-x OMP_NUM_THREADS=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;

  std::thread job([&] {
    r = mpirun(2, run + " --zero-stage 3 --save " + killed.string(), "-x OMP_NUM_THREADS=1");
  });
  const fs::path latest = killed / "latest_checkpointed_iteration.txt";
  for (int i = 0; i < 600 && !fs::exists(latest); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const std::vector<pid_t> ranks = ranks_of(killed.string());
  for (pid_t pid : ranks) kill(pid, SIGKILL);
  job.join();
  std::string at;
  std::ifstream(latest) >> at;
  std::printf("stage 3 run: %zu ranks killed, exit %d, latest checkpoint %s of 20\n", ranks.size(),
              r.exit_code, at.c_str());
  EXPECT_EQ(ranks.size(), 2u) << "the run ended before its kill: lengthen it\n" << r.output;

  const fs::path resumed = base / "resumed.jsonl";
  r = mpirun(2,
             run + " --zero-stage 2 --save " + killed.string() + " --load " + killed.string() +
                 " --metrics-file " + resumed.string(),
             "-x OMP_NUM_THREADS=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> all = losses_of(base / "straight.jsonl"), tail = losses_of(resumed);
  ASSERT_EQ(all.size(), 20u);
  ASSERT_FALSE(tail.empty());
  ASSERT_LE(tail.size(), all.size());
  EXPECT_EQ(tail, std::vector<double>(all.end() - tail.size(), all.end()));
  const std::vector<float> a = model_and_states(straight), b = model_and_states(killed);
  ASSERT_EQ(a.size(), b.size());
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
  EXPECT_EQ(differ, 0u) << "of " << a.size() << " parameters and states";
  fs::remove_all(base);
}

}  // namespace
}  // namespace omni

#endif  // OMNITRON_MPI_CHECK
