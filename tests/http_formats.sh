#!/usr/bin/env bash
# ctest http_formats: the formats of `d3stream http`'s GET routes, checked by
# third-party parsers on a live server (free loopback port, tiny package):
#   /metrics       parses with prometheus_client's text-format parser (Debian's
#                  python3-prometheus-client), and its counters move with the
#                  traffic sent between two fetches;
#   /openapi.yaml  is ops/openapi.yaml byte for byte and validates as OpenAPI
#                  3.0 with openapi-spec-validator (PyPI, in the virtualenv of
#                  tests/tools/pyvenv.sh: build/_fetch/pyvenv, or $D3_PYVENV).
# Fails, never skips, when a tool is missing.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
D3STREAM="${D3STREAM:-$ROOT/build/d3stream}"
PYVENV="${D3_PYVENV:-$ROOT/build/_fetch/pyvenv}"
MULT="${D3_TEST_TIMEOUT_MULT:-1}"

fail() {
  echo "http_formats: FAIL: $*" >&2
  exit 1
}
command -v curl >/dev/null || fail "curl not found; ops/setup-deps.sh installs it"
[ -x "$D3STREAM" ] || fail "no d3stream binary at $D3STREAM (set D3STREAM)"
# shellcheck source=tests/tools/http_server.sh
. "$ROOT/tests/tools/http_server.sh"
prom_python
"$PYVENV/bin/python" -c 'import openapi_spec_validator' 2>/dev/null ||
  fail "no openapi-spec-validator in $PYVENV; run tests/tools/pyvenv.sh (ops/test.sh does)"

