#!/usr/bin/env bash
# Load test of the HTTP shim: `d3stream http` on a free loopback port with the
# tiny synthetic package, driven by wrk (Debian's wrk, ops/setup-deps.sh)
# POSTing ops/examples/d3-nano-npu2.json to /v1/systemone from CONNECTIONS
# keep-alive connections for DURATION seconds, after a warm-up run.
#   tests/bench/load_http.sh [DURATION_S [CONNECTIONS]]     defaults 30 64
# Prints requests/s, latency p50/p90/p99/max, the responses by status, wrk's
# socket errors and the server's RSS (VmRSS sampled every second). Exits 1 when
#   - a response has a status other than 200 or 429 (429 = overloaded, the only
#     refusal allowed), or wrk saw socket errors or timeouts;
#   - the server died, stopped answering /health, did not exit 0 on SIGTERM,
#     or printed a sanitizer report;
#   - its RSS grew past 2 x (RSS after the warm-up) + 64 MiB. Once warm, the
#     engine's buffers, the 64 connections' and the allocator's arenas are all
#     in use, so the steady state stays near the warm-up figure; the 2x + 64 MiB
#     leaves room for allocator noise and short peaks, and still catches a
#     leak per request (30 s at ~1,000 req/s is ~36,000 requests: a leak of
#     ~3 KiB each, or one of the request body, trips it);
#   - fewer than D3_LOAD_MIN_REQUESTS (default 0) requests were answered in
#     the measured run.
# Environment:
#   D3STREAM             the binary (default build/d3stream)
#   D3_LOAD_MODEL        the package (default build/_demo/d3-synthetic-tiny,
#                        made with `make-package --size tiny --seed 1` if absent)
#   D3_LOAD_WARMUP_S     warm-up seconds (default 5)
#   D3_LOAD_SERVER_ARGS  more `d3stream http` options (e.g. --max-queue 8 to
#                        provoke 429s)
#   D3_LOAD_EXPECT_429   1: fail unless some responses were 429
#   D3_LOAD_MIN_REQUESTS see above
#   D3_TEST_TIMEOUT_MULT multiplies the waits (ops/test.sh sets 3 under ASan)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
DURATION="${1:-30}"
CONNS="${2:-64}"
D3STREAM="${D3STREAM:-$ROOT/build/d3stream}"
MODEL="${D3_LOAD_MODEL:-$ROOT/build/_demo/d3-synthetic-tiny}"
WARMUP="${D3_LOAD_WARMUP_S:-5}"
MIN_REQUESTS="${D3_LOAD_MIN_REQUESTS:-0}"
MULT="${D3_TEST_TIMEOUT_MULT:-1}"
BODY="$ROOT/ops/examples/d3-nano-npu2.json"
LUA="$ROOT/tests/bench/wrk_post.lua"
THREADS=2
if [ "$CONNS" -lt "$THREADS" ]; then THREADS="$CONNS"; fi

fail() {
  echo "load_http: FAIL: $*" >&2
  exit 1
}
for tool in wrk curl; do
  command -v "$tool" >/dev/null || fail "$tool not found; ops/setup-deps.sh installs it (Debian package $tool)"
done
[ -x "$D3STREAM" ] || fail "no d3stream binary at $D3STREAM (build it, or set D3STREAM)"
if [ ! -f "$MODEL/MODEL_MANIFEST.json" ]; then
  "$D3STREAM" make-package --size tiny --seed 1 --out "$MODEL" --force >/dev/null ||
    fail "make-package --out $MODEL failed"
fi

