#!/usr/bin/env python3
"""The checks of tests/soak.sh, over the files of its run directory.

    check.py wait  --bootstrap B --dir D --mode eos|alo --input T --output T
        until every record of the input topic has a result (read_committed
        for eos); fails when nothing new came for --stall s.
    check.py final --bootstrap B --dir D --mode eos|alo --input T --output T
                   --dlq T --minutes M --kills K --restarts R
        every check, one line per failure, then the summary; exit 1 on any.

The run directory (tests/soak.sh, tests/soak/load.py): events.tsv (epoch,
event, details: serve_start/serve_ready/kill9/serve_died/broker_stop/
broker_up/load_stop...), failures.txt (what soak.sh itself found),
kafka-sent.tsv (key, kind, expected status, bytes, epoch), http.tsv,
disconnects.tsv, probes.tsv, rss.tsv (epoch, pid, VmRSS kB), serve.N.log,
serve.N.prom. Topics are read with kcat (librdkafka, like serve).
"""
import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import time

# ------------------------------------------------------------------ expected log lines
#
# serve writes logfmt lines (level=info|warn|error), librdkafka's own lines
# (%LEVEL|epoch|FAC|client| ...: 0-3 errors, 4 warnings, 5-7 notices and
# debug) and plain lines (consumer, progress, start-up). An "error line" is a
# logfmt warn/error line, a librdkafka line of level 0-4, or a plain line
# that says error, fail, fatal, abort, fenced, warning or timed out. Each must
# match one of these; "window" says when it may appear:
#   any      at any time;
#   outage   from a broker stop to 60 s after the broker is back;
#   start    in the first 30 s of a serve process (after a kill -9 the new
#            process meets the old one's group member, transaction and
#            partitions), or within an outage.
EXPECTED = [
    # The synthetic package's placeholder template (make-package writes it;
    # serve renders the d3 prompt itself): one line per start.
    ("any", r"d3stream serve: warning: chat_template\.jinja .* is not a chat template the decision3"),
    # -X session.timeout.ms / heartbeat.interval.ms go to the consumer and the
    # producer alike; the producer says it ignores them, once per start.
    ("any", r"CONFWARN\|rdkafka#producer-\d+\| .*is a consumer property and will be ignored"),
    # libmicrohttpd's own wording (MHD_USE_ERROR_LOG) when serve closes, on
    # purpose, the connection of a client that hung up while its request
    # waited (ops_http_route.c: client_gone -> MHD_NO, the 499 of the log):
    # at most one per 499 (counted below).
    ("any", r"^Application reported internal error, closing connection\.$"),
    # libmicrohttpd: a client that left (RST) as its answer was written, or
    # in the middle of its body (the disconnecting client does both).
    ("any", r"^Failed to send the response headers for the request for `/v1/systemone'\. "
            r"Error: The connection was forcibly closed by remote peer$"),
    ("any", r"^Socket has been disconnected when reading request\.$"),
    # librdkafka while the broker is down or just back: connections refused,
    # reset, timed out; all brokers down; requests that failed and are retried.
    ("outage", r"\|(FAIL|ERROR|REQTMOUT|BROKERFAIL|DISCONNECT|CONNECT|TERMINATE|ALLBROKERSDOWN)\|"),
    ("outage", r"Connect to ipv4#127\.0\.0\.1:\d+ failed: Connection refused"),
    ("outage", r"(Disconnected|Connection reset|broker transport failure|All broker connections are down)"),
    ("outage", r"(timed out|Timed out)"),
    # A broker outage longer than session.timeout.ms: the member's session
    # ends, it gives up its partitions and rejoins; the auto-commit (at least
    # once) waits for the coordinator meanwhile.
    ("outage", r"\|SESSTMOUT\|.*Consumer group session timed out"),
    ("outage", r"\|COMMITFAIL\|.*: (Local: Waiting for coordinator|Broker: Coordinator not available|"
               r"Broker: Not coordinator|Local: Broker transport failure|Local: Timed out)"),
    # Exactly-once after the member lost its session (an outage) or the
    # group rebalanced (a restarted member): the offsets of the open
    # transaction belong to a generation that is gone, so the transaction
    # is aborted and its records redone from the committed offsets (serve
    # --help, --exactly-once); the results check shows nothing doubled.
    ("start", r"\|TXNERR\|rdkafka#producer-\d+\| .*Current transaction failed in state "
              r"InTransaction: Failed to commit offsets to transaction .*"
              r"\((UNKNOWN_MEMBER_ID|ILLEGAL_GENERATION|REBALANCE_IN_PROGRESS|FENCED_INSTANCE_ID)\)$"),
    ("start", r"^d3stream serve: transaction of \d+ results aborted: send_offsets_to_transaction: "
              r".*\((UNKNOWN_MEMBER_ID|ILLEGAL_GENERATION|REBALANCE_IN_PROGRESS)\); "
              r"rewinding to the committed offsets$"),
    # The transaction coordinator (transaction state log) loading after the
    # broker's restart, or a coordinator lookup failing while it is down:
    # librdkafka retries.
    # A restarted serve's init_transactions while the broker still ends (aborts)
    # the killed one's transaction: CONCURRENT_TRANSACTIONS, retried.
    ("start", r"GETPID\|.*(Coordinator load in progress|Coordinator not available|Not coordinator|"
              r"another concurrent operation on the same transaction was ongoing): retrying"),
    ("outage", r"(Coordinator load in progress|Coordinator not available|Not coordinator|"
               r"NOT_COORDINATOR|COORDINATOR_NOT_AVAILABLE|COORDINATOR_LOAD_IN_PROGRESS)"),
]
# Lines that are never errors even though a word above appears in them.
BENIGN = [
    r"level=info ",  # logfmt info lines (results, requests: their statuses are checked elsewhere)
    r"^%[5-7]\|",  # librdkafka notice/info/debug
    # serve's last line: no failed delivery (a non-zero count stays an error)
    r"^d3stream serve: stopped: \d+ answered, 0 failed deliveries, \d+ stale, "
    r"\d+ transactions committed, \d+ aborted$",
]
ERRORISH = re.compile(r"level=(warn|error)|^%[0-4]\||error|fail|fatal|abort|fenc|warning|timed out",
                      re.IGNORECASE)

