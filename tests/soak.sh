#!/usr/bin/env bash
# A soak of `d3stream serve --http` under mixed load and faults (issue 35,
# item 4): the tiny synthetic package, one serve process for the Kafka path
# and the HTTP shim, a real broker (ops/kafka.sh) of its own.
#
#   tests/soak.sh [MINUTES] [--at-least-once] [--static-membership]
#
# MINUTES (default 3) of load, then a drain and the checks. Run from anywhere
# after `cmake --build build`; the broker lives in build/_kafka-soak (its own
# ports and data: never the test broker of build/_kafka), the run's files in
# build/_soak/run (kept for a look after the run; removed at the next start).
#
# Load, all at once (tests/soak/load.py):
#   - a Kafka backfill preloaded before serve starts (500 records a minute of
#     run, at least 3,000: seconds of backlog), then a producer (kcat,
#     idempotent) of 15 records/s with a burst of 300 every minute; ~30% of
#     all requests repeat an earlier body byte for byte (the result cache,
#     across both paths), ~5% are bad (not JSON, not UTF-8, empty, every
#     question invalid, unknown model);
#   - 2 HTTP keep-alive clients POSTing /v1/systemone, the same mix;
#   - an image request (150-500 KB PNG or JPEG) every 6 s on each path;
#   - a client that leaves mid-request every 2 s (half a body; or the whole
#     body of a slow request, then gone before the answer);
#   - a prober of /health and /metrics every 5 s.
# Faults, alternating, the last one a kill -9 (runs up to 5 minutes: from 10 s
# on, every 15 s, in the first quarter; longer runs: from 15 s on, every 90 s,
# in the first half; SOAK_FAULT_EVERY sets the interval):
#   - kill -9 of serve, restarted at once with the same group and
#     transactional id (and instance id with --static-membership);
#   - a broker restart: ops/kafka.sh stop, 15 s down (outlasting the group
#     session of 10 s) or, every other time, 5 s; ops/kafka.sh restart (the
#     same ports, its data kept).
# The rest of the run is the quiet stretch in which serve's RSS is measured.
#
# Mode: --exactly-once (default; results read read_committed) or
# --at-least-once (serve without transactions). --static-membership: serve
# runs with --instance-id (a restart takes the killed one's place at once,
# without waiting for its session to end).
#
# Checks at the end (tests/soak/check.py), each failure named, exit 1:
#   - every request record of the input topic has exactly one result
#     (exactly-once, read_committed) or at least one (at-least-once), keyed
#     as the request, with the status its kind must get (200, or 400/404 for
#     the bad records);
#   - the DLQ holds only dead letters of bad records: in JSON mode none at all
#     (serve --help: every JSON value has an answer, a 400 result, none is a
#     dead letter);
#   - serve's RSS (VmRSS, sampled every 2 s) grows by less than 5% from the
#     end of the warm-up (40% of the quiet stretch, at least 60 s: the RSS at
#     its end is the highest sample until then, as malloc keeps its peaks) to
#     the end of the load (the median of its last 20 s); only the last serve
#     process is measured, the one that runs from the last kill -9 to the end
#     (a restarted process starts from nothing: its own warm-up); bounded
#     from 10 minutes on, reported in shorter runs (too short to plateau);
#   - HTTP 429 overloaded is counted, not failed: the admission answer while
#     the backfill holds the engine's queue (a known limit: Kafka can take the
#     whole queue from interactive requests);
#   - no error or warning line in serve's logs but the expected ones (listed
#     in check.py, each with why; the broker-outage ones only around an
#     outage);
#   - every HTTP answer was 200, or the 400/404 of an intended bad body;
#     refused connections and 503 only between a kill -9 and the restarted
#     serve's readiness;
#   - serve never exited unless killed, exits 0 on the final SIGTERM, and the
#     group has committed the input topic to its end.
# Then a summary: records, results, duplicates, DLQ, kills, broker restarts,
# RSS, HTTP counts.
#
# Environment: D3STREAM (the binary, default build/d3stream), SOAK_FAULT_EVERY,
# SOAK_KAFKA_RATE (15), SOAK_SEED (1).

# One compound command, read whole before it runs: an edit of this file
# during a run (30 minutes...) cannot change the run.
{
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

MINUTES=3
MODE=eos
STATIC=0
while [ $# -gt 0 ]; do
  case "$1" in
    --at-least-once) MODE=alo ;;
    --static-membership) STATIC=1 ;;
    --exactly-once) MODE=eos ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    -*) echo "soak.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *)
      [[ "$1" =~ ^[1-9][0-9]*$ ]] || { echo "soak.sh: MINUTES must be a whole number, not \"$1\"" >&2; exit 2; }
      MINUTES="$1" ;;
  esac
  shift
done

