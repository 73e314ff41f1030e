#!/usr/bin/env bash
# `omnitron plan` against published throughput: the rows of Narayanan et al. 2021
# ("Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
# arXiv 2104.04473), Table 1: GPT models of 1.7 B to 1 T parameters on DGX A100 nodes
# (8 x A100 80GB, 8 x 200 Gb/s HDR InfiniBand), sequence 2048, vocabulary 51200, fp16,
# activation recomputation, no interleaving. Their teraFLOP/s per GPU count the recomputed
# forward too: 96 B s l h^2 (1 + s/6h + V/16lh) per iteration. Two switches say how those
# runs ran: --attention-backend local (Megatron 2021 materialised the attention scores; no
# flash attention yet) and plan's --scatter-gather-p2p (the paper's section 4.1: each TP rank
# sends 1/TP of a stage's output over its own NIC). Prints the plan's figure beside theirs;
# the issue asks for each within 15 % (docs/plan.md has the table and what each part does).
#   bench/plan_narayanan.sh [path/to/omnitron] [--micro-batch-size N]
set -euo pipefail
OMNITRON=${1:-$(dirname "$0")/../build/omnitron}
MICRO=${MICRO:-1}
# params(B) heads hidden layers TP PP GPUs batch published-TFLOP/s
ROWS="1.7 24 2304 24 1 1 32 512 137
3.6 32 3072 30 2 1 64 512 138
7.5 32 4096 36 4 1 128 512 142
18.4 48 6144 40 8 1 256 1024 135
39.1 64 8192 48 8 2 512 1536 138
76.1 80 10240 60 8 4 1024 1792 140
145.6 96 12288 80 8 8 1536 2304 148
310.1 128 16384 96 8 16 1920 2160 155
529.6 128 20480 105 8 35 2520 2520 163
1008.0 160 25600 128 8 64 3072 3072 163"
printf "%8s %5s %4s %4s %5s %6s %10s %10s %7s %9s\n" params TP PP DP GPUs batch published predicted error "GiB/rank"
worst=0
while read -r params heads hidden layers tp pp gpus batch published; do
  out=$("$OMNITRON" plan --num-layers "$layers" --hidden-size "$hidden" \
    --num-attention-heads "$heads" --seq-length 2048 --max-position-embeddings 2048 \
    --vocab-size 51200 --machine A100 --gpus "$gpus" --tensor-model-parallel-size "$tp" \
    --pipeline-model-parallel-size "$pp" --micro-batch-size "$MICRO" \
    --global-batch-size "$batch" --fp16 --recompute-granularity full \
    --attention-backend local --scatter-gather-p2p 2>&1 || true)
  step_ms=$(awk '$1 == "step" && $2 + 0 > 0 { print $2 }' <<<"$out")
  gib=$(awk '$1 == "total" { print $2 }' <<<"$out")
  if [ -z "$step_ms" ]; then echo "$params B: $out"; continue; fi
  awk -v B="$batch" -v l="$layers" -v h="$hidden" -v gpus="$gpus" -v ms="$step_ms" \
    -v pub="$published" -v params="$params" -v tp="$tp" -v pp="$pp" -v gib="$gib" 'BEGIN {
      s = 2048; V = 51200
      flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
      tflops = flops / (ms / 1000) / gpus / 1e12
      err = 100 * (tflops - pub) / pub
      printf "%7sB %5d %4d %4d %5d %6d %10.0f %10.1f %6.1f%% %9s\n", params, tp, pp,
             gpus / (tp * pp), gpus, B, pub, tflops, err, gib
    }'
done <<<"$ROWS"
