# tests/tools/http_server.sh -- sourced by the scripts that drive `d3stream
# http` with third-party clients (tests/sdk_clients.sh, tests/jevcompat.sh):
# starts it on a free port and waits until /health answers.
#
#   http_server_start PKG LOG [ARGS...]   sets PID and URL; fail()s on timeout
#   http_server_name                      prints the served package's name
#   http_server_stop                      SIGTERM; fail()s unless it exits 0
#
# Needs D3STREAM, PYVENV, MULT and a fail() from the sourcing script.

http_server_start() {
  local pkg=$1 log=$2
  shift 2
  "$D3STREAM" http --model "$pkg" --listen 127.0.0.1:0 "$@" 2>"$log" &
  PID=$!
  URL=""
  for _ in $(seq $((300 * MULT))); do
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