BIN="${D3STREAM:-$ROOT/build/d3stream}"
PY="${PYTHON:-python3}"
KDIR="$ROOT/build/_kafka-soak"
BASE="$ROOT/build/_soak"
PKG="$BASE/pkg"
WORK="$BASE/run"
SEED="${SOAK_SEED:-1}"
T_RUN=$((MINUTES * 60))
# Faults from FAULT_FIRST s on, every FAULT_EVERY s, within the first
# FAULT_SHARE % of the run: short runs pack them (the quiet stretch after them
# must hold the warm-up and the RSS measurement).
if [ "$MINUTES" -le 5 ]; then
  FAULT_FIRST=10
  FAULT_EVERY=15
  FAULT_SHARE=25
else
  FAULT_FIRST=15
  FAULT_EVERY=90
  FAULT_SHARE=50
fi
FAULT_EVERY="${SOAK_FAULT_EVERY:-$FAULT_EVERY}"
GROUP="soak"
IN="soak-in"
OUT="soak-out"
DLQ="soak-dlq"
PARTS=3

for tool in kcat curl "$PY"; do
  command -v "$tool" >/dev/null 2>&1 || { echo "soak.sh: $tool is not installed (ops/setup-deps.sh)" >&2; exit 2; }
done
# The binary may be rebuilt meanwhile: wait a little for it.
for _ in $(seq 1 60); do [ -x "$BIN" ] && break; sleep 1; done
[ -x "$BIN" ] || { echo "soak.sh: no $BIN (cmake --build build)" >&2; exit 2; }

T0="$(date +%s.%N)"
say() { printf 'soak: [%6.1fs] %s\n' "$(awk -v a="$(date +%s.%N)" -v b="$T0" 'BEGIN { print a - b }')" "$*" >&2; }
now() { date +%s.%3N; }
# An event for check.py: epoch seconds, name, details.
ev() { echo "$(now) $*" >>"$WORK/events.tsv"; }
fail() { echo "$*" >>"$WORK/failures.txt"; say "FAILURE: $*"; }

# One soak at a time: a second one would stop the first one's broker and
# remove its files. The lock (fd 9) is not handed to the processes started
# below (9>&-), so that a leftover of a killed run never holds it.
mkdir -p "$BASE"
exec 9>"$BASE/lock"
flock -n 9 || { echo "soak.sh: another soak runs (lock $BASE/lock held)" >&2; exit 2; }

SERVE_PID=""
LOAD_PID=""
RSS_PID=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e # every step below, whatever the one before did
  if [ -n "$LOAD_PID" ]; then
    # Its own process group (setsid): the load generator and its kcat, which
    # would otherwise go on trying to deliver to a stopped broker.
    kill -TERM -- "-$LOAD_PID" 2>/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$LOAD_PID" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-$LOAD_PID" 2>/dev/null
    wait "$LOAD_PID" 2>/dev/null
  fi
  if [ -n "$RSS_PID" ]; then
    kill -TERM "$RSS_PID" 2>/dev/null
    wait "$RSS_PID" 2>/dev/null
  fi
  if [ -n "$SERVE_PID" ] && kill -0 "$SERVE_PID" 2>/dev/null; then
    kill -KILL "$SERVE_PID" 2>/dev/null
    wait "$SERVE_PID" 2>/dev/null
  fi
  ops/kafka.sh stop "$KDIR" >/dev/null 2>&1 9>&-
  exit "$rc"
}
# The trap first: a start cut short leaves a broker for it to stop.
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ops/kafka.sh stop "$KDIR" >/dev/null 2>&1 9>&- || true # a broker left by a killed run
rm -rf "$WORK"
mkdir -p "$WORK"
: >"$WORK/events.tsv"
: >"$WORK/failures.txt"

if [ ! -f "$PKG/MODEL_MANIFEST.json" ]; then
  "$BIN" make-package --size tiny --seed 1 --out "$PKG" --force >"$WORK/make-package.log" 2>&1 ||
    { cat "$WORK/make-package.log" >&2; exit 1; }
fi

say "mode $MODE$([ "$STATIC" = 1 ] && echo ", static membership"), $MINUTES min of load, faults every ${FAULT_EVERY}s; files in $WORK"
BROKER="$(ops/kafka.sh start "$KDIR" 2>"$WORK/kafka.sh.log" 9>&-)" ||
  { cat "$WORK/kafka.sh.log" >&2; exit 1; }
ev broker_up start
for t in "$IN" "$OUT" "$DLQ"; do
  ops/kafka.sh topic create "$t" "$PARTS" "$KDIR" >>"$WORK/kafka.sh.log" 2>&1 ||
    { cat "$WORK/kafka.sh.log" >&2; exit 1; }
