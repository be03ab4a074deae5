#!/usr/bin/env bash
# tests/fuzz/run.sh -- builds the libFuzzer harnesses with clang (ASan +
# UBSan) and runs each for SECONDS (default 60) over its seed corpus; a
# crash, leak or sanitizer report fails the script and leaves the input in
# OUT/artifacts. Not part of ctest or CI (clang and minutes of CPU); run it
# after changing a parser.
#
#     tests/fuzz/run.sh [SECONDS] [OUT]       # OUT defaults to build/_fuzz
#
# Needs `cmake --build build` first (the Avro harness takes the generated
# build/generated/sch_avsc.c) and clang (apt-get install clang). With
# D3_QWEN3_DIR set (tests/tools/fetch_qwen3_tokenizer.sh) the tokenizer's
# harness runs too.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SECS=${1:-60}
OUT=${2:-$ROOT/build/_fuzz}
cd "$ROOT"
command -v clang >/dev/null || { echo "run.sh: clang is needed (apt-get install clang)" >&2; exit 2; }
[ -f build/generated/sch_avsc.c ] || { echo "run.sh: build first (build/generated/sch_avsc.c)" >&2; exit 2; }
mkdir -p "$OUT/artifacts"
CC=(clang -std=c17 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Ischemas)
SCH_CORE=$(ls schemas/sch_*.c | grep -v -e sch_registry -e sch_avro)
SCH_AVRO=$(ls schemas/sch_*.c | grep -v sch_registry)
# shellcheck disable=SC2046,SC2086
{
  "${CC[@]}" schemas/sch_json.c schemas/sch_json_write.c tests/fuzz/fuzz_json.c -lm \
    -o "$OUT/fuzz_json"
  "${CC[@]}" $SCH_CORE tests/fuzz/fuzz_request.c $(pkg-config --cflags --libs libutf8proc) -lm \
    -o "$OUT/fuzz_request"
  "${CC[@]}" $SCH_AVRO build/generated/sch_avsc.c tests/fuzz/fuzz_avro.c \
    $(pkg-config --cflags --libs libutf8proc avro-c jansson) -lm -o "$OUT/fuzz_avro"
  "${CC[@]}" -Iengine -Inpu schemas/sch_image.c schemas/sch_image_other.c schemas/sch_image_avif.c \
    schemas/sch_json.c \
    schemas/sch_json_write.c schemas/sch_pytext.c engine/eng_image.c engine/eng_vis_pre.c \
    engine/eng_util.c \
    tests/fuzz/fuzz_image.c \
    $(pkg-config --cflags --libs libutf8proc libjpeg libwebp libwebpdemux zlib jansson) -lm \
    -o "$OUT/fuzz_image"
  if [ -n "${D3_QWEN3_DIR:-}" ]; then
    "${CC[@]}" -Iengine -Inpu engine/eng_tokenizer.c engine/eng_bpe.c engine/eng_pretok.c \
      engine/eng_util.c tests/fuzz/fuzz_tokenize.c \
      $(pkg-config --cflags --libs libutf8proc libpcre2-8 jansson) -lm -o "$OUT/fuzz_tokenize"
  fi
} 2>&1 | grep -v '^/usr/bin/ld: /tmp/' || true

# Seed corpora: the contract's bodies (JSON, and framed Avro made from them
# by the seed mode of fuzz_avro's build below) and the golden images.
mkdir -p "$OUT/corpus/json" "$OUT/corpus/avro" "$OUT/corpus/image"
python3 - "$OUT/corpus/json" <<'PY'
import json, sys, hashlib, os
for line in open("tests/contract/cases.jsonl"):
    b = json.loads(line).get("body")
    if isinstance(b, str) and len(b) < 8192:
        d = b.encode()
        open(os.path.join(sys.argv[1], hashlib.sha1(d).hexdigest()), "wb").write(d)
PY
cp tests/golden/image/src/* "$OUT/corpus/image/"
"${CC[@]/-fsanitize=fuzzer,address,undefined/-fsanitize=address,undefined}" -DFUZZ_AVRO_SEEDS \
  $SCH_AVRO build/generated/sch_avsc.c tests/fuzz/fuzz_avro.c \
  $(pkg-config --cflags --libs libutf8proc avro-c jansson) -lm -o "$OUT/avro_seeds" 2>&1 |
  grep -v '^/usr/bin/ld: /tmp/' || true
"$OUT/avro_seeds" "$OUT/corpus/json" "$OUT/corpus/avro"

rc=0
run() { # name corpus [flags...]
  local name=$1 corpus=$2
  shift 2
  echo "== $name: ${SECS} s"
  if ! "$OUT/$name" -max_total_time="$SECS" -timeout=20 -rss_limit_mb=4096 \
      -artifact_prefix="$OUT/artifacts/$name-" -print_final_stats=1 "$@" "$corpus" \
      >"$OUT/$name.log" 2>&1; then
    echo "run.sh: $name FAILED: see $OUT/$name.log and $OUT/artifacts/" >&2
    rc=1
  fi
  grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb' "$OUT/$name.log" || true
}
run fuzz_json "$OUT/corpus/json" -max_len=4096
run fuzz_request "$OUT/corpus/json" -max_len=8192 -dict=tests/fuzz/request.dict
run fuzz_avro "$OUT/corpus/avro" -max_len=4096 -malloc_limit_mb=512
run fuzz_image "$OUT/corpus/image" -max_len=65536
if [ -n "${D3_QWEN3_DIR:-}" ]; then
  run fuzz_tokenize "$OUT/corpus/json" -max_len=4096
fi
exit $rc
