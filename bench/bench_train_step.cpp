// Training-step throughput on the CPU: tokens/s and model GFLOP/s (Megatron's formula)
// for GPT-2 124M and a 6-layer GPT, beside the machine's sgemm rate measured in the
// same run; then the 6-layer GPT as mixtures of experts of the same active FLOPs (GFLOP/s
// count the active parameters, as Megatron's formula does): Mixtral-shaped (8 experts,
// top 2, each half the dense MLP) and DeepSeek-shaped (16 fine-grained experts, top 4, a
// shared expert, and multi-latent attention with rope on its decoupled part: q through a
// 192 latent, k and v through a 128 one, heads of 64 + 32; without linear biases, which
// Megatron's shared experts refuse).
// bench/pytorch_moe_cpu.py measures PyTorch on the same shapes. Prints figures; never passes or
// fails on time.
//
//   build/bench_train_step [--steps N] [--only TEXT]... [--rounds N] [training flags, e.g.
//                          --hidden-dropout 0]
//
// --only runs the configurations whose name contains TEXT (repeatable: any of them);
// --rounds N runs the chosen ones N times in turn (dense, MoE, dense, MoE, ...), so that on
// a loaded machine the MoE-to-dense ratio compares runs of the same moment. Each MoE row is
// followed by its GFLOP/s as a fraction of the dense row run just before it, and by that ratio
// again without both rows' optimizer time (the "optim ms" column); after the last round, each
// MoE row's median of those ratios and their range.
//
// The model takes `omnitron train`'s defaults, Megatron's dropout of 0.1 among them; flags
// given here are added to every configuration's.
//
// Each configuration runs in its own process so that its peak resident memory is its
// own (and OpenMP never sees a fork after its threads started).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/device.h"
#include "base/trace.h"
#include "bench_stats.h"
#include "config/options.h"
#include "data/datasets/dataset.h"
#include "train/flops.h"
#include "train/trainer.h"

namespace {

using omni::bench::median;

struct BenchConfig {
  const char* name;
  int layers, heads, hidden, seq, micro_batch;
  std::vector<std::string> flags = {};
};

// The optimizer's share of each step (its "optimizer" trace span: the gradient norm and the
// update), the steps after the first summed as the rows' times are.
class OptimizerTime : public omni::TraceSink {
 public:
  void span(const char* name, const char*, int, Clock::time_point begin,
            Clock::time_point end) override {
    if (std::strcmp(name, "optimizer") != 0 || ++steps_ == 1) return;
    seconds_ += std::chrono::duration<double>(end - begin).count();
  }
  double per_step() const { return steps_ > 1 ? seconds_ / double(steps_ - 1) : 0.0; }

 private:
  int steps_ = 0;
  double seconds_ = 0;
};

struct RowTimes {
  double gflops = 0, step = 0, optimizer = 0;  // GFLOP/s; seconds a step, the optimizer's part
  // The step's FLOPs over its time less the optimizer's.
  double without_optimizer() const { return gflops * step / (step - optimizer); }
};

std::string range(const std::vector<double>& v) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  char text[32];
  std::snprintf(text, sizeof text, "%.3f-%.3f", *lo, *hi);
  return text;
}

double peak_rss_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

// Whether the child exited normally.
template <typename F>
bool in_child(F&& body) {
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    body();
    std::fflush(stdout);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  std::printf("  (child failed with status %d)\n", status);
  return false;
}

