// Data- and tensor-parallel training on this machine's CPU ranks: the median step time and
// the bytes each rank sends per step, measured by a counting Communicator, beside the
// analytical count. Prints figures; never passes or fails on time.
//
//   build/bench_parallel                                   one rank (the baseline)
//   mpirun -np 2 -x OMP_NUM_THREADS=1 build/bench_parallel --tp 2
//   mpirun -np 2 -x OMP_NUM_THREADS=1 build/bench_parallel --dp 2
//   mpirun -np 2 -x OMP_NUM_THREADS=1 build/bench_parallel --sp 2   (Ulysses, all-to-all)
//   build/bench_parallel --moe                             the MoE model on one rank
//   mpirun -np 2 -x OMP_NUM_THREADS=1 build/bench_parallel --dp 2 --ep 2   expert parallel
//                       (--allgather: the allgather token dispatcher, Megatron's default)
//   mpirun -np 2 -x OMP_NUM_THREADS=1 build/bench_parallel --tp 2 --etp 1   the MoE model at
//                       TP 2 with --sequence-parallel and --expert-tensor-parallel-size 1
//                       (whole experts on every tp rank; --ep N splits them as above) and
//                       --disable-bias-linear
//   mpirun -np 2 -x OMP_NUM_THREADS=1 build/bench_parallel --dp 2 --overlap [--dist-opt]
//                       gradients reduced while the backward runs (--overlap-grad-reduce), with
//                       the distributed optimizer (its all-gather overlapped too); --bucket N:
//                       N-element gradient buckets (default: an eighth of the gradients, 3.75M
//                       here)
//   build/bench_parallel --compare       all of these (and one rank at 1 thread; the 2-thread
//                                        baseline first and last), then a
//                                        table of step times against one rank
//   options: --steps N (default 8), --warmup N (steps left out of the median, default 2)
//
// As root, OpenMPI's mpirun needs OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1.
//
// Every run trains the same GPT-2-shaped model on the same global batch (8 sequences of 256
// tokens, micro-batches of 4), so the step times compare directly: one rank does both
// micro-batches, each DP 2 rank one of them, each TP 2 rank both at half the width, each
// SP 2 (DeepSpeed-Ulysses) rank both with half of every sequence. With --moe (implied by
// --ep) each MLP is an MoE layer of 4 experts of half the MLP's width, top-2 (the same active
// FLOPs), and --ep N splits the experts over N data-parallel ranks
// (--moe-token-dispatcher-type alltoall, or allgather with --allgather).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/device.h"
#include "base/error.h"
#include "bench_stats.h"
#include "comm/communicator.h"
#include "comm/counting_communicator.h"
#include "comm/process_grid.h"
#include "config/options.h"
#include "data/datasets/dataset.h"
#include "train/trainer.h"

