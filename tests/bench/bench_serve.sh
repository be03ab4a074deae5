#!/usr/bin/env bash
# Throughput of the stream processor: broker -> d3stream serve -> broker.
#
#   tests/bench/bench_serve.sh [N] [serve options...]
#   BENCH_INVALID=1 tests/bench/bench_serve.sh [N]   the stream path alone
#   BENCH_TOKENIZER=build/_fetch/qwen3-tokenizer tests/bench/bench_serve.sh [N]
#   BENCH_REPEATS=0.5 tests/bench/bench_serve.sh [N] [--result-cache-entries 0]
#
# Preloads N requests (default 5000, tests/bench/gen_requests.py: short
# ticket-routing states, 1-3 questions each) into a fresh 4-partition topic,
# then times `d3stream serve --stop-at-end` from its start until it exits
# with every result delivered (and committed), on the tiny synthetic package,
# and prints requests/s, questions/s and the engine's token counts (from the
# metrics file). BENCH_INVALID=1 sends requests that all fail validation
# (400 without the engine): the capacity of the Kafka path itself.
# BENCH_REPEATS=F: every request new (a ticket number in its state) or,
# with probability F, a repeat of an earlier one (gen_requests.py
# --repeats); the result cache's hits and joins are printed. The broker is the one D3_KAFKA_BOOTSTRAP names, else a
# fresh one from ops/kafka.sh in build/_kafka-bench (stopped at the end).
# A benchmark, not a test: the figure depends on the machine and its load;
# compare runs made side by side.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
N="${1:-5000}"
shift || true
BIN="${D3STREAM:-$ROOT/build/d3stream}"
# BENCH_TOKENIZER=DIR: the tiny package with that (Qwen) tokenizer, whose
# prompts are as long as the real package's (the tiny package's own 548-id
# tokenizer makes them ~2.6x longer).
if [ -n "${BENCH_TOKENIZER:-}" ]; then
  PKG="$ROOT/build/_demo/d3-synthetic-tiny-$(basename "$BENCH_TOKENIZER")"
  TOKOPT=(--tokenizer "$BENCH_TOKENIZER")
else
  PKG="$ROOT/build/_demo/d3-synthetic-tiny"
  TOKOPT=()
fi
[ -f "$PKG/MODEL_MANIFEST.json" ] ||
  "$BIN" make-package --size tiny --seed 1 ${TOKOPT[@]+"${TOKOPT[@]}"} --out "$PKG" --force >&2

KDIR="$ROOT/build/_kafka-bench"
if [ -n "${D3_KAFKA_BOOTSTRAP:-}" ]; then
  BROKER="$D3_KAFKA_BOOTSTRAP"
  KDIR="${D3_KAFKA_DIR:?set D3_KAFKA_DIR to the ops/kafka.sh directory of that broker, for topic create}"
else
  # The trap first: a start cut short leaves a broker for it to stop.
  trap 'ops/kafka.sh stop "$KDIR" >/dev/null 2>&1 || true' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  ops/kafka.sh start "$KDIR" >&2
  BROKER="$(cat "$KDIR/bootstrap")"
fi

RUN="bench-$(date +%s)-$$"
WORK="$(mktemp -d)"
ops/kafka.sh topic create "$RUN.in" 4 "$KDIR" >/dev/null
ops/kafka.sh topic create "$RUN.out" 4 "$KDIR" >/dev/null
tests/bench/gen_requests.py "$N" 1 ${BENCH_INVALID:+--invalid} \
  ${BENCH_REPEATS:+--repeats "$BENCH_REPEATS"} >"$WORK/requests.tsv"
QUESTIONS=$(python3 -c "
import json,sys
print(sum(len(json.loads(l.split('\t',1)[1])['questions']) for l in open('$WORK/requests.tsv')))")
kcat -P -b "$BROKER" -t "$RUN.in" -K$'\t' -l "$WORK/requests.tsv"
echo "bench_serve: $N requests ($QUESTIONS questions) preloaded in $RUN.in; package $PKG" >&2

t0=$(date +%s.%N)
"$BIN" serve --model "$PKG" --brokers "$BROKER" --group "$RUN" --input "$RUN.in" \
  --output "$RUN.out" --from-beginning --stop-at-end --metrics-file "$WORK/metrics.prom" "$@" \
  2>"$WORK/serve.log" || { tail -20 "$WORK/serve.log" >&2; exit 1; }
t1=$(date +%s.%N)

got=$(kcat -C -b "$BROKER" -t "$RUN.out" -o beginning -e -q -f '%o\n' | wc -l)
metric() { awk -v m="$1" '$1 == m { print $2 }' "$WORK/metrics.prom"; }
TOK="$(metric d3stream_engine_input_tokens_total)"
COMP="$(metric d3stream_engine_computed_tokens_total)"
HITS="$(metric d3stream_result_cache_hits_total)"
JOINS="$(metric d3stream_engine_joins_total)"
# The steady rate: from the first result logged to the last, leaving out
# the start (package load, golden check, the producer's id and the group
# join: ~1.3 s against a fresh topic here), which is the same whatever
# the engine does and so compresses every ratio of two runs.
STEADY=$(python3 - "$WORK/serve.log" <<'PY'
import sys, datetime
ts = [l.split(" ", 1)[0][3:] for l in open(sys.argv[1]) if " msg=result " in l and l.startswith("ts=")]
t = [datetime.datetime.strptime(x, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp() for x in ts]
print("%d %.3f" % (len(t), t[-1] - t[0]) if len(t) > 1 else "0 0")
PY
)
awk -v n="$N" -v q="$QUESTIONS" -v t0="$t0" -v t1="$t1" -v got="$got" -v tok="$TOK" \
  -v comp="$COMP" -v hits="${HITS:-0}" -v joins="${JOINS:-0}" -v steady="$STEADY" 'BEGIN {
    dt = t1 - t0
    printf "bench_serve: %d results for %d requests in %.2f s: %.0f requests/s, %.0f questions/s; ", got, n, dt, n / dt, q / dt
    printf "tokens %d, run through the tower %d (%.0f%%); cache hits %d, joins %d\n", tok, comp, 100 * comp / (tok > 0 ? tok : 1), hits, joins
    split(steady, st, " ")
    if (st[2] > 0)
      printf "bench_serve: steady, first result to last: %d results in %.2f s: %.0f requests/s\n", st[1], st[2], (st[1] - 1) / st[2]
  }'
[ -n "${BENCH_KEEPLOG:-}" ] && cp "$WORK/serve.log" "$BENCH_KEEPLOG"
rm -rf "$WORK"
