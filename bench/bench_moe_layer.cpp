// One MoE layer's training forward + backward on the CPU against the dense MLP of the same
// active FLOPs, at bench_train_step's 6-layer shape (hidden 384, 1024 tokens = micro batch
// 4 x seq 256): what decides the MoE-to-dense ratio of issue 13, in seconds instead of
// bench_train_step's half minute.
//
//   build/bench_moe_layer [--reps N] [--tokens N] [--only dense|moe8|moe16]
//
// Rows (float32, the model's defaults: GELU, biases, aux loss 0.01, the alltoall dispatcher on
// one rank):
//   dense   fc1 384 -> 1536, GELU, fc2 1536 -> 384 (bench_train_step's dense MLP);
//   moe8    8 experts, top 2, each 768 wide: the same active FLOPs, plus the router;
//   moe16   16 experts, top 4, each 192 wide, plus a shared expert 768 wide, no biases.
// Each repetition runs every chosen row once in turn (dense, moe8, moe16, dense, ...), so a
// moment of load from other work lands on all of them. Printed: the medians of wall and of
// process CPU time (all threads; less swayed by other work on a shared machine), each beside
// the dense row's time over this row's (this row's rate as a fraction of dense's: < 1 slower),
// and a hash of the outputs and gradients of one step (equal before and after a change: the
// same bits). Prints figures; never fails.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/device.h"
#include "backend/ops.h"
#include "bench_stats.h"
#include "config/options.h"
#include "model/moe_layer.h"

