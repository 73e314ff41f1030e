// The hyper-parameters of the optimizer zoo (optim/optimizer_zoo.h): Megatron's flags for
// Lion and Muon, and omnitron's for the constants of LAMB, schedule-free and 8-bit Adam that
// Megatron-DeepSpeed leaves at their libraries' defaults (which are these flags' defaults).
#include "config/option_rows.h"
#include "optim/optimizer_zoo.h"

namespace omni::option_rows {

void add_optimizer_zoo_options(std::vector<OptionDef>& t) {
  const std::string O = "optimizer";
  auto zoo = [](Options& o) -> ZooConfig& { return o.optim.zoo; };
  t.push_back(number<double>("--lion-beta1", "X", O, "Lion: interpolation of the update's sign",
                             [zoo](Options& o) -> double& { return zoo(o).lion_beta1; }));
  t.push_back(number<double>("--lion-beta2", "X", O, "Lion: decay of its momentum",
                             [zoo](Options& o) -> double& { return zoo(o).lion_beta2; }));
  t.push_back(number<double>("--muon-momentum", "X", O, "Muon: momentum of its matrices",
                             [zoo](Options& o) -> double& { return zoo(o).muon_momentum; }));
  t.push_back(toggle("--muon-nesterov", O, "Muon: Nesterov momentum",
                     [zoo](Options& o) -> bool& { return zoo(o).muon_nesterov; }));
  t.push_back(toggle(
      "--muon-no-split-qkv", O,
      "Muon: orthogonalise the fused QKV weight as one matrix (by default its query, key and "
      "value rows apart, as Megatron)",
      [](Options& o) -> bool& { return o.muon_split_qkv; }, false));
  t.push_back(number<int>("--muon-num-ns-steps", "N", O, "Muon: Newton-Schulz iterations",
                          [zoo](Options& o) -> int& { return zoo(o).muon_num_ns_steps; }));
  add_alias(t, "--muon-ns-steps", "--muon-num-ns-steps");  // Megatron-DeepSpeed's spelling
  t.push_back(text("--muon-scale-mode", "spectral|unit_rms_norm|shape_scaling", O,
                   "Muon: the update's scale, sqrt(max(rows, cols)), sqrt(rows / cols) or "
                   "sqrt(max(1, rows / cols))",
                   [zoo](Options& o) -> std::string& { return zoo(o).muon_scale_mode; }));
  t.push_back(text("--muon-coefficient-type", "quintic|simple", O,
                   "Muon: the Newton-Schulz coefficients (emerging_optimizers' sets)",
                   [zoo](Options& o) -> std::string& { return zoo(o).muon_coefficient_type; }));
  t.push_back(
      number<double>("--muon-extra-scale-factor", "X", O, "Muon: a further factor on its update",
                     [zoo](Options& o) -> double& { return zoo(o).muon_extra_scale_factor; }));
  t.push_back(OptionDef{"--muon-scalar-optimizer", "adam", O,
                        "Muon: the optimizer of the embeddings, the output layer and the "
                        "tensors that are not 2-D (adam: AdamW with the --adam-* flags)",
                        [](Options&, const std::string& v) {
                          if (v != "adam")
                            throw NotBuiltError("--muon-scalar-optimizer " + v,
                                                "Muon with a scalar optimizer other than adam");
                        },
                        nullptr});
  t.push_back(plumbing("--muon-fp32-matmul-prec", "low|medium|high",
                       "omnitron's CPU runs Muon's Newton-Schulz iteration in fp32 (Megatron's "
                       "high); medium and low round its products to bf16 on a GPU"));
  t.push_back(
      plumbing("--muon-tp-mode", "blockwise|duplicated|distributed",
               "omnitron's Muon gathers each split matrix over the tensor-parallel group and "
               "orthogonalises it whole: every mode is the same"));
  t.push_back(plumbing("--muon-use-syrk", "", "a faster kernel for X X^T on NVIDIA GPUs"));
  t.push_back(number<double>("--lamb-min-coeff", "X", O,
                             "LAMB: lower clamp of the trust ratio (DeepSpeed FusedLamb's)",
                             [zoo](Options& o) -> double& { return zoo(o).lamb_min_coeff; }));
  t.push_back(number<double>("--lamb-max-coeff", "X", O,
                             "LAMB: upper clamp of the trust ratio (DeepSpeed FusedLamb's)",
                             [zoo](Options& o) -> double& { return zoo(o).lamb_max_coeff; }));
  t.push_back(number<int64_t>(
      "--schedulefree-warmup-steps", "N", O,
      "schedule-free: its own linear warmup over N steps, on top of the learning-rate schedule "
      "(Megatron-DeepSpeed passes --lr-warmup-iters here; 0: none)",
      [zoo](Options& o) -> int64_t& { return zoo(o).schedulefree_warmup_steps; }));
  t.push_back(number<double>("--schedulefree-r", "X", O,
                             "schedule-free: polynomial weighting power r of the average",
                             [zoo](Options& o) -> double& { return zoo(o).schedulefree_r; }));
  t.push_back(
      number<double>("--schedulefree-weight-lr-power", "X", O,
                     "schedule-free: power of the largest learning rate so far in each weight",
                     [zoo](Options& o) -> double& { return zoo(o).schedulefree_weight_lr_power; }));
  t.push_back(plumbing("--schedulefree-for-each", "",
                       "the foreach implementation computes the same update, faster"));
  t.push_back(number<double>("--sophiag-beta1", "X", O, "SophiaG: decay of its momentum",
                             [zoo](Options& o) -> double& { return zoo(o).sophiag_beta1; }));
  t.push_back(number<double>("--sophiag-beta2", "X", O, "SophiaG: decay of its Hessian estimate",
                             [zoo](Options& o) -> double& { return zoo(o).sophiag_beta2; }));
  t.push_back(number<double>("--sophiag-rho", "X", O, "SophiaG: clipping threshold rho",
                             [zoo](Options& o) -> double& { return zoo(o).sophiag_rho; }));
  t.push_back(number<int64_t>(
      "--adam8bit-min-8bit-size", "N", O,
      "adam8bit: tensors with fewer elements keep 32-bit moments (bitsandbytes' min_8bit_size)",
      [zoo](Options& o) -> int64_t& { return zoo(o).adam8bit_min_8bit_size; }));
  t.push_back(number<int64_t>("--galore-rank", "N", O,
                              "GaLore: rank of the projection (at most the matrix's shorter side)",
                              [zoo](Options& o) -> int64_t& { return zoo(o).galore_rank; }));
  t.push_back(number<int64_t>(
      "--galore-update-proj-gap", "N", O,
      "GaLore: steps between projections, each from the SVD of the current gradient",
      [zoo](Options& o) -> int64_t& { return zoo(o).galore_update_proj_gap; }));
  t.push_back(number<double>("--galore-scale", "X", O,
                             "GaLore: factor on the update projected back",
                             [zoo](Options& o) -> double& { return zoo(o).galore_scale; }));
  t.push_back(text("--galore-proj-type", "std|reverse_std|left|right", O,
                   "GaLore: the side projected (std: the shorter one; reverse_std: the longer)",
                   [zoo](Options& o) -> std::string& { return zoo(o).galore_proj_type; }));
  t.push_back(number<int64_t>(
      "--shampoo-update-freq", "N", O,
      "Shampoo: steps between inverse roots of its preconditioners (also the first step that "
      "preconditions; Adam's direction before it)",
      [zoo](Options& o) -> int64_t& { return zoo(o).shampoo_update_freq; }));
  add_alias(t, "--dshampooadamw-precondition-freq", "--shampoo-update-freq");
  t.push_back(number<double>("--shampoo-eps", "X", O,
                             "Shampoo: epsilon added to the preconditioners before their roots",
                             [zoo](Options& o) -> double& { return zoo(o).shampoo_eps; }));
  add_alias(t, "--dshampooadamw-eps", "--shampoo-eps");
  t.push_back(number<int64_t>(
      "--shampoo-max-preconditioner-dim", "N", O,
      "Shampoo: longer sides are cut into blocks of N, each preconditioned apart",
      [zoo](Options& o) -> int64_t& { return zoo(o).shampoo_max_preconditioner_dim; }));
  add_alias(t, "--dshampooadamw-max-preconditioner-dim", "--shampoo-max-preconditioner-dim");
}

// The zoo's checks, and Muon's QKV split from the model's attention shape.
void finalize_optimizer_zoo(Options& o) {
  const OptimizerKind kind = o.optim.kind;
  if (!is_zoo_optimizer(kind)) return;
  const std::string opt = "--optimizer " + o.optimizer;
  if (zoo_whole_only(kind)) {  // GaLore and Shampoo keep per-matrix states whole
    // Both shard by whole tensors under the distributed optimizer (zoo_galore.cpp,
    // zoo_shampoo.cpp) and assemble tensor-parallel slices' whole matrices
    // (WholeTensorStates); with ZeRO's sharded gradients and parameters they are not built.
    if (o.use_distributed_optimizer && o.zero_stage >= 2)
      throw NotBuiltError(opt + " with --zero-stage " + std::to_string(o.zero_stage),
                          "its whole-matrix steps are not built on ZeRO's sharded "
                          "gradients and parameters; use --zero-stage 1 (the "
                          "distributed optimizer)");
  }
  // Expert parallelism needs no refusal: every zoo optimizer's per-tensor quantities take each
  // expert of a stacked expert tensor on its own (LAMB's norms, adam8bit's blocks: zoo_tensors;
  // Muon's, Shampoo's and GaLore's matrices: is_expert_matrices), as on one rank.
  const ZooConfig& z = o.optim.zoo;
  OMNI_REQUIRE(z.lion_beta1 >= 0 && z.lion_beta1 <= 1 && z.lion_beta2 >= 0 && z.lion_beta2 < 1,
               "--lion-beta1 must be in [0, 1] and --lion-beta2 in [0, 1)");
  OMNI_REQUIRE(z.sophiag_beta1 >= 0 && z.sophiag_beta1 < 1 && z.sophiag_beta2 >= 0 &&
                   z.sophiag_beta2 < 1 && z.sophiag_rho >= 0,
               "--sophiag-beta1 and --sophiag-beta2 must be in [0, 1) and --sophiag-rho 0 or more");
  OMNI_REQUIRE(z.muon_momentum >= 0 && z.muon_momentum < 1, "--muon-momentum must be in [0, 1)");
  OMNI_REQUIRE(z.muon_num_ns_steps >= 1, "--muon-num-ns-steps must be at least 1 (got ",
               z.muon_num_ns_steps, ")");
  OMNI_REQUIRE(z.lamb_min_coeff > 0 && z.lamb_min_coeff <= z.lamb_max_coeff, "--lamb-min-coeff (",
               z.lamb_min_coeff, ") must be positive and at most --lamb-max-coeff (",
               z.lamb_max_coeff, ")");
  OMNI_REQUIRE(z.schedulefree_warmup_steps >= 0, "--schedulefree-warmup-steps must be 0 or more");
  OMNI_REQUIRE(z.adam8bit_min_8bit_size >= 0, "--adam8bit-min-8bit-size must be 0 or more");
  OMNI_REQUIRE(z.galore_rank >= 1 && z.galore_update_proj_gap >= 1,
               "--galore-rank and --galore-update-proj-gap must be at least 1 (got ", z.galore_rank,
               " and ", z.galore_update_proj_gap, ")");
  OMNI_REQUIRE(z.galore_proj_type == "std" || z.galore_proj_type == "reverse_std" ||
                   z.galore_proj_type == "left" || z.galore_proj_type == "right",
               "--galore-proj-type: '", z.galore_proj_type,
               "' is not one of std, reverse_std, left, right");
  OMNI_REQUIRE(
      z.shampoo_update_freq >= 1 && z.shampoo_max_preconditioner_dim >= 1 && z.shampoo_eps >= 0,
      "--shampoo-update-freq and --shampoo-max-preconditioner-dim must be at least 1 "
      "and --shampoo-eps 0 or more");
  if (kind == OptimizerKind::SGDScheduleFree)  // the reference refuses a momentum of 0 or 1
    OMNI_REQUIRE(o.optim.sgd_momentum > 0 && o.optim.sgd_momentum < 1, opt,
                 " needs --sgd-momentum in (0, 1), got ", o.optim.sgd_momentum);
  o.optim.zoo.qkv_split_shapes.clear();
  if (kind == OptimizerKind::Muon && o.muon_split_qkv) {
    const TransformerConfig& m = o.model;
    const int64_t kv = m.head_dim();
    o.optim.zoo.qkv_split_shapes = {m.num_attention_heads / m.query_groups() * kv, kv, kv};
  }
}

}  // namespace omni::option_rows