namespace {

using omni::Call;
using omni::call_name;
using omni::Communicator;
using omni::CountingCommunicator;
using omni::Tally;
using omni::bench::median;

struct Layout {
  int tp = 1, dp = 1, sp = 1;  // sp: Ulysses (--context-parallel-size with --cp-comm-type a2a)
  int ep = 1;
  int etp = 0;  // --expert-tensor-parallel-size (with --sequence-parallel); 0: tp
  bool moe = false;
  bool allgather = false;  // --moe-token-dispatcher-type allgather
  bool overlap = false;    // --overlap-grad-reduce (and --overlap-param-gather with dist_opt)
  bool dist_opt = false;   // --use-distributed-optimizer
  int bucket = 0;          // --ddp-bucket-size (elements); 0: the default (data_parallel.h)
};

// The bench's MoE layers (with Layout::moe).
constexpr int kExperts = 4, kTopK = 2;

// The bytes one rank sends per step by the algorithmic count (a(n, p) = 2(p-1)/p n for an
// all-reduce of n bytes over p ranks), for GPT-2 (learned positions, biases, LayerNorm,
// tied embeddings) with L layers, hidden h, sequence s, micro-batch b (T = b s tokens), m
// micro-batches per step on each rank, TP size t, DP size d:
//
// Tensor parallel, Megatron without sequence parallelism. Activations are replicated, so
// each all-reduce carries T h fp32 values:
//   per layer and micro-batch, 4: forward after the attention's and the MLP's row-parallel
//     output; backward at the inputs of the column-parallel QKV and fc1;
//   per micro-batch, 2 more: the vocabulary-parallel embedding's output (forward) and the
//     classifier input's gradient (backward);
//   the vocabulary-parallel cross-entropy, per token: its max logit, then its sum of
//     exponentials and target logit (3 doubles);
//   per step, the squared gradient norm (1 double) over the model-parallel group. No
//     replicated GPT-2 tensor has a partial gradient to sum (its layer norms see every token
//     without sequence parallelism; only qk-layernorm would).
//   TP = a(m ((4 L + 2) T h 4 + 3 T 8) + 8, t)
// Data parallel: the averaged fp32 gradients of this rank's P_t parameters, and the loss
// (1 double), and with --overlap-grad-reduce the sparse rows of the tied embedding (below):
//   DP = a(4 P_t + 8, d) + (d - 1) T (4 h + 8),
//   P_t = V_t h / t + s h + L (12 h^2 / t + 7 h / t + 6 h) + 2 h,
// V_t the vocabulary padded to a multiple of 128 t; a layer's QKV, fc1 (weights and biases)
// and projection, fc2 weights are split t ways, its two layer norms and two output biases
// replicated (6 h).
// Ulysses over u ranks (parallel/ulysses.h; with t = 1): each rank holds T/u tokens of every
// micro-batch, and per layer and micro-batch 8 all-to-alls of its rows' q, k, v, out (forward)
// and d(out), d(q), d(k), d(v) (backward), T/u h fp32 values each (GPT-2 has as many key/value
// heads as query heads), (u-1)/u of which leave the rank; per micro-batch the loss and its
// token count (2 doubles) are summed over the sequence's ranks; gradients are averaged over
// the d u ranks of data x context parallelism, the loss over the d data-parallel ranks:
//   SP = m L 8 (u-1)/u (T/u) h 4 + m a(8, u) 2,  DP = a(4 P_t, d u) + a(8, d).
//
// MoE (TP 1): each layer's MLP (8 h^2 + 5 h) is a router (E h + E) and E experts of width F
// (2 F h + F + h each), E/ep on each rank. The dense parameters are averaged over the d
// data-parallel ranks, the experts' over the d/ep ranks holding the same experts. Per
// micro-batch and MoE layer the alltoall dispatcher exchanges its row counts (E/ep f64 to
// each other rank) and four times rows of h floats (the tokens to their experts and back,
// forward and backward): with routing spread evenly, (ep-1)/ep of the T k rows go to other
// ranks, so the measured figure differs by the routing's imbalance. The allgather dispatcher
// instead all-gathers, per micro-batch and MoE layer, the tokens (T h floats) and the routing
// packed in one buffer (the token count, T k probabilities and T k expert indices: 1 + 2 T k
// floats), reduce-scatters the experts' output (T h floats per rank's block); backward it
// all-gathers the output's gradient and reduce-scatters the tokens' and the probabilities'
// (T h and T k floats per block): (ep-1) of each rank's block leave it, whatever the routing,
//   (ep-1) (4 T h + 1 + 3 T k) 4 bytes.
// Megatron's allgather dispatcher (token_dispatcher.py, MoEAllGatherTokenDispatcher) moves the
// same T h rows but, in place of the packed routing and its gradient (4 + 12 T k bytes), the
// probabilities and the routing map over every expert, T E floats and T E bytes, and the
// probabilities' gradient, T E floats (9 T E bytes): more whenever 12 k + 4 / T < 9 E (here
// k = 2, E = 4). Per step: the MoE figures (2 L + L E f64)
// over the data-parallel ranks and one f64 (the gradient norm's experts' part, added to the
// dense part before one all-reduce) over the expert-parallel ones.
double analytical_bytes(const omni::TransformerConfig& c, int micro_batch, int micro_batches,
                        const Layout& l) {
  auto a = [](double bytes, double p) { return 2 * (p - 1) / p * bytes; };
  const double L = c.num_layers, h = c.hidden_size, s = c.seq_length, t = l.tp;
  const double T = double(micro_batch) * s;
  const double tp = a(micro_batches * ((4 * L + 2) * T * h * 4 + 3 * T * 8) + 8, t);
  const int multiple = c.make_vocab_size_divisible_by * l.tp;
  const double vocab = double((c.vocab_size + multiple - 1) / multiple * multiple);
  const double params = vocab * h / t + s * h + L * (12 * h * h / t + 7 * h / t + 6 * h) + 2 * h;
  const double u = l.sp;
  const double sp = micro_batches * (L * 8 * (u - 1) / u * (T / u) * h * 4 + 2 * a(8, u));
  // --overlap-grad-reduce with the tied embedding on plain data parallelism (GPTModel::
  // set_deferred_embedding_grads): the last micro-batch's input-embedding rows (T of h fp32)
  // and their token ids and positions (2 int32 each) are all-gathered, (d-1)/d of d blocks.
  const bool sparse = l.overlap && l.dp > 1 && l.tp == 1 && l.sp == 1 &&
                      !c.untie_embeddings_and_output_weights && T * l.dp < c.vocab_size;
  const double rows = sparse ? (l.dp - 1) * T * (4 * h + 8) : 0;
  if (!l.moe) return tp + sp + a(4 * params, l.dp * u) + a(8, l.dp) + rows;
  // MoE under tensor parallelism is not modelled here (nan); the table by group shows its
  // tensor-parallel groups' bytes (tests/parallel/test_moe_tp_bytes.cpp holds an MoE layer's
  // to their analytical count).
  if (l.tp > 1) return NAN;
  const double E = c.num_moe_experts, F = c.moe_ffn_size(), k = c.moe_router_topk, ep = l.ep;
  const double dense = params - L * (8 * h * h + 5 * h) + L * (E * h + E);
  const double experts = L * E / ep * (2 * F * h + F + h);
  const double dispatch = l.allgather ? (ep - 1) * (4 * T * h + 1 + 3 * T * k) * 4
                                      : (ep - 1) * (E / ep) * 8 + 4 * T * k * (ep - 1) / ep * h * 4;
  return a(4 * dense + 8, l.dp) + a(4 * experts, l.dp / ep) + micro_batches * L * dispatch +
         a((2 * L + L * E) * 8, l.dp) + a(8, ep);
}

// User and system CPU seconds of this process so far, every thread's.
double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

struct Args {
  Layout layout;
  int steps = 8, warmup = 2;
  bool compare = false;
};

Args parse_args(int argc, char** argv) {
  Args r;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--compare" || a == "--moe" || a == "--overlap" || a == "--dist-opt" ||
        a == "--allgather") {
      (a == "--moe"         ? r.layout.moe
       : a == "--overlap"   ? r.layout.overlap
       : a == "--dist-opt"  ? r.layout.dist_opt
       : a == "--allgather" ? r.layout.allgather
                            : r.compare) = true;
      continue;
    }
    OMNI_REQUIRE(i + 1 < argc, "bench_parallel: ", a, " needs a value");
    const int v = std::atoi(argv[++i]);
    if (a == "--tp")
      r.layout.tp = v;
    else if (a == "--dp")
      r.layout.dp = v;
    else if (a == "--sp")
      r.layout.sp = v;
    else if (a == "--ep")
      r.layout.ep = v, r.layout.moe = true;
    else if (a == "--etp")
      r.layout.etp = v, r.layout.moe = true;
    else if (a == "--bucket")
      r.layout.bucket = v;
    else if (a == "--steps")
      r.steps = v;
    else if (a == "--warmup")
      r.warmup = v;
    else
      OMNI_REQUIRE(
          false, "bench_parallel: unknown option ", a,
          " (expected --tp, --dp, --sp, --ep, --etp, --moe, --allgather, --overlap, --dist-opt, "
          "--bucket, --steps, --warmup, --compare)");
  }
  OMNI_REQUIRE(
      !r.layout.allgather || r.layout.ep > 1,
      "bench_parallel: --allgather needs --ep above 1 (the dispatcher of expert parallelism)");
  OMNI_REQUIRE(r.layout.etp == 0 || (r.layout.etp < r.layout.tp && r.layout.tp % r.layout.etp == 0),
               "bench_parallel: --etp (", r.layout.etp, ") must divide and be below --tp (",
               r.layout.tp, ")");
  OMNI_REQUIRE(r.steps > r.warmup && r.warmup >= 0, "bench_parallel: --steps (", r.steps,
               ") must exceed --warmup (", r.warmup, ")");
  return r;
}

