#!/usr/bin/env python3
"""Golden data for tests/test_image.c: request images decoded as the upstream runtime decodes them
(PIL open + verify, open + convert("RGB")), torch's uint8 bicubic antialiased resize, the
normalised patch rows, and smart_resize, all from the reference libraries.

Needs: Pillow (written against 13.0.0, which bundles libjpeg-turbo 3.2.0, libwebp 1.6.0 and
zlib), torch (CPU; 2.15), numpy; for the YCCK JPEG the system's libturbojpeg.so.0 through ctypes
(that case is skipped when it is absent). Deterministic: numpy PCG64 pixels, fixed
encoder settings. One command regenerates everything under tests/golden/image/:

    /work/gvenv/bin/python tests/tools/gen_image_golden.py

Outputs (index.json describes every case; the C test reads only index.json and the files it names):
  src/<name>.<ext>  the encoded test images (PNG written by the small encoder below, so every
                    colour type, depth, filter and interlacing is covered; JPEG and WebP by Pillow)
  rgb/<name>.bin    Pillow's convert("RGB") bytes of each image that decodes (h * w * 3)
  resize/<name>.bin sampled rows of torch's resized output (the whole output's FNV-1a 64 is in the
                    index), for synthetic images the C test regenerates with pattern() below
  rows/<name>.bin   sampled fp32 patch rows of the reference preprocessing
Cases:
  decode    an image, optionally truncated (`cut`: keep that many bytes) or patched (`patch`:
            [offset, byte] pairs), and what upstream's decode() gives: an error message, or the
            RGB (file or, for the mutation sweep, its FNV-1a 64)
  resize    pattern(w, h, seed) resized to (oh, ow) by F.interpolate
  pipeline  an image through images.py's _preprocess: its grid and sampled rows
  smart     smart_resize(h, w, factor) -> (oh, ow) or the aspect error text
"""

from __future__ import annotations

import ctypes
import ctypes.util
import io
import json
import math
import struct
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, UnidentifiedImageError

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "golden" / "image"
MIN_PIXELS, MAX_PIXELS, MAX_SOURCE_PIXELS = 65_536, 1_638_400, 16_000_000
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

torch.set_num_threads(1)


# ---- hashing and the synthetic pattern the C test regenerates ---------------------------------

