#!/usr/bin/env bash
# Installs what is needed, builds, and trains the demo: a small byte-level GPT on the
# King James Bible, on the CPU, in a few minutes. Arguments go to `omnitron train`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
bash "$root/scripts/build.sh"
exec "$root/build/omnitron" train --save "$root/build/demo-model" "$@"
