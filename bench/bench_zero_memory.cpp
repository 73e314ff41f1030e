// Memory per data-parallel rank of parameters, gradients and optimizer states under ZeRO
// stages 0-3 (--zero-stage), measured: the resident pages of each rank's buffers (mincore;
// Trainer::held_memory), at their peak during a training step of GPT-2 124M (12 layers,
// hidden 768, vocabulary 50257, a short sequence: these buffers do not depend on it) on
// 1, 2 and 4 in-process ranks. Beside each row, what ZeRO's paper predicts with AdamW in
// fp32: with P the parameters' bytes and d the ranks, 4P (stage 0), 2P + 2P/d (1),
// P + 3P/d (2), 4P/d (3), plus under stage 3 the largest layer gathered whole and under
// stages 2 and 3 a layer's gradients before their reduce-scatter.
//
//   OMP_NUM_THREADS=1 build/bench_zero_memory [--ranks 1,2,4] [--seq-length 8] [--bf16]
//
// Prints figures; never passes or fails. Each configuration runs in its own process.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "comm/local_communicator.h"
#include "config/options.h"
#include "data/datasets/dataset.h"
#include "train/trainer.h"

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

struct Row {
  double params = 0, grads = 0, optimizer = 0;  // MiB, the largest over the ranks
};

Row measure(int ranks, int stage, const std::string& seq, bool bf16) {
  Row row;
  std::mutex m;
  omni::run_ranks(ranks, [&](omni::Communicator& world) {
    omni::Options o;
    std::vector<std::string> args = {"--mock-data",
                                     "--vocab-size",
                                     "50257",
                                     "--num-layers",
                                     "12",
                                     "--hidden-size",
                                     "768",
                                     "--num-attention-heads",
                                     "12",
                                     "--seq-length",
                                     seq,
                                     "--max-position-embeddings",
                                     "1024",
                                     "--micro-batch-size",
                                     "1",
                                     "--global-batch-size",
                                     std::to_string(ranks),
                                     "--train-iters",
                                     "1",
                                     "--eval-iters",
                                     "0",
                                     "--lr",
                                     "1e-4",
                                     "--no-progress",
                                     "--log-interval",
                                     "100",
                                     "--zero-stage",
                                     std::to_string(stage)};
    if (bf16) args.push_back("--bf16");
    omni::parse_options(args, o);
    o.data_parallel_size = ranks;
    omni::finalize(o);
    omni::Trainer t(o, omni::make_mock_data(o.model.vocab_size, uint64_t(o.seed)), 0, std::nullopt,
                    &world);
    omni::MetricsSink sink("", false, nullptr);
    t.track_memory_peak();
    t.run(sink);
    const omni::Trainer::HeldMemory h = t.held_memory();
    std::lock_guard<std::mutex> lock(m);
    row.params = std::max(row.params, h.params / kMiB);
    row.grads = std::max(row.grads, h.grads / kMiB);
    row.optimizer = std::max(row.optimizer, h.optimizer / kMiB);
  });
  return row;
}

// The measurement in a child process (so each configuration's memory is its own), its row
// handed back through a pipe.
Row in_child(int ranks, int stage, const std::string& seq, bool bf16) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    const Row r = measure(ranks, stage, seq, bf16);
    if (write(fds[1], &r, sizeof r) != ssize_t(sizeof r)) _exit(1);
    _exit(0);
  }
  close(fds[1]);
  Row r;
  if (read(fds[0], &r, sizeof r) != ssize_t(sizeof r)) std::printf("  (child failed)\n");
  close(fds[0]);
  waitpid(pid, nullptr, 0);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> dp = {1, 2, 4};
  std::string seq = "8";
  bool bf16 = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--bf16") {
      bf16 = true;
    } else if (flag == "--ranks" && i + 1 < argc) {
      dp.clear();
      for (const char* p = argv[++i]; *p; ++p)
        if (*p >= '1' && *p <= '9') dp.push_back(*p - '0');
    } else if (flag == "--seq-length" && i + 1 < argc && std::atoi(argv[i + 1]) > 0) {
      seq = argv[++i];
    } else {
      std::fprintf(stderr,
                   "bench_zero_memory: bad argument %s (expected --ranks LIST of digits 1-9, "
                   "--seq-length N > 0, --bf16)\n",
                   flag.c_str());
      return 2;
    }
  }
  if (dp.empty()) {
    std::fprintf(stderr, "bench_zero_memory: --ranks names no rank count (e.g. --ranks 1,2,4)\n");
    return 2;
  }
  std::printf(
      "GPT-2 124M, AdamW %s, peak MiB per rank of its buffers (measured) beside "
      "ZeRO's prediction\n",
      bf16 ? "--bf16 (the CPU's model: float values rounded to bf16; the fp32 master with the "
             "optimizer; predicted: fp32's plus the master and its gradients, 2P at stages 0-1, "
             "2P/d at 2-3)"
           : "fp32");
  std::printf("%3s %5s %9s %9s %9s %9s %10s\n", "DP", "stage", "params", "grads", "optimizer",
              "total", "predicted");
  double P = 0;
  for (int d : dp)
    for (int stage = 0; stage <= 3; ++stage) {
      const Row r = in_child(d, stage, seq, bf16);
      if (d == 1 && stage == 0) P = r.params;
      // --bf16: an fp32 master and its gradients beside the model, whole at stages 0 and 1
      // (Megatron's Float16Optimizer), this rank's shard at stages 2 and 3.
      const double master = !bf16 ? 0 : stage < 2 ? 2 * P : 2 * P / d;
      const double predicted = master + (stage == 0   ? 4 * P
                                         : stage == 1 ? 2 * P + 2 * P / d
                                         : stage == 2 ? P + 3 * P / d
                                                      : 4 * P / d);
      std::printf("%3d %5d %9.1f %9.1f %9.1f %9.1f %10.1f\n", d, stage, r.params, r.grads,
                  r.optimizer, r.params + r.grads + r.optimizer, predicted);
      std::fflush(stdout);
    }
  return 0;
}
