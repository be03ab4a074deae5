#!/usr/bin/env python3
"""Writes the golden files of tests/test_schemas_json.c from Python's own json
module and repr(float), the contract of schemas/sch_json.c (SPEC a.1, c.4).

    python3 tests/tools/gen_json_golden.py [OUT_DIR]   # default tests/golden/json

Outputs (deterministic: a fixed seed, so a rerun changes nothing unless the
Python version does):

  doubles.txt  "<16 hex digits of the IEEE bits> <repr(x)>" per line.
  parse.txt    "<KIND>\t<hex input>\t<hex A>\t<hex B>" per line, where KIND is
               OK (A = json.dumps(v, ensure_ascii=False), B = the canonical
               form: sort_keys, "," ":"), or UTF8 / SYNTAX / SURROGATE
               (A = the message, B = "-").

Requires CPython 3.11 (the upstream server's version): the messages and the
4300-digit integer limit are version-specific.
"""
import json
import math
import os
import random
import struct
import sys

SEED = 20240611
SURROGATE_MSG = "the request contains an unpaired surrogate"


def bits(x):
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def from_bits(b):
    return struct.unpack("<d", struct.pack("<Q", b))[0]


def doubles(rng):
    xs = [0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 2.225073858507201e-308,
          1.7976931348623157e308, 1e16, 1e-4, 1e-5, 9999999999999998.0, 1e15, 0.1, 0.2, 0.3,
          1 / 3, 2 / 3, 100.0, 12.5, 1e-7, 1e22, 1e23, 9007199254740992.0, 9007199254740993.0,
          123456789012345678.0, 0.5040127515792847, 4.35, 2.675, 1e-320]
    for e in range(-1074, 1024):
        # Powers of two are where the rounding interval is lopsided.
        x = math.ldexp(1.0, e)
        xs.append(x)
        if e % 8 == 0:
            xs += [math.nextafter(x, 0.0), math.nextafter(x, math.inf)]
    for e in range(-325, 309):
        x = float("1e%d" % e)
        xs += [x, math.nextafter(x, 0.0), math.nextafter(x, math.inf)]
    for _ in range(2000):
        b = rng.getrandbits(64)
        x = from_bits(b)
        if math.isfinite(x):
            xs.append(x)
    for _ in range(1500):
        digits = rng.randint(1, 17)
        mant = rng.randrange(10 ** (digits - 1), 10 ** digits)
        xs.append(float("%de%d" % (mant, rng.randint(-330, 310))))
    for _ in range(300):
        xs.append(rng.uniform(-1e6, 1e6))
        xs.append(float(rng.randint(-2 ** 60, 2 ** 60)))
    seen = set()
    out = []
    for x in xs:
        # repr(inf) is "inf" but json.dumps writes "Infinity": tested apart.
        if math.isfinite(x) and bits(x) not in seen:
            seen.add(bits(x))
            out.append(x)
    return out


# ---- parse cases ---------------------------------------------------------

HAND = [
    b"", b" ", b"\t\n\r ", b"\xef\xbb\xbf{}", b"\xef\xbb\xbf", b"\xef\xbb", b"{", b"}", b"[", b"]",
    b'{"a"', b'{"a":', b'{"a":1', b'{"a" 1}', b'{"a":1 "b"}', b"[1,]", b"[1 2]", b"[,]",
    b'"abc', b'"a\x01"', b'"a\x1f"', b'"a\x7f"', b'"\\x"', b'"\\u12"', b'"\\u12x4"',
    b'"\\ud800\\u12x4"', b'"\\u1234', b'"\\ud800\\udc00', b'"\\ud800\\udc00"', b"1 2",
    b"nul", b"nulll", b"-", b"-x", b"1e", b"1e+", b"1e+1", b"1E-1", b"1.", b"1.e5", b".5",
    b"01", b"-01", b"00", b"-0", b"-0.0", b"0e0", b"1e400", b"-1e400", b"1e-400", b"[1]\n\n x",
    b'"\xc3\xa9"x', b"\xff", b"\xc3", b"\xc3(", b"\xed\xa0\x80", b"\xed\x9f\xbf", b"\xc0\x80",
    b"\xc1\xbf", b"\xe0\x80\x80", b"\xe0\x9f\xbf", b"\xf0\x8f\xbf\xbf", b"\xf4\x90\x80\x80",
    b"\xf5\x80\x80\x80", b"\x80", b"ab\xe2\x82", b"\xe2\x82(", b"\xe2(\xa1", b"\xf0\x9f\x98",
    b"\xf0\x9f(\x80", b"\xf0\x9f\x98(", b"\xf0(", b"\xed", b"\xed\xa0", b'{"a":1}\xff',
    b'{"\\ud800":1}', b'"\\ud800" x', b'"\\udc00"', b'"\\ud800\\u0041"', b'"\\ud800\\\\"',
    b'"\\ud800\\ud800\\udc00"', b'"\\uDBFF\\uDFFF"', b'"\\ud83d\\ude00"', b'"\\ud800',
    b"1" * 4300, b"1" * 4301, b"-" + b"1" * 4301, b"[" + b"9" * 4301 + b",", b'[1,"\\ud800",',
    b'[1,"\\ud800",2]', b'{"a":1,}', b"{,}", b"[\n  1,\n  ]", b"NaN", b"Infinity", b"-Infinity",
    b"-Inf", b"Infinit", b"tru", b"true", b"false", b"null", b"[NaN,-Infinity,Infinity]",
    b'"\\', b'"\\u', b'"\\ud800\\', b'"\\ud800\\u', b'"\\/\\b\\f\\n\\r\\t\\"\\\\"',
    b'"\\u0000a\\u0000"', b'{"a\\u0000b":1,"a":2}', b'{"b":1,"a":2,"b":3}',
    b'{"b":1,"a":2,"b":3,"a":4,"c":5}', b'{"":1,"":2}', b"[]", b"{}", b"[[]]", b"[{}]",
    b'{"x":{"y":[1,{"z":null}]}}', b"123456789012345678901234567890",
    b"-123456789012345678901234567890", b"1.5", b"2.5e3", b"1e16", b"1e-5", b"0.0001",
    b"100", b"1E2", b'"\xe2\x80\xa8\x7f"', b'"\xf4\x8f\xbf\xbf"', b'"\xef\xbb\xbf"',
    b' \xef\xbb\xbf1', b'["\xc3\xa9", 1 x]', b'{"\xc3\xa9\xc3\xa9": [1, 2', b'["a",\n"b"\n1]',
    b'{"a":1}\n\n\n\xc3\xa9', b"\x00", b"[\x00]", b"\x0c1", b"\xc2\xa01", b"[1,\n\t 2 ,\r 3 ]",
    b'{"\xf0\x9f\x98\x80":1,"\xef\xbf\xbf":2,"\xc3\xa9":3,"z":4,"Z":5}', b"[1.0,-1.0,1e+16]",
    b"[0.1,0.2,0.30000000000000004]", b"[1e22,1e23,5e-324]", b"[-0,0,-0.0,0.0]",
]


