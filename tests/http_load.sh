#!/usr/bin/env bash
# ctest http_load: a short tests/bench/load_http.sh (wrk, 64 connections) on a
# new tiny package, twice:
#   1. 5 s at the default queue: only 200 (or 429) answers, no socket errors,
#      the server alive and answering /health, RSS within 2 x warm-up + 64 MiB,
#      at least 500 x D3_TEST_SCALE requests answered, exit 0 on SIGTERM;
#   2. 3 s with --max-queue 8, so that the queue overflows: the same, and some
#      answers must be 429 (overloaded) -- never another status.
# D3_TEST_SCALE (0.2 under ASan in ops/test.sh) scales the request floor, which
# is a sanity floor (the plain build does ~1,200 req/s on 2 cores), not a speed
# target; D3_TEST_TIMEOUT_MULT the waits. Fails, never skips, without wrk.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
command -v wrk >/dev/null || {
  echo "http_load: FAIL: wrk not found; ops/setup-deps.sh installs it (Debian package wrk)" >&2
  exit 1
}
SCALE="${D3_TEST_SCALE:-1}"
MIN="$(awk -v s="$SCALE" 'BEGIN {n = int(500 * s); print n < 1 ? 1 : n}')"
WORK="$(mktemp -d /tmp/d3httpload-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
export D3_LOAD_MODEL="$WORK/pkg"

echo "== http_load: 5 s, 64 connections, default queue (at least $MIN requests)"
D3_LOAD_WARMUP_S=2 D3_LOAD_MIN_REQUESTS="$MIN" "$ROOT/tests/bench/load_http.sh" 5 64
echo "== http_load: 3 s, 64 connections, --max-queue 8 (429s expected)"
D3_LOAD_WARMUP_S=1 D3_LOAD_SERVER_ARGS="--max-queue 8" D3_LOAD_EXPECT_429=1 \
  "$ROOT/tests/bench/load_http.sh" 3 64
echo "http_load: ok"
