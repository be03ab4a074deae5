#!/usr/bin/env python3
"""Golden numerics for the Qwen3.5 vision tower and image prompts, made with HF transformers.

One command regenerates everything (deterministic: numpy PCG64 weights and images, torch CPU
kernels; the encoded image bytes depend on the zlib / libjpeg-turbo / libwebp that Pillow
bundles):

    python3 tests/tools/gen_vision_golden.py [--threads 1] [--upstream-vision FILE]

Needs: torch (CPU), transformers with models/qwen3_5 (written against 5.24.0), safetensors,
numpy, pillow (with WebP), tokenizers. Reuses tests/tools/gen_tower_golden.py (weight rules,
fp64 copy of modeling_qwen3_5, readout maths) and tests/tools/gen_prompt_golden.py (the d3
prompt renderer of SPEC c, the SPEC c.7 tokenizer).

1. The package tests/fixtures/tiny-vl/ (SPEC e), a tiny random Qwen3.5 VL model:
   * text tower: as tests/fixtures/tiny-upstream (vocab 4048, hidden 64, 6 layers
     [lin, lin, lin, full, lin, full], ...) EXCEPT rotary: rope_theta 100 (not 1e7, so that
     the w axis' frequency is not negligible), partial_rotary_factor 0.5 (rotary
     dim 8 of head_dim 16, 4 frequencies) and mrope_section [2, 1, 1] interleaved, i.e.
     frequency j uses the position axis j % 3 for j < 3, frequency 3 the t axis
     (HF recomposition_frequencies: index 1 -> h, index 2 -> w, the rest t), so the t, h and
     w axes of image tokens all matter. Text weights: gen_tower_golden.random_weight rules,
     seed SEED (not the tiny-upstream values).
   * vision tower (model.visual.*): depth 2, hidden 32, 2 heads (head_dim 16), MLP 64
     (gelu_pytorch_tanh), patch 16, temporal patch 2, spatial merge 2, 3 channels,
     out_hidden 64, num_position_embeddings 64 (an 8x8 table, bilinearly resampled with
     align_corners=True to each image's patch grid), axial rotary theta 10000, merger
     LayerNorm(32) -> view(-1, 128) -> fc1 128x128 -> exact GELU (erf) -> fc2 64x128.
     Init (vision_weight below): patch_embed N(0, 1/1536), pos_embed N(0, 0.5^2),
     LayerNorm w 1 + 0.15 N, every bias 0.1 N, linears 0.9/sqrt(fan_in) N; activations are
     O(1) and the fp32 tower is within ~1e-6 (relative max-norm) of the fp64 run.
   * every weight rounded to BF16; model.safetensors holds them as BF16 under the
     Qwen3_5ForConditionalGeneration names (model.language_model.*, model.visual.*; no
     lm_head). The fp32 reference runs with exactly these BF16 values in fp32.
   * config.json (Qwen3_5Config.save_pretrained with vision_config, image/video/vision
     start/end token ids of the qwen35-mini tokenizer), preprocessor_config.json
     (Qwen2VLImageProcessorFast, CLIP mean/std), and -- copied byte for byte from
     tests/fixtures/tiny-upstream -- readout.safetensors, tokenizer.json,
     tokenizer_config.json, chat_template.jinja (the placeholder template, NOT one of SPEC
     e.5's pinned hashes); decision_config.json as tiny-upstream's but base_model
     "d3stream/tiny-vl"; MODEL_MANIFEST.json (SPEC e.3/e.4) with parameters.vision = the
     vision elements, loaded = text + vision + readout. Run tests/tools/gen_tower_golden.py
     first if tiny-upstream is missing.

2. The image pipeline (the upstream runtime's families/decision3/images.py, reproduced):
   PIL Image.open(bytes) -> .convert("RGB") -> uint8 HWC -> (1, 3, H, W) view (channels-last
   strides) -> smart_resize(H, W, factor 32, 65,536..1,638,400 pixels; Python round() is
   round-half-even) -> torch F.interpolate(uint8, bicubic, align_corners=False,
   antialias=True) (skipped when the size is unchanged) -> float32 -> (x - mean255) /
   std255 with mean255 = float32(image_mean) * 255 and std255 = float32(image_std) * 255
   computed in float32 (values in index.json "preprocess") -> patch rows: for merge-block
   row bh, block col bw, in-block row ih, col iw (patch row = bh*2 + ih, patch col =
   bw*2 + iw), row index ((bh * (gw/2) + bw) * 2 + ih) * 2 + iw, and within a row of 1536
   values the order (channel c, temporal t in {0,1} (the same frame twice), y in 0..15,
   x in 0..15): value = normalized[c, 16*(patch row) + y, 16*(patch col) + x].
   grid = (1, H/16, W/16); tokens = (H/16) * (W/16) / 4.

3. tests/golden/vision/: index.json + raw little-endian arrays (*.bin, no header; C order;
   dtypes "f32" = IEEE float32, "i32" = int32, "u8" = uint8) + images/ (the encoded image
   files). Every array is listed once in index.json "arrays":
       {"name": N, "dtype": "f32"|"i32"|"u8", "shape": [...], "file": "<N>.bin"}
   (file paths relative to tests/golden/vision/), and the cases name their arrays by role.

   index.json:
   {
     "format": "d3-vision-golden/1, see tests/tools/gen_vision_golden.py",
     "package": "tests/fixtures/tiny-vl",
     "torch", "transformers", "pillow", "numpy", "cpu_capability",
     "preprocess": {"patch_size", "temporal_patch_size", "merge_size", "min_pixels",
                    "max_pixels", "image_mean", "image_std",
                    "mean255_f32": [3 floats], "std255_f32": [3 floats]},
     "arrays": [ {name, dtype, shape, file}, ... ],
     "images": [ {                        one per image case
         "name", "file": "images/<name>.<ext>", "format": "PNG"|"JPEG"|"WEBP",
         "sha256" (of the file), "bytes", "source_size": [H, W] (PIL size is (W, H)),
         "resized": [H, W], "grid": [t, h, w] (patches), "tokens" (merged tokens),
         "pixel_rows": [row indices into the (grid_h*grid_w, 1536) pixel_values],
         "arrays": {
           "decoded_u8"  (jpeg_300x200 only) [H0, W0, 3] the RGB decode before resizing,
           "resized_u8"  (not for the large image) [H, W, 3] after the uint8 resize,
           "pixel_rows"  [R, 1536] f32 the pixel_values rows listed in "pixel_rows",
           "embed_rows"  [R, 32] f32 patch_embed(row) + resampled pos_embed (input of block 0)
                          at those rows,
           "blocks_rows" [R, 32] f32 output of the last block (before the merger) at those rows,
           "tower"       [tokens, 64] f32 the merger output (what replaces the image's
                          <|image_pad|> tokens; = get_image_features(...).pooler_output,
                          NOT last_hidden_state which is the pre-merger [patches, 32])},
         "fp32_vs_fp64": {"tower", "blocks_rows", "embed_rows"} relative max-norm error
                          (max|a-b| / max|b|) of the fp32 run against the fp64 run,
         "resize_float_path_max_abs_diff": the uint8 resize against round(clamp(float32
                          bicubic antialias resize of the same uint8 image)) (informative),
         "tower_abs_max"}, ... ],
     "requests": [ {"name", "request": <System One request body, images as data URLs of the
                    files above>, "images": [image case names, in request order]}, ... ],
     "records": [ {                       one per (request, question, mode)
         "name", "request", "question" (question id), "mode": "causal"|"noncausal",
         "type", "n_options", "prompt" (the rendered text, placeholders not expanded),
         "n_tokens" (T, after expansion), "image_token_spans": [[start, count], ...],
         "arrays": {
           "input_ids"  [T] i32 expanded ids (each image's single <|image_pad|> repeated
                        tokens times),
           "positions"  [3, T] i32 the (t, h, w) rotary positions the forward used (captured
                        at the text rotary embedding's input; equal to get_rope_index),
           "final_last" [64] f32 final-norm hidden at position T-1,
           "logits"     [255] f32 final_last x readout^T (fp32),
           "probs"      [n_options] f32 softmax over 255 with rows >= n masked, keep n,
                        renormalise (computed in float64, stored f32)},
         "probs_f64": the same probabilities as JSON numbers (float64 repr),
         "fp32_vs_fp64": {"final_last", "logits", "probs"}}, ... ]
   }
   Attention modes (SPEC d.3), batch of one, no padding:
     causal:    attention_mask = ones(1, T) (HF causal mask on the full-attention layers);
     noncausal: full-attention layers get an all-zero additive 4-D mask (1, 1, T, T), the
                Gated DeltaNet layers stay recurrent (mask None); positions passed
                explicitly from get_rope_index (the same as in causal mode, asserted).
   Rotary positions (transformers 5.24 Qwen3_5Model.get_rope_index with mm_token_type_ids =
   1 exactly on <|image_pad|> ids): text tokens t = h = w = running position p (p += 1);
   an image of grid (1, gh, gw) starting at p gives merged token (r, c) (row-major over the
   gh/2 x gw/2 merged grid) t = p, h = p + r, w = p + c, then p += max(gh, gw) / 2.

4. fp64 reference: the same BF16 weights through gen_tower_golden's fp64 copy of
   modeling_qwen3_5 (vision and text; the copy's AutoModel is redirected to the copy's
   classes). Not stored; its distance from the fp32 golden is reported per case. Note: HF
   computes the bilinear pos-embed weights in float32 whatever the model dtype (vision_utils),
   so the fp64 run uses those float32 weights too.

--upstream-vision FILE: also run the upstream runtime's
engines/native/models/qwen3_5_vision.py (a local copy of the file; its two package imports
are replaced by stubs: rotate_half and a KernelSet whose "sdpa" is
F.scaled_dot_product_attention) on every image, print its distance from transformers' and
assert it is within TOWER_REL (printed only; index.json is the same with or without it).
"""

