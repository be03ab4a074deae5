#!/usr/bin/env bash
# The main job on embedded defaults: builds d3stream, writes a tiny synthetic
# package (random weights: the answers are meaningless, the machinery is
# real) and answers the D3-Nano-NPU2 example request with it, printing the
# exact response body the HTTP shim will send.
#   ops/demo.sh [REQUEST.json] [make-package options...]
# e.g. ops/demo.sh ops/examples/d3-nano-npu2.json --size nano
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
ops/setup-deps.sh >/dev/null
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "$(nproc)" --target d3stream >/dev/null
REQ="${1:-ops/examples/d3-nano-npu2.json}"
shift || true
SIZE=tiny
ARGS=("$@")
for ((i = 0; i < ${#ARGS[@]}; i++)); do
  [ "${ARGS[$i]}" = "--size" ] && SIZE="${ARGS[$((i + 1))]}"
done
PKG="$ROOT/build/_demo/d3-synthetic-$SIZE"
if [ ! -f "$PKG/MODEL_MANIFEST.json" ] && [ ! -f "$PKG/MANIFEST.sha256" ]; then
  build/d3stream make-package --size "$SIZE" --seed 1 --out "$PKG" --force "$@" >&2
fi
echo "request: $REQ, package: $PKG (synthetic: meaningless answers)" >&2
exec build/d3stream ask --model "$PKG" "$REQ"
