// Training-step throughput on one GPU: GPT-2 124M at sequence 1024 and a Llama 3.2 1B-shaped
// model at sequence 2048, bf16 with fp32 master weights and AdamW, on random tokens. Prints
// step time, tokens/s, model TFLOP/s by Megatron's formula (train/flops.h: causal attention
// counted as half, as Megatron counts it since January 2026) and MFU against the dense bf16
// peak; never passes or fails.
//
//   build/bench_gpu_train_step [--model gpt2|llama1b|all] [--steps N] [--warmup N]
//                              [--micro-batch B] [--dtype bf16|f32] [--peak-tflops P]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#if defined(OMNITRON_GPU)
#include "backend/gpu/gpu_ops.h"
#include "model/gpt_model.h"
#include "optim/mixed_precision.h"
#include "optim/optimizer.h"
#include "train/flops.h"

namespace {

struct Bench {
  const char* name;
  omni::TransformerConfig cfg;
  int micro_batch;
};

std::vector<Bench> benches() {
  omni::TransformerConfig gpt2;
  gpt2.num_layers = 12, gpt2.hidden_size = 768, gpt2.num_attention_heads = 12;
  gpt2.seq_length = 1024, gpt2.vocab_size = 50257;
  omni::TransformerConfig llama;  // Llama 3.2 1B's shape
  llama.num_layers = 16, llama.hidden_size = 2048, llama.num_attention_heads = 32;
  llama.group_query_attention = true, llama.num_query_groups = 8, llama.ffn_hidden_size = 8192;
  llama.seq_length = 2048, llama.vocab_size = 128256, llama.rotary_base = 500000;
  llama.normalization = omni::Normalization::RMSNorm;
  llama.position_embedding_type = omni::PositionEmbedding::Rope;
  llama.swiglu = true, llama.add_bias_linear = false;
  return {{"gpt2", gpt2, 32}, {"llama1b", llama, 4}};
}

template <typename T>
void run(const Bench& b, int micro_batch, int steps, int warmup, double peak_tflops,
         const char* dtype) {
  const omni::TransformerConfig& cfg = b.cfg;
  const int n = micro_batch * cfg.seq_length;
  std::mt19937 rng(1);
  std::vector<int32_t> tokens(n), labels(n);
  for (int i = 0; i < n; ++i)
    tokens[i] = rng() % cfg.vocab_size, labels[i] = rng() % cfg.vocab_size;
  const omni::MicroBatch mb{tokens.data(), labels.data(), nullptr, micro_batch, cfg.seq_length};
  std::printf("%s: %d layers, hidden %d, seq %d, micro-batch %d, %s; building...\n", b.name,
              cfg.num_layers, cfg.hidden_size, cfg.seq_length, micro_batch, dtype);
  std::fflush(stdout);
  // The trainer's step (train/trainer.cpp) on one GPU: the one model, fp32 master weights
  // beside 16-bit ones, clipping at norm 1 and AdamW, all in device memory.
  const omni::ops::Exec x{omni::gpu_backend()};
  omni::GPTModel<T> model(cfg, micro_batch, 1234, {}, x);
  std::unique_ptr<omni::MixedPrecision> mixed;
  if constexpr (omni::is_16bit<T>)
    mixed = std::make_unique<omni::MixedPrecision>(model.params(), x);
  omni::ParameterSet<float>& master = [&]() -> omni::ParameterSet<float>& {
    if constexpr (omni::is_16bit<T>)
      return mixed->master();
    else
      return model.params();
  }();
  omni::OptimizerConfig oc;
  oc.adam_beta2 = 0.95, oc.weight_decay = 0.1;
  omni::Optimizer<float> optimizer(oc, master, x);
  std::vector<double> ms;
  double loss = 0;
  for (int s = 1; s <= warmup + steps; ++s) {
    omni::gpu::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    omni::ops::zero(x, model.params().grads(), size_t(model.params().size()));
    loss = model.forward_backward(mb, 1.0);
    if (mixed) mixed->unscale_and_check(1.0f);
    const double norm = std::sqrt(omni::ops::sum_squares(x, master.grads(), size_t(master.size())));
    if (norm > 1.0) omni::scale_gradients(master, 1.0 / norm, x);
    optimizer.step(master, 3e-4);
    if (mixed) mixed->copy_master_to_model();
    omni::gpu::synchronize();
    const double t =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (s > warmup) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  const double tflops = omni::megatron_flops_per_iteration(cfg, micro_batch) / (med * 1e-3) / 1e12;
  std::printf(
      "%-8s %-5s params %6.1fM  step %8.1f ms (min %.1f)  %9.0f tokens/s  %6.1f TFLOP/s"
      "  MFU %5.1f%%  (loss %.3f)\n",
      b.name, dtype, model.params().size() / 1e6, med, ms.front(), n / (med * 1e-3), tflops,
      100.0 * tflops / peak_tflops, loss);
}

}  // namespace

int main(int argc, char** argv) {
  std::string which = "all", dtype = "bf16";
  int steps = 10, warmup = 3, micro_batch = 0;
  double peak = 989.0;  // H100 SXM dense bf16
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--model")
      which = argv[i + 1];
    else if (a == "--steps")
      steps = std::atoi(argv[i + 1]);
    else if (a == "--warmup")
      warmup = std::atoi(argv[i + 1]);
    else if (a == "--micro-batch")
      micro_batch = std::atoi(argv[i + 1]);
    else if (a == "--dtype")
      dtype = argv[i + 1];
    else if (a == "--peak-tflops")
      peak = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "bench_gpu_train_step: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (omni::gpu::device_count() == 0) {
    std::printf("bench_gpu_train_step: no GPU visible; nothing measured\n");
    return 0;
  }
  try {
    for (const Bench& b : benches()) {
      if (which != "all" && which != b.name) continue;
      const int mb = micro_batch ? micro_batch : b.micro_batch;
      if (dtype == "f32")
        run<float>(b, mb, steps, warmup, peak, "f32");
      else
        run<omni::bf16>(b, mb, steps, warmup, peak, "bf16");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_train_step: %s\n", e.what());
    return 1;
  }
  return 0;
}

#else
int main() {
  std::printf("bench_gpu_train_step: built without a GPU backend (OMNITRON_CUDA/OMNITRON_HIP)\n");
  return 0;
}
#endif
