// Megatron's training and regularization groups: batches, length of training, the
// optimizer and activation recompute.
#include "config/option_rows.h"

#include <sstream>

namespace omni::option_rows {

namespace {

// Megatron's activation recompute flags (its training group), the last rows of the group.
void add_recompute_options(std::vector<OptionDef>& t) {
  const std::string RC = "activation recompute";
  t.push_back(OptionDef{"--checkpoint-activations", "", RC,
                        "old name of --recompute-granularity full --recompute-method uniform",
                        [](Options& o, const std::string&) {
                          o.recompute_granularity = "full", o.recompute_method = "uniform";
                          o.recompute_num_layers = 1;
                        },
                        [](const Options&) { return std::string(); }});
  t.push_back(
      OptionDef{"--recompute-activations", "", RC,
                "recompute the attention probabilities (--recompute-granularity selective)",
                [](Options& o, const std::string&) { o.recompute_granularity = "selective"; },
                [](const Options&) { return std::string(); }});
  t.push_back(text("--recompute-granularity", "full|selective", RC,
                   "full: keep only layer inputs; selective: no attention probabilities",
                   [](Options& o) -> std::string& { return o.recompute_granularity; }));
  t.push_back(text("--recompute-method", "uniform|block", RC,
                   "with full: every layer (uniform 1), or the first N of each stage (block N)",
                   [](Options& o) -> std::string& { return o.recompute_method; }));
  t.push_back(number<int>("--recompute-num-layers", "N", RC, "N for --recompute-method",
                          [](Options& o) -> int& { return o.recompute_num_layers; }));
  // Selective recompute here recomputes the core attention (Megatron's default module);
  // recompute trades memory for time and never changes results, so others get a note.
  OptionDef modules{
      "--recompute-modules",
      "M...",
      RC,
      "modules selective recompute recomputes: core_attn",
      [](Options& o, const std::string& v) {
        std::istringstream in(v);
        for (std::string m; in >> m;)
          if (m != "core_attn")
            plumbing("--recompute-modules", "M...",
                     "selective recompute here recomputes the core attention (core_attn) only")
                .set(o, v);
      },
      nullptr};
  modules.many = true;
  t.push_back(std::move(modules));
}

}  // namespace

void add_training_options(std::vector<OptionDef>& t) {
  const std::string T = "training", O = "optimizer";
  t.push_back(number<int>("--micro-batch-size", "N", T, "samples per forward/backward",
                          [](Options& o) -> int& { return o.micro_batch_size; }));
  t.push_back(number<int>(
      "--global-batch-size", "N", T,
      "samples per optimizer step (a multiple of the micro batch: gradient accumulation)",
      [](Options& o) -> int& { return o.global_batch_size; }));
  OptionDef iters = number<int64_t>("--train-iters", "N", T, "optimizer steps",
                                    [](Options& o) -> int64_t& { return o.train_iters; });
  iters.set = [set = iters.set](Options& o, const std::string& v) {
    set(o, v);
    o.train_iters_given = true;
  };
  t.push_back(std::move(iters));
  t.push_back(number<int64_t>(
      "--train-samples", "N", T,
      "train on N samples instead of --train-iters steps (the schedule then counts samples)",
      [](Options& o) -> int64_t& { return o.train_samples_total; }));
  t.push_back(OptionDef{
      "--rampup-batch-size", "START INCR SAMPLES", T,
      "with --train-samples: the global batch grows from START by INCR to --global-batch-size "
      "over the first SAMPLES samples",
      [](Options& o, const std::string& v) {
        std::istringstream in(v);
        std::string start, incr, samples, extra;
        if (!(in >> start >> incr >> samples) || (in >> extra))
          throw UsageError("--rampup-batch-size expects three values, START INCR SAMPLES; got '" +
                           v + "'");
        o.rampup_start = parse_number<int>("--rampup-batch-size START", start);
        o.rampup_increment = parse_number<int>("--rampup-batch-size INCR", incr);
        o.rampup_samples = parse_number<int64_t>("--rampup-batch-size SAMPLES", samples);
      },
      [](const Options& o) {
        return o.rampup_start == 0
                   ? std::string()
                   : std::to_string(o.rampup_start) + " " + std::to_string(o.rampup_increment) +
                         " " + std::to_string(o.rampup_samples);
      },
      true});
  t.push_back(number<int64_t>("--seed", "N", T, "seed of initialisation and data order",
                              [](Options& o) -> int64_t& { return o.seed; }));
  t.push_back(OptionDef{
      "--optimizer", "NAME", O,
      "adam: Adam with decoupled weight decay (AdamW, as Megatron's; adamw is the same); sgd: "
      "SGD with momentum and L2 weight decay; the zoo (on the GPU too; with tensor parallelism and "
      "the distributed optimizer, but the galore kinds and shampoo): "
      "lamb (ds.fusedlamb, ipex.lamb, ipex.fusedlamb), lion, muon, adamwschedulefree, "
      "sgdschedulefree, adam8bit, sophiag (with its Hessian estimate at 0, as Megatron-DeepSpeed "
      "runs it), galoreadamw, galoreadamw8bit, galoreadamw8bitperlayer (the same math as "
      "galoreadamw8bit: per layer is when the update runs, a memory technique), shampoo "
      "(dshampooadamw: DistributedShampoo with Adam grafting); apex.adam and apex.sgd are adamw "
      "and sgd",
      [](Options& o, const std::string& v) {
        for (const char* other : {"dist_muon", "adaptive_muon", "soap", "muonclip", "ds.onebitlamb",
                                  "adopt", "adafactor"})
          if (v == other) throw NotBuiltError("--optimizer " + v, "the " + v + " optimizer");
        parse_optimizer(v);  // names the choices when `v` is none of them
        o.optimizer = v;
      },
      [](const Options& o) { return o.optimizer; }});
  t.push_back(number<double>("--weight-decay", "X", O,
                             "decoupled weight decay (not on biases and norms)",
                             [](Options& o) -> double& { return o.optim.weight_decay; }));
  t.push_back(number<double>("--adam-beta1", "X", O, "Adam beta1",
                             [](Options& o) -> double& { return o.optim.adam_beta1; }));
  t.push_back(number<double>("--adam-beta2", "X", O, "Adam beta2",
                             [](Options& o) -> double& { return o.optim.adam_beta2; }));
  t.push_back(number<double>("--adam-eps", "X", O, "Adam epsilon",
                             [](Options& o) -> double& { return o.optim.adam_eps; }));
  t.push_back(number<double>("--sgd-momentum", "X", O, "SGD momentum",
                             [](Options& o) -> double& { return o.optim.sgd_momentum; }));
  t.push_back(number<double>("--clip-grad", "X", O, "clip the global gradient norm to X (0: off)",
                             [](Options& o) -> double& { return o.optim.clip_grad; }));
  // Megatron keeps main gradients, main parameters and Adam's moments in fp32 unless its
  // precision-aware optimizer is given other dtypes; fp32 is what omnitron keeps.
  for (const char* flag :
       {"--main-grads-dtype", "--main-params-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype"}) {
    const std::string f = flag;
    t.push_back(OptionDef{f, "fp32", O, "fp32 (lower precisions are not built yet)",
                          [f](Options&, const std::string& v) {
                            if (v != "fp32")
                              throw NotBuiltError(f + " " + v,
                                                  "optimizer states and main parameters in "
                                                  "less than fp32");
                          },
                          nullptr});
  }
  t.push_back(toggle("--calculate-per-token-loss", T,
                     "the loss is the global batch's token sum over its token count (not the "
                     "mean of the micro-batches' means)",
                     [](Options& o) -> bool& { return o.calculate_per_token_loss; }));
  t.push_back(toggle(
      "--no-check-for-nan-in-loss-and-grad", T,
      "train on through a non-finite gradient norm (by default it stops the run)",
      [](Options& o) -> bool& { return o.check_for_nan_in_loss_and_grad; }, false));
  // Megatron's retired spellings, refused as Megatron refuses them.
  for (auto [flag, use] : {std::pair{"--batch-size", "--micro-batch-size"},
                           std::pair{"--warmup", "--lr-warmup-fraction or --lr-warmup-iters"},
                           std::pair{"--model-parallel-size", "--tensor-model-parallel-size"}}) {
    const std::string f = flag, u = use;
    t.push_back(OptionDef{f, "N", T, "no longer valid: use " + u,
                          [f, u](Options&, const std::string&) {
                            throw UsageError(f + " is no longer valid (as in Megatron); use " + u);
                          },
                          nullptr});
  }
  t.push_back(OptionDef{
      "--dataloader-type", "single|cyclic|external", T,
      "single: samples in Megatron's order, each once; cyclic: noted (single's order)",
      [](Options& o, const std::string& v) {
        // Megatron's cyclic sampler reshuffles the (already shuffled) GPT samples each epoch
        // with PyTorch's generator: the same samples per epoch in another order. Primus sets
        // it in every experiment, so it is accepted with a note rather than refused.
        if (v == "cyclic")
          plumbing("--dataloader-type", "cyclic",
                   "samples are read in the single loader's order; cyclic's extra per-epoch "
                   "reshuffle (PyTorch's generator) is not reproduced, so the same samples "
                   "come in another order")
              .set(o, v);
        if (v == "external")
          throw NotBuiltError("--dataloader-type " + v, "the external data loader");
        if (v != "single" && v != "cyclic")
          throw UsageError("--dataloader-type: '" + v + "' is not one of single, cyclic, external");
      },
      nullptr});

  add_optimizer_zoo_options(t);
  add_recompute_options(t);
}

}  // namespace omni::option_rows