from __future__ import annotations

import argparse
import base64
import copy
import hashlib
import io
import json
import math
import shutil
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))
import gen_tower_golden as TG  # noqa: E402
import gen_prompt_golden as PG  # noqa: E402

REPO = TOOLS.parents[1]
MINI = REPO / "tests" / "fixtures" / "qwen35-mini"
UPSTREAM_PKG = REPO / "tests" / "fixtures" / "tiny-upstream"
PKG_OUT = REPO / "tests" / "fixtures" / "tiny-vl"
GOLD_OUT = REPO / "tests" / "golden" / "vision"

SEED = 20260611
IMG_SEED = 20260612
HIDDEN = TG.HIDDEN
N_CODES = TG.N_CODES
TEXT_PREFIX = "model.language_model."
VIS_PREFIX = "model.visual."

PATCH, TEMPORAL, MERGE = 16, 2, 2
MIN_PIXELS, MAX_PIXELS = 65_536, 1_638_400
IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]
RESCALE = 1 / 255

VISION_CONFIG = dict(
    depth=2, hidden_size=32, num_heads=2, intermediate_size=64, patch_size=PATCH,
    temporal_patch_size=TEMPORAL, spatial_merge_size=MERGE, in_channels=3, out_hidden_size=HIDDEN,
    num_position_embeddings=64, hidden_act="gelu_pytorch_tanh",
    rope_parameters={"rope_type": "axial", "rope_theta": 10000.0},
)

# fp32 golden vs fp64 run (relative max-norm), asserted
TOWER_REL = 5e-6
RECORD_REL = 3e-5
RECORD_PROB = 1e-5
BUDGET = 2_500_000
# inv_freq = theta^(-2j/8), j = 0..3 -> axes t, h, w, t. With tiny-upstream's 1e7 the w
# frequency (j = 2) is 3.2e-4 rad per position and moving the w positions changes the final
# hidden by only ~2e-5; with 100 the frequencies are 1, 0.32, 0.1, 0.032.
TEXT_ROPE_THETA = 100.0


def text_config_kwargs() -> dict:
    kw = TG.text_config_kwargs()
    kw["rope_parameters"] = dict(kw["rope_parameters"], partial_rotary_factor=0.5,
                                 mrope_section=[2, 1, 1], mrope_interleaved=True,
                                 rope_theta=TEXT_ROPE_THETA)
    return kw


def full_config():
    from transformers import Qwen3_5Config
    cfg = Qwen3_5Config(text_config=text_config_kwargs(), vision_config=dict(VISION_CONFIG),
                        **TG.mini_special_ids())
    cfg.architectures = ["Qwen3_5ForConditionalGeneration"]
    return cfg