// What --compare reads from each measuring run: its last line, printed by rank 0.
constexpr const char* kResultFormat =
    "bench_parallel result: median %lf ms, min %lf ms, %lf bytes, %lf analytical, busy %lf, "
    "exposed %lf ms\n";

// Trains args.steps steps in the layout the world and the arguments give; rank 0 prints.
void measure(const Args& args) {
  const Layout& layout = args.layout;
  Communicator& world = omni::world_communicator();
  const int dp = omni::data_parallel_size(
      world.size(), {.tp = layout.tp, .cp = layout.sp, .ep = layout.ep, .etp = layout.etp});
  OMNI_REQUIRE(dp == layout.dp, "bench_parallel: ", world.size(), " ranks with --tp ", layout.tp,
               " and --sp ", layout.sp, " make data parallel ", dp, ", not --dp ", layout.dp);

  const int micro_batch = 4, global_batch = 8;
  omni::Options o;
  // Without dropout (Megatron's default of 0.1 is omnitron's too): the layouts' communication
  // is what is compared, and the figures stay comparable with the runs before dropout existed.
  omni::parse_options({"--mock-data",
                       "--hidden-dropout",
                       "0",
                       "--attention-dropout",
                       "0",
                       "--vocab-size",
                       "50257",
                       "--num-layers",
                       "6",
                       "--num-attention-heads",
                       "6",
                       "--hidden-size",
                       "384",
                       "--seq-length",
                       "256",
                       "--micro-batch-size",
                       std::to_string(micro_batch),
                       "--global-batch-size",
                       std::to_string(global_batch),
                       "--tensor-model-parallel-size",
                       std::to_string(layout.tp),
                       "--ds-sequence-parallel-size",
                       std::to_string(layout.sp),
                       "--train-iters",
                       std::to_string(args.steps),
                       "--eval-iters",
                       "0",
                       "--log-interval",
                       "1000000",
                       "--no-progress"},
                      o);
  if (layout.moe)
    omni::parse_options({"--num-experts", std::to_string(kExperts), "--moe-router-topk",
                         std::to_string(kTopK), "--moe-ffn-hidden-size", "768",
                         "--moe-token-dispatcher-type", layout.allgather ? "allgather" : "alltoall",
                         "--expert-model-parallel-size", std::to_string(layout.ep)},
                        o);
  if (layout.etp > 0)  // (the experts' biases are not built under tensor parallelism)
    omni::parse_options({"--sequence-parallel", "--expert-tensor-parallel-size",
                         std::to_string(layout.etp), "--disable-bias-linear"},
                        o);
  if (layout.overlap) omni::parse_options({"--overlap-grad-reduce"}, o);
  if (layout.bucket > 0)
    omni::parse_options({"--ddp-bucket-size", std::to_string(layout.bucket)}, o);
  if (layout.dist_opt) omni::parse_options({"--use-distributed-optimizer"}, o);
  if (layout.overlap && layout.dist_opt) omni::parse_options({"--overlap-param-gather"}, o);
  o.data_parallel_size = dp;
  omni::finalize(o);
  const omni::TransformerConfig& m = o.model;
  const bool lead = world.rank() == 0;
  if (lead) {
    std::printf(
        "model: GPT-2 shape, %d layers, hidden %d, %d heads, seq %d, vocab %d; %.1fM "
        "parameters\n",
        m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length, m.vocab_size,
        m.num_parameters() / 1e6);
    std::printf("batch: %d sequences per step in micro-batches of %d; micro-batches per rank: %d\n",
                global_batch, micro_batch, o.grad_accumulation_steps());
    std::printf(
        "layout: %d rank(s) = tensor %d x Ulysses %d x data %d, OpenMP threads per rank: %d; "
        "cpu: %s\n",
        world.size(), layout.tp, layout.sp, dp, omni::cpu_threads(),
        omni::cpu_model_name().c_str());
    if (layout.overlap || layout.dist_opt)
      std::printf(
          "gradients: %s%s\n",
          layout.dist_opt ? "distributed optimizer (reduce-scatter, all-gather)" : "all-reduced",
          layout.overlap ? ", overlapped with the backward (--overlap-grad-reduce)" : "");
    if (layout.moe)
      std::printf(
          "MoE: every MLP %d experts of width %d, top-%d; expert parallel %d (%s); expert "
          "tensor parallel %d%s\n",
          m.num_moe_experts, m.moe_ffn_size(), m.moe_router_topk, layout.ep,
          m.moe_token_dispatcher_type.c_str(), layout.etp > 0 ? layout.etp : layout.tp,
          layout.etp > 0 ? " (sequence parallel)" : "");
    std::fflush(stdout);
  }

  Tally tally;
  CountingCommunicator counted(world, tally);
  omni::Trainer trainer(o, omni::make_mock_data(m.vocab_size, 1), 0, std::nullopt, &counted);
  omni::MetricsSink sink("", false, nullptr);
  tally.on = true;
  const double cpu_before = cpu_seconds();
  const omni::TrainResult r = trainer.run(sink);
  const double cpu = cpu_seconds() - cpu_before;
  tally.on = false;

  const std::vector<double> timed(r.step_seconds.begin() + args.warmup, r.step_seconds.end());
  const double step = median(timed);
  double all_steps = 0;
  for (double s : r.step_seconds) all_steps += s;
  // Every step runs the same calls, so the run's bytes divided by its steps are one step's.
  const double per_step = 1.0 / double(r.step_seconds.size());
  // Exposed communication: the time spent inside communication calls and waits, per step.
  const double exposed_ms = 1000 * tally.blocked_seconds * per_step;
  std::vector<double> mine = {tally.total_algorithmic() * per_step, step,
                              tally.blocked_seconds / all_steps, cpu / all_steps, exposed_ms};
  std::vector<double> ranks(mine.size() * world.size());
  world.all_gather(ranks.data(), mine.data(), mine.size());
  if (!lead) return;

  std::printf(
      "\nstep time, rank 0: median %.0f ms over steps %d..%d (min %.0f, max %.0f); "
      "%.0f tokens/s; rank 0 busy %.0f%% of one core\n",
      step * 1000, args.warmup + 1, args.steps,
      *std::min_element(timed.begin(), timed.end()) * 1000,
      *std::max_element(timed.begin(), timed.end()) * 1000,
      double(global_batch) * m.seq_length / step, 100 * mine[3]);
  const double expected = analytical_bytes(m, micro_batch, o.grad_accumulation_steps(), layout);
  double most_sent = 0;
  if (world.size() > 1) {
    std::printf(
        "\nsent by rank 0 per step (algorithmic bytes as nccl-tests' bus bandwidth counts "
        "them: all-reduce 2(p-1)/p n,\nreduce-scatter and all-gather (p-1)/p of the full "
        "buffer; not the wire bytes of the algorithm OpenMPI picks):\n");
    std::printf("%-6s %-15s %10s %16s %18s\n", "group", "call", "calls", "payload bytes",
                "algorithmic bytes");
    for (const auto& [key, e] : tally.entries)
      std::printf("%-6s %-15s %10.1f %16.0f %18.0f\n", key.first.c_str(), call_name(key.second),
                  double(e.calls) * per_step, e.payload * per_step, e.algorithmic * per_step);
    std::printf("\n%-6s %18s %18s %12s %14s %9s %11s %9s\n", "rank", "sent bytes/step",
                "analytical", "difference", "median ms", "in comm", "exposed ms", "busy");
    for (int k = 0; k < world.size(); ++k) {
      const double* v = ranks.data() + k * mine.size();
      most_sent = std::max(most_sent, v[0]);
      std::printf("%-6d %18.0f %18.0f %12.0f %14.0f %8.0f%% %11.0f %8.0f%%\n", k, v[0], expected,
                  v[0] - expected, v[1] * 1000, 100 * v[2], v[4], 100 * v[3]);
    }
    std::printf(
        "(in comm: share of all steps' time spent inside communication calls and waits, "
        "waiting for the other ranks included;\n exposed ms: the same time per step;\n busy: the "
        "rank's CPU time over the same "
        "steps' wall time, in cores: below 100%% per thread, the rank was waiting for a core "
        "or sleeping)\n");
  }
  std::printf(kResultFormat, step * 1000, *std::min_element(timed.begin(), timed.end()) * 1000,
              most_sent, expected, mine[3], exposed_ms);
}