RowTimes run_config(const BenchConfig& b, int steps, double sgemm_gflops,
                    const std::vector<std::string>& extra) {
  omni::Options o;
  std::vector<std::string> args = {"--mock-data",
                                   "--vocab-size",
                                   "50257",
                                   "--num-layers",
                                   std::to_string(b.layers),
                                   "--num-attention-heads",
                                   std::to_string(b.heads),
                                   "--hidden-size",
                                   std::to_string(b.hidden),
                                   "--seq-length",
                                   std::to_string(b.seq),
                                   "--micro-batch-size",
                                   std::to_string(b.micro_batch),
                                   "--train-iters",
                                   std::to_string(steps + 1),
                                   "--eval-iters",
                                   "0",
                                   "--log-interval",
                                   "1000000",
                                   "--no-progress"};
  args.insert(args.end(), b.flags.begin(), b.flags.end());
  args.insert(args.end(), extra.begin(), extra.end());
  omni::parse_options(args, o);
  omni::finalize(o);
  omni::Trainer trainer(o, omni::make_mock_data(o.model.vocab_size, 1), sgemm_gflops);
  omni::MetricsSink sink("", false, nullptr);
  OptimizerTime optimizer;
  omni::set_trace_sink(&optimizer);
  omni::TrainResult r = trainer.run(sink);
  omni::set_trace_sink(nullptr);
  // The first step touches every buffer for the first time: time the ones after it.
  double sec_per_step = 0;
  for (size_t i = 1; i < r.step_seconds.size(); ++i) sec_per_step += r.step_seconds[i];
  sec_per_step /= double(r.step_seconds.size() - 1);
  const double flops = omni::megatron_flops_per_iteration(o.model, o.global_batch_size);
  const double tokens = double(o.global_batch_size) * o.model.seq_length;
  const double gflops = flops / sec_per_step / 1e9;
  std::printf("%-34s %10.0f %12.1f %10.1f %9.1f%% %10.0f %8.1f\n", b.name, tokens / sec_per_step,
              sec_per_step * 1000, gflops, 100.0 * gflops / sgemm_gflops, peak_rss_mib(),
              optimizer.per_step() * 1000);
  return {gflops, sec_per_step, optimizer.per_step()};
}

}  // namespace