def vision_weight(name: str, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """Deterministic init of model.visual.* by name (see the docstring)."""
    if name.endswith("patch_embed.proj.weight"):
        fan = int(np.prod(shape[1:]))
        return rng.standard_normal(shape) / np.sqrt(fan)
    if name.endswith("pos_embed.weight"):
        return 0.5 * rng.standard_normal(shape)
    if "norm" in name.rsplit(".", 2)[-2] and name.endswith(".weight"):  # LayerNorm: plain w
        return 1.0 + 0.15 * rng.standard_normal(shape)
    if name.endswith(".bias"):
        return 0.1 * rng.standard_normal(shape)
    if len(shape) == 2:
        return (0.9 / np.sqrt(shape[1])) * rng.standard_normal(shape)
    raise SystemExit(f"no init rule for {name} {shape}")


def build_model(torch):
    from transformers import Qwen3_5ForConditionalGeneration

    cfg = full_config()
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(cfg).to(torch.float32).eval()
    assert model.config.vision_config._attn_implementation == "eager"
    assert model.config.text_config._attn_implementation == "eager"
    rng = np.random.Generator(np.random.PCG64(SEED))
    sd = model.state_dict()
    new = {}
    for name in sorted(sd):
        shape = tuple(sd[name].shape)
        if name == "lm_head.weight":  # not part of a d3 package, never used
            new[name] = torch.zeros(shape)
            continue
        if name.startswith(VIS_PREFIX):
            w = vision_weight(name, shape, rng)
        else:
            assert name.startswith(TEXT_PREFIX), name
            w = TG.random_weight(name, shape, rng)
        new[name] = TG.bf16_round(torch.from_numpy(np.asarray(w, dtype=np.float32)))
    model.load_state_dict(new, strict=True)
    return cfg, model, new


def build_model64(torch, cfg, sd):
    """fp64 twin through gen_tower_golden's fp64 copy of modeling_qwen3_5 (vision + text)."""
    mod = TG.fp64_modeling_module(torch)

    class AutoShim:
        @staticmethod
        def from_config(c, **kw):
            if c.model_type == "qwen3_5_vision":
                return mod.Qwen3_5VisionModel(c)
            if c.model_type == "qwen3_5_text":
                return mod.Qwen3_5TextModel(c)
            raise SystemExit(f"unexpected sub-config {c.model_type}")

    mod.AutoModel = AutoShim
    torch.manual_seed(0)
    model = mod.Qwen3_5ForConditionalGeneration(cfg).double().eval()
    model.load_state_dict({k: v.double() for k, v in sd.items()}, strict=True)
    for n, t in list(model.named_parameters()) + list(model.named_buffers()):
        assert t.dtype == torch.float64, (n, t.dtype)
    assert type(model.model.visual).__module__ == mod.__name__
    assert type(model.model.language_model).__module__ == mod.__name__

    def out64(m, i, o):
        for t in (o if isinstance(o, (tuple, list)) else (o,)):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                assert t.dtype == torch.float64, (type(m).__name__, t.dtype)

    for m in model.modules():
        if m is not model.model.visual.rotary_pos_emb:  # returns fp64 cos/sin anyway
            m.register_forward_hook(out64)
    model.d3_calls = mod.d3_calls
    return model


# --------------------------------------------------------------------------- images


def make_rgb(width: int, height: int, seed: int) -> np.ndarray:
    """Smooth-ish deterministic content: low-frequency waves, a soft blob, two hard shapes."""
    rng = np.random.Generator(np.random.PCG64(seed))
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    u, v = x / max(width - 1, 1), y / max(height - 1, 1)
    img = np.zeros((height, width, 3))
    for c in range(3):
        acc = 128.0 + 20.0 * (c - 1)
        for _ in range(3):
            fx, fy = rng.uniform(0.3, 3.0, 2)
            acc = acc + rng.uniform(20, 45) * np.cos(2 * np.pi * (fx * u + fy * v) + rng.uniform(0, 6.3))
        img[..., c] = acc
    cx, cy, r = rng.uniform(0.25, 0.75), rng.uniform(0.25, 0.75), rng.uniform(0.1, 0.3)
    d2 = ((u - cx) * width) ** 2 + ((v - cy) * height) ** 2
    rad = r * min(width, height)
    img += np.exp(-d2 / (2 * rad ** 2))[..., None] * rng.uniform(-60, 60, 3)
    # a hard-edged disk and rectangle (exercise the antialiased resize)
    cx, cy = rng.uniform(0.2, 0.8), rng.uniform(0.2, 0.8)
    disk = ((u - cx) * width) ** 2 + ((v - cy) * height) ** 2 < (0.15 * min(width, height)) ** 2
    img[disk] = rng.uniform(0, 255, 3)
    x0, x1 = sorted(rng.uniform(0.05, 0.95, 2))
    y0, y1 = sorted(rng.uniform(0.05, 0.95, 2))
    rect = (u >= x0) & (u <= x1) & (v >= y0) & (v <= y0 + 0.5 * (y1 - y0))
    img[rect] = 0.6 * img[rect] + 0.4 * rng.uniform(0, 255, 3)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


IMAGE_CASES = [
    # name, width, height, format, save kwargs
    ("png_64x48", 64, 48, "PNG", {"compress_level": 9}),
    ("jpeg_300x200", 300, 200, "JPEG", {"quality": 90}),
    ("webp_200x300", 200, 300, "WEBP", {"quality": 80, "method": 4}),
    ("png_900x96", 900, 96, "PNG", {"compress_level": 9}),
    ("jpeg_1400x1300", 1400, 1300, "JPEG", {"quality": 85}),
]
LARGE = "jpeg_1400x1300"  # no resized_u8 (budget)
DECODED = {"jpeg_300x200"}  # store the decode before resizing
EXT = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp"}
MEDIA = {"PNG": "png", "JPEG": "jpeg", "WEBP": "webp"}


def encode_image(name, width, height, fmt, kw, seed) -> bytes:
    from PIL import Image
    im = Image.fromarray(make_rgb(width, height, seed), "RGB")
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()




def decode_rgb(payload: bytes):
    from PIL import Image
    with Image.open(io.BytesIO(payload)) as image:
        assert image.format in ("PNG", "JPEG", "WEBP"), image.format
        image.verify()
    with Image.open(io.BytesIO(payload)) as image:
        return image.convert("RGB")


def uint8_resize(torch, image, height, width):
    """The runtime's _resize (torchvision resize_image for a CPU uint8 batch)."""
    import torch.nn.functional as F
    shape = image.shape
    numel = image.numel()
    channels, old_h, old_w = shape[-3:]
    if (height, width) == (old_h, old_w):
        return image
    image = image.reshape(-1, channels, old_h, old_w)
    strides = image.stride()
    if image.is_contiguous(memory_format=torch.channels_last) and image.shape[0] == 1 \
            and numel != strides[0]:
        restrided = list(strides)
        restrided[0] = numel
        image = image.as_strided((1, channels, old_h, old_w), restrided)
    image = F.interpolate(image, size=[height, width], mode="bicubic", align_corners=False,
                          antialias=True)
    return image.reshape((*shape[:-3], channels, height, width))


def preprocess(torch, rgb):
    """Returns dict(decoded [H0,W0,3] u8, resized [1,3,H,W] u8, pixel_values [N,1536] f32,
    grid (1, gh, gw), tokens, float_diff)."""
    import torch.nn.functional as F
    arr = np.array(rgb, copy=True)
    pixels = torch.as_tensor(arr).view(rgb.size[1], rgb.size[0], 3).permute(2, 0, 1)
    stacked = torch.stack([pixels])
    _, _, old_h, old_w = stacked.shape
    height, width = PG.smart_resize(old_h, old_w, PATCH * MERGE, MIN_PIXELS, MAX_PIXELS)
    resized = uint8_resize(torch, stacked, height, width)
    assert resized.dtype == torch.uint8
    # informative: the float path of the same resize
    fl = F.interpolate(stacked.float(), size=[height, width], mode="bicubic",
                       align_corners=False, antialias=True).round().clamp(0, 255)
    float_diff = int((fl - resized.float()).abs().max())
    mean = torch.tensor(IMAGE_MEAN) * (1.0 / RESCALE)
    std = torch.tensor(IMAGE_STD) * (1.0 / RESCALE)
    assert mean.dtype == torch.float32
    normalized = resized.to(dtype=torch.float32).sub(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))
    batch, channel = normalized.shape[:2]
    gh, gw = height // PATCH, width // PATCH
    patches = normalized.reshape(batch, channel, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE,
                                 PATCH).permute(0, 2, 5, 3, 6, 1, 4, 7)
    rows = patches.unsqueeze(6).expand(-1, -1, -1, -1, -1, -1, TEMPORAL, -1, -1).reshape(
        batch, gh * gw, channel * TEMPORAL * PATCH * PATCH)
    return {"decoded": arr, "resized": resized, "pixel_values": rows[0].contiguous(),
            "grid": (1, gh, gw), "tokens": gh * gw // MERGE ** 2, "float_diff": float_diff,
            "mean255": mean, "std255": std, "normalized": normalized}