done
say "broker $BROKER, topics $IN $OUT $DLQ ($PARTS partitions)"

# A free loopback port for the shim, the same across restarts (the clients
# reconnect to it).
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((20000 + (RANDOM * 32768 + RANDOM) % 12000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
  done
  return 1
}
HTTP_PORT="$(free_port)"
HTTP="127.0.0.1:$HTTP_PORT"

N_BACKFILL=$((MINUTES * 500))
[ "$N_BACKFILL" -ge 3000 ] || N_BACKFILL=3000
"$PY" tests/soak/load.py backfill "$N_BACKFILL" "$SEED" "$WORK" >"$WORK/backfill.tsv"
kcat -P -b "$BROKER" -t "$IN" -K$'\t' -X enable.idempotence=true -X message.max.bytes=2000000 \
  -l "$WORK/backfill.tsv" 2>>"$WORK/kcat-producer.log"
rm -f "$WORK/backfill.tsv"
say "backfill: $N_BACKFILL records preloaded"

SERVE_ARGS=(serve --model "$PKG" --brokers "$BROKER" --group "$GROUP" --input "$IN" --output "$OUT"
  --dlq "$DLQ" --from-beginning --http "$HTTP"
  # The result cache small enough to be full after the warm-up: RSS growth
  # past it is not the cache filling up.
  --result-cache-entries 2048
  -X session.timeout.ms=10000 -X heartbeat.interval.ms=1000)
[ "$MODE" = eos ] && SERVE_ARGS+=(--exactly-once --transactional-id soak-txn)
[ "$STATIC" = 1 ] && SERVE_ARGS+=(--instance-id soak-0)
N_SERVE=0

# Starts serve (log serve.N.log, metrics serve.N.prom) and waits until
# /health answers 200.
serve_start() {
  N_SERVE=$((N_SERVE + 1))
  "$BIN" "${SERVE_ARGS[@]}" --metrics-file "$WORK/serve.$N_SERVE.prom" 2>"$WORK/serve.$N_SERVE.log" 9>&- &
  SERVE_PID=$!
  echo "$SERVE_PID" >"$WORK/serve.pid"
  ev serve_start "$SERVE_PID" "$N_SERVE"
  local i
  for i in $(seq 1 300); do
    if [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://$HTTP/health")" = 200 ]; then
      ev serve_ready "$SERVE_PID" "$N_SERVE"
      return 0
    fi
    if ! kill -0 "$SERVE_PID" 2>/dev/null; then
      break
    fi
    sleep 0.2
  done
  fail "serve #$N_SERVE (pid $SERVE_PID) did not become ready (see $WORK/serve.$N_SERVE.log)"
  ev serve_ready "$SERVE_PID" "$N_SERVE" # for the windows; the failure is recorded
  return 1
}

# serve must still run; when it exited, record why and start another.
serve_check() {
  if ! kill -0 "$SERVE_PID" 2>/dev/null; then
    local st=0
    wait "$SERVE_PID" || st=$?
    ev serve_died "$SERVE_PID" "$st"
    fail "serve #$N_SERVE (pid $SERVE_PID) exited by itself with status $st (see $WORK/serve.$N_SERVE.log)"
    serve_start || true
  fi
}

serve_start || exit 1
say "serve #1 pid $SERVE_PID ready, HTTP on $HTTP"

# VmRSS of the current serve every 2 s: epoch, pid, kB.
(
  exec 9>&-
  trap 'exit 0' TERM
  while :; do
    p="$(cat "$WORK/serve.pid" 2>/dev/null || true)"
    if [ -n "$p" ] && r="$(awk '/^VmRSS:/ { print $2 }' "/proc/$p/status" 2>/dev/null)" && [ -n "$r" ]; then
      echo "$(date +%s.%3N) $p $r" >>"$WORK/rss.tsv"
    fi
    sleep 2
  done
) &
RSS_PID=$!

setsid "$PY" tests/soak/load.py run --bootstrap "$BROKER" --topic "$IN" --http "$HTTP" --dir "$WORK" \
  --seed "$SEED" --kafka-rate "${SOAK_KAFKA_RATE:-15}" >"$WORK/load.log" 2>&1 9>&- &
LOAD_PID=$!
ev load_start
T_LOAD="$(date +%s)"

# The fault schedule: kill -9 and broker restart alternating, an odd count
# (the last a kill -9).
FAULTS=()
t=$FAULT_FIRST
limit=$((T_RUN * FAULT_SHARE / 100))
while [ "$t" -le "$limit" ]; do
  FAULTS+=("$t")
  t=$((t + FAULT_EVERY))
done
[ $((${#FAULTS[@]} % 2)) -eq 1 ] || unset 'FAULTS[-1]'
KILLS=0
RESTARTS=0
k=0
while :; do
  el=$(($(date +%s) - T_LOAD))
  [ "$el" -ge "$T_RUN" ] && break
  kill -0 "$LOAD_PID" 2>/dev/null || { fail "the load generator stopped early (see $WORK/load.log)"; break; }
  serve_check
  if [ "$k" -lt "${#FAULTS[@]}" ] && [ "$el" -ge "${FAULTS[$k]}" ]; then
    if [ $((k % 2)) -eq 0 ]; then
      KILLS=$((KILLS + 1))
      say "fault $((k + 1)): kill -9 serve #$N_SERVE (pid $SERVE_PID)"
      ev kill9 "$SERVE_PID"
      kill -KILL "$SERVE_PID"
      st=0
      { wait "$SERVE_PID"; } 2>/dev/null || st=$?
      [ "$st" -eq 137 ] || fail "serve #$N_SERVE had exited ($st) before its kill -9"
      serve_start || true
      say "serve #$N_SERVE pid $SERVE_PID ready"
    else
      RESTARTS=$((RESTARTS + 1))
      # The first outage outlasts the group session (10 s): the member's
      # session ends and it rejoins; the next one is short; and so on.
      down=$((RESTARTS % 2 == 1 ? 15 : 5))
      say "fault $((k + 1)): broker restart, ${down}s down"
      ev broker_stop
      ops/kafka.sh stop "$KDIR" >>"$WORK/kafka.sh.log" 2>&1 9>&- || fail "ops/kafka.sh stop failed"
      for _ in $(seq 1 "$down"); do
        sleep 1
        serve_check
      done
      if ops/kafka.sh restart "$KDIR" >>"$WORK/kafka.sh.log" 2>&1 9>&-; then
        ev broker_up restart
        say "broker back at $(cat "$KDIR/bootstrap")"
      else
        fail "ops/kafka.sh restart failed (see $WORK/kafka.sh.log)"
        exit 1
      fi
    fi
    k=$((k + 1))
  fi
  sleep 1
done

say "load stops ($KILLS kill -9, $RESTARTS broker restarts)"
ev load_stop
touch "$WORK/stop"
st=0
wait "$LOAD_PID" || st=$?
LOAD_PID=""
[ "$st" -eq 0 ] || fail "the load generator exited $st (see $WORK/load.log)"
ev load_stopped
serve_check

# Every request answered, then committed to the end, then SIGTERM.
"$PY" tests/soak/check.py wait --bootstrap "$BROKER" --dir "$WORK" --mode "$MODE" \
  --input "$IN" --output "$OUT" || fail "not every request record got a result (see above)"
serve_check
say "every request answered; waiting for the group's commit"
group_lag() { # the group's total lag on the input topic; empty when unknown
  java -cp "${D3_KAFKA_CACHE:-$ROOT/build/_fetch/kafka-3.9.2}/libs/*" -Dlog4j.configuration="file:$KDIR/tools-log4j.properties" \
    org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server "$BROKER" \
    --describe --group "$GROUP" 2>/dev/null |
    awk -v t="$IN" '$2 == t { if ($6 == "-") bad = 1; else lag += $6; n++ } END { if (n && !bad) print lag }'
}
lag=""
for _ in $(seq 1 60); do
  lag="$(group_lag)"
  [ "$lag" = 0 ] && break
  sleep 2
done
[ "$lag" = 0 ] || fail "group $GROUP has not committed $IN to its end (lag ${lag:-unknown}) 120 s after the last result"
RSS_END="$(awk '/^VmRSS:/ { print $2 }' "/proc/$SERVE_PID/status" 2>/dev/null || true)"
kill -TERM "$RSS_PID" 2>/dev/null || true
wait "$RSS_PID" 2>/dev/null || true
RSS_PID=""
ev serve_term "$SERVE_PID"
kill -TERM "$SERVE_PID" 2>/dev/null || true
st=0
for _ in $(seq 1 120); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 1; done
if kill -0 "$SERVE_PID" 2>/dev/null; then
  fail "serve #$N_SERVE still runs 120 s after SIGTERM"
  kill -KILL "$SERVE_PID"
fi
wait "$SERVE_PID" || st=$?
ev serve_exit "$SERVE_PID" "$st"
SERVE_PID=""
[ "$st" -eq 0 ] || fail "serve #$N_SERVE exited $st after SIGTERM, not 0 (see $WORK/serve.$N_SERVE.log)"
say "serve stopped (exit $st, RSS at the end ${RSS_END:-?} kB)"

"$PY" tests/soak/check.py final --bootstrap "$BROKER" --dir "$WORK" --mode "$MODE" \
  --input "$IN" --output "$OUT" --dlq "$DLQ" --minutes "$MINUTES" --kills "$KILLS" \
  --restarts "$RESTARTS"
exit 0
}
