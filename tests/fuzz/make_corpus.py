#!/usr/bin/env python3
"""tests/fuzz/make_corpus.py -- writes the committed seed corpus of the
libFuzzer harnesses, tests/fuzz/corpus/<harness>/, from the repository's
fixtures and from small packages that `d3stream make-package --size tiny`
writes. Run once, and again when the fixtures or a format change; the
output is deterministic (same build, same files), so a rerun shows in git
only what changed.

    cmake --build build && tests/fuzz/make_corpus.py

Seeds are small on purpose (the whole corpus well under 1 MB): a package
file is cut to a few tensors and its packed tensors to a tile or a band of
tiles, which keeps what the readers decide on (names, dtypes, tile kinds,
twins, duplicated rows, the quantizer's codes) and drops the bulk. Inputs
that once failed are kept apart, in tests/fuzz/regress/<harness>/, by hand.
"""
import base64
import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests/fuzz/corpus"
D3STREAM = ROOT / "build/d3stream"

# Harness -> largest seed; run.sh's -max_len must stay above these.
LIMITS = {"json": 8192, "request": 8192, "avro": 8192, "image": 8192,
          "tokenize": 512, "safetensors": 16384, "q4nx": 40960}


def safe_name(s):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", s).strip("_")[:80] or "empty"


def put(harness, name, data):
    if isinstance(data, str):
        data = data.encode()
    if len(data) > LIMITS[harness]:
        sys.exit(f"make_corpus: {harness}/{name} is {len(data)} bytes, over {LIMITS[harness]}")
    (CORPUS / harness / safe_name(name)).write_bytes(data)


# ---- the contract's bodies: json, request, avro, tokenize ----

def contract_bodies():
    for line in open(ROOT / "tests/contract/cases.jsonl", encoding="utf-8"):
        case = json.loads(line)
        body = case.get("body")
        if isinstance(body, str) and len(body.encode()) <= LIMITS["request"]:
            yield case["name"], body


def json_seeds():
    for name, body in contract_bodies():
        put("json", name, body)
        put("request", name, body)
    # The JSON golden file's inputs: the reader's edge cases (hex, column 2).
    seen = set()
    for line in open(ROOT / "tests/golden/json/parse.txt", encoding="utf-8"):
        cols = line.rstrip("\n").split("\t")
        if len(cols) < 2 or cols[1] == "=":
            continue
        data = bytes.fromhex(cols[1])
        if data not in seen and len(data) <= 1024:
            seen.add(data)
            put("json", f"golden-{cols[0].lower()}-{len(seen):03d}", data)


def avro_seeds():
    """Framed Avro records made from the request bodies by fuzz_avro.c's
    seed mode, built here with the project's compiler."""
    gen = ROOT / "build/generated/sch_avsc.c"
    if not gen.exists():
        sys.exit("make_corpus: build first (build/generated/sch_avsc.c)")
    srcs = [str(p) for p in sorted((ROOT / "schemas").glob("sch_*.c"))
            if "sch_registry" not in p.name]
    libs = subprocess.run(["pkg-config", "--cflags", "--libs", "libutf8proc", "avro-c",
                           "jansson"], check=True, capture_output=True, text=True).stdout.split()
    with tempfile.TemporaryDirectory() as tmp:
        tool, bodies = Path(tmp) / "avro_seeds", Path(tmp) / "bodies"
        bodies.mkdir()
        for name, body in contract_bodies():
            (bodies / safe_name(name)).write_text(body, encoding="utf-8")
        subprocess.run(["cc", "-std=c17", "-D_GNU_SOURCE", "-O1", "-DFUZZ_AVRO_SEEDS",
                        f"-I{ROOT}/include", f"-I{ROOT}/schemas", *srcs, str(gen),
                        str(ROOT / "tests/fuzz/fuzz_avro.c"), *libs, "-lm", "-o", str(tool)],
                       check=True)
        subprocess.run([str(tool), str(bodies), str(CORPUS / "avro")], check=True)


def tokenize_seeds():
    """Every 20th text of the tokenizer's golden file, and chat markup."""
    lines = open(ROOT / "tests/golden/tokenizer/qwen3.as_is.jsonl", encoding="utf-8").readlines()
    for i, line in enumerate(lines[::20]):
        text = json.loads(line)["text"].encode()
        if text and len(text) <= LIMITS["tokenize"]:
            put("tokenize", f"golden-{i:03d}", text)
    put("tokenize", "chat", "<|im_start|>user\nIs it raining?<|im_end|>\n<|im_start|>assistant\n")
    put("tokenize", "invalid-utf8", b"caf\xc3 \xff\xfe")


# ---- images: the golden images and the other formats' cases ----