WORK="$(mktemp -d /tmp/d3formats-XXXXXX)"
LOG="$WORK/server.log"
PID=""
cleanup() {
  [ -n "$PID" ] && kill -KILL "$PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

"$D3STREAM" make-package --size tiny --seed 1 --out "$WORK/pkg" >"$WORK/make.log" 2>&1 ||
  { cat "$WORK/make.log" >&2; fail "make-package failed"; }
# The log exists before the server starts: the poll below reads it while
# the background job may not have opened it yet (set -e, pipefail).
d3_server_start "$LOG" http --model "$WORK/pkg" --listen 127.0.0.1:0

get() { # <path> <file>: GET, 200 expected
  local code
  code="$(curl -s -o "$2" -w '%{http_code}' --max-time $((30 * MULT)) "$URL$1")"
  [ "$code" = 200 ] || fail "GET $1 answered $code"
}
post() { # <body file> <expected status>
  local code
  code="$(curl -s -o /dev/null -w '%{http_code}' --max-time $((30 * MULT)) \
    -H 'Content-Type: application/json' --data-binary "@$1" "$URL/v1/systemone")"
  [ "$code" = "$2" ] || fail "POST /v1/systemone $1 answered $code ($2 expected)"
}

# The traffic between the two fetches: 3 answered requests, 1 invalid one.
get /metrics "$WORK/m1.txt"
for _ in 1 2 3; do post "$ROOT/ops/examples/d3-nano-npu2.json" 200; done
printf 'not json' >"$WORK/bad.json"
post "$WORK/bad.json" 400
get /metrics "$WORK/m2.txt"

"$PROM_PY" - "$WORK/m1.txt" "$WORK/m2.txt" <<'EOF' || fail "/metrics (above)"
import math, sys
from prometheus_client.parser import text_string_to_metric_families

def parse(path):
    text = open(path, encoding="utf-8").read()
    fams = list(text_string_to_metric_families(text))  # raises on a bad line
    samples = {}
    for fam in fams:
        if fam.type == "unknown":
            sys.exit(f"{path}: family {fam.name} has no # TYPE")
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            if key in samples:
                sys.exit(f"{path}: duplicate sample {key}")
            if math.isnan(s.value):
                sys.exit(f"{path}: {key} is NaN")
            samples[key] = s.value
    return fams, samples

f1, a = parse(sys.argv[1])
f2, b = parse(sys.argv[2])
print(f"http_formats: /metrics parsed: {len(f2)} families, {len(b)} samples")

def val(m, name, **labels):
    return m.get((name, tuple(sorted(labels.items()))), 0.0)

def moved(name, by, **labels):
    d = val(b, name, **labels) - val(a, name, **labels)
    ok = d >= by if by > 0 else d > 0
    lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
    print(f"http_formats: {name}{{{lab}}} +{d:g}" + ("" if ok else "  <- FAIL"))
    return ok

ok = True
req = "d3stream_http_requests_total"
ok &= moved(req, 3, route="/v1/systemone", status="200")
ok &= moved(req, 1, route="/v1/systemone", status="400")
ok &= moved(req, 1, route="/metrics", status="200")
ok &= moved("d3stream_http_questions_total", 3, outcome="answered")
ok &= moved("d3stream_http_input_tokens_total", 0)
ok &= moved("d3stream_http_queue_seconds_count", 3)
ok &= moved("d3stream_http_request_duration_seconds_count", 3)
ok &= moved("d3stream_engine_requests_total", 3)
# A counter never goes down.
for fam in f2:
    if fam.type in ("counter", "histogram"):
        for s in fam.samples:
            k = (s.name, tuple(sorted(s.labels.items())))
            if k in a and b[k] < a[k]:
                print(f"http_formats: {k} went down: {a[k]} -> {b[k]}  <- FAIL")
                ok = False
sys.exit(0 if ok else 1)
EOF

get /openapi.yaml "$WORK/openapi.yaml"
cmp -s "$WORK/openapi.yaml" "$ROOT/ops/openapi.yaml" ||
  fail "GET /openapi.yaml differs from ops/openapi.yaml (rebuild?)"
"$PYVENV/bin/python" - "$WORK/openapi.yaml" <<'EOF' || fail "/openapi.yaml (above)"
import sys
import openapi_spec_validator
from openapi_spec_validator import validate
from openapi_spec_validator.readers import read_from_filename
from importlib.metadata import version

spec, _ = read_from_filename(sys.argv[1])
if not str(spec.get("openapi", "")).startswith("3.0"):
    sys.exit(f"openapi: {spec.get('openapi')!r}, 3.0.x expected")
validate(spec)  # raises OpenAPIValidationError with the path of the fault
print(f"http_formats: /openapi.yaml valid OpenAPI {spec['openapi']} "
      f"(openapi-spec-validator {version('openapi-spec-validator')}), {len(spec['paths'])} paths")
EOF

# Answers validate against the spec's own schemas: a 200 with every kind of
# answer and a per-question error, and a whole-request error.
save() { # <body> <out file> <expected status>: POST, the response kept
  local code
  code="$(curl -s -o "$2" -w '%{http_code}' --max-time $((30 * MULT)) \
    -H 'Content-Type: application/json' --data-binary "$1" "$URL/v1/systemone")"
  [ "$code" = "$3" ] || fail "POST /v1/systemone answered $code ($3 expected): $(cat "$2")"
}
save '{"state": "a ticket", "questions": {"c": {"type": "choice", "criteria": {"x": "X", "y": null}},
  "n": {"type": "noul", "instructions": "Urgent?"}, "s": {"type": "score", "instructions": "How bad?",
  "criteria": ["low", "mid", "high"]}, "bad": {"type": "choice", "criteria": {"only": null}},
  "odd": {"type": "set"}}, "options": {"return_meta": true}}' "$WORK/r200.json" 200
save '{"questions": {}}' "$WORK/r400.json" 400
"$PYVENV/bin/python" - "$WORK/openapi.yaml" "$WORK/r200.json" "$WORK/r400.json" <<'EOF' ||
import json, sys
from openapi_schema_validator import OAS30Validator
from openapi_spec_validator.readers import read_from_filename

spec, _ = read_from_filename(sys.argv[1])
for path, name in ((sys.argv[2], "Response"), (sys.argv[3], "Error")):
    body = json.load(open(path, encoding="utf-8"))
    schema = {"$ref": f"#/components/schemas/{name}", "components": spec["components"]}
    OAS30Validator(schema).validate(body)  # raises with the path of the fault
    print(f"http_formats: a {name} body validates against /openapi.yaml")
EOF
  fail "a response does not match /openapi.yaml (above)"

kill -TERM "$PID"
rc=0
wait "$PID" || rc=$?
PID=""
if grep -qE 'ERROR: (Address|Leak|Thread)Sanitizer|runtime error:' "$LOG"; then
  cat "$LOG" >&2
  fail "sanitizer report (above)"
fi
[ "$rc" -eq 0 ] || { tail -n 40 "$LOG" >&2; fail "d3stream http exited $rc on SIGTERM (0 expected)"; }
echo "http_formats: ok"
