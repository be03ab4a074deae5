# tests/tools/http_server.sh -- sourced by the scripts that drive d3stream's
# HTTP side with third-party clients and parsers (tests/sdk_clients.sh,
# tests/jevcompat.sh, tests/http_formats.sh, tests/grafana.sh): starts
# `http` (or `serve --http`) on a free port and waits until /health answers.
#
#   http_server_start PKG LOG [ARGS...]   sets PID and URL; fail()s on timeout
#   d3_server_start LOG COMMAND [ARGS...] the same for any command that serves
#                                         HTTP (serve --http 127.0.0.1:0)
#   http_server_name                      prints the served package's name
#   http_server_stop                      SIGTERM; fail()s unless it exits 0
#   prom_python                           sets PROM_PY: a python3 with Debian's
#                                         prometheus_client; fail()s without one
#
# Needs D3STREAM, MULT and a fail() from the sourcing script (PYVENV for
# http_server_name).

http_server_start() {
  local pkg=$1 log=$2
  shift 2
  d3_server_start "$log" http --model "$pkg" --listen 127.0.0.1:0 "$@"
}

# d3_server_start LOG COMMAND [ARGS...]: `d3stream COMMAND ARGS` in the
# background (an `http`, or a `serve --http 127.0.0.1:0`), its stderr in
# LOG; sets PID and URL once /health answers 200.
d3_server_start() {
  local log=$1
  shift
  : >"$log" # the poll below may read it before the server opens it
  "$D3STREAM" "$@" 2>"$log" &
  PID=$!
  URL=""
  for _ in $(seq $((300 * MULT))); do
    kill -0 "$PID" 2>/dev/null || { cat "$log" >&2; fail "d3stream $1 exited while starting"; }
    URL="$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" | head -1 | sed 's/listening on //')" || true
    [ -n "$URL" ] && curl -sf "$URL/health" >/dev/null && return 0
    sleep 0.1
  done
  cat "$log" >&2
  fail "the server never got ready"
}

http_server_name() {
  curl -sf "$URL/v1/models" |
    "$PYVENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])'
}

http_server_stop() {
  kill -TERM "$PID"
  wait "$PID" || fail "d3stream http did not exit 0 on SIGTERM"
  PID=""
}

# Debian's python3-prometheus-client is for Debian's interpreter, which need
# not be the first python3 on PATH.
prom_python() {
  PROM_PY=""
  for py in /usr/bin/python3 python3; do
    if command -v "$py" >/dev/null && "$py" -c 'import prometheus_client.parser' 2>/dev/null; then
      PROM_PY="$py"
      return 0
    fi
  done
  fail "no python3 with prometheus_client; ops/setup-deps.sh installs python3-prometheus-client"
}