def image_seeds():
    for p in sorted((ROOT / "tests/golden/image/src").iterdir()):
        if p.stat().st_size <= LIMITS["image"]:
            put("image", p.name, p.read_bytes())
    other = json.load(open(ROOT / "tests/fixtures/image-other.json", encoding="utf-8"))
    for case in other["cases"]:
        data = base64.b64decode(case["data"])
        if len(data) <= LIMITS["image"]:
            put("image", "other-" + case["name"], data)


# ---- safetensors files ----

def st_read(path):
    b = Path(path).read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    meta = header.pop("__metadata__", None)
    tensors = []
    for name, e in header.items():
        lo, hi = e["data_offsets"]
        tensors.append([name, e["dtype"], list(e["shape"]), b[8 + n + lo:8 + n + hi]])
    return tensors, meta


def st_bytes(tensors, meta=None, header_pad=8):
    """A file as the reference writer lays it out: the header padded with
    spaces, the tensors back to back in the order given."""
    header, off, blob = {}, 0, b""
    if meta is not None:
        header["__metadata__"] = meta
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blob += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % header_pad)
    return struct.pack("<Q", len(h)) + h + blob


def st_small(tensors, n=10, max_bytes=512):
    return [t for t in tensors if len(t[3]) <= max_bytes][:n]


def safetensors_seeds(pk):
    sources = {
        "tiny-upstream-model": ROOT / "tests/fixtures/tiny-upstream/model.safetensors",
        "tiny-upstream-readout": ROOT / "tests/fixtures/tiny-upstream/readout.safetensors",
        "tiny-vl-model": ROOT / "tests/fixtures/tiny-vl/model.safetensors",
        "make-package-tiny": pk / "st/model.safetensors",
    }
    for name, path in sources.items():
        tensors, meta = st_read(path)
        small = st_small(tensors)
        if not small:  # the readout: its one tensor, cut to one row
            t = tensors[0]
            row = len(t[3]) // t[2][0]
            small = [[t[0], t[1], [1] + t[2][1:], t[3][:row]]]
        put("safetensors", name, st_bytes(small, meta))
    # The header of a whole model (its data left out: refused, but a rich
    # JSON object to mutate), and edge cases the fixtures do not hold.
    b = sources["tiny-upstream-model"].read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    put("safetensors", "tiny-upstream-header-only", b[:8 + n])
    dtypes = ["BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "I64",
              "U64", "F64"]
    sizes = [1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8]
    put("safetensors", "every-dtype",
        st_bytes([[f"t.{d.lower()}", d, [2], bytes(range(1, 1 + 2 * s))]
                  for d, s in zip(dtypes, sizes)], {"format": "pt"}))
    put("safetensors", "f16-specials",
        st_bytes([["h", "F16", [6], struct.pack("<6H", 0x0001, 0x03ff, 0x7c00, 0xfc00, 0x7e01,
                                                0x3c00)]]))
    put("safetensors", "scalar-empty-rank8",
        st_bytes([["scalar", "F32", [], struct.pack("<f", 1.5)],
                  ["empty", "BF16", [0, 4], b""],
                  ["empty2", "F32", [3, 0], b""],
                  ["rank8", "U8", [1, 1, 1, 1, 1, 1, 1, 2], b"\x01\x02"]]))
    put("safetensors", "empty-header", struct.pack("<Q", 2) + b"{}")
    put("safetensors", "metadata-only", st_bytes([], {"a": "b", "format": "pt"}))
    put("safetensors", "unpadded-trailing",
        st_bytes([["x", "F32", [1], struct.pack("<f", 2.0)]], None, 1) + b"tail")


# ---- Q4NX files ----

# make-package layouts: (seed name, extra arguments)
Q4NX_VARIANTS = [
    ("q4k-B", []),
    ("q41-A", ["--q4nx-tiles", "q4_1", "--q4nx-raster", "A"]),
    ("q41-B", ["--q4nx-tiles", "q4_1", "--q4nx-raster", "B"]),
    ("q40-A", ["--q4nx-tiles", "q4_0", "--q4nx-raster", "A"]),
    ("q40-B-alpha-tiles", ["--q4nx-tiles", "q4_0", "--q4nx-raster", "B", "--q4nx-alpha",
                           "tiles"]),
    ("q41-A-embed-bf16", ["--q4nx-tiles", "q4_1", "--q4nx-raster", "A", "--q4nx-embed", "bf16"]),
]