def check_patch_layout(pre):
    """The documented closed form of the patch rows (independent of the reshapes above)."""
    import torch
    norm = pre["normalized"][0]
    _, gh, gw = pre["grid"]
    pv = pre["pixel_values"]
    rng = np.random.Generator(np.random.PCG64(7))
    for idx in list(rng.integers(0, gh * gw, 12)) + [0, gh * gw - 1]:
        idx = int(idx)
        iw, ih = idx % 2, (idx // 2) % 2
        blk = idx // 4
        bw, bh = blk % (gw // 2), blk // (gw // 2)
        pr, pc = 2 * bh + ih, 2 * bw + iw
        tile = norm[:, 16 * pr:16 * pr + 16, 16 * pc:16 * pc + 16]  # [3, 16, 16]
        want = torch.stack([tile, tile], dim=1).reshape(-1)
        assert torch.equal(pv[idx], want), idx


def pixel_row_indices(n: int, k: int) -> list[int]:
    s = {0, 1, 2, 3, n - 1}
    s |= {int(round(i * (n - 1) / (k - 4))) for i in range(1, k - 4)}
    return sorted(s)


# --------------------------------------------------------------------------- tower runs


def run_tower(torch, model, pixel_values, grids):
    """(merged [tokens, 64], blocks_out [patches, 32], embed [patches, 32])."""
    visual = model.model.visual
    cap = {}
    h = visual.blocks[0].register_forward_pre_hook(
        lambda m, a: cap.__setitem__("embed", a[0].detach().clone()))
    try:
        with torch.no_grad():
            out = model.model.get_image_features(
                pixel_values, torch.tensor(grids, dtype=torch.long), return_dict=True)
    finally:
        h.remove()
    merged = torch.cat(out.pooler_output, dim=0)
    assert merged.shape == (sum(t * gh * gw // 4 for t, gh, gw in grids), HIDDEN)
    assert out.last_hidden_state.shape == (pixel_values.shape[0], VISION_CONFIG["hidden_size"])
    return merged, out.last_hidden_state, cap["embed"]


def load_upstream_vision(torch, path: Path):
    """The runtime's qwen3_5_vision.py with its two package imports stubbed."""
    import torch.nn.functional as F
    src = path.read_text(encoding="utf-8")
    for imp in ("from ....accel.kernels import KernelSet\n", "from .common import rotate_half\n"):
        assert imp in src, imp
        src = src.replace(imp, "")
    mod = types.ModuleType("d3_upstream_qwen3_5_vision")

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    class KernelSet:
        def __call__(self, name):
            assert name == "sdpa"
            return F.scaled_dot_product_attention

    mod.__dict__.update(rotate_half=rotate_half, KernelSet=KernelSet)
    exec(compile(src, str(path), "exec"), mod.__dict__)
    return mod, KernelSet()


# --------------------------------------------------------------------------- outputs


class Gold:
    def __init__(self, root: Path):
        self.root = root
        self.arrays = []
        self.names = set()

    def add(self, name: str, arr, dtype: str) -> str:
        assert name not in self.names, name
        self.names.add(name)
        np_dtype = {"f32": "<f4", "i32": "<i4", "u8": "u1"}[dtype]
        a = np.ascontiguousarray(np.asarray(arr), dtype=np_dtype)
        if dtype == "i32":
            assert np.array_equal(a, np.asarray(arr)), name
        f = f"{name}.bin"
        (self.root / f).write_bytes(a.tobytes())
        self.arrays.append({"name": name, "dtype": dtype, "shape": list(a.shape), "file": f})
        return name


def write_package(torch, cfg, sd) -> dict:
    from safetensors.torch import save_file

    for f in ("readout.safetensors", "tokenizer.json", "tokenizer_config.json",
              "chat_template.jinja", "decision_config.json"):
        if not (UPSTREAM_PKG / f).is_file():
            raise SystemExit(f"{UPSTREAM_PKG / f} missing: run tests/tools/gen_tower_golden.py")
    tok = json.loads((UPSTREAM_PKG / "tokenizer.json").read_text(encoding="utf-8"))
    added = {a["content"]: a["id"] for a in tok["added_tokens"]}
    ids = TG.mini_special_ids()
    assert ids == {"image_token_id": added["<|image_pad|>"],
                   "video_token_id": added["<|video_pad|>"],
                   "vision_start_token_id": added["<|vision_start|>"],
                   "vision_end_token_id": added["<|vision_end|>"]}, ids

    if PKG_OUT.exists():
        shutil.rmtree(PKG_OUT)
    PKG_OUT.mkdir(parents=True)
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in sd.items()
               if k.startswith((TEXT_PREFIX, VIS_PREFIX))}
    assert len(tensors) == len(sd) - 1  # all but lm_head
    save_file(tensors, str(PKG_OUT / "model.safetensors"), metadata={"format": "pt"})
    (PKG_OUT / "model.safetensors").chmod(0o644)
    for f in ("readout.safetensors", "tokenizer.json", "tokenizer_config.json",
              "chat_template.jinja"):
        shutil.copyfile(UPSTREAM_PKG / f, PKG_OUT / f)

    with tempfile.TemporaryDirectory() as td:
        cfg.save_pretrained(td)
        conf = json.loads((Path(td) / "config.json").read_text(encoding="utf-8"))
    conf["dtype"] = "bfloat16"
    conf["architectures"] = ["Qwen3_5ForConditionalGeneration"]
    tc = conf["text_config"]
    for k, v in text_config_kwargs().items():
        tc.setdefault(k, v)
    tc["model_type"] = "qwen3_5_text"
    tc["rope_parameters"] = text_config_kwargs()["rope_parameters"]
    vc = conf["vision_config"]
    for k, v in VISION_CONFIG.items():
        vc.setdefault(k, v)
    vc["model_type"] = "qwen3_5_vision"
    assert "deepstack_visual_indexes" not in vc
    for k, v in ids.items():
        assert conf[k] == v, (k, conf.get(k))
    (PKG_OUT / "config.json").write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n",
                                         encoding="utf-8")

    pre = {
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "processor_class": "Qwen3VLProcessor",
        "do_convert_rgb": True, "do_resize": True, "do_rescale": True, "do_normalize": True,
        "resample": 3, "rescale_factor": RESCALE,
        "image_mean": IMAGE_MEAN, "image_std": IMAGE_STD,
        "patch_size": PATCH, "temporal_patch_size": TEMPORAL, "merge_size": MERGE,
        "size": {"shortest_edge": MIN_PIXELS, "longest_edge": 16777216},
    }
    (PKG_OUT / "preprocessor_config.json").write_text(json.dumps(pre, indent=2) + "\n",
                                                      encoding="utf-8")

    dc = json.loads((UPSTREAM_PKG / "decision_config.json").read_text(encoding="utf-8"))
    dc["base_model"] = "d3stream/tiny-vl"
    (PKG_OUT / "decision_config.json").write_text(json.dumps(dc, indent=2) + "\n",
                                                  encoding="utf-8")
    (PKG_OUT / "README.md").write_text(
        "# tiny-vl (test fixture)\n\n"
        "Generated by `tests/tools/gen_vision_golden.py`; do not edit by hand (the hashes in\n"
        "MODEL_MANIFEST.json cover every file here).\n\n"
        "A tiny random Qwen3.5 VL model: the tiny-upstream text tower shape (hidden 64, 6 layers,\n"
        "vocab 4048) with partial rotary 0.5 and mrope_section [2, 1, 1], plus a 2-block vision\n"
        "tower (hidden 32, out 64, 8x8 position table), BF16, in the upstream package layout\n"
        "(SPEC e), with goldens in `tests/golden/vision/`. Tokenizer, readout and the\n"
        "placeholder chat_template.jinja are tiny-upstream's (the template's SHA-256 is NOT one\n"
        "of SPEC e.5's pinned templates; a strict loader refuses it unless the test relaxes\n"
        "that check).\n", encoding="utf-8")

    files = sorted(p.name for p in PKG_OUT.iterdir() if p.is_file())
    files_sha = {f: TG.sha256_file(PKG_OUT / f) for f in files}
    files_bytes = {f: (PKG_OUT / f).stat().st_size for f in files}
    ident_files = {f: files_sha[f] for f in files
                   if f.endswith(".safetensors") or f in ("tokenizer.json", "tokenizer_config.json",
                                                          "chat_template.jinja")}
    decision_keys = ["format_version", "format_id", "prompt", "base_model", "revision", "codes",
                     "token_ids", "temperature", "attention_mode", "pooling", "max_length",
                     "readout_dtype"]
    D = {k: dc[k] for k in decision_keys if k in dc}
    model_sha = hashlib.sha256(json.dumps({"files": ident_files, "decision": D}, sort_keys=True,
                                          separators=(",", ":")).encode("utf-8")).hexdigest()
    n_text = sum(int(v.numel()) for k, v in tensors.items() if k.startswith(TEXT_PREFIX))
    n_vis = sum(int(v.numel()) for k, v in tensors.items() if k.startswith(VIS_PREFIX))
    n_readout = N_CODES * HIDDEN
    manifest = {
        "schema": "d3-package-manifest/1",
        "model_name": "tiny-vl",
        "format_id": "d3-code-readout-v1",
        "prompt": "d3",
        "attention_mode": dc["attention_mode"],
        "max_input_tokens": TG.MAX_POS,
        "licence": {"spdx": "Apache-2.0",
                    "components": [{"component": "tiny-vl test weights",
                                    "licence": "Apache-2.0"}]},
        "parameters": {"text": n_text, "vision": n_vis, "readout": n_readout,
                       "loaded": n_text + n_vis + n_readout},
        "identity": {"model_sha256": model_sha, "files_sha256": ident_files, "decision": D},
        "files_sha256": files_sha,
        "files_bytes": files_bytes,
    }
    (PKG_OUT / "MODEL_MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n",
                                                 encoding="utf-8")
    return {"n_text": n_text, "n_vis": n_vis, "model_sha256": model_sha,
            "codes": dc["codes"], "dc": dc}


def rel(a, b) -> float:
    return TG.rel_err(np.asarray(a, np.float64), np.asarray(b, np.float64))


# --------------------------------------------------------------------------- full model


REQUESTS = [
    ("one_image", ["png_64x48"], {
        "state": "A customer sent this photo of the delivered item.",
        "questions": {
            "colour": {"type": "choice", "instructions": "Which colour dominates the image?",
                       "criteria": {"red": "Mostly red or orange", "green": "Mostly green",
                                    "blue": None}},
            "damaged": {"type": "noul", "instructions": "Does the item look damaged?"}}}),
    ("two_images", ["jpeg_300x200", "webp_200x300"], {
        "state": {"ticket": 4512, "note": "Before and after pictures attached."},
        "questions": {
            "same": {"type": "noul", "instructions": "Do the two images show the same object?",
                     "criteria": {"false": "Different objects", "true": "The same object"}},
            "route": {"type": "choice", "instructions": "Which team should look at this?",
                      "criteria": {"returns": "Refunds and replacements", "billing": "Payments",
                                   "general": None}}}}),
    ("wide_image", ["png_900x96"], {
        "state": "Banner image for the storefront.",
        "questions": {
            "style": {"type": "choice", "instructions": "What best describes the banner?",
                      "criteria": {"plain": "Plain colours", "pattern": "A repeating pattern",
                                   "photo": "A photograph"}}}}),
    ("large_image", [LARGE], {
        "state": "Scanned page of a delivery note.",
        "questions": {
            "signed": {"type": "noul", "instructions": "Is the delivery note signed?"}}}),
]


def data_url(fmt: str, payload: bytes) -> str:
    return f"data:image/{MEDIA[fmt]};base64," + base64.b64encode(payload).decode("ascii")


def run_full(torch, model, ids, pixel_values, grids, mode, dtype, cfg):
    """(final [T, H], positions [3, T]) with the positions captured at the text rotary input."""
    T = len(ids)
    x = torch.tensor([ids], dtype=torch.long)
    mm = (x == cfg.image_token_id).to(torch.int32)
    grid = torch.tensor(grids, dtype=torch.long)
    cap = []
    h = model.model.language_model.rotary_emb.register_forward_pre_hook(
        lambda m, a: cap.append(a[1].detach().clone()))
    try:
        with torch.no_grad():
            if mode == "causal":
                out = model.model(input_ids=x, attention_mask=torch.ones(1, T, dtype=torch.long),
                                  pixel_values=pixel_values, image_grid_thw=grid,
                                  mm_token_type_ids=mm, use_cache=False)
            else:
                pos, _ = model.model.get_rope_index(x, mm_token_type_ids=mm, image_grid_thw=grid)
                full = torch.zeros(1, 1, T, T, dtype=dtype)
                out = model.model(input_ids=x, position_ids=pos,
                                  attention_mask={"full_attention": full,
                                                  "linear_attention": None},
                                  pixel_values=pixel_values, image_grid_thw=grid,
                                  mm_token_type_ids=mm, use_cache=False)
    finally:
        h.remove()
    assert len(cap) == 1 and cap[0].shape == (3, 1, T), [c.shape for c in cap]
    assert out.last_hidden_state.dtype == dtype
    return out.last_hidden_state[0], cap[0][:, 0, :]


def expected_positions(ids, image_token_id, grids):
    """get_rope_index written out (see the docstring), for an independent check."""
    pos = np.zeros((3, len(ids)), dtype=np.int64)
    p, i, k = 0, 0, 0
    while i < len(ids):
        if ids[i] != image_token_id:
            pos[:, i] = p
            p += 1
            i += 1
            continue
        _, gh, gw = grids[k]
        k += 1
        mh, mw = gh // MERGE, gw // MERGE
        for r in range(mh):
            for c in range(mw):
                pos[:, i] = (p, p + r, p + c)
                i += 1
        p += max(gh, gw) // MERGE
    assert k == len(grids)
    return pos


def main() -> int:
    ap = argparse.ArgumentParser(description="Regenerate tests/fixtures/tiny-vl/ and "
                                 "tests/golden/vision/ (Qwen3.5 vision goldens, HF fp32).")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--upstream-vision", type=Path,
                    help="a local copy of vllm_srun engines/native/models/qwen3_5_vision.py "
                         "to cross-check against transformers")
    args = ap.parse_args()

    import PIL
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"pillow {PIL.__version__}, cpu {torch.backends.cpu.get_cpu_capability()}", flush=True)

    cfg, model, sd = build_model(torch)
    info = write_package(torch, cfg, sd)
    print(f"package: text {info['n_text']}, vision {info['n_vis']} params, "
          f"model_sha256 {info['model_sha256']}", flush=True)
    model64 = build_model64(torch, cfg, sd)

    if GOLD_OUT.exists():
        shutil.rmtree(GOLD_OUT)
    (GOLD_OUT / "images").mkdir(parents=True)
    gold = Gold(GOLD_OUT)

    upstream = None
    if args.upstream_vision:
        umod, kernels = load_upstream_vision(torch, args.upstream_vision)
        vcfg = json.loads((PKG_OUT / "config.json").read_text(encoding="utf-8"))["vision_config"]
        upstream = umod.Qwen3_5VisionBackbone(vcfg).eval()
        vis_sd = {k[len(VIS_PREFIX):]: v for k, v in sd.items() if k.startswith(VIS_PREFIX)}
        upstream.load_state_dict(vis_sd, strict=True)
        upstream.kernels = kernels

    # ---- image cases
    images, pre_by_name, up_report = [], {}, {}
    for i, (name, w, h, fmt, kw) in enumerate(IMAGE_CASES):
        payload = encode_image(name, w, h, fmt, kw, IMG_SEED + i)
        fname = f"images/{name}.{EXT[fmt]}"
        (GOLD_OUT / fname).write_bytes(payload)
        rgb = decode_rgb(payload)
        assert rgb.size == (w, h)
        pre = preprocess(torch, rgb)
        check_patch_layout(pre)
        pre["payload"], pre["fmt"] = payload, fmt
        pre_by_name[name] = pre
        pv, grid = pre["pixel_values"], pre["grid"]
        merged, blocks, embed = run_tower(torch, model, pv, [grid])
        merged64, blocks64, embed64 = run_tower(torch, model64, pv.double(), [grid])
        n = pv.shape[0]
        rows = pixel_row_indices(n, 12 if name == LARGE else 8)
        errs = {"tower": rel(merged.numpy(), merged64.numpy()),
                "blocks_rows": rel(blocks[rows].numpy(), blocks64[rows].numpy()),
                "embed_rows": rel(embed[rows].numpy(), embed64[rows].numpy())}
        for k, e in errs.items():
            assert e <= TOWER_REL, f"{name}: fp32 {k} {e:.3g} from fp64"
        arrays = {}
        if name in DECODED:
            arrays["decoded_u8"] = gold.add(f"{name}.decoded_u8", pre["decoded"], "u8")
        if name != LARGE:
            arrays["resized_u8"] = gold.add(f"{name}.resized_u8",
                                            pre["resized"][0].permute(1, 2, 0).numpy(), "u8")
        arrays["pixel_rows"] = gold.add(f"{name}.pixel_rows", pv[rows].numpy(), "f32")
        arrays["embed_rows"] = gold.add(f"{name}.embed_rows", embed[rows].numpy(), "f32")
        arrays["blocks_rows"] = gold.add(f"{name}.blocks_rows", blocks[rows].numpy(), "f32")
        arrays["tower"] = gold.add(f"{name}.tower", merged.numpy(), "f32")
        H, W = pre["resized"].shape[-2:]
        entry = {"name": name, "file": fname, "format": fmt,
                 "sha256": hashlib.sha256(payload).hexdigest(), "bytes": len(payload),
                 "source_size": [h, w], "resized": [int(H), int(W)], "grid": list(grid),
                 "tokens": pre["tokens"], "pixel_rows": rows, "arrays": arrays,
                 "fp32_vs_fp64": {k: float(f"{v:.3g}") for k, v in errs.items()},
                 "resize_float_path_max_abs_diff": pre["float_diff"],
                 "tower_abs_max": round(float(merged.abs().max()), 4)}
        if upstream is not None:
            with torch.no_grad():
                um = upstream(pv, [grid])
            d = {"max_abs": float((um - merged).abs().max()),
                 "rel_vs_hf": rel(um.numpy(), merged.numpy()),
                 "rel_vs_fp64": rel(um.numpy(), merged64.numpy())}
            up_report[name] = d  # printed only: index.json does not depend on the option
            assert d["rel_vs_hf"] <= TOWER_REL, (name, d)
        images.append(entry)
        print(f"  {name:16s} {fmt:4s} {len(payload):7d} B  {h}x{w} -> {H}x{W} grid {grid} "
              f"tokens {pre['tokens']:5d} |tower|max {float(merged.abs().max()):.3f} "
              f"fp32-fp64 tower {errs['tower']:.2e} rows {errs['blocks_rows']:.2e} "
              f"float-resize diff {pre['float_diff']}"
              + (f" upstream-hf {up_report[name]['rel_vs_hf']:.2e}" if upstream else ""),
              flush=True)
    assert images[0]["tokens"] == 70 and images[0]["resized"] == [224, 320]
    big = next(e for e in images if e["name"] == LARGE)
    assert big["resized"][0] * big["resized"][1] <= MAX_PIXELS
    assert round(1300 / 32) * 32 * round(1400 / 32) * 32 > MAX_PIXELS  # really downscaled

    # two images in one tower call == each alone (attention stays within each image)
    a, b = pre_by_name["jpeg_300x200"], pre_by_name["webp_200x300"]
    both, _, _ = run_tower(torch, model, torch.cat([a["pixel_values"], b["pixel_values"]]),
                           [a["grid"], b["grid"]])
    sep = torch.cat([run_tower(torch, model, p["pixel_values"], [p["grid"]])[0] for p in (a, b)])
    assert float((both - sep).abs().max()) < 1e-5
    # eager == sdpa for the tower
    model.config.vision_config._attn_implementation = "sdpa"
    try:
        sd_out, _, _ = run_tower(torch, model, a["pixel_values"], [a["grid"]])
    finally:
        model.config.vision_config._attn_implementation = "eager"
    eg_out, _, _ = run_tower(torch, model, a["pixel_values"], [a["grid"]])
    assert float((sd_out - eg_out).abs().max()) < 1e-5
    print("checks: patch layout closed form; two-image call == separate calls; eager == sdpa",
          flush=True)

    # ---- full-model records
    pkg = PG.Package("tiny-vl", PKG_OUT, info["dc"])
    readout_path = PKG_OUT / "readout.safetensors"
    from safetensors.torch import load_file
    W = load_file(str(readout_path))["weight"].to(torch.float32)
    assert W.shape == (N_CODES, HIDDEN)
    W64 = W.double()
    img_id = cfg.image_token_id
    requests, records = [], []
    worst = {"rel": 0.0, "prob": 0.0}
    for rname, img_names, body in REQUESTS:
        req = dict(body)
        req["images"] = [data_url(pre_by_name[n]["fmt"], pre_by_name[n]["payload"])
                         for n in img_names]
        req = {"state": req["state"], "images": req["images"], "questions": req["questions"]}
        requests.append({"name": rname, "request": req, "images": img_names})
        grids = [list(pre_by_name[n]["grid"]) for n in img_names]
        toks = [pre_by_name[n]["tokens"] for n in img_names]
        pv = torch.cat([pre_by_name[n]["pixel_values"] for n in img_names])
        for qid, q in req["questions"].items():
            instructions, options = PG.question_options(q)
            text = PG.render(PG.user_text(req["state"], instructions, options, info["codes"]),
                             len(img_names))
            ids0 = pkg.encode(text)
            assert ids0.count(img_id) == len(img_names)
            ids, spans, k = [], [], 0
            for t in ids0:
                if t == img_id:
                    spans.append([len(ids), toks[k]])
                    ids += [img_id] * toks[k]
                    k += 1
                else:
                    ids.append(t)
            assert spans[-1][0] + spans[-1][1] < len(ids) - 10  # text after the images
            n_opt = len(options)
            finals = {}
            for mode in ("causal", "noncausal"):
                fin, pos = run_full(torch, model, ids, pv, grids, mode, torch.float32, cfg)
                calls0 = dict(model64.d3_calls)
                fin64, pos64 = run_full(torch, model64, ids, pv.double(), grids, mode,
                                        torch.float64, cfg)
                assert model64.d3_calls["delta"] - calls0["delta"] == 4
                assert torch.equal(pos, pos64)
                assert np.array_equal(pos.numpy(), expected_positions(ids, img_id, grids))
                final_last = fin[-1]
                logits = final_last @ W.T
                l32 = logits.double().numpy()
                probs = TG.readout_probs(l32, n_opt)
                logits64 = (fin64[-1] @ W64.T).numpy()
                probs64 = TG.readout_probs(logits64, n_opt)
                errs = {"final_last": rel(final_last.numpy(), fin64[-1].numpy()),
                        "logits": rel(l32, logits64),
                        "probs": float(np.abs(probs - probs64).max())}
                rec = f"{rname}.{qid}.{mode}"
                for key in ("final_last", "logits"):
                    assert errs[key] <= RECORD_REL, f"{rec}: fp32 {key} {errs[key]:.3g}"
                    worst["rel"] = max(worst["rel"], errs[key])
                assert errs["probs"] <= RECORD_PROB, f"{rec}: fp32 probs {errs['probs']:.3g}"
                worst["prob"] = max(worst["prob"], errs["probs"])
                finals[mode] = final_last
                arrays = {
                    "input_ids": gold.add(f"{rec}.input_ids", np.asarray(ids), "i32"),
                    "positions": gold.add(f"{rec}.positions", pos.numpy(), "i32"),
                    "final_last": gold.add(f"{rec}.final_last", final_last.numpy(), "f32"),
                    "logits": gold.add(f"{rec}.logits", logits.numpy(), "f32"),
                    "probs": gold.add(f"{rec}.probs", probs, "f32"),
                }
                records.append({"name": rec, "request": rname, "question": qid, "mode": mode,
                                "type": q["type"], "n_options": n_opt, "prompt": text,
                                "n_tokens": len(ids), "image_token_spans": spans,
                                "arrays": arrays, "probs_f64": [float(p) for p in probs],
                                "fp32_vs_fp64": {k: float(f"{v:.3g}") for k, v in errs.items()}})
                print(f"  {rec:32s} T={len(ids):4d} probs={np.round(probs, 4).tolist()} "
                      f"fp32-fp64 final {errs['final_last']:.2e} probs {errs['probs']:.1e}",
                      flush=True)
            d = float((finals["causal"] - finals["noncausal"]).abs().max())
            assert d > 1e-3, f"{rname}.{qid}: modes agree ({d})"
    # the inputs the records are meant to test all matter: the image content, and each of the
    # t, h and w position axes of the image tokens (mrope_section [2, 1, 1])
    rname, img_names, body = REQUESTS[0]
    qid, q = next(iter(body["questions"].items()))
    instructions, options = PG.question_options(q)
    text = PG.render(PG.user_text(body["state"], instructions, options, info["codes"]), 1)
    ids0 = pkg.encode(text)
    at = ids0.index(img_id)
    ids = ids0[:at] + [img_id] * pre_by_name[img_names[0]]["tokens"] + ids0[at + 1:]
    grids = [list(pre_by_name[img_names[0]]["grid"])]
    other = pre_by_name["jpeg_300x200"]
    assert list(other["grid"]) == grids[0]
    x = torch.tensor([ids])
    mm = (x == img_id).to(torch.int32)
    pos, _ = model.model.get_rope_index(x, mm_token_type_ids=mm,
                                        image_grid_thw=torch.tensor(grids))

    def last(pv, p):
        with torch.no_grad():
            return model.model(input_ids=x, position_ids=p, attention_mask=torch.ones_like(x),
                               pixel_values=pv, image_grid_thw=torch.tensor(grids),
                               mm_token_type_ids=mm, use_cache=False).last_hidden_state[0, -1]

    base = last(pre_by_name[img_names[0]]["pixel_values"], pos)
    d_img = float((last(other["pixel_values"], pos) - base).abs().max())
    d_axis = []
    for axis in range(3):
        p2 = pos.clone()
        img_cols = (mm[0] == 1)
        p2[axis, 0, img_cols] += 1 + torch.arange(int(img_cols.sum())) % 3
        d_axis.append(float((last(pre_by_name[img_names[0]]["pixel_values"], p2) - base)
                            .abs().max()))
    assert d_img > 1e-3 and min(d_axis) > 1e-4, (d_img, d_axis)
    print(f"checks: final hidden moves by {d_img:.3g} with another image, by "
          f"{[float(f'{d:.3g}') for d in d_axis]} when the t / h / w image positions move",
          flush=True)
    print(f"checks: records fp32 vs fp64 worst relative {worst['rel']:.2e}, probability "
          f"{worst['prob']:.2e}; positions == get_rope_index closed form", flush=True)

    (GOLD_OUT / "index.json").write_text(json.dumps({
        "format": "d3-vision-golden/1, see tests/tools/gen_vision_golden.py",
        "package": str(PKG_OUT.relative_to(REPO)),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "pillow": PIL.__version__, "numpy": np.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "preprocess": {"patch_size": PATCH, "temporal_patch_size": TEMPORAL, "merge_size": MERGE,
                       "min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS,
                       "image_mean": IMAGE_MEAN, "image_std": IMAGE_STD,
                       "mean255_f32": [float(v) for v in pre_by_name[LARGE]["mean255"]],
                       "std255_f32": [float(v) for v in pre_by_name[LARGE]["std255"]]},
        "arrays": gold.arrays, "images": images, "requests": requests,
        "records": records}, indent=1) + "\n", encoding="utf-8")

    total = sum(p.stat().st_size for p in GOLD_OUT.rglob("*") if p.is_file())
    pkg_size = sum(p.stat().st_size for p in PKG_OUT.iterdir())
    print(f"golden {total} bytes in {len(gold.arrays)} arrays + {len(images)} images; "
          f"package {pkg_size} bytes")
    assert total <= BUDGET, total
    return 0


if __name__ == "__main__":
    sys.exit(main())
