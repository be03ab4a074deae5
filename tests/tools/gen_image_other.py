#!/usr/bin/env python3
"""Writes tests/fixtures/image-other.json for tests/test_image.c: small files
of the formats Pillow opens besides PNG, JPEG and WebP (GIF, BMP, DIB, TIFF,
PPM and kin, AVIF, ICO, CUR, QOI, JPEG 2000, TGA), whole, cut and with sizes past
the decompression-bomb limit, each with what upstream answers for it
(images.py: Image.open, the bomb check inside it, then the format check).

    python3 tests/tools/gen_image_other.py    # Pillow 13 (its wheels read AVIF)
"""
import base64, io, json, pathlib, struct, warnings, zlib
warnings.simplefilter("ignore")
from PIL import Image, UnidentifiedImageError

def answer(b):
    try:
        with Image.open(io.BytesIO(b)) as im:
            return None if im.format in ("PNG", "JPEG", "WEBP") else "images must be PNG, JPEG or WebP"
    except (OSError, SyntaxError, UnidentifiedImageError, Image.DecompressionBombError) as e:
        return f"invalid image data ({type(e).__name__})"

def chunk(t, d):
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

def png1x1():
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0\0\0\0")) + chunk(b"IEND", b""))

def tiff(be, entries, big=False):
    e = ">" if be else "<"
    if big:
        head = (b"MM" if be else b"II") + struct.pack(e + "HHHQ", 43, 8, 0, 16)
        ifd = struct.pack(e + "Q", len(entries))
        ifd += b"".join(struct.pack(e + "HHQQ", t, ty, 1, v) for t, ty, v in entries)
        return head + ifd + struct.pack(e + "Q", 0)
    head = (b"MM" if be else b"II") + struct.pack(e + "HI", 42, 8)
    ifd = struct.pack(e + "H", len(entries))
    ifd += b"".join(struct.pack(e + "HHII", t, ty, 1, v << 16 if be and ty == 3 else v)
                    for t, ty, v in entries)
    return head + ifd + struct.pack(e + "I", 0)

def dib(w, h, bits=24, hs=40):
    return struct.pack("<IiiHHIIiiII", hs, w, h, 1, bits, 0, 0, 0, 0, 0, 0)

def bmp(w, h, bits=24):
    info = dib(w, h, bits)
    return b"BM" + struct.pack("<IHHI", 14 + len(info) + 16, 0, 0, 14 + len(info)) + info + bytes(16)

def bmp_core(w, h):
    info = struct.pack("<IHHHH", 12, w, h, 1, 24)
    return b"BM" + struct.pack("<IHHI", 26 + 16, 0, 0, 26) + info + bytes(16)

def gif(screen, frame):
    (sw, sh), (x0, y0, fw, fh) = screen, frame
    return (b"GIF89a" + struct.pack("<HHBBB", sw, sh, 0x80, 0, 0) + b"\0\0\0\xff\xff\xff"
            + b"," + struct.pack("<HHHHB", x0, y0, fw, fh, 0) + b"\x02\x02\x44\x01\x00;")

def ico(frame, magic=1, w=1, h=1):
    return struct.pack("<HHH", 0, magic, 1) + struct.pack("<BBBBHHII", w, h, 0, 0, 1, 32, len(frame), 22) + frame

def jp2(w, h, nc=3, extra=b""):
    ihdr = struct.pack(">I4sIIHBBBB", 22, b"ihdr", h, w, nc, 7, 7, 0, 0)
    return b"\0\0\0\x0cjP  \r\n\x87\n" + struct.pack(">I4s", 8 + len(ihdr), b"jp2h") + ihdr + extra

def j2k(w, h, nc=3):
    siz = struct.pack(">HHIIIIIIIIH", 38 + 3 * nc, 0, w, h, 0, 0, w, h, 0, 0, nc) + b"\x07\x01\x01" * nc
    return b"\xff\x4f\xff\x51" + siz + b"\xff\xd9"

def tga(w, h):
    return struct.pack("<BBBHHBHHHHBB", 0, 0, 2, 0, 0, 0, 0, 0, w, h, 24, 0x20) + bytes(12)