def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def pattern(w: int, h: int, seed: int) -> np.ndarray:
    """An RGB image from integer arithmetic only, mirrored by pattern() in tests/test_image.c:
    smooth ramps, a checkerboard and xorshift noise, so both aliasing and gradients are tested."""
    y, x = np.mgrid[0:h, 0:w].astype(np.int64)
    out = np.empty((h, w, 3), np.uint8)
    for c in range(3):
        v = (x * 255) // max(w - 1, 1) * (c + 1) + (y * 255) // max(h - 1, 1) * (3 - c)
        v += ((x // 7 + y // 5) % 2) * 60
        s = (x * 73856093) ^ (y * 19349663) ^ ((c + seed) * 83492791)
        s &= 0xFFFFFFFF
        s ^= (s << 13) & 0xFFFFFFFF
        s ^= s >> 17
        s ^= (s << 5) & 0xFFFFFFFF
        v += (s & 63) - 32
        out[..., c] = (v & 255).astype(np.uint8)
    return out


def natural(w: int, h: int, seed: int) -> np.ndarray:
    """A smooth photo-like RGB image (blurred noise) for the lossy codecs."""
    rng = np.random.default_rng(seed)
    base = rng.random((h // 4 + 2, w // 4 + 2, 3))
    img = np.kron(base, np.ones((4, 4, 1)))[:h, :w]
    img = (img * 200 + rng.random((h, w, 3)) * 55).clip(0, 255)
    return img.astype(np.uint8)


# ---- a small PNG encoder: every colour type, depth, filter, Adam7 -----------------------------

def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def pack_row(vals: np.ndarray, depth: int) -> bytes:
    vals = vals.ravel().astype(np.int64)
    if depth == 16:
        return b"".join(struct.pack(">H", int(v)) for v in vals)
    if depth == 8:
        return bytes(int(v) for v in vals)
    per = 8 // depth
    out = bytearray()
    for i in range(0, len(vals), per):
        b = 0
        for j in range(per):
            b <<= depth
            if i + j < len(vals):
                b |= int(vals[i + j])
        out.append(b)
    return bytes(out)


def filter_rows(rows: list[bytes], bpp: int, first_filter: int) -> bytes:
    out = bytearray()
    prev = bytes(len(rows[0])) if rows else b""
    for i, row in enumerate(rows):
        ft = (first_filter + i) % 5
        out.append(ft)
        for k, x in enumerate(row):
            a = row[k - bpp] if k >= bpp else 0
            b = prev[k]
            c = prev[k - bpp] if k >= bpp else 0
            if ft == 0:
                p = 0
            elif ft == 1:
                p = a
            elif ft == 2:
                p = b
            elif ft == 3:
                p = (a + b) // 2
            else:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                p = a if pa <= pb and pa <= pc else b if pb <= pc else c
            out.append((x - p) & 255)
        prev = row
    return bytes(out)


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def png_bytes(samples: np.ndarray, depth: int, ct: int, *, plte: bytes | None = None,
              trns: bytes | None = None, interlace: bool = False, extra: bytes = b"",
              idat_parts: int = 1, ihdr: tuple | None = None, raw_tail: bytes | None = None,
              zdata: bytes | None = None, after_idat: bytes = b"", iend: bool = True) -> bytes:
    h, w = samples.shape[:2]
    ch = CHANNELS[ct]
    bpp = max(1, ch * depth // 8)
    if interlace:
        raw = bytearray()
        for p, (x0, y0, dx, dy) in enumerate(ADAM7):
            sub = samples[y0::dy, x0::dx]
            if sub.shape[0] == 0 or sub.shape[1] == 0:
                continue
            raw += filter_rows([pack_row(r, depth) for r in sub], bpp, p)
        raw = bytes(raw)
    else:
        raw = filter_rows([pack_row(r, depth) for r in samples], bpp, 0)
    if raw_tail is not None:
        raw += raw_tail
    data = zdata if zdata is not None else zlib.compress(raw, 9)
    hw, hh, hd, hc, hcomp, hfilt, hil = ihdr if ihdr else (w, h, depth, ct, 0, 0, int(interlace))
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", hw, hh, hd, hc, hcomp, hfilt, hil))
    out += extra
    if plte is not None:
        out += chunk(b"PLTE", plte)
    if trns is not None:
        out += chunk(b"tRNS", trns)
    step = max(1, -(-len(data) // idat_parts))
    for i in range(0, max(len(data), 1), step):
        out += chunk(b"IDAT", data[i:i + step])
    out += after_idat
    if iend:
        out += chunk(b"IEND", b"")
    return out


# ---- upstream's decode(), as images.py runs PIL -----------------------------------------------

def upstream_decode(payload: bytes):
    """("ok", HxWx3 uint8) or ("err", message) as images.decode() gives them after _payload."""
    try:
        with Image.open(io.BytesIO(payload)) as im:
            if im.format not in ("PNG", "JPEG", "WEBP"):
                return "err", "images must be PNG, JPEG or WebP"
            if im.width * im.height > MAX_SOURCE_PIXELS:
                return "err", f"each image must have at most {MAX_SOURCE_PIXELS:,} pixels"
            im.verify()
        with Image.open(io.BytesIO(payload)) as im:
            rgb = np.asarray(im.convert("RGB")).copy()
    except (OSError, SyntaxError, UnidentifiedImageError, Image.DecompressionBombError) as exc:
        return "err", f"invalid image data ({type(exc).__name__})"
    except Exception as exc:  # what upstream does not catch (a 500 there)
        return "raise", f"{type(exc).__name__}: {exc}"
    h, w = rgb.shape[:2]
    if max(h, w) / min(h, w) > 200:
        return "err", f"absolute aspect ratio must be smaller than 200, got {max(h, w) / min(h, w)}"
    return "ok", rgb


# ---- smart_resize and the torch preprocessing, as images.py has them --------------------------

def smart_resize(height: int, width: int, factor: int, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS):
    """gen_prompt_golden's (the one copy), with this tool's pixel budget defaults."""
    from gen_prompt_golden import smart_resize as shared
    return shared(height, width, factor, min_pixels, max_pixels)


def torch_resize(rgb: np.ndarray, oh: int, ow: int) -> np.ndarray:
    """images.py's path: HWC -> permute (a channels-last view) -> stack -> the restride -> F.interpolate."""
    pixels = torch.as_tensor(rgb.copy()).permute(2, 0, 1)
    stacked = torch.stack([pixels])
    c, h, w = stacked.shape[-3:]
    if (oh, ow) == (h, w):
        return rgb.copy()
    img = stacked.reshape(-1, c, h, w)
    if img.is_contiguous(memory_format=torch.channels_last) and img.shape[0] == 1 and img.numel() != img.stride()[0]:
        st = list(img.stride())
        st[0] = img.numel()
        img = img.as_strided((1, c, h, w), st)
    out = F.interpolate(img, size=[oh, ow], mode="bicubic", align_corners=False, antialias=True)
    return out[0].permute(1, 2, 0).contiguous().numpy()


def torch_rows(resized: np.ndarray, mean, std, patch=16, merge=2, temporal=2, rescale=1 / 255):
    t = torch.as_tensor(resized.copy()).permute(2, 0, 1)[None]
    m = torch.tensor(mean) * (1.0 / rescale)
    s = torch.tensor(std) * (1.0 / rescale)
    norm = t.to(dtype=torch.float32).sub(m.view(-1, 1, 1)).div_(s.view(-1, 1, 1))
    b, c, H, W = norm.shape
    gh, gw = H // patch, W // patch
    p = norm.reshape(b, c, gh // merge, merge, patch, gw // merge, merge, patch).permute(0, 2, 5, 3, 6, 1, 4, 7)
    rows = p.unsqueeze(6).expand(-1, -1, -1, -1, -1, -1, temporal, -1, -1).reshape(b, gh * gw, c * temporal * patch * patch)
    return rows[0].numpy(), gh, gw


# ---- the cases --------------------------------------------------------------------------------

class Golden:
    def __init__(self):
        self.cases: list[dict] = []
        self.srcs: dict[str, bytes] = {}
        for sub in ("src", "rgb", "resize", "rows"):
            (OUT / sub).mkdir(parents=True, exist_ok=True)
            for f in (OUT / sub).iterdir():
                f.unlink()

    def src(self, name: str, ext: str, data: bytes) -> str:
        fn = f"src/{name}.{ext}"
        (OUT / fn).write_bytes(data)
        self.srcs[fn] = data
        return fn

    def decode(self, name: str, fn: str, *, cut: int | None = None, patch=None, store=True, note=None):
        data = bytearray(self.srcs[fn])
        if cut is not None:
            data = data[:cut]
        for off, val in patch or []:
            data[off] = val
        kind, res = upstream_decode(bytes(data))
        case = {"kind": "decode", "name": name, "file": fn}
        if cut is not None:
            case["cut"] = cut
        if patch:
            case["patch"] = patch
        if note:
            case["note"] = note
        if kind == "ok":
            case["w"], case["h"] = res.shape[1], res.shape[0]
            case["fnv"] = fnv1a64(res.tobytes())
            if store:
                (OUT / f"rgb/{name}.bin").write_bytes(res.tobytes())
                case["rgb"] = f"rgb/{name}.bin"
        elif kind == "err":
            case["error"] = res
        else:
            case["raises"] = res  # upstream would not answer 400; the C test only reports it
        self.cases.append(case)
        return kind, res


def png_cases(g: Golden):
    rng = np.random.default_rng(7)
    w, h = 37, 23
    rgb = pattern(w, h, 1)
    a = (rng.random((h, w, 1)) * 256).astype(np.uint8)
    grey = rgb[..., :1]
    g16 = (rng.random((h, w, 1)) * 65536).astype(np.int64)
    g16[0, :8, 0] = [0, 1, 255, 256, 257, 1000, 65280, 65535]
    rgb16 = (rng.random((h, w, 3)) * 65536).astype(np.int64)
    a16 = (rng.random((h, w, 1)) * 65536).astype(np.int64)
    pal = bytes(rng.integers(0, 256, 3 * 256, dtype=np.uint8))
    specs = {
        "png_rgb8": dict(samples=rgb, depth=8, ct=2),
        "png_rgba8": dict(samples=np.concatenate([rgb, a], 2), depth=8, ct=6),
        "png_grey8": dict(samples=grey, depth=8, ct=0),
        "png_greya8": dict(samples=np.concatenate([grey, a], 2), depth=8, ct=4),
        "png_grey1": dict(samples=grey >> 7, depth=1, ct=0),
        "png_grey2": dict(samples=grey >> 6, depth=2, ct=0),
        "png_grey4": dict(samples=grey >> 4, depth=4, ct=0),
        "png_grey16": dict(samples=g16, depth=16, ct=0),
        "png_grey16_trns": dict(samples=g16, depth=16, ct=0, trns=struct.pack(">H", 256)),
        "png_greya16": dict(samples=np.concatenate([g16, a16], 2), depth=16, ct=4),
        "png_rgb16": dict(samples=rgb16, depth=16, ct=2),
        "png_rgba16": dict(samples=np.concatenate([rgb16, a16], 2), depth=16, ct=6),
        "png_pal8": dict(samples=rgb[..., :1], depth=8, ct=3, plte=pal),
        "png_pal8_trns": dict(samples=rgb[..., :1], depth=8, ct=3, plte=pal, trns=bytes(range(0, 256, 3))),
        "png_pal4_short": dict(samples=grey >> 4, depth=4, ct=3, plte=pal[:3 * 5]),  # indices past PLTE
        "png_pal2": dict(samples=grey >> 6, depth=2, ct=3, plte=pal[:12]),
        "png_pal1": dict(samples=grey >> 7, depth=1, ct=3, plte=pal[:6], trns=b"\x00"),
        "png_grey8_trns": dict(samples=grey, depth=8, ct=0, trns=struct.pack(">H", 17)),
        "png_rgb8_trns": dict(samples=rgb, depth=8, ct=2, trns=struct.pack(">HHH", 1, 2, 3)),
        "png_rgb8_interlaced": dict(samples=rgb, depth=8, ct=2, interlace=True),
        "png_grey4_interlaced": dict(samples=grey >> 4, depth=4, ct=0, interlace=True),
        "png_pal2_interlaced": dict(samples=grey >> 6, depth=2, ct=3, plte=pal[:12], interlace=True),
        "png_rgba16_interlaced": dict(samples=np.concatenate([rgb16, a16], 2), depth=16, ct=6, interlace=True),
        "png_grey16_interlaced": dict(samples=g16, depth=16, ct=0, interlace=True),
        "png_tiny_interlaced": dict(samples=rgb[:3, :2], depth=8, ct=2, interlace=True),
        "png_1x1": dict(samples=rgb[:1, :1], depth=8, ct=2),
        "png_idat_split": dict(samples=rgb, depth=8, ct=2, idat_parts=7),
        "png_unknown_critical": dict(samples=rgb, depth=8, ct=2, extra=chunk(b"ABCD", b"whatever")),
        "png_ancillary": dict(samples=rgb, depth=8, ct=2, extra=chunk(b"gAMA", struct.pack(">I", 45455))
                              + chunk(b"sRGB", b"\x00") + chunk(b"tEXt", b"Comment\x00hello")
                              + chunk(b"pHYs", struct.pack(">IIB", 2835, 2835, 1))),
        "png_ihdr_compression1": dict(samples=rgb, depth=8, ct=2, ihdr=(w, h, 8, 2, 1, 0, 0)),
        "png_ihdr_filter1": dict(samples=rgb, depth=8, ct=2, ihdr=(w, h, 8, 2, 0, 1, 0)),
        "png_extra_zlib_data": dict(samples=rgb, depth=8, ct=2, raw_tail=bytes(500)),
        "png_after_iend": dict(samples=rgb, depth=8, ct=2, after_idat=b""),
        "png_no_iend": dict(samples=rgb, depth=8, ct=2, iend=False),
        "png_pal_no_plte": dict(samples=grey >> 4, depth=4, ct=3),
        "png_tail_chunk": dict(samples=rgb, depth=8, ct=2, after_idat=chunk(b"tEXt", b"a\x00b")),
    }
    for name, kw in specs.items():
        fn = g.src(name, "png", png_bytes(**kw))
        g.decode(name, fn)
    # Interlace byte 2: Pillow reads any nonzero value as Adam7.
    fn = g.src("png_ihdr_interlace2", "png", png_bytes(rgb, 8, 2, interlace=True, ihdr=(w, h, 8, 2, 0, 0, 2)))
    g.decode("png_ihdr_interlace2", fn)
    # An unterminated zlib stream whose rows are all there (Pillow stops at the last row).
    raw_full = zlib.compress(filter_rows([pack_row(r, 8) for r in rgb], 3, 0), 9)
    fn = g.src("png_zlib_unterminated", "png", png_bytes(rgb, 8, 2, zdata=raw_full[:-6]))
    g.decode("png_zlib_unterminated", fn)
    fn = g.src("png_zlib_short", "png", png_bytes(rgb, 8, 2, zdata=zlib.compress(
        filter_rows([pack_row(r, 8) for r in rgb[:-1]], 3, 0))))
    g.decode("png_zlib_short", fn)
    # Garbage after IEND, and IEND's CRC wrong (verify() never reads it).
    base = png_bytes(rgb, 8, 2)
    fn = g.src("png_trailing_garbage", "png", base + b"garbage after the end")
    g.decode("png_trailing_garbage", fn)
    fn = g.src("png_iend_bad_crc", "png", base[:-4] + b"\x00\x00\x00\x00")
    g.decode("png_iend_bad_crc", fn)
    # The header lies: IHDR 100x100 over 10x10 data, and IHDR 10x10 over 100x100 data.
    small, big = pattern(10, 10, 3), pattern(100, 100, 4)
    fn = g.src("png_lie_big", "png", png_bytes(small, 8, 2, ihdr=(100, 100, 8, 2, 0, 0, 0)))
    g.decode("png_lie_big", fn)
    fn = g.src("png_lie_small", "png", png_bytes(big, 8, 2, ihdr=(10, 10, 8, 2, 0, 0, 0)))
    g.decode("png_lie_small", fn)
    # Declared far bigger than the data: 4000x4000 (passes the schema) and 20000x20000 (does not).
    fn = g.src("png_lie_4000", "png", png_bytes(small, 8, 2, ihdr=(4000, 4000, 8, 2, 0, 0, 0)))
    g.decode("png_lie_4000", fn)
    fn = g.src("png_lie_20000", "png", png_bytes(small, 8, 2, ihdr=(20000, 20000, 8, 2, 0, 0, 0)))
    g.decode("png_lie_20000", fn)
    # Past the aspect limit: 1x100000 (grey, compresses to nothing), and 201x1.
    fn = g.src("png_1x100000", "png", png_bytes(np.zeros((1, 100000, 1), np.uint8), 8, 0))
    g.decode("png_1x100000", fn)
    fn = g.src("png_1x201", "png", png_bytes(np.full((201, 1, 3), 9, np.uint8), 8, 2))
    g.decode("png_1x201", fn)
    fn = g.src("png_1x200", "png", png_bytes(pattern(1, 200, 8), 8, 2))
    g.decode("png_1x200", fn)
    # A Pillow-written PNG (its own encoder, optimize).
    bio = io.BytesIO()
    Image.fromarray(natural(64, 48, 5)).save(bio, "PNG", optimize=True)
    fn = g.src("png_pillow_64x48", "png", bio.getvalue())
    g.decode("png_pillow_64x48", fn)
    # Truncations and corruptions of png_rgb8 and the interlaced one.
    for src_name in ("png_rgb8", "png_rgb8_interlaced", "png_idat_split"):
        fn = f"src/{src_name}.png"
        n = len(g.srcs[fn])
        idat = g.srcs[fn].index(b"IDAT") - 4
        cuts = sorted({idat, idat + 2, idat + 4, idat + 6, idat + 8, idat + 20, (idat + n) // 2,
                       n - 16, n - 13, n - 12, n - 11, n - 9, n - 8, n - 5, n - 4, n - 1})
        for cut in cuts:
            g.decode(f"{src_name}_cut{cut}", fn, cut=cut, store=False)
    fn = "src/png_rgb8.png"
    data = g.srcs[fn]
    idat = data.index(b"IDAT") - 4
    g.decode("png_bad_idat_crc", fn, patch=[[idat + 8 + 10, data[idat + 8 + 10] ^ 0x55]], store=False)
    g.decode("png_bad_chunk_name", fn, patch=[[idat + 4, ord("#")]], store=False)
    # A broken deflate stream with its CRC fixed: a decoder error, not verify's.
    broken = bytearray(data)
    ln = struct.unpack(">I", broken[idat:idat + 4])[0]
    for k in range(20, 28):
        broken[idat + 8 + k] ^= 0xA5
    broken[idat + 8 + ln:idat + 12 + ln] = struct.pack(">I", zlib.crc32(bytes(broken[idat + 4:idat + 8 + ln])))
    fn = g.src("png_bad_deflate", "png", bytes(broken))
    g.decode("png_bad_deflate", fn, store=False)
    fn = g.src("png_bad_magic", "png", b"\x89PNH" + data[4:])
    g.decode("png_bad_magic", fn, store=False)


def tj_ycck(rgb: np.ndarray) -> bytes | None:
    """A YCCK JPEG: TurboJPEG compresses CMYK pixels as YCCK (libjpeg-turbo's tjCompress2)."""
    path = ctypes.util.find_library("turbojpeg") or "libturbojpeg.so.0"
    try:
        tj = ctypes.CDLL(path)
    except OSError:
        return None
    h, w = rgb.shape[:2]
    cmyk = np.concatenate([255 - rgb, np.minimum(rgb.min(axis=2, keepdims=True), 200)], axis=2)
    buf = np.ascontiguousarray(cmyk, np.uint8)
    tj.tjInitCompress.restype = ctypes.c_void_p
    handle = ctypes.c_void_p(tj.tjInitCompress())
    out = ctypes.POINTER(ctypes.c_ubyte)()
    size = ctypes.c_ulong(0)
    TJPF_CMYK, TJSAMP_420 = 11, 2
    rc = tj.tjCompress2(handle, buf.ctypes.data_as(ctypes.c_void_p), w, 0, h, TJPF_CMYK,
                        ctypes.byref(out), ctypes.byref(size), TJSAMP_420, 90, 0)
    if rc != 0:
        return None
    data = ctypes.string_at(out, size.value)
    tj.tjFree(out)
    tj.tjDestroy(handle)
    return data


def jpeg_cases(g: Golden):
    w, h = 37, 23
    img = natural(w, h, 11)
    pil = Image.fromarray(img)

    def save(name, im, **kw):
        bio = io.BytesIO()
        im.save(bio, "JPEG", **kw)
        fn = g.src(name, "jpg", bio.getvalue())
        g.decode(name, fn)
        return fn

    save("jpeg_baseline", pil, quality=90)
    save("jpeg_444", pil, quality=90, subsampling=0)
    save("jpeg_422", pil, quality=90, subsampling=1)
    save("jpeg_progressive", pil, quality=85, progressive=True)
    save("jpeg_progressive_444", pil, quality=85, progressive=True, subsampling=0)
    save("jpeg_optimize", pil, quality=75, optimize=True)
    save("jpeg_q100", pil, quality=100)
    save("jpeg_grey", pil.convert("L"), quality=90)
    save("jpeg_cmyk", pil.convert("CMYK"), quality=90)
    save("jpeg_restart", pil, quality=90, restart_marker_blocks=2)
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90; upstream does not transpose
    save("jpeg_exif_rotate", pil, quality=90, exif=exif.tobytes())
    save("jpeg_1x1", Image.fromarray(img[:1, :1]), quality=90)
    save("jpeg_16x16", Image.fromarray(natural(16, 16, 3)), quality=90)
    big = save("jpeg_64x48", Image.fromarray(natural(64, 48, 12)), quality=90)
    ycck = tj_ycck(img)
    if ycck is not None:
        fn = g.src("jpeg_ycck", "jpg", ycck)
        g.decode("jpeg_ycck", fn)
    # Truncations (every one is Pillow's "image file is truncated") and corruptions.
    for fn in ("src/jpeg_baseline.jpg", "src/jpeg_progressive.jpg", "src/jpeg_cmyk.jpg", big):
        data = g.srcs[fn]
        n = len(data)
        sos = data.index(b"\xff\xda")
        for cut in sorted({sos + 2, sos + 14, (sos + n) // 2, n - 40, n - 3, n - 2, n - 1}):
            g.decode(f"{Path(fn).stem}_cut{cut}", fn, cut=cut, store=False)
    data = g.srcs[big]
    sos = data.index(b"\xff\xda")
    # Corrupt entropy-coded bytes: libjpeg warns and goes on; Pillow ignores warnings.
    for k, off in enumerate((sos + 40, sos + 200, len(data) - 60)):
        val = data[off] ^ 0x3C
        if val == 0xFF:
            val = 0x7F
        g.decode(f"jpeg_corrupt{k}", big, patch=[[off, val]], store=True)
    # Junk bytes before EOI (libjpeg's "extraneous bytes" warning).
    fn = g.src("jpeg_junk_before_eoi", "jpg", data[:-2] + b"\x00\x11\x22" + data[-2:])
    g.decode("jpeg_junk_before_eoi", fn)
    fn = g.src("jpeg_trailing_garbage", "jpg", data + b"garbage after EOI")
    g.decode("jpeg_trailing_garbage", fn)
    # SOF says 64x96 over 64x48 data (the scan runs out), and 32x24 over it (data left over).
    sof = data.index(b"\xff\xc0")
    lie = bytearray(data)
    lie[sof + 5:sof + 7] = struct.pack(">H", 96)
    fn = g.src("jpeg_lie_big", "jpg", bytes(lie))
    g.decode("jpeg_lie_big", fn, store=False)
    lie[sof + 5:sof + 9] = struct.pack(">HH", 24, 32)
    fn = g.src("jpeg_lie_small", "jpg", bytes(lie))
    g.decode("jpeg_lie_small", fn)


def webp_riff(chunks: bytes) -> bytes:
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WEBP" + chunks


def webp_chunk(kind: bytes, data: bytes) -> bytes:
    pad = b"\x00" if len(data) % 2 else b""
    return kind + struct.pack("<I", len(data)) + data + pad


def webp_cases(g: Golden):
    w, h = 37, 23
    img = natural(w, h, 21)
    rng = np.random.default_rng(22)
    alpha = (rng.random((h, w)) * 256).astype(np.uint8)
    alpha[:, :5] = 0  # fully transparent pixels keep their colour in "exact" lossless
    rgba = Image.fromarray(np.dstack([img, alpha]))

    def save(name, im, **kw):
        bio = io.BytesIO()
        im.save(bio, "WEBP", **kw)
        fn = g.src(name, "webp", bio.getvalue())
        g.decode(name, fn)
        return fn

    lossy = save("webp_lossy", Image.fromarray(img), quality=80, method=4)
    lossless = save("webp_lossless", Image.fromarray(img), lossless=True)
    save("webp_lossy_alpha", rgba, quality=80)
    save("webp_lossless_alpha", rgba, lossless=True, exact=True)
    frames = [Image.fromarray(natural(w, h, 30 + k)) for k in range(3)]
    anim = save("webp_anim", frames[0], save_all=True, append_images=frames[1:], duration=100, loop=0,
                quality=80)
    save("webp_anim_lossless", frames[0], save_all=True, append_images=frames[1:], duration=100,
         lossless=True)
    save("webp_64x48", Image.fromarray(natural(64, 48, 23)), quality=90)
    # An animation whose first frame is a 20x12 rectangle at (4, 6) of the 37x23 canvas.
    bio = io.BytesIO()
    Image.fromarray(natural(20, 12, 24)).save(bio, "WEBP", lossless=True)
    sub = bio.getvalue()
    vp8l = sub[12:]  # the VP8L chunk, header included
    anmf = (struct.pack("<I", 4 // 2)[:3] + struct.pack("<I", 6 // 2)[:3] + struct.pack("<I", 20 - 1)[:3]
            + struct.pack("<I", 12 - 1)[:3] + struct.pack("<I", 100)[:3] + b"\x00")
    vp8x = bytes([0x10 | 0x02, 0, 0, 0]) + struct.pack("<I", w - 1)[:3] + struct.pack("<I", h - 1)[:3]
    data = webp_riff(webp_chunk(b"VP8X", vp8x) + webp_chunk(b"ANIM", b"\x00\x00\x00\x00\x00\x00")
                     + webp_chunk(b"ANMF", anmf + vp8l))
    fn = g.src("webp_anim_offset", "webp", data)
    g.decode("webp_anim_offset", fn)
    for fn in (lossy, lossless, anim):
        data = g.srcs[fn]
        n = len(data)
        for cut in sorted({16, 30, 40, n // 2, n - 10, n - 2, n - 1}):
            g.decode(f"{Path(fn).stem}_cut{cut}", fn, cut=cut, store=False)
    data = g.srcs[lossy]
    for k, off in enumerate((40, 80, len(data) - 30)):
        g.decode(f"webp_corrupt{k}", lossy, patch=[[off, data[off] ^ 0x5A]])
    data = g.srcs[lossless]
    for k, off in enumerate((30, 60, len(data) - 20)):
        g.decode(f"webp_lossless_corrupt{k}", lossless, patch=[[off, data[off] ^ 0x5A]])


def mutation_sweep(g: Golden, seed: int = 99, per_file: int = 40):
    """Random single-byte changes of a few images: the outcome (and pixels) must be upstream's."""
    rng = np.random.default_rng(seed)
    for fn in ("src/png_rgb8.png", "src/png_pal4_short.png", "src/png_rgb8_interlaced.png",
               "src/jpeg_baseline.jpg", "src/jpeg_progressive.jpg", "src/webp_lossy.webp",
               "src/webp_lossless.webp"):
        data = g.srcs[fn]
        for k in range(per_file):
            off = int(rng.integers(0, len(data)))
            val = int(rng.integers(0, 256))
            if val == data[off]:
                val ^= 1
            g.decode(f"mut_{Path(fn).stem}_{k}", fn, patch=[[off, val]], store=False)


def resize_cases(g: Golden):
    sizes = [  # (w, h, ow, oh) or smart-resized when ow is None
        (37, 23, None, None), (64, 48, None, None), (333, 320, None, None), (320, 333, None, None),
        (320, 320, None, None), (200, 1, None, None), (1, 150, None, None), (2000, 1500, None, None),
        (4000, 3000, None, None), (1277, 31, None, None),
        (37, 23, 50, 20), (37, 23, 7, 11), (37, 23, 3, 2), (37, 23, 100, 23),
        (37, 23, 37, 90), (5, 3, 64, 64), (640, 480, 64, 48), (97, 1, 13, 1),
    ]
    for k, (w, h, ow, oh) in enumerate(sizes):
        seed = 40 + k
        src = pattern(w, h, seed)
        if ow is None:
            oh, ow = smart_resize(h, w, 32)
        out = torch_resize(src, oh, ow)
        picks = sorted({0, 1, oh // 3, oh // 2, oh - 2, oh - 1} & set(range(oh)))
        name = f"resize_{w}x{h}_to_{ow}x{oh}"
        (OUT / f"resize/{name}.bin").write_bytes(out[picks].tobytes())
        g.cases.append({"kind": "resize", "name": name, "w": w, "h": h, "seed": seed, "ow": ow,
                        "oh": oh, "rows": picks, "file": f"resize/{name}.bin",
                        "fnv": fnv1a64(out.tobytes())})


def pipeline_cases(g: Golden):
    for name, mean, std in (("png_pillow_64x48", CLIP_MEAN, CLIP_STD), ("jpeg_64x48", CLIP_MEAN, CLIP_STD),
                            ("webp_64x48", [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]), ("png_rgba16", CLIP_MEAN, CLIP_STD),
                            ("png_1x200", [0.5, 0.5, 0.5], [0.5, 0.5, 0.5])):
        fn = next(f for f in g.srcs if Path(f).stem == name)
        kind, rgb = upstream_decode(g.srcs[fn])
        assert kind == "ok", (name, rgb)
        oh, ow = smart_resize(rgb.shape[0], rgb.shape[1], 32)
        resized = torch_resize(rgb, oh, ow)
        rows, gh, gw = torch_rows(resized, mean, std)
        picks = sorted({0, 1, 5, len(rows) // 2, len(rows) - 1})
        (OUT / f"rows/{name}.bin").write_bytes(rows[picks].astype("<f4").tobytes())
        g.cases.append({"kind": "pipeline", "name": name, "file": fn, "mean": mean, "std": std,
                        "oh": oh, "ow": ow, "gh": gh, "gw": gw, "tokens": gh * gw // 4,
                        "resized_fnv": fnv1a64(resized.tobytes()), "rows": picks,
                        "rows_file": f"rows/{name}.bin",
                        "rows_fnv": fnv1a64(rows.astype("<f4").tobytes())})


def smart_cases(g: Golden):
    rng = np.random.default_rng(5)
    pairs = [(16, 16), (48, 48), (80, 80), (16, 48), (48, 80), (112, 16), (1, 1), (1, 200), (200, 1),
             (1, 201), (2, 401), (2, 400), (10, 2005), (3, 601), (4000, 4000), (5656, 2828),
             (56568, 283), (283, 56568), (1280, 1280), (1281, 1279), (1600, 1024), (28, 28), (1, 100000),
             (100000, 1), (7, 1403), (32 * 40, 32 * 40 + 16), (32 * 40 + 16, 32 * 40), (3999, 4001)]
    for _ in range(400):
        h = int(rng.integers(1, 8000))
        w = int(rng.integers(max(1, h // 199), min(8000, h * 199) + 1))
        pairs.append((h, w))
    for _ in range(60):
        h = int(rng.integers(1, 300))
        pairs.append((h, int(h * rng.uniform(200, 400)) + 1))
    for factor in (32, 28):
        for h, w in pairs if factor == 32 else pairs[:80]:
            case = {"kind": "smart", "h": h, "w": w, "factor": factor}
            try:
                case["oh"], case["ow"] = smart_resize(h, w, factor)
            except ValueError as exc:
                case["error"] = str(exc)
            g.cases.append(case)


def main():
    g = Golden()
    png_cases(g)
    jpeg_cases(g)
    webp_cases(g)
    mutation_sweep(g)
    resize_cases(g)
    pipeline_cases(g)
    smart_cases(g)
    index = {
        "generator": "tests/tools/gen_image_golden.py",
        "versions": {"pillow": Image.__version__, "torch": torch.__version__, "numpy": np.__version__},
        "cases": g.cases,
    }
    (OUT / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    total = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    kinds: dict[str, int] = {}
    for c in g.cases:
        kinds[c["kind"]] = kinds.get(c["kind"], 0) + 1
    print(f"{len(g.cases)} cases {kinds}, {total} bytes under {OUT.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
