#!/usr/bin/env bash
# tests/fuzz/run.sh -- builds the libFuzzer harnesses with clang (ASan,
# UBSan made fatal) and runs each, one after the other, for SECONDS over
# its committed seeds (tests/fuzz/corpus/<name>/) and the inputs that once
# failed (tests/fuzz/regress/<name>/). What a run finds new goes to a
# scratch corpus, OUT/corpus/<name>/, that later runs start from too. A
# crash, a leak, a timeout, an out-of-memory or a sanitizer report fails
# the script, which prints the input and how to keep it as a regression
# test (the ctest fuzz_<name> replays tests/fuzz/regress/<name>/).
#
#     tests/fuzz/run.sh [SECONDS] [OUT]
#
# SECONDS per harness: the argument, else $FUZZ_SECONDS, else 60. OUT
# defaults to build/_fuzz. FUZZ_ONLY="q4nx safetensors" runs those only.
# Needs `cmake --build build` first (the Avro harness takes the generated
# build/generated/sch_avsc.c) and clang with libFuzzer (ops/setup-deps.sh:
# clang, libclang-rt-14-dev). The tokenizer's harness runs when
# D3_QWEN3_DIR holds tokenizer.json (tests/tools/fetch_qwen3_tokenizer.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SECS=${1:-${FUZZ_SECONDS:-60}}
OUT=${2:-$ROOT/build/_fuzz}
cd "$ROOT"
command -v clang >/dev/null || { echo "run.sh: clang is needed (ops/setup-deps.sh)" >&2; exit 2; }
[ -f build/generated/sch_avsc.c ] || { echo "run.sh: build first (cmake --build build)" >&2; exit 2; }
mkdir -p "$OUT/artifacts"

NAMES=(json request avro image safetensors q4nx multipart codec)
if [ -n "${D3_QWEN3_DIR:-}" ] && [ -f "$D3_QWEN3_DIR/tokenizer.json" ]; then
  NAMES+=(tokenize)
fi
[ -z "${FUZZ_ONLY:-}" ] || read -r -a NAMES <<<"$FUZZ_ONLY"

CC=(clang -std=c17 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
  -Iinclude -Ischemas -Iengine -Inpu)
pc() { pkg-config --cflags --libs "$@"; }
# The sources each harness needs besides its own file, and its libraries.
# The engine's readers call the kernels' pool (npu_parallel_for), so they
# take npu_pool.c and the CPU probe it sizes itself with.
SCH_CORE=$(ls schemas/sch_*.c | grep -v -e sch_registry -e sch_avro)
SCH_AVRO=$(ls schemas/sch_*.c | grep -v sch_registry)
ENG_ST="engine/eng_safetensors.c engine/eng_util.c npu/npu_pool.c npu/npu_cpu.c"
srcs() {
  case $1 in
  json) echo "schemas/sch_json.c schemas/sch_json_write.c -lm" ;;
  request) echo "$SCH_CORE $(pc libutf8proc) -lm" ;;
  avro) echo "$SCH_AVRO build/generated/sch_avsc.c $(pc libutf8proc avro-c jansson) -lm" ;;
  image)
    echo "schemas/sch_image.c schemas/sch_image_other.c schemas/sch_image_avif.c" \
      "schemas/sch_json.c schemas/sch_json_write.c schemas/sch_pytext.c engine/eng_image.c" \
      "engine/eng_vis_pre.c engine/eng_util.c" \
      "$(pc libutf8proc libjpeg libwebp libwebpdemux zlib jansson) -lm"
    ;;
  safetensors) echo "$ENG_ST $(pc jansson) -lm -pthread" ;;
  q4nx)
    echo "engine/eng_q4nx.c engine/eng_q4nx_layout.c engine/eng_q4nx_tiles.c" \
      "engine/eng_q4nx_vision.c $ENG_ST $(pc jansson) -lm -pthread"
    ;;
  multipart) echo "-Iops ops/ops_http_multipart.c ops/ops_base64.c $(pc jansson libmicrohttpd)" ;;
  codec) echo "-Iops ops/ops_http_codec.c $(pc zlib libzstd libmicrohttpd)" ;;
  tokenize)
    echo "engine/eng_tokenizer.c engine/eng_bpe.c engine/eng_pretok.c engine/eng_util.c" \
      "$(pc libutf8proc libpcre2-8 jansson) -lm"
    ;;
  esac
}
# libFuzzer options per harness: inputs no longer than the formats need,
# and the dictionaries of their keywords.
opts() {
  case $1 in
  json) echo "-max_len=8192" ;;
  request) echo "-max_len=8192 -dict=tests/fuzz/request.dict" ;;
  avro) echo "-max_len=8192 -malloc_limit_mb=512" ;;
  image) echo "-max_len=65536" ;;
  safetensors) echo "-max_len=16384 -dict=tests/fuzz/safetensors.dict" ;;
  q4nx) echo "-max_len=65536 -dict=tests/fuzz/q4nx.dict" ;;
  multipart) echo "-max_len=16384" ;;
  codec) echo "-max_len=16384" ;;
  tokenize) echo "-max_len=4096" ;;
  esac
}