# The outage patterns apply to the Kafka clients' lines only: librdkafka's
# own and serve's consumer/producer reports of its errors.
KAFKA_LINE = re.compile(r"^(%[0-7]\|\d+\.\d+\|[A-Z]+\|rdkafka#|d3stream consumer: |producer: rdkafka#)")

OUTAGE_TAIL = 60.0
START_GRACE = 30.0

# ------------------------------------------------------------------ input


def read_tsv(path):
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8", errors="replace") as f:
        return [line.rstrip("\n").split("\t") for line in f if line.strip()]


def read_events(d):
    evs = []
    for line in open(os.path.join(d, "events.tsv")):
        p = line.split()
        if len(p) >= 2:
            evs.append((float(p[0]), p[1], p[2:]))
    return evs


def kcat_read(bootstrap, topic, fmt, isolation="read_committed"):
    """Every record of topic, as lines of kcat's -f fmt (a trailing \\n)."""
    p = subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q",
                        "-X", f"isolation.level={isolation}", "-f", fmt],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"kcat reading {topic}: {p.stderr.decode(errors='replace')[-500:]}")
    return p.stdout.decode("utf-8", errors="replace").split("\n")[:-1]


def read_input(a):
    """{source "topic/p/o": key}."""
    recs = {}
    for line in kcat_read(a.bootstrap, a.input, "%p\t%o\t%k\n"):
        p, o, k = line.split("\t", 2)
        recs[f"{a.input}/{p}/{o}"] = k
    return recs


def parse_headers(h):
    out = {}
    for kv in h.split(","):
        if "=" in kv:
            k, v = kv.split("=", 1)
            out[k] = v
    return out


def read_results(a, isolation="read_committed"):
    """[(key, headers, value)] of the results topic."""
    res = []
    for line in kcat_read(a.bootstrap, a.output, "%k\t%h\t%s\n", isolation):
        k, h, v = line.split("\t", 2)
        res.append((k, parse_headers(h), v))
    return res


# ------------------------------------------------------------------ wait


def cmd_wait(a):
    last_n, last_t = -1, time.time()
    while True:
        inp = read_input(a)
        got = {h.get("d3-source") for _, h, _ in read_results(a)}
        missing = [s for s in inp if s not in got]
        n = len(inp) - len(missing)
        if not missing:
            print(f"check: all {len(inp)} request records have a result", file=sys.stderr)
            return 0
        if n != last_n:
            last_n, last_t = n, time.time()
            print(f"check: {n} of {len(inp)} request records answered", file=sys.stderr)
        elif time.time() - last_t > a.stall:
            print(f"check: {len(missing)} of {len(inp)} request records have no result after "
                  f"{a.stall:.0f} s without progress, e.g. {sorted(missing)[:5]}", file=sys.stderr)
            return 1
        time.sleep(3)


