#!/usr/bin/env bash
# The Python tools the tests need that Debian 12 does not package, from PyPI
# into a virtualenv (tests/http_formats.sh: openapi-spec-validator checks
# GET /openapi.yaml; tests/sdk_clients.sh: the official SDK, typesafe-sdk). Idempotent: does nothing when the venv already holds the
# pinned versions.
#   tests/tools/pyvenv.sh [DIR]    DIR defaults to build/_fetch/pyvenv
# Needs Debian's python3 and python3-venv (ops/setup-deps.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
DIR="${1:-${D3_PYVENV:-$ROOT/build/_fetch/pyvenv}}"
# Pinned, its dependencies too: a new release must not change what the tests
# accept.
PINS=(
  openapi-spec-validator==0.9.0 openapi-schema-validator==0.9.0
  annotated-types==0.8.0 attrs==26.1.0 jsonschema==4.26.0 jsonschema-path==0.5.0
  jsonschema-specifications==2025.9.1 lazy-object-proxy==1.13.0 pathable==0.6.0
  pydantic==2.14.4 pydantic-settings==2.16.3 pydantic_core==2.50.5
  python-dotenv==1.2.4 PyYAML==6.0.4 referencing==0.37.0 rfc3339-validator==0.1.4
  rpds-py==2026.9.1 six==1.17.0 typing-inspection==0.4.5 typing_extensions==4.16.0
  # tests/sdk_clients.sh: the official System One SDK and its dependencies
  typesafe-sdk==0.7.5 anyio==4.16.0 h11==0.16.0 httpcore2==2.17.0 httpx2==2.17.0 idna==3.21
  packaging==26.4 tenacity==9.2.1 truststore==0.10.5 backports.zstd==1.8.0
  # tests/jevcompat.sh: the conformance suite of the System One API
  jevcompat==0.1.1
)

STAMP="$DIR/.d3-pins"
if [ -x "$DIR/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "${PINS[*]}" ] &&
  "$DIR/bin/python" -c 'import openapi_spec_validator, typesafe_sdk, backports.zstd, jevcompat' 2>/dev/null; then
  echo "pyvenv: $DIR ready (${PINS[0]})"
  exit 0
fi
# Debian's interpreter (python3-venv is for it), not whatever python3 comes
# first on PATH.
PY=/usr/bin/python3
[ -x "$PY" ] || PY="$(command -v python3)" || {
  echo "pyvenv: no python3; run ops/setup-deps.sh" >&2
  exit 1
}
if ! "$PY" -c 'import ensurepip, venv' 2>/dev/null; then
  echo "pyvenv: $PY has no venv/ensurepip; run ops/setup-deps.sh (python3-venv)" >&2
  exit 1
fi
echo "pyvenv: creating $DIR with ${PINS[0]} and its pinned dependencies"
rm -rf "$DIR"
mkdir -p "$(dirname "$DIR")"
"$PY" -m venv "$DIR"
"$DIR/bin/python" -m pip install --quiet --disable-pip-version-check "${PINS[@]}"
printf '%s' "${PINS[*]}" >"$STAMP"
"$DIR/bin/python" -c 'import openapi_spec_validator, typesafe_sdk, backports.zstd, jevcompat'
echo "pyvenv: $DIR ready (${PINS[0]})"