int main(int argc, char** argv) {
  omni::ensure_runtime_environment(argv);
  int steps = 4, rounds = 1;
  std::vector<std::string> extra, only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: bench_train_step [--steps N] [--only TEXT]... [--rounds N] [training flags]\n"
          "  --steps N     timed steps per configuration after a first untimed one (4)\n"
          "  --only TEXT   only the configurations whose name contains TEXT (repeatable)\n"
          "  --rounds N    run the chosen configurations N times in turn\n"
          "  training flags (omnitron train's, e.g. --hidden-dropout 0 --bf16) are added to\n"
          "  every configuration's\n");
      return 0;
    }
    if (a == "--steps" && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (a == "--only" && i + 1 < argc)
      only.push_back(argv[++i]);
    else if (a == "--rounds" && i + 1 < argc)
      rounds = std::max(1, std::atoi(argv[++i]));
    else
      extra.push_back(a);
  }

  try {  // a misspelt training flag is one line here, not a failure in every child
    omni::Options probe;
    omni::parse_options(extra, probe);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train_step: %s\n", e.what());
    return 2;
  }

  // The sgemm rate is measured in a child too: the parent never starts OpenMP threads.
  int fds[2];
  if (pipe(fds) != 0) return 1;
  const bool measured = in_child([&] {
    double g = std::max(omni::measure_gemm_gflops(2048, 5), omni::measure_gemm_gflops(4096, 3));
    std::printf("cpu: %s, %d threads (idle OpenMP threads wait: %s); %s\nfp32 GEMM: %s\n",
                omni::cpu_model_name().c_str(), omni::cpu_threads(),
                omni::openmp_wait_policy().c_str(), omni::blas_config().c_str(),
                omni::ops::describe_cpu_fp32_gemm().c_str());
    if (write(fds[1], &g, sizeof g) != sizeof g) _exit(1);
  });
  double sgemm = 0;
  if (!measured || read(fds[0], &sgemm, sizeof sgemm) != sizeof sgemm) return 1;
  std::printf("sgemm: %.0f GFLOP/s (best of 2048^3 and 4096^3 products)\n\n", sgemm);
  std::printf("%-34s %10s %12s %10s %10s %10s %8s\n", "model (vocab 50257, micro batch 4)",
              "tokens/s", "ms/step", "GFLOP/s", "of sgemm", "peak MiB", "optim ms");
  // The MoE rows route every layer's MLP; the Megatron MoE defaults Mixtral's recipe sets
  // (aux loss 0.01, grouped GEMM, the all-to-all dispatcher) are on.
  const std::vector<std::string> moe = {"--moe-router-load-balancing-type",
                                        "aux_loss",
                                        "--moe-aux-loss-coeff",
                                        "0.01",
                                        "--moe-grouped-gemm",
                                        "--moe-token-dispatcher-type",
                                        "alltoall"};
  auto with = [&moe](std::vector<std::string> f) {
    f.insert(f.end(), moe.begin(), moe.end());
    return f;
  };
  const BenchConfig configs[] = {
      {"GPT-2 124M, seq 64", 12, 12, 768, 64, 4},
      {"GPT-2 124M, seq 256", 12, 12, 768, 256, 4},
      {"6 layers, 6 heads, 384, seq 256", 6, 6, 384, 256, 4},
      {"  MoE 8 experts, top 2, ffn 768", 6, 6, 384, 256, 4,
       with({"--num-experts", "8", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "768"})},
      {"  MoE 16 top 4, shared 768, MLA", 6, 6, 384, 256, 4,
       with({"--num-experts", "16", "--moe-router-topk", "4", "--moe-ffn-hidden-size", "192",
             "--moe-shared-expert-intermediate-size", "768", "--disable-bias-linear",
             "--multi-latent-attention", "--q-lora-rank", "192", "--kv-lora-rank", "128",
             "--qk-head-dim", "64", "--qk-pos-emb-head-dim", "32", "--v-head-dim", "64",
             "--position-embedding-type", "rope"})},
  };
  auto chosen = [&only](const BenchConfig& c) {
    return only.empty() || std::any_of(only.begin(), only.end(), [&c](const std::string& o) {
             return std::string(c.name).find(o) != std::string::npos;
           });
  };
  // An indented (MoE) row is also read as a fraction of the GFLOP/s of the dense row above
  // it in the same round, the figure issue 13's targets name, and so again with both rows'
  // optimizer time left out: the update and the gradient norm pass over every parameter
  // once a step, a cost that follows the total parameter count (the experts' all of them),
  // not the active FLOPs, and is amortised over the micro-batches of a larger global batch.
  RowTimes dense;
  // Per MoE row, its rounds' two ratios, for the summary after the last round.
  std::vector<std::vector<double>> ratios(std::size(configs)), ratios_without(std::size(configs));
  for (int round = 0; round < rounds; ++round)
    for (size_t i = 0; i < std::size(configs); ++i) {
      const BenchConfig& c = configs[i];
      if (!chosen(c)) continue;
      RowTimes t;
      const bool ok = in_child([&] {
        try {
          const RowTimes mine = run_config(c, steps, sgemm, extra);
          if (write(fds[1], &mine, sizeof mine) != sizeof mine) _exit(1);
        } catch (const std::exception& e) {  // e.g. flags this configuration refuses
          std::printf("%-34s %s\n", c.name, e.what());
          std::fflush(stdout);
          _exit(1);
        }
      });
      if (!ok || read(fds[0], &t, sizeof t) != sizeof t) t = RowTimes{};
      if (c.name[0] != ' ') {
        dense = t;
      } else if (dense.gflops > 0 && t.gflops > 0) {
        const double ratio = t.gflops / dense.gflops,
                     without = t.without_optimizer() / dense.without_optimizer();
        std::printf("%-34s %10s %12s %9.3fx of the dense row's GFLOP/s\n", "", "", "", ratio);
        std::printf("%-34s %10s %12s %9.3fx without the optimizer (%.1f ms against %.1f)\n", "",
                    "", "", without, t.optimizer * 1000, dense.optimizer * 1000);
        ratios[i].push_back(ratio);
        ratios_without[i].push_back(without);
      }
    }
  // On a machine whose speed drifts between rows, one round's ratio is noisy: the median of
  // the rounds', with their range, is the figure to read.
  if (rounds > 1 && std::any_of(ratios.begin(), ratios.end(), [](auto& r) { return !r.empty(); })) {
    std::printf("\nof the dense row's GFLOP/s over %d rounds: median (lowest-highest)\n", rounds);
    for (size_t i = 0; i < std::size(configs); ++i)
      if (!ratios[i].empty())
        std::printf("%-34s %.3fx (%s); without the optimizer %.3fx (%s)\n", configs[i].name,
                    median(ratios[i]), range(ratios[i]).c_str(), median(ratios_without[i]),
                    range(ratios_without[i]).c_str());
  }
  return 0;
}
