#!/usr/bin/env bash
# ctest jevcompat: the System One API's conformance suite (jevcompat 0.1.1
# from PyPI, in the virtualenv of tests/tools/pyvenv.sh) against
# `d3stream http` on a new tiny package whose max_length is raised to
# 32,768 (so that its 255-option question fits, as on d3-nano; served with
# --no-verify, since that edit breaks the manifest). Fails on any failed
# requirement but the documented SPEC differences (docs/http.md, "Where
# d3stream follows SPEC, not the hosted service"), and when one of those passes
# (then the list is stale). Issue 30, item 8.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
D3STREAM="${D3STREAM:-$ROOT/build/d3stream}"
PYVENV="${D3_PYVENV:-$ROOT/build/_fetch/pyvenv}"
MULT="${D3_TEST_TIMEOUT_MULT:-1}"
# The requirements SPEC decides otherwise, each with its section.
DOCUMENTED=(
  request.unknown-fields   # SPEC a.2: unknown top-level fields are a 400
  errors.validation-shape  # SPEC b.7: {"error": {"code", "message"}}, 400 not 422
  errors.shape             # SPEC b.7: the same body for every error
  confidence.formula       # SPEC b.4: 1 - H / ln(n)
)
# (response.extensions fails only when a question gets a per-question
# error, SPEC b.6's unprefixed error and message: none does here.)
fail() {
  echo "jevcompat: FAIL: $*" >&2
  exit 1
}
[ -x "$PYVENV/bin/jevcompat" ] || fail "no jevcompat in $PYVENV (run tests/tools/pyvenv.sh)"
WORK="$(mktemp -d /tmp/d3jev-XXXXXX)"
PID=""
trap '[ -n "$PID" ] && kill -KILL "$PID" 2>/dev/null; rm -rf "$WORK"' EXIT
"$D3STREAM" make-package --size tiny --seed 4 --out "$WORK/pkg" >/dev/null 2>&1 ||
  fail "make-package failed"
"$PYVENV/bin/python" - "$WORK/pkg/decision_config.json" <<'PY'
import json, sys
p = sys.argv[1]
d = json.load(open(p))
d["max_length"] = 32768
json.dump(d, open(p, "w"), indent=2)
PY
. "$ROOT/tests/tools/http_server.sh"
http_server_start "$WORK/pkg" "$WORK/log" --no-verify
NAME="$(http_server_name)"
"$PYVENV/bin/jevcompat" test "$URL" --model "$NAME" >"$WORK/report" 2>&1 || true
grep -E '^(not )?conformant|MUST [0-9]+/[0-9]+' "$WORK/report" | tail -1
failed="$(grep -oE '✗ (MUST|SHOULD) +[a-z0-9.-]+' "$WORK/report" | awk '{print $3}' | sort -u)"
rc=0
for req in $failed; do
  if [[ " ${DOCUMENTED[*]} " != *" $req "* ]]; then
    echo "jevcompat: FAIL: $req is not a documented SPEC difference:" >&2
    grep -A4 "✗ .* $req " "$WORK/report" >&2 || true
    rc=1
  fi
done
for req in "${DOCUMENTED[@]}"; do
  grep -qE "✓ (MUST|SHOULD) +$req " "$WORK/report" &&
    { echo "jevcompat: FAIL: $req passes now: drop it from the documented differences" >&2; rc=1; }
done
grep -qE '✓ (MUST|SHOULD) +request.structured-text ' "$WORK/report" ||
  { cat "$WORK/report" >&2; fail "the report does not look like jevcompat's"; }
http_server_stop
[ $rc -eq 0 ] && echo "jevcompat: ok (failed only: $(echo $failed))"
exit $rc