Q4NX_KEEP = [  # layer 0 (linear attention) and the full-attention q_proj of layer 3
    "model.layers.0.input_layernorm.weight", "model.layers.0.linear_attn.ssm_a",
    "model.layers.0.linear_attn.ssm_dt.bias", "model.layers.0.linear_attn.ssm_conv1d.weight",
    "model.layers.0.linear_attn.ssm_norm.weight",
    "model.layers.0.linear_attn.ssm_alpha_proj.weight",
    "model.layers.0.linear_attn.ssm_alpha_proj.bf16.weight",
    "model.layers.0.linear_attn.qkv_proj.weight",
    "model.layers.3.self_attn.q_norm.weight", "model.layers.3.self_attn.q_proj.weight",
    "model.norm.weight", "lm_head.weight", "model.embed_tokens.weight",
]


def first_band(t, rows=1):
    """A packed tensor cut to its first `rows` bands of tiles; a 2-D one
    (the BF16 embedding) to its first 32 rows."""
    name, dtype, shape, raw = t
    if dtype == "I8" and len(shape) == 3 and shape[0] > rows:
        return [name, dtype, [rows] + shape[1:], raw[:rows * shape[1] * shape[2]]]
    if dtype == "BF16" and len(shape) == 2 and shape[0] > 32:
        return [name, dtype, [32, shape[1]], raw[:32 * shape[1] * 2]]
    return t


def q4nx_legacy(q8):
    """A legacy Q8 tile (Q4NX.md §4.5) from a Q8 one's bytes: its first 128
    scales, written twice, 4096 of its codes (in the Q8 tile's order: a
    seed, not the same matrix), zero padding."""
    scales, codes = q8[3][:256], q8[3][512:512 + 4096]
    tile = scales + scales + codes + bytes(512)
    return ["model.layers.0.mlp.down_proj.weight", "I8", [1, 1, 5120], tile]


def to_f16(t):
    """A BF16 tensor as F16, which the reader takes though no converter
    writes it."""
    name, _, shape, raw = t
    vals = struct.unpack(f"<{len(raw) // 2}H", raw)
    f32 = [struct.unpack("<f", struct.pack("<I", v << 16))[0] for v in vals]
    return [name, "F16", shape, struct.pack(f"<{len(f32)}e", *f32)]


def vision_seed(path):
    """Norms and biases of block 0 and one tiled weight, re-tiled to
    64 x 8 blocks of the first 8 columns (MM_K = 8 by §5's fallback)."""
    tensors, meta = st_read(path)
    keep = [t for t in tensors if t[0].startswith("model.visual.blocks.0.")
            and t[0].endswith((".bias", "norm1.weight", "norm2.weight"))]
    qkv = next(t for t in tensors if t[0] == "model.visual.blocks.0.attn.qkv.weight")
    mm_k = qkv[2][2] // 64
    small = b"".join(qkv[3][2 * n * mm_k:2 * (n * mm_k + 8)] for n in range(64))
    keep.append([qkv[0], "BF16", [1, 1, 512], small])
    return st_bytes(keep, meta)


def q4nx_seeds(pk):
    for name, extra in Q4NX_VARIANTS:
        out = pk / name
        subprocess.run([str(D3STREAM), "make-package", "--size", "tiny", "--format", "q4nx",
                        "--out", str(out), *extra], check=True, stdout=subprocess.DEVNULL)
        tensors, meta = st_read(out / "model.q4nx")
        kept = [first_band(t) for t in tensors if t[0] in Q4NX_KEEP]
        put("q4nx", name, st_bytes(kept, meta))
        if name == "q4k-B":
            lm = next(t for t in tensors if t[0] == "lm_head.weight")
            norm = next(t for t in tensors if t[0] == "model.norm.weight")
            put("q4nx", "legacy-q8-f16", st_bytes([to_f16(norm), q4nx_legacy(lm)], meta))
            put("q4nx", "vision", vision_seed(out / "vision_weight.q4nx"))


def main():
    if not D3STREAM.exists():
        sys.exit("make_corpus: build first (build/d3stream)")
    for h in LIMITS:
        shutil.rmtree(CORPUS / h, ignore_errors=True)
        (CORPUS / h).mkdir(parents=True)
    json_seeds()
    avro_seeds()
    tokenize_seeds()
    image_seeds()
    with tempfile.TemporaryDirectory() as tmp:
        pk = Path(tmp)
        subprocess.run([str(D3STREAM), "make-package", "--size", "tiny", "--out",
                        str(pk / "st")], check=True, stdout=subprocess.DEVNULL)
        safetensors_seeds(pk)
        q4nx_seeds(pk)
    total = 0
    for h in LIMITS:
        files = list((CORPUS / h).iterdir())
        size = sum(f.stat().st_size for f in files)
        total += size
        print(f"{h:12} {len(files):4} files {size:8} bytes")
    print(f"{'all':12} {'':4}       {total:8} bytes")


if __name__ == "__main__":
    main()