// Runs the one-rank baseline at 2 and 1 OpenMP threads and DP 2, TP 2, SP 2 under mpirun (one
// thread per rank), each in its own process, and prints their figures side by side.
void compare(const Args& args) {
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  OMNI_CHECK(len > 0, "[bench_parallel] cannot read /proc/self/exe");
  self[len] = '\0';
  const std::string common = std::string(self) + " --steps " + std::to_string(args.steps) +
                             " --warmup " + std::to_string(args.warmup);
  struct Run {
    const char* name;
    std::string command;
    double ms = 0, min_ms = 0, bytes = 0, analytical = 0, busy = 0, exposed = 0;
  };
  const std::string mpirun = "mpirun -np 2 -x OMP_NUM_THREADS=1 ";
  std::vector<Run> runs = {
      {"one rank, 2 threads", "OMP_NUM_THREADS=2 " + common},
      {"one rank, 1 thread", "OMP_NUM_THREADS=1 " + common},
      {"DP 2, 1 thread each", mpirun + common + " --dp 2"},
      {"DP 2, overlapped", mpirun + common + " --dp 2 --overlap"},
      {"DP 2, dist-opt, ovl", mpirun + common + " --dp 2 --dist-opt --overlap"},
      {"TP 2, 1 thread each", mpirun + common + " --tp 2"},
      {"SP 2 (Ulysses)", mpirun + common + " --sp 2"},
      {"MoE, one rank", "OMP_NUM_THREADS=1 " + common + " --moe"},
      {"MoE EP 2, 1 thr each", mpirun + common + " --dp 2 --ep 2"},
      {"MoE EP 2, allgather", mpirun + common + " --dp 2 --ep 2 --allgather"},
      // The baseline again: the rows compare with both sittings' mean, so a machine whose
      // load drifts during the runs moves the baseline as it moved them.
      {"one rank, 2 thr again", "OMP_NUM_THREADS=2 " + common},
  };
  for (Run& run : runs) {
    std::printf("\n$ %s\n", run.command.c_str());
    std::fflush(stdout);
    FILE* out = popen((run.command + " 2>&1").c_str(), "r");
    OMNI_CHECK(out, "[bench_parallel] cannot start ", run.command);
    char line[1024];
    bool found = false;
    while (std::fgets(line, sizeof line, out)) {
      std::fputs(line, stdout);
      found |= std::sscanf(line, kResultFormat, &run.ms, &run.min_ms, &run.bytes, &run.analytical,
                           &run.busy, &run.exposed) == 6;
    }
    const int status = pclose(out);
    OMNI_CHECK(status == 0 && found, "[bench_parallel] ", run.command, " failed (status ", status,
               ")");
  }
  std::printf("\n%-20s %10s %8s %13s %12s %16s %16s %8s %7s\n", "run", "median ms", "min ms",
              "vs 2 threads", "vs 1 thread", "sent bytes/step", "analytical", "exposed", "busy");
  // The MoE rows against the MoE model on one rank at one thread.
  const size_t moe_one = runs.size() - 4;
  const double two_ms = (runs.front().ms + runs.back().ms) / 2;
  for (size_t i = 0; i < runs.size(); ++i) {
    const Run& run = runs[i];
    const Run& one = i >= moe_one && i + 1 < runs.size() ? runs[moe_one] : runs[1];
    std::printf("%-20s %10.0f %8.0f %12.2fx %11.2fx %16.0f %16.0f %8.0f %6.0f%%\n", run.name,
                run.ms, run.min_ms, two_ms / run.ms, one.ms / run.ms, run.bytes, run.analytical,
                run.exposed, 100 * run.busy);
  }
  std::printf(
      "(vs 2 threads: the mean of the two one-rank, 2-thread runs' median step times (first and "
      "last) over this run's; vs: one rank's median step time over this run's, on the same global "
      "batch, the MoE rows "
      "against the MoE model's one rank at 1 thread in the 'vs 1 thread' column; sent: the "
      "most any rank sends, algorithmic count (MoE: the analytical count assumes evenly spread "
      "routing);\n exposed: ms per step rank 0 spent inside communication calls and waits; busy: "
      "rank 0's CPU time over its wall time, "
      "in cores: under 100%% per thread, it was waiting for a core this machine's other work "
      "held)\n");
}

}  // namespace

int main(int argc, char** argv) {
  omni::ensure_runtime_environment(argv);
  try {
    const Args args = parse_args(argc, argv);
    if (args.compare)
      compare(args);
    else
      measure(args);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_parallel: %s\n", e.what());
    omni::abort_world(1);
    return 1;
  }
}
