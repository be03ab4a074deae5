#!/usr/bin/env python3
"""The load of tests/soak.sh: Kafka request records and HTTP clients.

    load.py backfill N SEED DIR > records.tsv
        N request records as `key<TAB>value` lines for `kcat -P -K'\\t'`
        (the backfill preloaded before serve starts), each logged in
        DIR/kafka-sent.tsv.
    load.py run --bootstrap H:P --topic T --http H:P --dir DIR [options]
        until DIR/stop exists (or SIGTERM/SIGINT): a Kafka producer (one kcat
        -P process, idempotent, fed line by line) at --kafka-rate records/s
        with a burst of --burst records every --burst-every s; --http-clients
        keep-alive clients POSTing /v1/systemone; one client that disconnects
        mid-request (half a body, or the whole body and gone before the
        answer); a prober of /health and /metrics. What was sent and what came
        back is logged in DIR (kafka-sent.tsv, http.tsv, disconnects.tsv,
        probes.tsv) for tests/soak/check.py; at the end DIR/load.json.

The mix, both paths: ~62% new requests (a ticket number in the state: never
answered before), ~30% byte-for-byte repeats of an earlier body (Kafka or HTTP:
the result cache), ~5% bad ones with the status the contract gives them
(400 not JSON / not UTF-8 / empty / every question invalid, 404 unknown model),
and an image request (PNG of random pixels or a baseline JPEG of random DCT
coefficients, 150-500 KB) every --image-every s on each path. Deterministic for
a seed, apart from timing. Standard library only (no Kafka client: kcat).
"""
import http.client
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
import base64
import importlib.util
import argparse
import collections

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# The project's request generator (tests/bench/gen_requests.py): short
# ticket-routing states, one to three questions.
_spec = importlib.util.spec_from_file_location(
    "gen_requests", os.path.join(ROOT, "tests", "bench", "gen_requests.py"))
gen_requests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_requests)

# ------------------------------------------------------------------ images


def png_noise(rng, w, h):
    """An RGB PNG of random pixels (incompressible: ~3*w*h bytes)."""
    raw = bytearray()
    for _ in range(h):
        raw.append(0)
        raw += rng.randbytes(3 * w)

    def chunk(tag, data):
        c = struct.pack(">I", len(data)) + tag + data
        return c + struct.pack(">I", zlib.crc32(tag + data) & 0xffffffff)

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) +
            chunk(b"IDAT", zlib.compress(bytes(raw), 1)) + chunk(b"IEND", b""))


class BitWriter:
    def __init__(self):
        self.out = bytearray()
        self.acc = 0
        self.n = 0

    def put(self, code, length):
        self.acc = (self.acc << length) | code
        self.n += length
        while self.n >= 8:
            self.n -= 8
            b = (self.acc >> self.n) & 0xff
            self.out.append(b)
            if b == 0xff:
                self.out.append(0)  # byte stuffing
        self.acc &= (1 << self.n) - 1

    def flush(self):
        if self.n:
            self.put((1 << (8 - self.n)) - 1, 8 - self.n)  # pad with ones


def _cat(v):
    """JPEG magnitude category and the bits of v."""
    a = abs(v)
    s = a.bit_length()
    return s, (v if v >= 0 else v + (1 << s) - 1)


