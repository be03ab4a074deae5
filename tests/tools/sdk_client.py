"""The official System One SDK (typesafe-sdk, from PyPI) against `d3stream http`.

    python sdk_client.py BASE_URL PACKAGE_NAME [vision]

Only base_url (and the api_key the SDK insists on; d3stream checks none yet)
is set: the SDK's default model, jev-latest, must be served as an alias, and
its default compression (zstd bodies) must be taken.
Each call prints one line; any failure raises (exit 1). Issue 30, item 8
(choice, noul, score, several questions, zstd and plain bodies, an Image
upload with `vision`, models.list(), an error).
"""
import math
import sys

import typesafe_sdk as ts

base, package = sys.argv[1], sys.argv[2]
vision = len(sys.argv) > 3 and sys.argv[3] == "vision"
# The SDK's own default compression: zstd (backports.zstd on Python < 3.14)
# for bodies of 1,024 bytes or more.
client = ts.TypeSafeClient(api_key="unused", base_url=base)
plain = ts.TypeSafeClient(api_key="unused", base_url=base, compression=False)
assert client._config.compression == "zstd", "the SDK would not compress: no backports.zstd?"


def close(a, b):
    return math.isclose(a, b, rel_tol=0, abs_tol=1e-9)


long_state = "Customer writes: I was charged twice for my March invoice. " * 40
r = client.system_one(
    state=long_state,
    questions={
        "team": ts.Choice(instructions="Which team should handle this ticket?",
                          criteria={"billing": "Invoices, charges, refunds",
                                    "tech": "Outages, bugs", "sales": None}),
        "urgent": ts.Noul(instructions="Does the customer need an answer today?"),
        "severity": ts.Score(instructions="How severe is the problem?",
                             criteria=["Trivial", "Minor", "Major", "Critical"]),
    },
)
assert r.model == package, f"model {r.model!r}, expected the package's name {package!r}"
team, urgent, severity = r.answers["team"], r.answers["urgent"], r.answers["severity"]
assert team.choice in ("billing", "tech", "sales"), team
assert close(sum(team.probabilities.values()), 1.0), team
assert 0.0 <= urgent.noul <= 1.0, urgent
assert r.usage.input_tokens > 0, r.usage
print(f"sdk: choice {team.choice}, noul {urgent.noul:.4f}, score {severity!r:.60}, "
      f"{r.usage.input_tokens} tokens")

r2 = plain.system_one(state=long_state, questions={
    "urgent": ts.Noul(instructions="Does the customer need an answer today?")})
assert close(r2.answers["urgent"].noul, urgent.noul), (r2.answers["urgent"], urgent)
print(f"sdk: the same noul uncompressed, {len(long_state)} state bytes")

def png(w, h):
    """A w x h RGB PNG of a gradient, written with zlib only."""
    import struct
    import zlib
    raw = b"".join(b"\0" + bytes(v for x in range(w) for v in (x * 255 // w, y * 255 // h, 128))
                   for y in range(h))

    def chunk(t, d):
        c = struct.pack(">I", len(d)) + t + d
        return c + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


if vision:
    photo = ts.Image(png(64, 48))
    with client.attach_assets(photo):
        r3 = client.system_one(state=f"Product photo: {photo}",
                               questions={"damaged": ts.Noul(instructions="Is it damaged?")})
    assert 0.0 <= r3.answers["damaged"].noul <= 1.0, r3
    print(f"sdk: an Image upload (multipart), noul {r3.answers['damaged'].noul:.4f}, "
          f"{r3.usage.input_tokens} tokens")

models = client.models.list()
names = [m.name for m in models.models]
assert package in names and "jev-latest" in names, names
print(f"sdk: models.list() {names}")

try:
    client.system_one(state="x", questions={"q": ts.Noul(instructions="Is it?")},
                      model="no-such-model")
    raise AssertionError("an unknown model was answered")
except ts.TypeSafeNotFoundError as e:
    print(f"sdk: unknown model -> {type(e).__name__}")
print("sdk: ok")