# ------------------------------------------------------------------ final


class Windows:
    """Times when serve was down (kill -9 .. ready) and the broker was
    (stop .. back + OUTAGE_TAIL), and the start of each serve process."""

    def __init__(self, evs):
        self.down, self.outages, self.starts = [], [], []
        self.kills = [t for t, name, _ in evs if name in ("kill9", "serve_died")]
        t_kill = None
        t_stop = None
        for t, name, _ in evs:
            if name in ("kill9", "serve_died"):
                t_kill = t
            elif name == "serve_start":
                self.starts.append(t)
            elif name == "serve_ready" and t_kill is not None:
                self.down.append((t_kill - 0.5, t + 3.0))
                t_kill = None
            elif name == "broker_stop":
                t_stop = t
            elif name == "broker_up" and t_stop is not None:
                self.outages.append((t_stop - 0.5, t + OUTAGE_TAIL))
                t_stop = None
        if t_stop is not None:
            self.outages.append((t_stop - 0.5, float("inf")))

    @staticmethod
    def within(t, spans):
        return any(lo <= t <= hi for lo, hi in spans)

    def serve_down(self, t):
        return self.within(t, self.down)

    def refused(self, t0, t1, conn_t):
        """Whether a failed connection is the kill's doing: it failed while
        serve was down, or it was a keep-alive connection to a process
        killed since it was opened (its next request meets the reset)."""
        return (self.serve_down(t0) or self.serve_down(t1) or
                (conn_t > 0 and any(conn_t <= k <= t0 for k in self.kills)))

    def outage(self, t):
        return self.within(t, self.outages)

    def start(self, t):
        return any(s - 0.5 <= t <= s + START_GRACE for s in self.starts) or self.outage(t)


TS_LOGFMT = re.compile(r"^ts=(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d(?:\.\d+)?)Z")
TS_RDK = re.compile(r"^%\d\|(\d+\.\d+)\|")


def line_time(line, prev):
    m = TS_RDK.match(line)
    if m:
        return float(m.group(1))
    m = TS_LOGFMT.match(line)
    if m:
        import calendar
        y, mo, d, hh, mm = (int(x) for x in m.groups()[:5])
        return calendar.timegm((y, mo, d, hh, mm, 0)) + float(m.group(6))
    return prev  # plain lines: the time of the line before