build() { # name
  # shellcheck disable=SC2046
  "${CC[@]}" tests/fuzz/fuzz_"$1".c $(srcs "$1") -o "$OUT/fuzz_$1"
}

# The failing input: where it is, and how to keep it.
report() { # name log
  local name=$1 log=$2 art
  echo "run.sh: fuzz_$name FAILED; the end of $log:" >&2
  tail -n 60 "$log" >&2
  art=$(find "$OUT/artifacts" -name "$name-*" -newer "$OUT/artifacts/.start-$name" | head -n 1)
  [ -n "$art" ] || return 0
  local keep="tests/fuzz/regress/$name/$(basename "$art" | sed "s/^$name-//")"
  cat >&2 <<EOF
run.sh: the input is $art. Keep it as a regression test, fix the bug, and
check that the replay passes (ctest -R fuzz_$name runs it in both builds):
    mkdir -p tests/fuzz/regress/$name && cp $art $keep
    cmake --build build && build/tests/fuzz_replay_$name $keep
EOF
  if [ "$(stat -c %s "$art")" -le 65536 ]; then
    echo "run.sh: the input again, where this log is all there is (paste the lines):" >&2
    echo "mkdir -p tests/fuzz/regress/$name && base64 -d > $keep <<'B64'" >&2
    base64 -w 76 "$art" >&2
    echo "B64" >&2
  fi
}

run() { # name
  local name=$1 log="$OUT/fuzz_$1.log"
  local dirs=("$OUT/corpus/$name" "tests/fuzz/corpus/$name")
  [ -d "tests/fuzz/regress/$name" ] && dirs+=("tests/fuzz/regress/$name")
  mkdir -p "$OUT/corpus/$name"
  touch "$OUT/artifacts/.start-$name" # older inputs are kept, but not reported again
  # shellcheck disable=SC2046
  if ! "$OUT/fuzz_$name" -max_total_time="$SECS" -timeout=20 -rss_limit_mb=2048 \
    -artifact_prefix="$OUT/artifacts/$name-" -print_final_stats=1 $(opts "$name") \
    "${dirs[@]}" >"$log" 2>&1; then
    report "$name" "$log"
    return 1
  fi
  local runs cov
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1)
  echo "fuzz_$name: ${runs:-?} inputs in $SECS s, $cov, scratch corpus $(ls "$OUT/corpus/$name" | wc -l)"
}

start=$SECONDS
for name in "${NAMES[@]}"; do
  build "$name"
done
echo "run.sh: built ${#NAMES[@]} harnesses in $((SECONDS - start)) s; ${SECS} s each"
rc=0
for name in "${NAMES[@]}"; do
  run "$name" || rc=1
done
echo "run.sh: $((SECONDS - start)) s in all; $([ $rc -eq 0 ] && echo "no failure" || echo FAILED)"
exit $rc
