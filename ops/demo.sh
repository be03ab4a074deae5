#!/usr/bin/env bash
# The main job on embedded defaults, end to end through Kafka:
#   1. builds d3stream;
#   2. writes a tiny synthetic package (random weights: the answers are
#      meaningless, the machinery is real) unless --model DIR is given;
#   3. starts a local Apache Kafka broker (ops/kafka.sh) unless
#      D3_KAFKA_BOOTSTRAP names one (then D3_KAFKA_DIR must name its
#      ops/kafka.sh directory, to create the topics there);
#   4. creates a requests topic (2 partitions), a results topic and a
#      dead-letter topic;
#   5. sends the requests (default: every ops/examples/*.json, the
#      D3-Nano-NPU2 example of SPEC a.12 first), each file one record keyed
#      by its file name;
#   6. runs `d3stream serve --stop-at-end` until every request is answered;
#   7. prints each result record: its key, status and the response body.
# The broker it started is stopped at the end.
#
#   ops/demo.sh [--size tiny|lite|nano] [--model DIR] [--exactly-once] [REQUEST.json...]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# Paths given are the caller's: made absolute before the cd below.
abs() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

SIZE=tiny
MODEL=""
EOS=()
REQS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --size) SIZE="$2"; shift 2 ;;
    --model) MODEL="$(abs "$2")"; shift 2 ;;
    --exactly-once) EOS=(--exactly-once); shift ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; # the header above
    -*) echo "demo.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) REQS+=("$(abs "$1")"); shift ;;
  esac
done
cd "$ROOT"
for f in ${REQS[@]+"${REQS[@]}"}; do
  [ -r "$f" ] || { echo "demo.sh: cannot read $f" >&2; exit 2; }
done
[ -z "$MODEL" ] || [ -d "$MODEL" ] || { echo "demo.sh: --model $MODEL is not a directory" >&2; exit 2; }
if [ ${#REQS[@]} -eq 0 ]; then
  REQS=(ops/examples/d3-nano-npu2.json)
  for f in ops/examples/*.json; do
    [ "$f" = ops/examples/d3-nano-npu2.json ] || REQS+=("$f")
  done
fi

say() { echo "demo: $*" >&2; }

ops/setup-deps.sh >/dev/null
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "$(nproc)" --target d3stream >/dev/null

if [ -z "$MODEL" ]; then
  MODEL="$ROOT/build/_demo/d3-synthetic-$SIZE"
  if [ ! -f "$MODEL/MODEL_MANIFEST.json" ] && [ ! -f "$MODEL/MANIFEST.sha256" ]; then
    say "writing a $SIZE synthetic package (random weights: meaningless answers) to $MODEL"
    build/d3stream make-package --size "$SIZE" --seed 1 --out "$MODEL" --force >&2
  fi
fi

KDIR="$ROOT/build/_kafka-demo"
if [ -n "${D3_KAFKA_BOOTSTRAP:-}" ]; then
  BROKER="$D3_KAFKA_BOOTSTRAP"
  # ops/kafka.sh brokers refuse to create topics on first use.
  KDIR="${D3_KAFKA_DIR:?set D3_KAFKA_DIR to the ops/kafka.sh directory of that broker, for topic create}"
else
  say "starting a local Kafka broker (the first run fetches its jars from Maven Central)"
  # The trap first: a start cut short leaves a broker for it to stop.
  trap 'ops/kafka.sh stop "$KDIR" >/dev/null 2>&1 || true' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  ops/kafka.sh start "$KDIR" >&2
  BROKER="$(cat "$KDIR/bootstrap")"
fi

RUN="demo-$(date +%s)-$$"
IN="d3.requests.$RUN"
OUT="d3.results.$RUN"
DLQ="d3.dlq.$RUN"
for t in "$IN:2" "$OUT:2" "$DLQ:1"; do
  ops/kafka.sh topic create "${t%%:*}" "${t##*:}" "$KDIR" >/dev/null
done

say "sending ${#REQS[@]} requests to $IN at $BROKER"
for f in "${REQS[@]}"; do
  # One record per file: JSON text has no raw newlines inside strings, so
  # joining the lines keeps the request intact.
  tr -d '\n' <"$f" | kcat -P -b "$BROKER" -t "$IN" -k "$(basename "$f")"
done

say "serving until every request is answered"
build/d3stream serve --model "$MODEL" --brokers "$BROKER" --group "d3.demo.$RUN" \
  --input "$IN" --output "$OUT" --dlq "$DLQ" --from-beginning --stop-at-end ${EOS[@]+"${EOS[@]}"}

say "results on $OUT:"
kcat -C -b "$BROKER" -t "$OUT" -o beginning -e -q -X isolation.level=read_committed \
  -f '--- %k (partition %p, offset %o) %h\n%s\n'