def rand_string(rng):
    pool = ["a", "b", "\u00e9", "\u2028", "\x7f", "\U0001f600", "\n", "\x00", "\x1f", '"', "\\",
            "/", "\ufffd", "\uffff", " ", "\t"]
    return "".join(rng.choice(pool) for _ in range(rng.randint(0, 6)))


def rand_value(rng, depth):
    r = rng.random()
    if depth > 3 or r < 0.45:
        kind = rng.randrange(8)
        if kind == 0:
            return None
        if kind == 1:
            return rng.random() < 0.5
        if kind == 2:
            return rng.choice([0, -1, 7, 2 ** 64, -(10 ** 30), rng.randint(-10 ** 6, 10 ** 6)])
        if kind == 3:
            return rng.choice([0.0, -0.0, 1.5, 1e-7, 1e16, 1e300, float("nan"), float("inf"),
                               -float("inf"), rng.uniform(-1e3, 1e3)])
        return rand_string(rng)
    if r < 0.7:
        return [rand_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = ["a", "b", "", "\u00e9", "A", "\U0001f600", "aa", "\x00"]
    return {rng.choice(keys): rand_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def rand_text(rng, v):
    """json.dumps with random whitespace and, sometimes, \\u escapes."""
    text = json.dumps(v, ensure_ascii=rng.random() < 0.3)
    out = []
    for ch in text:
        out.append(ch)
        if ch in ",:[{" and rng.random() < 0.2:
            out.append(rng.choice([" ", "\n", "\t", "\r\n ", ""]))
    return "".join(out).encode("utf-8")


def mutate(rng, data):
    data = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(4)
        if op == 0 and data:
            del data[rng.randrange(len(data)):]
        elif op == 1 and data:
            data[rng.randrange(len(data))] = rng.choice(b'{}[]":,\\ux01-.eE\n \x00\xff\xc3\x80')
        elif op == 2:
            data.insert(rng.randrange(len(data) + 1), rng.choice(b'{}[]":,\\u01e\n\xe2\xed'))
        elif data:
            del data[rng.randrange(len(data))]
    return bytes(data)


def has_surrogate(v):
    if isinstance(v, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in v)
    if isinstance(v, list):
        return any(has_surrogate(x) for x in v)
    if isinstance(v, dict):
        return any(has_surrogate(k) or has_surrogate(x) for k, x in v.items())
    return False


def expect(data):
    """(kind, A, B) as sch_json_parse and the dumps must give them."""
    try:
        v = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        return "UTF8", str(e), None
    except ValueError as e:  # JSONDecodeError, and the int digit limit
        return "SYNTAX", str(e), None
    if has_surrogate(v):
        return "SURROGATE", SURROGATE_MSG, None
    return ("OK", json.dumps(v, ensure_ascii=False),
            json.dumps(v, ensure_ascii=False, sort_keys=True, separators=(",", ":")))


def parse_cases(rng):
    cases = list(HAND)
    for _ in range(500):
        text = rand_text(rng, rand_value(rng, 0))
        cases.append(text)
        cases.append(mutate(rng, text))
    seen = set()
    out = []
    for c in cases:
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


def hexs(s):
    if s is None:
        return "-"
    b = s.encode("utf-8", "surrogatepass") if isinstance(s, str) else s
    return b.hex() if b else "="


def main():
    if sys.version_info[:2] != (3, 11):
        sys.exit("gen_json_golden.py: needs Python 3.11 (the upstream server's)")
    here = os.path.dirname(os.path.abspath(__file__))
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "golden", "json")
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(SEED)
    with open(os.path.join(out_dir, "doubles.txt"), "w") as f:
        for x in doubles(rng):
            f.write("%016x %r\n" % (bits(x), x))
    with open(os.path.join(out_dir, "parse.txt"), "w") as f:
        for data in parse_cases(rng):
            kind, a, b = expect(data)
            f.write("%s\t%s\t%s\t%s\n" % (kind, hexs(data), hexs(a), hexs(b)))


if __name__ == "__main__":
    main()