def jpeg_noise(rng, w, h, ncomp=3, density=0.45):
    """A baseline JPEG (SOF0, 4:4:4) of random quantized DCT coefficients:
    a valid file any decoder reads, as large as a photo of its size, made
    without a DCT. Own Huffman tables: the 12 DC categories as 4-bit codes,
    the 162 AC symbols as 8-bit codes (no all-ones code, as JPEG requires)."""
    dc_syms = list(range(12))
    ac_syms = [0x00, 0xf0] + [(r << 4) | s for r in range(16) for s in range(1, 11)]
    dc_code = {s: i for i, s in enumerate(dc_syms)}
    ac_code = {s: i for i, s in enumerate(ac_syms)}

    def seg(marker, data):
        return struct.pack(">BBH", 0xff, marker, len(data) + 2) + data

    out = bytearray(b"\xff\xd8")
    out += seg(0xe0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
    out += seg(0xdb, b"\x00" + bytes([2] * 64))
    sof = struct.pack(">BHHB", 8, h, w, ncomp)
    for c in range(ncomp):
        sof += bytes([c + 1, 0x11, 0])
    out += seg(0xc0, sof)
    bits = [0] * 16
    bits[3] = len(dc_syms)
    out += seg(0xc4, b"\x00" + bytes(bits) + bytes(dc_syms))
    bits = [0] * 16
    bits[7] = len(ac_syms)
    out += seg(0xc4, b"\x10" + bytes(bits) + bytes(ac_syms))
    sos = bytes([ncomp]) + b"".join(bytes([c + 1, 0x00]) for c in range(ncomp)) + b"\x00\x3f\x00"
    out += seg(0xda, sos)
    bw = BitWriter()
    pred = [0] * ncomp
    rnd = rng.random
    rint = rng.randint
    for _ in range(((h + 7) // 8) * ((w + 7) // 8)):
        for c in range(ncomp):
            dc = rint(-120, 120)
            s, b = _cat(dc - pred[c])
            pred[c] = dc
            bw.put(dc_code[s], 4)
            if s:
                bw.put(b, s)
            run = 0
            for _k in range(63):
                if rnd() >= density:
                    run += 1
                    continue
                v = rint(1, 40) * (1 if rnd() < 0.5 else -1)
                while run > 15:
                    bw.put(ac_code[0xf0], 8)
                    run -= 16
                s, b = _cat(v)
                bw.put(ac_code[(run << 4) | s], 8)
                bw.put(b, s)
                run = 0
            if run:
                bw.put(ac_code[0x00], 8)  # EOB
    bw.flush()
    out += bw.out
    out += b"\xff\xd9"
    return bytes(out)


# ------------------------------------------------------------------ requests

BAD_KINDS = [
    # kind, expected status (SPEC b.7: the contract's answer to each)
    ("bad-json", 400),
    ("bad-utf8", 400),
    ("bad-empty", 400),
    ("bad-invalid", 400),
    ("bad-model", 404),
]


class Gen:
    """Request bodies: new, repeats, bad, images. Thread-safe."""

    def __init__(self, seed, tag):
        self.rng = random.Random(seed)
        self.tag = tag
        self.lock = threading.Lock()
        self.ticket = 0
        self.pool = collections.deque(maxlen=400)  # recent good text bodies
        self.jpegs = []

    def new(self):
        with self.lock:
            self.ticket += 1
            req = gen_requests.request(self.rng, False, f"{self.tag}{self.ticket}")
            body = json.dumps(req, separators=(",", ":")).encode()
            self.pool.append(body)
            return body

    def pick(self, p_dup=0.30, p_bad=0.05):
        """(kind, body bytes, expected status) of a text request."""
        with self.lock:
            r = self.rng.random()
            if r < p_bad:
                kind, status = self.rng.choice(BAD_KINDS)
                return kind, self.bad(kind), status
            if r < p_bad + p_dup and self.pool:
                return "dup", self.rng.choice(self.pool), 200
        return "new", self.new(), 200

    def bad(self, kind):
        rng = self.rng
        if kind == "bad-json":
            return rng.choice([b'{"state": "unterminated', b"{bad", b"[1, 2,", b"not json at all",
                               b'{"state": "x", "questions": {"q": {"type": "noul",}}}'])
        if kind == "bad-utf8":
            return b'{"state": "caf\xe9 \xff\xfe", "questions": {}}'
        if kind == "bad-empty":
            return b""
        if kind == "bad-invalid":  # valid JSON, every question invalid
            return json.dumps({"state": f"bad {rng.random():.6f}", "questions": {"route": {
                "type": "choice", "criteria": {"only-one": None}}}}).encode()
        if kind == "bad-model":
            return json.dumps({"model": "no-such-model", "state": "x", "questions": {"q": {
                "type": "noul", "instructions": "ok?"}}}).encode()
        raise ValueError(kind)

    def image(self):
        """(kind, body, 200): a request of one large image, two questions."""
        with self.lock:
            self.ticket += 1
            t = self.ticket
            rng = random.Random(self.rng.random())
            use_jpeg = self.rng.random() < 0.5
            jpegs = self.jpegs
        if use_jpeg:
            if len(jpegs) < 6:  # a few made once (pure Python: ~1 s each)
                w, h = rng.choice([(256, 192), (320, 240), (384, 256)])
                img = jpeg_noise(rng, w, h)
                with self.lock:
                    self.jpegs.append(img)
            else:
                img = rng.choice(jpegs)
            url = "data:image/jpeg;base64," + base64.b64encode(img).decode()
            kind = "img-jpeg"
        else:
            w, h = rng.choice([(224, 224), (300, 200), (320, 320), (400, 360)])
            img = png_noise(rng, w, h)
            url = "data:image/png;base64," + base64.b64encode(img).decode()
            kind = "img-png"
        req = {"state": f"Claim {self.tag}{t}: a photo of the parcel as it arrived.",
               "images": [url],
               "questions": {
                   "damaged": {"type": "noul", "instructions": "Is the parcel damaged?"},
                   "action": {"type": "choice", "instructions": "What should we do?",
                              "criteria": {"refund": "Refund the order", "replace": None,
                                           "reject": "Reject the claim"}}}}
        return kind, json.dumps(req, separators=(",", ":")).encode(), 200


def tsv_line(*fields):
    return "\t".join(str(f) for f in fields) + "\n"


# ------------------------------------------------------------------ backfill


def cmd_backfill(n, seed, d):
    gen = Gen(seed, "B")
    out = sys.stdout.buffer
    with open(os.path.join(d, "kafka-sent.tsv"), "a") as log:
        for i in range(n):
            if i % 250 == 125:
                kind, body, status = gen.image()
            else:
                kind, body, status = gen.pick()
            key = f"bf-{i:07d}"
            out.write(key.encode() + b"\t" + body + b"\n")
            log.write(tsv_line(key, kind, status, len(body), f"{time.time():.3f}"))
    out.flush()


# ------------------------------------------------------------------ run


class Runner:
    def __init__(self, a):
        self.a = a
        self.stop = threading.Event()
        self.host, port = a.http.rsplit(":", 1)
        self.port = int(port)
        self.lock = threading.Lock()
        self.files = {}
        self.counts = collections.Counter()
        self.gen = Gen(a.seed, "L")

    def log(self, name, line):
        with self.lock:
            f = self.files.get(name)
            if f is None:
                f = self.files[name] = open(os.path.join(self.a.dir, name), "a", buffering=1)
            f.write(line)

    def stopped(self):
        if os.path.exists(os.path.join(self.a.dir, "stop")):
            self.stop.set()
        return self.stop.is_set()

    # ---------------------------------------------------------- Kafka

    def kcat(self):
        a = self.a
        # -E: keep going while the broker is down (kcat exits on "all
        # brokers down" otherwise). Idempotent: a retry across a broker
        # restart writes no second copy.
        return subprocess.Popen(
            ["kcat", "-P", "-E", "-b", a.bootstrap, "-t", a.topic, "-K", "\t",
             "-X", "enable.idempotence=true", "-X", "linger.ms=5",
             "-X", "message.timeout.ms=600000", "-X", "message.max.bytes=2000000"],
            stdin=subprocess.PIPE, stderr=self.kcat_log, stdout=self.kcat_log)

    def kafka(self):
        a = self.a
        self.kcat_log = open(os.path.join(a.dir, "kcat-producer.log"), "ab")
        p = self.kcat()
        seq = 0
        t_img = time.time() + a.image_every / 2
        t_burst = time.time() + a.burst_every
        period = 1.0 / a.kafka_rate
        nxt = time.time()
        try:
            while not self.stopped():
                now = time.time()
                batch = []
                if now >= t_img:
                    batch.append(self.gen.image())
                    t_img = now + a.image_every
                elif a.burst and now >= t_burst:
                    batch.extend(self.gen.pick() for _ in range(a.burst))
                    t_burst = now + a.burst_every
                    self.counts["kafka_bursts"] += 1
                else:
                    batch.append(self.gen.pick())
                lines = []
                for kind, body, status in batch:
                    key = f"kf-{seq:07d}"
                    seq += 1
                    lines.append(key.encode() + b"\t" + body + b"\n")
                    self.log("kafka-sent.tsv", tsv_line(key, kind, status, len(body),
                                                        f"{time.time():.3f}"))
                    self.counts["kafka_sent"] += 1
                try:
                    p.stdin.write(b"".join(lines))
                    p.stdin.flush()
                except BrokenPipeError:
                    # kcat died: what it had not delivered is lost (check.py
                    # names it); a new one goes on.
                    self.counts["kcat_died"] += 1
                    print(f"load: kcat exited {p.wait()}; starting another", file=sys.stderr)
                    p = self.kcat()
                nxt += period
                d = nxt - time.time()
                if d > 0:
                    time.sleep(d)
                else:
                    nxt = time.time()
        finally:
            try:
                p.stdin.close()
            except BrokenPipeError:
                pass
            rc = p.wait()  # kcat delivers what it has, then exits
            self.counts["kcat_exit"] = rc
            self.kcat_log.close()

    # ---------------------------------------------------------- HTTP

    def conn(self):
        return http.client.HTTPConnection(self.host, self.port, timeout=self.a.http_timeout)

    def http_client(self, idx):
        a = self.a
        c = None
        c_t = 0.0  # when the current connection was opened
        seq = 0
        used = 0  # requests on the current connection
        t_img = time.time() + a.image_every * (idx + 1) / (a.http_clients + 1)
        while not self.stopped():
            if idx == 0 and time.time() >= t_img:
                kind, body, expect = self.gen.image()
                t_img = time.time() + a.image_every
            else:
                kind, body, expect = self.gen.pick()
            rid = f"h{idx}-{seq:07d}"
            seq += 1
            t0 = time.time()
            reused = used > 0
            status, note = "", ""
            try:
                if c is None:
                    c = self.conn()
                    c_t = t0
                    used = 0
                    reused = False
                c.request("POST", "/v1/systemone", body=body,
                          headers={"Content-Type": "application/json", "X-Request-Id": rid})
                r = c.getresponse()
                data = r.read()
                used += 1
                status = str(r.status)
                echoed = r.getheader("X-Request-Id")
                if echoed != rid:
                    note = f"x-request-id={echoed}"
                elif r.status == 200:
                    try:
                        if "answers" not in json.loads(data):
                            note = "200-without-answers"
                    except ValueError:
                        note = "200-not-json"
                elif r.status in (400, 404, 429, 500, 503):
                    try:
                        note = json.loads(data)["error"]["code"]
                    except (ValueError, KeyError, TypeError):
                        note = "error-body-not-json"
                if r.will_close:
                    c.close()
                    c = None
            except (OSError, http.client.HTTPException) as e:
                status = "conn"
                note = type(e).__name__
                if c is not None:
                    c.close()
                c = None
            t1 = time.time()
            self.log("http.tsv", tsv_line(f"{t0:.3f}", f"{t1:.3f}", rid, kind, expect, status,
                                          int(reused), note, f"{c_t:.3f}"))
            self.counts["http_sent"] += 1
            if status == "conn":
                time.sleep(0.25)  # serve is down: retry soon, not in a tight loop
            else:
                time.sleep(a.http_think)
        if c is not None:
            c.close()

    def disconnector(self):
        """Clients that leave mid-request: half a body then gone; the whole
        body of a slow request (many questions on a long state) then gone
        before the answer; an image body then gone."""
        a = self.a
        seq = 0
        modes = ["half-body", "no-wait", "image-no-wait", "no-wait"]
        while not self.stopped():
            time.sleep(a.disconnect_every)
            mode = modes[seq % len(modes)]
            rid = f"d-{seq:07d}"
            seq += 1
            if mode == "image-no-wait":
                body = self.gen.image()[1]
            else:
                with self.gen.lock:
                    self.gen.ticket += 1
                    t = self.gen.ticket
                state = f"Ticket D{t}. " + " ".join(f"Line {i}: the customer explains again."
                                                     for i in range(120))
                qs = {f"q{i}": {"type": "noul", "instructions": f"Is point {i} urgent?"}
                      for i in range(24)}
                body = json.dumps({"state": state, "questions": qs}).encode()
            head = (f"POST /v1/systemone HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                    f"Content-Type: application/json\r\nX-Request-Id: {rid}\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode()
            outcome = "left"
            try:
                s = socket.create_connection((self.host, self.port), timeout=5)
                try:
                    if mode == "half-body":
                        s.sendall(head + body[:len(body) // 2])
                        time.sleep(0.05)
                    else:
                        s.sendall(head + body)
                        time.sleep(0.01)
                    # RST, not FIN: gone without a goodbye.
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                finally:
                    s.close()
            except OSError as e:
                outcome = "conn:" + type(e).__name__
            self.log("disconnects.tsv", tsv_line(f"{time.time():.3f}", rid, mode, outcome))
            self.counts["disconnects"] += 1

    def prober(self):
        """/health and /metrics on one keep-alive connection, as a monitor."""
        c = None
        c_t = 0.0
        while not self.stopped():
            for path in ("/health", "/metrics"):
                t0 = time.time()
                try:
                    if c is None:
                        c = self.conn()
                        c_t = t0
                    c.request("GET", path)
                    r = c.getresponse()
                    r.read()
                    status = str(r.status)
                    if r.will_close:
                        c.close()
                        c = None
                except (OSError, http.client.HTTPException) as e:
                    status = "conn:" + type(e).__name__
                    if c is not None:
                        c.close()
                    c = None
                self.log("probes.tsv", tsv_line(f"{t0:.3f}", path, status, f"{c_t:.3f}"))
            time.sleep(self.a.probe_every)

    def guarded(self, fn, *args):
        """Runs fn; an exception stops the whole load (and fails it)."""
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 -- reported, then the run fails
            import traceback
            traceback.print_exc()
            self.counts["thread_errors"] += 1
            self.stop.set()

    def run(self):
        def on_signal(_sig, _frm):
            self.stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        g = self.guarded
        threads = [threading.Thread(target=g, args=(self.kafka,), name="kafka")]
        threads += [threading.Thread(target=g, args=(self.http_client, i), name=f"http{i}")
                    for i in range(self.a.http_clients)]
        threads.append(threading.Thread(target=g, args=(self.disconnector,), name="disconnect"))
        threads.append(threading.Thread(target=g, args=(self.prober,), name="probe"))
        for t in threads:
            t.daemon = True
            t.start()
        while not self.stopped():
            time.sleep(0.2)
        for t in threads:
            t.join(timeout=120)
        alive = [t.name for t in threads if t.is_alive()]
        self.counts["threads_stuck"] = len(alive)
        with open(os.path.join(self.a.dir, "load.json"), "w") as f:
            json.dump(dict(self.counts, stuck=alive), f)
        with self.lock:
            for f in self.files.values():
                f.close()
        ok = (not alive and self.counts.get("kcat_exit", 0) == 0 and
              not self.counts["thread_errors"] and not self.counts["kcat_died"])
        return 0 if ok else 1


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "backfill":
        cmd_backfill(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=["run"])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--http", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kafka-rate", type=float, default=15.0)
    ap.add_argument("--burst", type=int, default=300)
    ap.add_argument("--burst-every", type=float, default=60.0)
    ap.add_argument("--http-clients", type=int, default=2)
    ap.add_argument("--http-think", type=float, default=0.08)
    ap.add_argument("--http-timeout", type=float, default=60.0)
    ap.add_argument("--image-every", type=float, default=6.0)
    ap.add_argument("--disconnect-every", type=float, default=2.0)
    ap.add_argument("--probe-every", type=float, default=5.0)
    a = ap.parse_args()
    return Runner(a).run()


if __name__ == "__main__":
    sys.exit(main())