STRIP = (273, 4, 0)
CASES = [
    ("gif 3x2", gif((3, 2), (0, 0, 3, 2))),
    ("gif screen 65535x65535", gif((65535, 65535), (0, 0, 1, 1))),
    ("gif frame past a 1x1 screen", gif((1, 1), (0, 0, 65535, 65535))),
    ("gif frame grown to 13378x13378", gif((8, 8), (3378, 3378, 10000, 10000))),
    ("gif frame grown to 13377x13377", gif((8, 8), (3377, 3377, 10000, 10000))),
    ("gif without a frame", gif((3, 2), (0, 0, 3, 2))[:19] + b";"),
    ("bmp 100x100", bmp(100, 100)),
    ("bmp 30000x30000", bmp(30000, 30000)),
    ("bmp top-down 30000x-30000", bmp(30000, -30000)),
    ("bmp top-down 5x-3", bmp(5, -3)),
    ("bmp core 65535x65535", bmp_core(65535, 65535)),
    ("bmp 9 bits", bmp(4, 4, 9)),
    ("bmp header cut", bmp(4, 4)[:30]),
    ("dib 4x4", dib(4, 4) + bytes(48)),
    ("tiff le", tiff(False, [(256, 3, 3), (257, 3, 2), STRIP])),
    ("tiff be", tiff(True, [(256, 3, 3), (257, 3, 2), STRIP])),
    ("bigtiff", tiff(False, [(256, 3, 3), (257, 3, 2), STRIP], big=True)),
    ("tiff 20000x20000", tiff(False, [(256, 4, 20000), (257, 4, 20000), STRIP])),
    ("tiff without strips", tiff(False, [(256, 3, 3), (257, 3, 2)])),
    ("tiff without a height", tiff(False, [(256, 3, 3), STRIP])),
    ("tiff header only", b"II*\0\x08\0\0\0"),
    ("pbm plain", b"P1\n3 2\n0 1 0\n1 0 1\n"),
    ("pgm plain", b"P2 3 2 255 1 2 3 4 5 6"),
    ("ppm plain", b"P3\n1 1\n255\n1 2 3\n"),
    ("pbm", b"P4\n3 2\n\0\0"),
    ("pgm # comment", b"P5\n# c\n3 2\n255\n" + bytes(6)),
    ("ppm", b"P6 3 2 255\n" + bytes(18)),
    ("pfm", b"Pf\n3 2\n-1.0\n" + bytes(24)),
    ("pgm 20000x20000", b"P5\n20000 20000\n255\n" + bytes(8)),
    ("p7 is not ppm", b"P7\nWIDTH 3\nHEIGHT 2\nDEPTH 1\nMAXVAL 255\nENDHDR\n" + bytes(6)),
    ("ico png", ico(png1x1())),
    ("ico dib", ico(dib(1, 2, 32) + bytes(8))),
    ("ico frame cut", ico(png1x1())[:40]),
    ("cur dib", ico(dib(1, 2, 32) + bytes(8), magic=2)),
    ("qoi", b"qoif\0\0\0\3\0\0\0\2\3\0" + bytes(8)),
    ("qoi 20000x20000", b"qoif" + struct.pack(">II", 20000, 20000) + b"\3\0" + bytes(8)),
    ("qoi cut", b"qoif\0\0\0\3\0\0\0\2"),
    ("jp2", jp2(3, 2)),
    ("jp2 20000x20000", jp2(20000, 20000)),
    ("jp2 box cut", jp2(3, 2)[:20]),
    ("jp2 without a mode", jp2(3, 2, nc=5)),
    ("j2k", j2k(3, 2)),
    ("j2k SIZ cut", j2k(3, 2)[:30]),
    ("tga", tga(3, 2)),
    ("tga 20000x20000", tga(20000, 20000)),
    ("text", b"hello, world\n"),
]

def avif(mode="RGB", size=(64, 48), **kw):
    b = io.BytesIO()
    Image.new(mode, size, 128).save(b, "AVIF", **kw)
    return b.getvalue()

def avif_sized(w, h):
    d = avif()
    i = d.index(b"ispe") + 8
    return d[:i] + struct.pack(">II", w, h) + d[i + 8:]

def avif_cases():
    """Pillow's AVIF plugin (libavif's parse): whole files, cuts, sizes, brands."""
    d, exif = avif(), avif(size=(20, 20), exif=b"Exif\0\0II*\0\x08\0\0\0\0\0\0\0")
    out = [("avif 64x48", d), ("avif rgba 33x17", avif("RGBA", (33, 17))),
           ("avif grey 300x7", avif("L", (300, 7))), ("avif exif", exif),
           ("avif exif data cut", exif[:350]),
           ("avif brand mif1 only", d[:8] + b"mif1" + d[12:16] + b"mif1" * 4 + d[32:])]
    out += [(f"avif cut at {c}", d[:c]) for c in range(0, len(d) + 1, 9)]
    for w, h in [(20000, 10000), (13000, 13000), (40000, 100), (32768, 100), (16384, 16384),
                 (16385, 16384), (0, 5)]:
        out.append((f"avif ispe {w}x{h}", avif_sized(w, h)))
    return out

OUT = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "image-other.json"


def main():
    cases = []
    for name, b in CASES + avif_cases():
        a = answer(b)
        assert a is not None, name
        cases.append({"name": name, "data": base64.b64encode(b).decode(), "error": a})
    doc = {"pillow": Image.__version__, "cases": cases}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