WORK="$(mktemp -d /tmp/d3load-XXXXXX)"
LOG="$WORK/server.log"
PID=""
SAMPLER=""
cleanup() {
  [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null
  [ -n "$PID" ] && kill -KILL "$PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

# ASan's quarantine alone would hold up to 256 MiB of freed memory and look
# like growth: keep it small (ignored by a build without ASan).
read -ra SERVER_ARGS <<<"${D3_LOAD_SERVER_ARGS:-}"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=16"
# The log exists before the server starts: the poll below reads it while
# the background job may not have opened it yet (set -e, pipefail).
: >"$LOG"
"$D3STREAM" http --model "$MODEL" --listen 127.0.0.1:0 "${SERVER_ARGS[@]}" 2>"$LOG" &
PID=$!

alive() { # the server is running (not gone, not a zombie)
  local st
  st="$(awk '{print $3}' "/proc/$PID/stat" 2>/dev/null)" || return 1
  [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$PID/status" 2>/dev/null || echo 0; }

PORT=""
deadline=$((SECONDS + 30 * MULT))
while [ -z "$PORT" ] && [ $SECONDS -lt $deadline ]; do
  alive || { cat "$LOG" >&2; fail "d3stream http exited while starting"; }
  PORT="$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9]*\).*|\1|p' "$LOG" | head -n1)"
  [ -n "$PORT" ] || sleep 0.05
done
[ -n "$PORT" ] || { cat "$LOG" >&2; fail "d3stream http did not print its address"; }
URL="http://127.0.0.1:$PORT"
# Listening comes before the weights are loaded: /health says when.
until [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ]; do
  [ $SECONDS -lt $deadline ] || { cat "$LOG" >&2; fail "/health never answered 200"; }
  alive || { cat "$LOG" >&2; fail "d3stream http exited while loading"; }
  sleep 0.05
done

run_wrk() { # <seconds> <output file>
  D3_WRK_BODY="$BODY" wrk -t"$THREADS" -c"$CONNS" -d"$1"s --latency --timeout "$((10 * MULT))"s \
    -s "$LUA" "$URL/v1/systemone" >"$2" 2>&1 || { cat "$2" >&2; fail "wrk failed"; }
}
fig() { awk -v k="$2" '$1 == "d3:" && $2 == k {$1 = $2 = ""; sub(/^ +/, ""); print}' "$1"; }
check_run() { # <wrk output> <what>: statuses 200/429 only, no socket errors
  local out="$1" what="$2" bad
  alive || { tail -n 40 "$LOG" >&2; fail "$what: d3stream http died under load"; }
  [ -n "$(fig "$out" requests)" ] || { cat "$out" >&2; fail "$what: wrk printed no figures"; }
  bad="$(awk '$1 == "d3:" && $2 == "status" && $3 != 200 && $3 != 429 {printf " %s x%s", $3, $4}' "$out")"
  [ -z "$bad" ] || fail "$what: statuses other than 200/429:$bad"
  read -r c r w t _ <<<"$(fig "$out" errors)"
  [ $((c + r + w + t)) -eq 0 ] ||
    fail "$what: wrk socket errors: connect $c, read $r, write $w, timeout $t"
}

echo "load_http: $D3STREAM http on $URL, package $MODEL"
echo "load_http: warm-up ${WARMUP} s, then ${DURATION} s, $CONNS connections, $THREADS wrk threads"
run_wrk "$WARMUP" "$WORK/warmup.txt"
check_run "$WORK/warmup.txt" warm-up
RSS_WARM="$(rss_kib)"

(
  while [ -r "/proc/$PID/status" ]; do
    awk '/^VmRSS:/ {print $2}' "/proc/$PID/status" 2>/dev/null || true
    sleep 1
  done
) >"$WORK/rss.txt" &
SAMPLER=$!
run_wrk "$DURATION" "$WORK/run.txt"
kill "$SAMPLER" 2>/dev/null || true
wait "$SAMPLER" 2>/dev/null || true
SAMPLER=""
rss_kib >>"$WORK/rss.txt"
RSS_MAX="$(sort -n "$WORK/rss.txt" | tail -n1)"
RSS_BOUND=$((2 * RSS_WARM + 64 * 1024))

OUT="$WORK/run.txt"
read -r p50 p90 p99 pmax <<<"$(fig "$OUT" latency_ms)"
echo "load_http: requests      $(fig "$OUT" requests) in $(fig "$OUT" duration_s) s"
echo "load_http: requests/s    $(fig "$OUT" rps)"
echo "load_http: latency ms    p50 $p50  p90 $p90  p99 $p99  max $pmax"
awk '$1 == "d3:" && $2 == "status" {printf "load_http: status %s      %s\n", $3, $4}' "$OUT"
echo "load_http: socket errors $(fig "$OUT" errors | awk '{printf "connect %s read %s write %s timeout %s", $1, $2, $3, $4}')"
echo "load_http: RSS MiB       after warm-up $((RSS_WARM / 1024)), max $((RSS_MAX / 1024)) (bound $((RSS_BOUND / 1024)): 2 x warm-up + 64), samples $(wc -l <"$WORK/rss.txt")"

check_run "$OUT" run
N429="$(awk '$1 == "d3:" && $2 == "status" && $3 == 429 {print $4}' "$WORK/warmup.txt" "$OUT" | awk '{n += $1} END {print n + 0}')"
[ "${D3_LOAD_EXPECT_429:-0}" != 1 ] || [ "$N429" -gt 0 ] || fail "no 429 although the queue was meant to overflow"
[ "$RSS_MAX" -le "$RSS_BOUND" ] ||
  fail "RSS grew to $((RSS_MAX / 1024)) MiB, past 2 x $((RSS_WARM / 1024)) + 64 MiB"
N="$(fig "$OUT" requests)"
[ "$N" -ge "$MIN_REQUESTS" ] || fail "only $N requests answered in $DURATION s (at least $MIN_REQUESTS expected)"
code="$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")"
[ "$code" = 200 ] || fail "/health answered $code after the load"

kill -TERM "$PID"
rc=0
wait "$PID" || rc=$?
PID=""
if grep -qE 'ERROR: (Address|Leak|Thread)Sanitizer|runtime error:' "$LOG"; then
  cat "$LOG" >&2
  fail "sanitizer report (above)"
fi
[ "$rc" -eq 0 ] || { tail -n 40 "$LOG" >&2; fail "d3stream http exited $rc on SIGTERM (0 expected)"; }
echo "load_http: ok"
