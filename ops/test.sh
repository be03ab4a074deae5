#!/usr/bin/env bash
# The whole test suite, as CI runs it: dependencies, the format and
# banned-function checks, fixtures, a real Kafka broker (ops/kafka.sh), a
# -Werror build with every test, the commands the docs quote
# (tests/doctest.sh), the .deb built, installed and checked
# (ops/package.sh --check), then the same tests again under ASan+UBSan,
# then each libFuzzer harness for 25 s, a 3-minute soak of serve --http with
# faults, and ThreadSanitizer runs (about 20 minutes on 2 cores).
#   ops/test.sh            everything
#   ops/test.sh --quick    the plain build only
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
JOBS="$(nproc)"

ops/setup-deps.sh
# Format and banned functions first: a minute of build is not worth spending
# on a tree that cannot land.
ops/check-style.sh
export D3_QWEN3_DIR="${D3_QWEN3_DIR:-$ROOT/build/_fetch/qwen3-tokenizer}"
tests/tools/fetch_qwen3_tokenizer.sh "$D3_QWEN3_DIR"
# PyPI's openapi-spec-validator, pinned, for tests/http_formats.sh.
export D3_PYVENV="${D3_PYVENV:-$ROOT/build/_fetch/pyvenv}"
tests/tools/pyvenv.sh "$D3_PYVENV"

# One real Kafka broker (ops/kafka.sh: KRaft, loopback) for both runs below;
# stopped however this script ends.
KAFKA_DIR="$ROOT/build/_kafka"
trap 'ops/kafka.sh stop "$KAFKA_DIR" || true' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
D3_KAFKA_BOOTSTRAP="$(ops/kafka.sh start "$KAFKA_DIR")"
export D3_KAFKA_BOOTSTRAP
export D3_KAFKA_DIR="$KAFKA_DIR"

run_suite() { # <build dir> <cmake args...>
  local dir="$1"; shift
  echo "== build $dir ($*)"
  cmake -S . -B "$dir" -G Ninja -DD3_WERROR=ON "$@" >/dev/null
  cmake --build "$dir" -j "$JOBS"
  echo "== test $dir"
  ctest --test-dir "$dir" --output-on-failure -j "$JOBS"
}

run_suite build -DCMAKE_BUILD_TYPE=RelWithDebInfo
echo "== docs"
tests/doctest.py --bin build/d3stream
echo "== package"
ops/package.sh --check
if [ "${1:-}" != "--quick" ]; then
  # Optimised (-O2 -g): the tower goldens run 5,000-token prompts, which take
  # minutes at -O0 under ASan; the sanitizers work the same at -O2.
  # D3_TEST_TIMEOUT_MULT: tests that wait (test_kafka) allow 3x as long.
  # D3_TEST_SCALE: the serve acceptance runs (tests/test_serve_*.c) send a
  # fifth of their requests; the plain build above runs the full numbers.
  D3_TEST_TIMEOUT_MULT=3 D3_TEST_SCALE=0.2 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    LSAN_OPTIONS="suppressions=$ROOT/tests/lsan.supp:print_suppressions=0" \
    run_suite build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DD3_SANITIZE=ON
  # libFuzzer: every harness 25 s over its committed seeds (tests/fuzz/run.sh,
  # about 3.5 minutes on 2 cores); a crash, leak or sanitizer report fails.
  echo "== fuzz"
  FUZZ_SECONDS=25 tests/fuzz/run.sh
  # serve --http under mixed load, kill -9 and a broker restart, 3 minutes
  # (tests/soak.sh: its own broker in build/_kafka-soak; the checks at its end).
  echo "== soak"
  tests/soak.sh 3
  # ThreadSanitizer on the binary under the HTTP load
  # (tests/tsan.sh: why not the Criterion suites).
  echo "== tsan"
  tests/tsan.sh 0
fi
echo "== all tests passed"