namespace {

namespace ops = omni::ops;
using Clock = std::chrono::steady_clock;
using omni::bench::median;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<float> normal(size_t n, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// The process's CPU time (all threads): less sensitive than wall time to other work on a
// shared machine (OMNI's OpenMP threads wait passively, so idle threads add little).
double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// FNV-1a over the bytes of some buffers: equal figures before and after a change that keeps
// the math show that it kept every bit.
uint64_t fnv(std::initializer_list<const std::vector<float>*> vs) {
  uint64_t h = 1469598103934665603ull;
  for (const std::vector<float>* v : vs) {
    const auto* b = reinterpret_cast<const unsigned char*>(v->data());
    for (size_t i = 0; i < v->size() * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  return h;
}

std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

constexpr int kHidden = 384, kDenseFfn = 1536;

// The dense MLP's forward + backward (the model's order: fc2's gradients, GELU's, fc1's).
struct Dense {
  int N;
  std::vector<float> w1, b1, w2, b2, g1, gb1, g2, gb2, h, a, y, dy, da, dh, dx;
  const float* x;
  explicit Dense(int tokens, const float* input) : N(tokens), x(input) {
    const size_t C = kHidden, F = kDenseFfn;
    w1 = normal(F * C, 0.02f, 11), b1 = normal(F, 0.02f, 12);
    w2 = normal(C * F, 0.02f, 13), b2 = normal(C, 0.02f, 14);
    g1.assign(F * C, 0), gb1.assign(F, 0), g2.assign(C * F, 0), gb2.assign(C, 0);
    h.resize(N * F), a.resize(N * F), da.resize(N * F), dh.resize(N * F);
    y.resize(N * C), dx.resize(N * C);
    dy = normal(N * C, 1.0f, 15);
  }
  void step() {
    const ops::Exec e;
    ops::linear_forward(e, h.data(), x, w1.data(), b1.data(), N, kHidden, kDenseFfn);
    ops::gelu_forward(e, a.data(), h.data(), h.size(), omni::GeluForm::Erf);
    ops::linear_forward(e, y.data(), a.data(), w2.data(), b2.data(), N, kDenseFfn, kHidden);
    ops::linear_backward(e, da.data(), g2.data(), gb2.data(), dy.data(), a.data(), w2.data(), N,
                         kDenseFfn, kHidden);
    ops::gelu_backward(e, dh.data(), da.data(), h.data(), h.size(), omni::GeluForm::Erf);
    ops::linear_backward(e, dx.data(), g1.data(), gb1.data(), dh.data(), x, w1.data(), N, kHidden,
                         kDenseFfn);
  }
};

struct MoE {
  int N;
  omni::TransformerConfig cfg;
  std::vector<float> params, grads, y, dy, dx;
  omni::MoEParams<float> p, g;
  std::unique_ptr<omni::MoELayer<float>> layer;
  const float* x;
  MoE(int tokens, const float* input, const std::string& extra) : N(tokens), x(input) {
    omni::Options o;
    // bench_train_step's MoE rows: one layer of its 6-layer model, Mixtral's recipe's defaults.
    std::vector<std::string> args = words(
        "--mock-data --vocab-size 50257 --num-layers 1 --hidden-size " + std::to_string(kHidden) +
        " --num-attention-heads 6 --seq-length 256 --moe-router-load-balancing-type aux_loss "
        "--moe-aux-loss-coeff 0.01 --moe-grouped-gemm --moe-token-dispatcher-type alltoall");
    for (std::string& w : words(extra)) args.push_back(std::move(w));
    omni::parse_options(args, o);
    omni::finalize(o);
    cfg = o.model;
    const int64_t n = omni::moe_parameter_count(cfg);
    params = normal(size_t(n), 0.02f, 21);
    grads.assign(size_t(n), 0);
    p = omni::moe_param_views(params.data(), cfg);
    g = omni::moe_param_views(grads.data(), cfg);
    layer = std::make_unique<omni::MoELayer<float>>(cfg);
    y.resize(size_t(N) * kHidden), dx.resize(size_t(N) * kHidden);
    dy = normal(size_t(N) * kHidden, 1.0f, 22);
  }
  void step() {
    layer->forward(y.data(), x, N, cfg.seq_length, p, /*train=*/true);
    layer->backward(dx.data(), dy.data(), p, g, 1.0);
  }
};

}  // namespace

int main(int argc, char** argv) {
  omni::ensure_runtime_environment(argv);
  int reps = 40, tokens = 1024;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--tokens" && i + 1 < argc)
      tokens = std::max(1, std::atoi(argv[++i]));
    else if (a == "--only" && i + 1 < argc && (only = argv[++i], true) &&
             (only == "dense" || only == "moe8" || only == "moe16"))
      continue;
    else {
      std::fprintf(stderr,
                   "bench_moe_layer: bad argument %s (expected --reps N, --tokens N, "
                   "--only dense|moe8|moe16)\n",
                   argv[i]);
      return 2;
    }
  }
  const std::vector<float> x = normal(size_t(tokens) * kHidden, 1.0f, 1);
  Dense dense(tokens, x.data());
  MoE moe8(tokens, x.data(), "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 768");
  MoE moe16(tokens, x.data(),
            "--num-experts 16 --moe-router-topk 4 --moe-ffn-hidden-size 192 "
            "--moe-shared-expert-intermediate-size 768 --disable-bias-linear");
  struct Row {
    const char* name;
    std::function<void()> step;
    std::function<uint64_t()> hash;
    std::vector<double> t, cpu;
  };
  auto moe_hash = [](const MoE& m) { return fnv({&m.y, &m.dx, &m.grads}); };
  std::vector<Row> rows = {
      {"dense",
       [&] { dense.step(); },
       [&] {
         return fnv({&dense.y, &dense.dx, &dense.g1, &dense.gb1, &dense.g2, &dense.gb2});
       },
       {},
       {}},
      {"moe8", [&] { moe8.step(); }, [&] { return moe_hash(moe8); }, {}, {}},
      {"moe16", [&] { moe16.step(); }, [&] { return moe_hash(moe16); }, {}, {}}};
  std::erase_if(rows, [&](const Row& r) { return !only.empty() && only != r.name; });
  std::vector<uint64_t> hashes;
  for (Row& r : rows) {  // first touch of every buffer; the outputs of one step
    r.step();
    hashes.push_back(r.hash());
  }
  for (int i = 0; i < reps; ++i)
    for (Row& r : rows) {
      const Clock::time_point t0 = Clock::now();
      const double c0 = cpu_seconds();
      r.step();
      r.t.push_back(seconds_since(t0));
      r.cpu.push_back(cpu_seconds() - c0);
    }
  // Active FLOPs of the dense MLP's forward + backward: 3 x 2 x 2 N C F.
  const double flops = 3.0 * 2 * 2 * tokens * kHidden * kDenseFfn;
  std::printf("%d tokens, hidden %d, %d threads, median of %d\n", tokens, kHidden,
              omni::cpu_threads(), reps);
  std::printf("%-6s %10s %10s %9s %12s %9s  %s\n", "row", "wall ms", "GFLOP/s", "/dense", "cpu ms",
              "/dense", "hash of y, dx, grads after one step");
  double dense_t = 0, dense_c = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double t = median(r.t), c = median(r.cpu);
    if (std::string(r.name) == "dense") dense_t = t, dense_c = c;
    std::printf("%-6s %10.3f %10.1f", r.name, t * 1e3, flops / t / 1e9);
    if (dense_t > 0) std::printf(" %8.3fx", dense_t / t);
    std::printf(" %12.3f", c * 1e3);
    if (dense_c > 0) std::printf(" %8.3fx", dense_c / c);
    std::printf("  %016llx\n", static_cast<unsigned long long>(hashes[i]));
  }
  std::printf(
      "(/dense: the dense row's time over this row's, i.e. this row's rate as a fraction "
      "of dense's)\n");
  return 0;
}
