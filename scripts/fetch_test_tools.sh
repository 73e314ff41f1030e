#!/usr/bin/env bash
# Fetches the third-party JavaScript the tests use as independent readers (never committed;
# data/ is git-ignored): SheetJS's CRC-32C and protobuf.js, which parses .proto text at run
# time. tests/tools/read_tfevents.js decodes our TensorBoard event files with them.
#   scripts/fetch_test_tools.sh [DIR]    DIR defaults to data/test-tools under the repo root
# Writes DIR/crc32c.js and DIR/protobuf.min.js. Idempotent.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-$root/data/test-tools}"
if [[ -s "$dir/crc32c.js" && -s "$dir/protobuf.min.js" ]]; then
  echo "fetch_test_tools: ok ($dir)"
  exit 0
fi
mkdir -p "$dir"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# Pinned: a new release could change a file's place in the tarball.
CRC32C=crc-32@1.2.2
PROTOBUFJS=protobufjs@7.5.4
if ! (cd "$tmp" && npm pack --silent "$CRC32C" "$PROTOBUFJS" >/dev/null 2>"$tmp/npm.log"); then
  echo "fetch_test_tools: 'npm pack $CRC32C $PROTOBUFJS' failed:" >&2
  cat "$tmp/npm.log" >&2
  exit 1
fi
mkdir "$tmp/crc" "$tmp/pb"
tar -xzf "$tmp"/crc-32-*.tgz -C "$tmp/crc" package/crc32c.js
tar -xzf "$tmp"/protobufjs-*.tgz -C "$tmp/pb" package/dist/protobuf.min.js
mv "$tmp/crc/package/crc32c.js" "$dir/crc32c.js"
mv "$tmp/pb/package/dist/protobuf.min.js" "$dir/protobuf.min.js"
echo "fetch_test_tools: ok ($dir)"
