#!/usr/bin/env bash
# ctest grafana: every metric a panel of ops/grafana/d3stream.json queries is
# one that d3stream exports, with the labels the query names. The exports
# are read from a live `d3stream serve --http` (a tiny package, a real broker,
# one Kafka record and one HTTP request answered, so the labelled series
# exist): /metrics of that process carries the Kafka, engine, cache and
# HTTP families at once. Every selector's metric name must be a sample name
# of the scrape (d3stream_x_bucket included) and each label it matches on
# must be a label of that metric. Fails, never skips.
#   D3_KAFKA_BOOTSTRAP  the broker (ops/test.sh starts one)
#   D3_KAFKA_DIR        its ops/kafka.sh directory, for the topics (default
#                       build/_kafka when that is the broker named)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
D3STREAM="${D3STREAM:-$ROOT/build/d3stream}"
MULT="${D3_TEST_TIMEOUT_MULT:-1}"
DASH="$ROOT/ops/grafana/d3stream.json"

fail() {
  echo "grafana: FAIL: $*" >&2
  exit 1
}
[ -x "$D3STREAM" ] || fail "no d3stream binary at $D3STREAM (set D3STREAM)"
# shellcheck source=tests/tools/http_server.sh
. "$ROOT/tests/tools/http_server.sh"
prom_python
BROKERS="${D3_KAFKA_BOOTSTRAP:?grafana: set D3_KAFKA_BOOTSTRAP (ops/kafka.sh start DIR prints it)}"
KDIR="${D3_KAFKA_DIR:-$ROOT/build/_kafka}"
[ "$(cat "$KDIR/bootstrap" 2>/dev/null)" = "$BROKERS" ] ||
  fail "D3_KAFKA_DIR ($KDIR) is not the directory of the broker at $BROKERS"

WORK="$(mktemp -d /tmp/d3grafana-XXXXXX)"
LOG="$WORK/serve.log"
PID=""
cleanup() {
  [ -n "$PID" ] && kill -KILL "$PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

"$D3STREAM" make-package --size tiny --seed 1 --out "$WORK/pkg" >"$WORK/make.log" 2>&1 ||
  { cat "$WORK/make.log" >&2; fail "make-package failed"; }
T="grafana-$$-$RANDOM"
"$ROOT/ops/kafka.sh" topic create "$T.in" 1 "$KDIR" >/dev/null
"$ROOT/ops/kafka.sh" topic create "$T.out" 1 "$KDIR" >/dev/null
printf 'k\t{"state": "the parcel came late", "questions": {"q": {"type": "noul", "instructions": "Late?"}}}\n' |
  kcat -P -b "$BROKERS" -t "$T.in" -K$'\t'
d3_server_start "$LOG" serve --model "$WORK/pkg" --brokers "$BROKERS" --group "$T" \
  --input "$T.in" --output "$T.out" --from-beginning --http 127.0.0.1:0
deadline=$((SECONDS + 60 * MULT))
code="$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' \
  --data-binary "@$ROOT/ops/examples/d3-nano-npu2.json" "$URL/v1/systemone")"
[ "$code" = 200 ] || fail "POST /v1/systemone answered $code"
until grep -q 'msg=result' "$LOG"; do
  [ $SECONDS -lt $deadline ] || { cat "$LOG" >&2; fail "the Kafka record was never answered"; }
  sleep 0.05
done
curl -sf "$URL/metrics" >"$WORK/metrics.txt" || fail "GET /metrics"

# Debian's python3-prometheus-client reads the scrape (as in http_formats.sh).
"$PROM_PY" - "$DASH" "$WORK/metrics.txt" <<'PY' || fail "the dashboard queries what is not exported (above)"
import json, re, sys
from prometheus_client.parser import text_string_to_metric_families

dash = json.load(open(sys.argv[1]))
labels = {}  # sample name (d3stream_x_bucket included) -> its label names
for fam in text_string_to_metric_families(open(sys.argv[2], encoding="utf-8").read()):
    for smp in fam.samples:
        labels.setdefault(smp.name, set()).update(smp.labels)

exprs = []
def walk(p):
    for t in p.get("targets", []):
        exprs.append((p.get("title", "?"), t["expr"]))
    for q in p.get("panels", []):
        walk(q)
for p in dash["panels"]:
    walk(p)
for v in dash.get("templating", {}).get("list", []):
    q = v.get("query")
    exprs.append((f"variable {v['name']}", q["query"] if isinstance(q, dict) else q))

bad, n = [], 0
for title, e in exprs:
    for m in re.finditer(r"\b(d3stream_[a-z0-9_]+)(\{([^}]*)\})?", e):
        n += 1
        name = m.group(1)
        if name not in labels:
            bad.append(f"{title}: {name} is not exported")
            continue
        # label matchers, by (le) and by (x) clauses around this selector
        used = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)', m.group(3) or ""))
        used.discard("instance")  # Prometheus' own target label
        for lab in sorted(used - labels[name]):
            bad.append(f"{title}: {name} has no label {lab!r} (it has {sorted(labels[name])})")
    for by in re.findall(r"\bby\s*\(([^)]*)\)", e):
        names = re.findall(r"\b(d3stream_[a-z0-9_]+)", e)
        for lab in [x.strip() for x in by.split(",") if x.strip()]:
            if lab == "instance":
                continue
            if not any(lab in labels.get(nm, set()) for nm in names):
                bad.append(f"{title}: by ({lab}) names a label none of {names} has")
if n == 0:
    sys.exit("no d3stream_ metric in the dashboard")
for b in bad:
    print("grafana:", b)
print(f"grafana: {len(exprs)} queries, {n} selectors, {len(labels)} exported sample names")
sys.exit(1 if bad else 0)
PY
echo "grafana: ok"