def check_logs(d, win, fails):
    expected = [(w, re.compile(p)) for w, p in EXPECTED]
    benign = [re.compile(p) for p in BENIGN]
    counts = collections.Counter()
    bad = []
    n_logs = 0
    status = collections.Counter()
    for name in sorted(os.listdir(d)):
        if not re.match(r"serve\.\d+\.log$", name):
            continue
        n_logs += 1
        t = None
        # The start event of this process: plain lines before any stamp.
        with open(os.path.join(d, name), encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                t = line_time(line, t)
                m = re.search(r" msg=(result|request) .*status=(\d+)", line)
                if m:
                    status[(m.group(1), m.group(2))] += 1
                if not ERRORISH.search(line) or any(b.search(line) for b in benign):
                    continue
                ok = False
                for w, rx in expected:
                    if not rx.search(line):
                        continue
                    if w == "outage" and not KAFKA_LINE.search(line):
                        continue
                    if (w == "any" or t is None or (w == "outage" and win.outage(t)) or
                            (w == "start" and win.start(t))):
                        ok = True
                        counts[rx.pattern[:60]] += 1
                        break
                if not ok:
                    bad.append(f"{name}: {line[:300]}")
    closed = counts.get(expected[2][1].pattern[:60], 0)
    if closed > status[("request", "499")]:
        fails.append(f"logs: {closed} 'Application reported internal error' lines but only "
                     f"{status[('request', '499')]} requests logged 499: not all for departed "
                     "clients")
    if bad:
        fails.append(f"logs: {len(bad)} unexpected error/warning lines in serve's logs, e.g.:\n    "
                     + "\n    ".join(bad[:15]))
    return n_logs, counts, status


def check_records(a, fails, info):
    sent = {}
    kinds = collections.Counter()
    for row in read_tsv(os.path.join(a.dir, "kafka-sent.tsv")):
        key, kind, expect = row[0], row[1], int(row[2])
        sent[key] = (kind, expect)
        kinds[kind] += 1
    inp = read_input(a)
    by_key = collections.defaultdict(list)
    for src, key in inp.items():
        by_key[key].append(src)
    # The producer (kcat, idempotent) wrote each record once.
    lost = [k for k in sent if k not in by_key]
    twice = [k for k, s in by_key.items() if len(s) > 1]
    alien = [k for k in by_key if k not in sent]
    if lost:
        fails.append(f"input: {len(lost)} records the load generator sent are not in {a.input} "
                     f"(the producer lost them), e.g. {lost[:5]}")
    if twice:
        fails.append(f"input: {len(twice)} keys are in {a.input} more than once (a producer retry "
                     f"wrote a copy), e.g. {twice[:5]}")
    if alien:
        fails.append(f"input: {len(alien)} records in {a.input} that nobody sent, e.g. {alien[:5]}")

    res = read_results(a)
    per_src = collections.defaultdict(list)
    unknown = []
    for key, h, v in res:
        src = h.get("d3-source")
        if src not in inp:
            unknown.append((key, src))
            continue
        per_src[src].append((key, h, v))
    if unknown:
        fails.append(f"results: {len(unknown)} results name no request record (d3-source), "
                     f"e.g. {unknown[:5]}")
    none, multi, wrong = [], [], []
    dups = 0
    status_n = collections.Counter()
    for src, key in inp.items():
        rs = per_src.get(src, [])
        if not rs:
            none.append(f"{key} ({src})")
            continue
        if len(rs) > 1:
            dups += len(rs) - 1
            multi.append(f"{key} ({src}) x{len(rs)}")
        kind, expect = sent.get(key, ("?", None))
        for rkey, h, v in rs:
            st = h.get("d3-status", "")
            status_n[st] += 1
            problem = None
            if rkey != key:
                problem = f"keyed {rkey!r}"
            elif expect is not None and st != str(expect):
                problem = f"status {st}, want {expect}"
            elif st == "200" and '"answers"' not in v:
                problem = "a 200 without answers"
            elif not h.get("d3-request-id") or not h.get("d3-model"):
                problem = "no d3-request-id or d3-model header"
            if problem:
                wrong.append(f"{key} ({kind}, {src}): {problem}: {v[:160]}")
    if none:
        fails.append(f"results: {len(none)} request records have no result, e.g. {none[:5]}")
    if a.mode == "eos" and multi:
        fails.append(f"results: exactly-once, yet {len(multi)} request records have more than one "
                     f"committed result ({dups} extra), e.g. {multi[:5]}")
    if wrong:
        fails.append(f"results: {len(wrong)} results are not what their request must get, e.g.:\n    "
                     + "\n    ".join(wrong[:10]))
    info["sent"] = len(sent)
    info["kinds"] = kinds
    info["input"] = len(inp)
    info["results"] = len(res)
    info["dups"] = dups
    info["result_status"] = status_n
    info["bad_sent"] = sum(n for k, n in kinds.items() if k.startswith("bad-"))
    if a.mode == "eos":
        info["uncommitted"] = len(kcat_read(a.bootstrap, a.output, "%o\n", "read_uncommitted"))

    # The DLQ: only dead letters of bad records. In JSON mode a record is
    # never a dead letter (serve --help, --dlq): every value gets its answer.
    dl = kcat_read(a.bootstrap, a.dlq, "%k\t%h\n", "read_committed")
    info["dlq"] = len(dl)
    expect_dlq = 0  # JSON mode
    not_bad = [line.split("\t", 1)[0] for line in dl
               if not sent.get(line.split("\t", 1)[0], ("",))[0].startswith("bad-")]
    if not_bad:
        fails.append(f"dlq: {len(not_bad)} dead letters are not bad records, e.g. {not_bad[:5]}")
    if len(dl) != expect_dlq:
        fails.append(f"dlq: {len(dl)} dead letters, want {expect_dlq} (JSON mode: bad records get a "
                     f"400/404 result, never a dead letter), e.g. {dl[:3]}")


def check_http(a, win, fails, info):
    rows = read_tsv(os.path.join(a.dir, "http.tsv"))
    st = collections.Counter()
    unexpected, excused = [], 0
    reused = 0
    for r in rows:
        t0, t1, rid, kind, expect, status, reuse, note, conn_t = (r + [""] * 9)[:9]
        st[status] += 1
        reused += reuse == "1"
        if status == expect and not note.startswith(("x-request-id", "200-")):
            continue
        # 429 overloaded is the contract's admission answer (SPEC b.7) while
        # the backfill holds the engine's queue (--max-queue jobs): a real
        # client retries it after Retry-After. Counted, not a failure.
        if ((status == "conn" and win.refused(float(t0), float(t1), float(conn_t or 0))) or
                (status == "503" and win.serve_down(float(t0))) or
                (status == "429" and "overloaded" in note)):
            excused += 1
            continue
        unexpected.append(f"{rid} {kind} at +{float(t0) - info['t0']:.1f}s: {status} "
                          f"(want {expect}) {note}")
    if unexpected:
        fails.append(f"http: {len(unexpected)} answers other than the intended ones, e.g.:\n    "
                     + "\n    ".join(unexpected[:10]))
    info["http"] = len(rows)
    info["http_status"] = st
    info["http_excused"] = excused
    info["http_reused"] = reused
    info["http_bad"] = sum(1 for r in rows if r[3].startswith("bad-"))
    info["http_img"] = sum(1 for r in rows if r[3].startswith("img-"))
    probes = read_tsv(os.path.join(a.dir, "probes.tsv"))
    pbad = [f"{p[1]} at +{float(p[0]) - info['t0']:.1f}s: {p[2]}" for p in probes
            if p[2] != "200" and not win.serve_down(float(p[0])) and
            not (p[2].startswith("conn") and win.refused(float(p[0]), float(p[0]),
                                                         float((p + ["0"])[3])))]
    if pbad:
        fails.append(f"probes: {len(pbad)} /health or /metrics answers not 200 while serve ran, "
                     f"e.g. {pbad[:5]}")
    info["probes"] = len(probes)
    dis = read_tsv(os.path.join(a.dir, "disconnects.tsv"))
    dbad = [f"{x[1]} {x[2]}: {x[3]}" for x in dis
            if x[3] != "left" and not win.serve_down(float(x[0]))]
    if dbad:
        fails.append(f"disconnects: {len(dbad)} connections refused while serve ran, e.g. {dbad[:5]}")
    info["disconnects"] = collections.Counter(x[2] for x in dis)


def check_rss(a, evs, fails, info):
    """The last serve process: its RSS at the end of its warm-up against
    the end of the load."""
    starts = [(t, d[0]) for t, n, d in evs if n == "serve_ready"]
    stop = [t for t, n, _ in evs if n == "load_stop"]
    if not starts or not stop:
        fails.append("rss: no serve start or load stop recorded")
        return
    t_start, pid = starts[-1]
    t_end = stop[-1]
    samples = [(float(r[0]), int(r[2])) for r in (x.split() for x in
               open(os.path.join(a.dir, "rss.tsv")).read().splitlines()) if r[1] == pid]
    quiet = t_end - t_start
    warm = max(60.0, 0.4 * quiet)
    info["rss_quiet"] = quiet
    info["rss_warm"] = warm
    if quiet < warm + 30:
        info["rss"] = f"not measured: the last serve ran only {quiet:.0f} s of load"
        if a.minutes >= 3:
            fails.append(f"rss: the last serve process ran only {quiet:.0f} s of load, too little "
                         f"to measure")
        return
    # At the end of the warm-up: the highest sample so far (malloc keeps what
    # a burst took; the process has had its bursts, images, disconnects).
    warmup = [kb for t, kb in samples if t <= t_start + warm]
    at_warm = [kb for t, kb in samples if t_start + warm - 10 <= t <= t_start + warm]
    end = [kb for t, kb in samples if t_end - 20 <= t <= t_end]
    if not warmup or not at_warm or not end:
        fails.append(f"rss: no samples of pid {pid} in its warm-up or at the end of the load")
        return
    b, e = max(warmup), statistics.median(end)
    growth = (e - b) / b * 100
    info["rss"] = (f"pid {pid}: {b / 1024:.1f} MiB by the end of a {warm:.0f} s warm-up "
                   f"(its last 10 s: median {statistics.median(at_warm) / 1024:.1f}) -> "
                   f"{e / 1024:.1f} MiB at the end, {quiet - warm:.0f} s later ({growth:+.2f}%); "
                   f"peak after the warm-up {max(kb for t, kb in samples if t > t_start + warm) / 1024:.1f} MiB")
    # The bound holds from 10 minutes on: in a 3-minute run the last serve
    # has a minute of warm-up and about one more, too short for malloc's
    # arenas to plateau (measured -1.3% to +8.3% there; 30 minutes: -4.0%).
    if growth >= 5.0 and a.minutes >= 10:
        fails.append(f"rss: serve grew by {growth:.2f}% (>= 5%) after its warm-up: {info['rss']}")
    elif growth >= 5.0:
        info["rss"] += " (not bounded under 10 minutes)"
    # The other processes, for the record.
    others = collections.defaultdict(list)
    for r in open(os.path.join(a.dir, "rss.tsv")).read().splitlines():
        t, p, kb = r.split()
        if p != pid:
            others[p].append(int(kb))
    info["rss_others"] = [f"{max(v) / 1024:.1f}" for v in others.values()]


def metric_sum(d, name):
    """The sum over serve processes of a counter's last value in their
    metrics files (a killed process's file is up to 5 s old)."""
    tot = 0.0
    for f in os.listdir(d):
        if re.match(r"serve\.\d+\.prom$", f):
            for line in open(os.path.join(d, f)):
                p = line.split()
                if len(p) == 2 and p[0] == name:
                    tot += float(p[1])
    return int(tot)


def cmd_final(a):
    fails = [line.rstrip("\n") for line in open(os.path.join(a.dir, "failures.txt")) if line.strip()]
    evs = read_events(a.dir)
    win = Windows(evs)
    info = {"t0": evs[0][0] if evs else 0}
    check_records(a, fails, info)
    check_http(a, win, fails, info)
    check_rss(a, evs, fails, info)
    n_logs, expected_seen, log_status = check_logs(a.dir, win, fails)

    k = info["kinds"]
    print("")
    print(f"soak summary ({'exactly-once' if a.mode == 'eos' else 'at-least-once'}, "
          f"{a.minutes} min of load)")
    print(f"  faults     {a.kills} kill -9 of serve, {a.restarts} broker restarts; "
          f"{n_logs} serve processes")
    print(f"  kafka      {info['input']} request records ({info['sent']} sent: "
          f"{k['new']} new, {k['dup']} repeats, {info['bad_sent']} bad, "
          f"{k['img-png'] + k['img-jpeg']} images)")
    extra = (f", {info['uncommitted'] - info['results']} more in aborted transactions"
             if a.mode == "eos" else "")
    st = info["result_status"]
    print(f"  results    {info['results']} ({', '.join(f'{s}: {n}' for s, n in sorted(st.items()))})"
          f"; {info['dups']} duplicates{extra}")
    print(f"  dlq        {info['dlq']} (JSON mode: none expected)")
    hs = info["http_status"]
    print(f"  http       {info['http']} requests ({', '.join(f'{s}: {n}' for s, n in sorted(hs.items()))}"
          f"; {info['http_bad']} intended bad, {info['http_img']} images; "
          f"{info['http_reused']} on a reused keep-alive connection; "
          f"{info['http_excused']} refused/503 by a kill -9 or 429 overloaded)")
    dis = info["disconnects"]
    print(f"  clients    {sum(dis.values())} left mid-request "
          f"({', '.join(f'{m}: {n}' for m, n in sorted(dis.items()))}); "
          f"499 logged {log_status[('request', '499')]}; {info['probes']} probes")
    print(f"  cache      {metric_sum(a.dir, 'd3stream_result_cache_hits_total')} hits, "
          f"{metric_sum(a.dir, 'd3stream_engine_joins_total')} joins (metrics files)")
    print(f"  rss        {info.get('rss', '?')}"
          + (f"; earlier processes' peaks {', '.join(info['rss_others'])} MiB"
             if info.get("rss_others") else ""))
    if expected_seen:
        print("  expected   " + "; ".join(f"{n}x {p}" for p, n in expected_seen.most_common()))
    if fails:
        print("")
        for f in fails:
            print(f"soak: FAIL {f}")
        print(f"soak: {len(fails)} check(s) failed; files in {a.dir}")
        return 1
    print("soak: all checks passed")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=["wait", "final"])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--mode", choices=["eos", "alo"], required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--dlq")
    ap.add_argument("--minutes", type=int, default=3)
    ap.add_argument("--kills", type=int, default=0)
    ap.add_argument("--restarts", type=int, default=0)
    ap.add_argument("--stall", type=float, default=120.0)
    a = ap.parse_args()
    return cmd_wait(a) if a.cmd == "wait" else cmd_final(a)


if __name__ == "__main__":
    sys.exit(main())
