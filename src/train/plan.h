// `omnitron plan`: what a training run will need and how long its steps will take, before it
// runs. Given a model (TransformerConfig), a parallel layout (Options, as `omnitron train`
// takes them) and a machine (a PlanDevice), it predicts each rank's memory and the step time
// with its parts. Every figure carries the one line that says where it comes from, and the
// formula behind it for --explain.
//
// The memory model is omnitron's own trainer: the same tensors GPTModel allocates (its
// activations per micro-batch in flight, as the pipeline schedule keeps them), ParameterSet's
// flat buffers and the optimizer's states, so tests/train/test_plan.cpp compares it with
// what a small model really allocates. The time model is analytic: Megatron's 2021 FLOP formula
// (train/flops.h, narayanan_flops_per_iteration) as matrix products at a per-size efficiency of
// the device's peak (each product of the model's layers at its own shape: attention's or MLA's
// projections, the dense MLP, an MoE layer's router, experts and shared expert) plus the
// memory-bound passes at its memory bandwidth on GPUs (one measured fraction on the CPU), ring
// collectives at the link bandwidth, and the 1F1B bubble of Narayanan et al. 2021.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/options.h"
#include "parallel/schedules.h"

namespace omni {

// A machine's accelerator and its links, from the vendor's published figures (the table's
// rows cite them), or this machine's CPU as measured.
struct PlanDevice {
  std::string name;         // "H100", "cpu"
  std::string description;  // "NVIDIA H100 SXM5 80GB"
  double bf16_tflops = 0;   // dense (not 2:4 sparse) bf16/fp16 matrix peak per rank
  double fp32_tflops = 0;   // fp32 peak per rank (no TF32)
  double memory_gib = 0;    // per rank
  double hbm_gbps = 0;      // device memory bandwidth per rank, GB/s
  double intra_gbps = 0;    // per rank, one direction, to ranks of the same node, GB/s
  double inter_gbps = 0;    // per rank, one direction, to other nodes, GB/s
  int ranks_per_node = 8;
  // The fraction of peak that training's matrix products sustain, and of the link bandwidth
  // that ring collectives reach (each row says why).
  // On the CPU (and on a GPU given --compute-efficiency or without gemm_efficiency) one
  // sustained fraction of peak for all the compute.
  double compute_efficiency = 0.55;
  // The CPU's under --bf16 (its bf16 GEMMs' rate; 0: compute_efficiency).
  double bf16_compute_efficiency = 0;
  double link_efficiency = 0.8;
  // GPUs: the fraction of peak a matrix product of at least `first` GFLOP sustains (largest
  // first; plan_devices.cpp says where each comes from), the elementwise and attention-score
  // traffic at hbm_efficiency of hbm_gbps (Calculon's, Isaev et al. SC'23, for transfers of
  // 100 MB and more). Empty: compute_efficiency for everything, no traffic term.
  std::vector<std::pair<double, double>> gemm_efficiency;
  double hbm_efficiency = 0.9;
  bool host_memory = false;  // cpu: ranks share the host; bf16 is stored and computed as fp32
  // Dropout mask elements per second drawn outside fused kernels (billions); 0: the device
  // applies dropout inside its attention and bias-dropout-add kernels, at no counted time.
  double dropout_gelems = 0;
  std::string source;  // where the figures come from
};

// The names plan_device() knows, for messages and --help.
std::vector<std::string> plan_device_names();
// The row for `name` (case-insensitive: "h100", "MI300X"); "cpu" measures this machine's CPU
// (sgemm and dropout-mask rates at a rank's share of the threads; memory and copy bandwidth
// divided) for `ranks_on_host` ranks.
// Throws UsageError naming the known devices for an unknown name.
PlanDevice plan_device(const std::string& name, int ranks_on_host);

// One figure with its explanation: `why` says in one line what was counted, `formula` the
// general rule (--explain).
struct PlanFigure {
  std::string name;
  double value = 0;  // bytes for memory, seconds for time
  std::string why;
  std::string formula;
};

// The layout of one plan (Options' names; `gpus` is the whole world).
struct PlanLayout {
  int gpus = 1, tp = 1, cp = 1, pp = 1, vp = 1, dp = 1;
  int ep = 1;  // --expert-model-parallel-size: MoE layers' experts split over EP of the DP ranks
  // --expert-tensor-parallel-size: each routed expert's width split over ETP ranks. 0: TP's
  // (Megatron's default); expert_tp() is the one place the plan reads it. Other than TP (a
  // divisor of it, with SP) the experts have their own grid, ETP x EP x EDP x PP
  // (comm/process_grid.h), and each block of ETP tensor-parallel ranks routes only its
  // sequence-parallel rows. Above TP (a multiple of it, with SP under TP > 1) every rank
  // routes its own rows and its experts' rows are gathered over the ETP ranks, ETP/TP dense
  // tensor-parallel groups (model/moe_layer.h).
  int etp = 0;
  int expert_tp() const { return etp > 0 ? etp : tp; }
  // Over how many ranks an expert's rows are gathered: ETP above TP, else 1 (the rows a rank's
  // experts run are ETP x its own under alltoall; allgather gathers the tokens over ETP x EP).
  int expert_gather() const { return expert_tp() > tp ? expert_tp() : 1; }
  // The expert grid's data-parallel size, gpus / (ETP x EP x PP): the ranks holding the same
  // experts, over which their gradients are reduced and their optimizer states sharded.
  int expert_dp() const { return gpus / (expert_tp() * ep * pp); }
  // Into how many blocks a micro-batch's b s/CP tokens split for the routing: 1 when every
  // TP rank routes them all (ETP = TP), TP / ETP when each block of ETP ranks routes its own,
  // TP when each rank routes its own sequence-parallel rows (ETP > TP).
  int routing_blocks() const {
    return expert_tp() < tp ? tp / expert_tp() : expert_tp() > tp ? tp : 1;
  }
  // --cp-comm-type: "p2p" (ring attention: keys and values passed around the CP ranks) or
  // "a2a" (DeepSpeed-Ulysses, parallel/ulysses.h: all-to-alls trading the sequence split for a
  // split of the heads, heads and query groups divisible by TP x CP).
  std::string cp_comm_type = "p2p";
  bool ulysses() const { return cp > 1 && cp_comm_type == "a2a"; }
  int micro_batch = 1, global_batch = 1;
  bool sequence_parallel = false, distributed_optimizer = false, overlap_grad_reduce = false;
  int zero_stage = 0;     // 2: gradients sharded too, 3: parameters too
  std::string recompute;  // "", "full" or "selective"
  std::string recompute_method;
  int recompute_num_layers = 0;
  int first_stage_layers = 0, last_stage_layers = 0;  // uneven pipeline split; 0: even
  std::string precision = "fp32";                     // "bf16", "fp16" or "fp32"
  // --attention-backend: "local" or "unfused" is Megatron's attention that materialises the
  // b x heads x s x s scores (the 2021 runs'); anything else is flash-style (omnitron's GPU
  // kernels, cuDNN), no score matrix. The CPU has one attention and ignores it.
  std::string attention_backend = "auto";
  // Megatron 2021's scatter/gather of the pipeline's sends (plan's --scatter-gather-p2p): each
  // TP rank sends 1/TP of the activation over its own NIC, the receivers all-gather it in the
  // node. omnitron's pipeline sends the whole tensor from every TP rank.
  bool scatter_gather_p2p = false;
  int micro_batches() const { return global_batch / (micro_batch * dp); }
  std::string describe() const;  // "TP 2 x CP 1 x PP 2 x DP 2, micro-batch 1, ..."
};

// Everything a plan says.
struct Plan {
  TransformerConfig model;
  PlanDevice device;
  PlanLayout layout;
  int stage = 0;                   // the pipeline rank whose memory is reported (the largest)
  std::vector<PlanFigure> memory;  // per rank, bytes; the last is the total
  std::vector<PlanFigure> time;    // per step, seconds; the last is the total
  double memory_bytes() const { return memory.back().value; }
  double step_seconds() const { return time.back().value; }
  bool fits() const;  // total memory within the device's
  double tokens_per_second() const;
  double model_tflops_per_rank() const;  // the 2021 formula's FLOPs / step time / ranks
};

// The layout that `opts` names (finalized Options: data_parallel_size set from `gpus`).
PlanLayout plan_layout(const Options& opts, int gpus);

// Per-rank parameter count of pipeline rank `stage` (each rank of a tensor-parallel group holds
// as many), as GPTModel's parameter_layout lays them out.
int64_t plan_rank_parameters(const TransformerConfig& c, const PlanLayout& l, int stage);
// Of those, the routed experts' (E/EP experts of each MoE layer): reduced and, with the
// distributed optimizer, sharded over the expert-data-parallel group (expert_dp() ranks).
int64_t plan_rank_expert_parameters(const TransformerConfig& c, const PlanLayout& l, int stage);
// Activation bytes that GPTModel::activation_bytes() reports on pipeline rank `stage` after a
// step: residual streams and the tensors each layer keeps, for every micro-batch the schedule
// holds at once, and recompute's scratch layer. `element_bytes`: the storage type's size.
int64_t plan_activation_bytes(const TransformerConfig& c, const PlanLayout& l, int stage,
                              int element_bytes);
// Bytes one MoE layer keeps for its backward per micro-batch on a rank (MoELayer::
// activation_bytes after a training forward): every TP rank routes the micro-batch's whole
// b s/CP tokens (gathered under SP) with the replicated router (ETP < TP: its block's
// 1/routing_blocks() of them, ETP > TP: its own 1/TP, the shared expert still all); its
// experts' rows are the expected top-k x tokens when dropless (exact for EP 1; under EP the
// mean over the expert-parallel ranks, the peak rank's depending on the routing balance),
// E x capacity with --moe-pad-expert-input-to-capacity, ETP times that under ETP > TP (the
// ETP ranks' rows gathered), each row 1/ETP of the experts' width; the shared expert 1/TP of
// its width on every token; allgather's gathered tokens (EP x b s/CP rows, ETP x EP x those
// of ETP > TP) or alltoall's (and ETP > TP's exchange's) returned rows. `element_bytes`: the storage type's size (16-bit: the router's
// tensors float, as the model keeps them).
int64_t plan_moe_layer_bytes(const TransformerConfig& c, const PlanLayout& l, int element_bytes);
// MoELayer::Scratch (model/moe_buffer.h): the one set of backward temporaries a model's MoE
// layers share, each buffer at its largest use; with the expected rows at a rank's experts
// (plan_moe_layer_bytes' rows), exact for EP 1 and capacity padding, under EP a rank's grows to
// the most rows its experts receive in any layer and micro-batch of the step.
int64_t plan_moe_scratch_bytes(const TransformerConfig& c, const PlanLayout& l, int element_bytes);
// The experts' traffic one rank sends per step on pipeline rank `stage` (the algorithmic bytes
// of comm/counting_communicator.h: (n-1)/n of an all-gather's or reduce-scatter's whole
// buffer, 2 (n-1)/n of an all-reduce's, what a send sends), per group of the expert grid, with
// `element_bytes` the storage type's size (the routing travels in the router's type).
struct PlanExpertTraffic {
  // alltoall at EP > 1 (the EP group): each MoE layer's dispatch and combine of the rank's
  // top-k rows, forward and backward, (EP-1)/EP of them leaving (expected when dropless).
  double ep = 0;
  // allgather over the expert grid's tp x ep group (EP ranks at ETP <= TP, ETP x EP above):
  // the routing and tokens gathered and the outputs reduce-scattered forward; the output
  // gradients gathered, the input and probability gradients reduce-scattered backward.
  double gather = 0;
  int gather_ranks = 1;
  // alltoall at ETP > TP (the expert tensor-parallel group, parallel/expert_dispatch.h's
  // ExpertTensorExchange): per MoE layer the counts of the rank's E/EP experts all-gathered,
  // then its rows sent to the other ETP-1 ranks four times (the rows and the output
  // gradients gathered, the slices' outputs and input gradients reduce-scattered).
  double expert_tp = 0;
  // The experts' gradients reduced over the expert-data-parallel group (all-reduce; with the
  // distributed optimizer reduce-scatter + the parameters' all-gather), when it is not the
  // dense DP x CP group; P_e x the gradient bytes (4: the reduction's float buffers).
  double expert_dp = 0;
  int moe_layers = 0;  // the stage's MoE layers
};
PlanExpertTraffic plan_expert_traffic(const TransformerConfig& c, const PlanLayout& l, int stage,
                                      int element_bytes, double grad_bytes = 4);

// The bytes one rank sends over the context-parallel group per step on pipeline rank `stage`
// under Ulysses (--cp-comm-type a2a; 0 otherwise), as comm/counting_communicator.h counts an
// all-to-all ((CP-1)/CP of the rank's buffer): per layer and micro-batch the forward's four
// all-to-alls (q, k, v to heads, the output back) and the backward's four (d(out) to heads,
// d(q), d(k), d(v) back), each of the rank's b s/CP rows of its TP share's H (query, output)
// or G (key, value) heads; four more for each recomputed forward; `element_bytes` the storage
// type's size. The last stage's multi-token-prediction depths count as layers.
double plan_ulysses_bytes(const TransformerConfig& c, const PlanLayout& l, int stage,
                          int element_bytes);

// Bytes one multi-latent-attention layer keeps besides the attention's q, k, v (per micro-batch,
// on a rank: the latents, their norms, the up-projection's keys and values of this rank's
// heads, the rope key), as GPTModel::allocate_mla allocates them; 0 for other models.
int64_t plan_mla_layer_bytes(const TransformerConfig& c, const PlanLayout& l, int element_bytes);
// The model chunks of pipeline rank `stage` (pipeline_rank_layers), and per chunk the most
// micro-batches that hold activations at once in its schedule (pipeline_schedule), which is
// how many activation slots the pipeline executor allocates.
std::vector<LayerRange> plan_stage_layers(const TransformerConfig& c, const PlanLayout& l,
                                          int stage);
std::vector<int> plan_slots_in_flight(const PlanLayout& l, int stage);
// Whether the `index_in_chunk`-th layer of a model chunk runs its forward again (full
// recompute: every layer, or under the block method the chunk's first recompute_num_layers).
bool plan_layer_recomputed(const PlanLayout& l, int index_in_chunk);
// GPTModel's scratch (allocated once), the last stage's final-norm tensors per micro-batch
// in flight and each micro-batch's staged token ids: what activation_bytes() leaves out, as
// GPTModel::workspace_bytes() reports it after a step. `host_tables`: the rope tables are the
// CPU's (double) rather than a GPU's (float).
int64_t plan_workspace_bytes(const TransformerConfig& c, const PlanLayout& l, int stage,
                             int element_bytes, bool host_tables = false);
// Megatron's activation memory per layer in bytes (Korthikanti et al. 2022, Table 2: 16-bit
// activations, dropout masks, attention scores kept unless recomputed), for comparison.
double korthikanti_layer_bytes(const TransformerConfig& c, const PlanLayout& l);

// The plan of one layout. Throws UsageError for a layout the model cannot take (naming the
// flag), as `omnitron train` would.
Plan make_plan(const TransformerConfig& model, const PlanLayout& layout, const PlanDevice& device);

// --search: every layout of `gpus` ranks (TP within a node, PP, CP, micro-batch, recompute,
// interleaving; SP and the distributed optimizer where they apply; under CP > 1 the ring and,
// unless `keep_cp_comm` (then base.cp_comm_type), Ulysses where the heads split; for MoE
// models expert parallelism over the divisors of the experts count that divide DP x CP,
// unless `keep_ep`: then base.ep, as the user gave it; and the experts' tensor parallelism
// ETP = TP, ETP 1 under TP > 1 and ETP 2 TP where it fits a node, unless `keep_etp`: then
// base.etp) for `global_batch`, the fitting ones fastest first (at most `top`), and how many
// were tried and did not fit.
struct PlanSearch {
  std::vector<Plan> fitting;
  int tried = 0, too_big = 0;
  bool searched_ep = false;   // the layouts' EP varied
  bool searched_etp = false;  // ETPs other than TP's were tried beside it
  bool searched_cp_comm = false;  // Ulysses (a2a) tried beside the ring under CP > 1
  Plan smallest;  // the layout that needs the least memory (for the message when none fits)
};
PlanSearch search_plans(const TransformerConfig& model, const PlanLayout& base,
                        const PlanDevice& device, int top, bool keep_ep = false,
                        bool keep_etp = false, bool keep_cp_comm = false);

}  // namespace omni
