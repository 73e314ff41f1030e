#!/usr/bin/env bash
# Installs what is needed, builds, and trains the demo: a small byte-level GPT on the
# King James Bible, on the CPU, in a few minutes, saved to build/demo-model.
# Arguments go to `omnitron train` and override the demo preset.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
bash "$root/scripts/build.sh"
exec "$root/build/omnitron" train "$@"
