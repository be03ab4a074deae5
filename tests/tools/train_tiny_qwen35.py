#!/usr/bin/env python3
"""Trains a small Qwen3.5 text model on the King James Bible and writes it as an upstream
package: tests/fixtures/trained-tiny/ (SPEC e), the fixture of tests/test_accuracy.c.

One command regenerates it (deterministic: fixed seeds, one torch thread, a fixed number of
steps; the numbers depend only on torch's fp32 CPU kernels):

    apt-get install -y bible-kjv-text        # the text (and bible-kjv, its reader)
    /work/torchvenv/bin/python tests/tools/train_tiny_qwen35.py

Needs: the `bible` program of Debian's bible-kjv package with the bible-kjv-text data
(`bible -f Gen1:1-Rev22:21` prints every verse as "<ref> <text>"), torch (CPU), transformers
with models/qwen3_5 (written against 5.24.0), tokenizers, safetensors, numpy.

Text: the King James Version (Authorized Version, 1611) as Debian's bible-kjv-text ships it
(31,102 verses). The text is in the public domain (outside the United Kingdom, where the
Crown's letters patent still restrict printing it); the package's copyright file says "The
copyright for the King James Version text of the Bible is expired".

Model (the layout of tests/fixtures/tiny-upstream, larger): Qwen3_5ForCausalLM, vocab 4048
(= tests/fixtures/qwen35-mini/tokenizer.json), hidden 160, 6 layers [lin, lin, lin, full, lin,
full], full attention 4 q heads / 2 kv heads, head_dim 48, output gate, partial rotary 0.25,
Gated DeltaNet 2 key heads / 4 value heads, head dims 48, conv kernel 4, MLP 320, untied
lm_head. HF's default init (torch seed), AdamW, next-token loss on 256-token windows of the
training chapters.

Split: chapter k (0..1188 in canonical order) is held out when k % 20 == 10 (59 chapters,
about 5% of the text); training samples random windows of the other chapters' token stream
(chapters tokenized one by one, joined by <|endoftext|>). The held-out loss is the mean
next-token NLL (nats) over the held-out stream in 256-token windows, with the fp32 weights
and with the BF16-rounded ones the package holds; the baseline is the unigram model of the
training tokens (add-0.5 smoothing) on the same held-out targets.

Package (as tests/tools/gen_tower_golden.py writes tiny-upstream): model.safetensors (BF16,
"model.language_model.*", no lm_head, no vision tower), config.json, readout.safetensors
(`weight` [255, 160] float32), decision_config.json (the codes and token ids of qwen35-mini,
attention_mode causal: the model was trained causally), tokenizer.json and
tokenizer_config.json (copied from qwen35-mini), chat_template.jinja (a placeholder, NOT one of
SPEC e.5's pinned templates: see README), README.md, MODEL_MANIFEST.json (SPEC e.3/e.4), and
prompts.json: 200 held-out passages (whole consecutive verses of held-out chapters, 40..300
tokens each) with their token ids.

Readout row i = lm_head row of token_ids[i] (the token of answer code i), in fp32: the
readout's logits are the language model's own next-token logits of the code tokens, so its
option probabilities are the LM's next-token distribution restricted to the first n codes
(checked below against the HF model run on the package's BF16 weights).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never look for hub kernels
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_tower_golden as pkgw  # noqa: E402  the tiny-upstream package writer's pieces
MINI = REPO / "tests" / "fixtures" / "qwen35-mini"
PKG_OUT = REPO / "tests" / "fixtures" / "trained-tiny"

SEED = 20261205
VOCAB = 4048
HIDDEN = 160
INTER = 320
LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention",
               "linear_attention", "full_attention"]
MAX_POS = 8192
N_CODES = 255
TEXT_PREFIX = "model.language_model."
SEQ = 256
HOLDOUT_MOD, HOLDOUT_REM = 20, 10
N_PROMPTS = 200
PROMPT_MIN, PROMPT_MAX = 40, 300
MAX_FIXTURE_BYTES = 20_000_000
MAX_FILE_BYTES = 5_000_000  # the repository keeps each committed file under 5 MB


def text_config_kwargs() -> dict:
    """tiny-upstream's text_config at this model's shape."""
    rope = dict(pkgw.text_config_kwargs()["rope_parameters"], mrope_section=[2, 2, 2])
    return pkgw.text_config_kwargs(hidden_size=HIDDEN, intermediate_size=INTER, head_dim=48,
                                   linear_key_head_dim=48, linear_value_head_dim=48,
                                   max_position_embeddings=MAX_POS, rope_parameters=rope)


# ------------------------------------------------------------------------------------ text

REF = re.compile(r"^(\S+?)(\d+):(\d+) (.*)$")


def kjv_chapters() -> list[dict]:
    """Every chapter in canonical order: {"ref": "Ge1", "verses": [text, ...]}."""
    try:
        out = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True, capture_output=True,
                             cwd=tempfile.gettempdir()).stdout.decode("utf-8")
    except FileNotFoundError:
        raise SystemExit("no `bible` program: apt-get install -y bible-kjv-text (needs bible-kjv)")
    chapters: list[dict] = []
    n = 0
    for line in out.splitlines():
        if not line.strip():
            continue
        m = REF.match(line)
        assert m, f"unexpected line {line[:60]!r}"
        key = f"{m.group(1)}{m.group(2)}"
        if not chapters or chapters[-1]["ref"] != key:
            chapters.append({"ref": key, "verses": []})
        chapters[-1]["verses"].append(" ".join(m.group(4).split()))
        n += 1
    assert n == 31102 and len(chapters) == 1189, (n, len(chapters))
    return chapters


def chapter_text(ch: dict) -> str:
    return "\n".join(ch["verses"]) + "\n"


def is_heldout(k: int) -> bool:
    return k % HOLDOUT_MOD == HOLDOUT_REM


def make_prompts(tok, chapters: list[dict], rng: np.random.Generator) -> list[dict]:
    """N_PROMPTS passages of consecutive whole verses of held-out chapters, PROMPT_MIN..PROMPT_MAX
    tokens, lengths skewed short (the C test runs each twice), distinct start verses."""
    held = [k for k in range(len(chapters)) if is_heldout(k)]
    seen = set()
    prompts = []
    tries = 0
    while len(prompts) < N_PROMPTS:
        tries += 1
        assert tries < 100 * N_PROMPTS
        k = held[len(prompts) % len(held)]
        verses = chapters[k]["verses"]
        start = int(rng.integers(0, len(verses)))
        target = PROMPT_MIN + int((PROMPT_MAX - PROMPT_MIN) * float(rng.random()) ** 2)
        if (k, start) in seen:
            continue
        text, ids, end = None, None, start
        while end < len(verses):
            cand = "\n".join(verses[start:end + 1])
            cids = tok.encode(cand).ids
            if len(cids) > PROMPT_MAX or (len(cids) > target and ids is not None
                                          and len(ids) >= PROMPT_MIN):
                break
            text, ids, end = cand, cids, end + 1
        if ids is None or len(ids) < PROMPT_MIN:
            continue
        seen.add((k, start))
        prompts.append({"ref": f"{chapters[k]['ref']}:{start + 1}-{end}", "text": text,
                        "ids": ids})
    return prompts


# ------------------------------------------------------------------------------------ model

def build_model(torch):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    cfg = Qwen3_5TextConfig(**text_config_kwargs())
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(SEED)
    model = Qwen3_5ForCausalLM(cfg).to(torch.float32)
    return cfg, model


def windows(stream: np.ndarray, seq: int) -> list[np.ndarray]:
    """Non-overlapping windows of seq + 1 tokens (inputs + shifted targets), the tail too."""
    out = []
    i = 0
    while i + 1 < len(stream):
        out.append(stream[i:i + seq + 1])
        i += seq
    return out


def eval_loss(torch, model, stream: np.ndarray) -> float:
    model.eval()
    tot, n = 0.0, 0
    with torch.no_grad():
        for w in windows(stream, SEQ):
            x = torch.from_numpy(w[:-1].astype(np.int64))[None]
            y = torch.from_numpy(w[1:].astype(np.int64))[None]
            logits = model(input_ids=x, use_cache=False).logits.float()
            tot += float(torch.nn.functional.cross_entropy(logits[0], y[0], reduction="sum"))
            n += y.numel()
    return tot / n


def train(torch, model, stream: np.ndarray, steps: int, batch: int, lr: float, log_every: int):
    rng = np.random.Generator(np.random.PCG64(SEED + 1))
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() == 2 and "embed" not in n else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    warm = max(1, steps // 20)

    def lr_at(s):
        if s < warm:
            return lr * (s + 1) / warm
        t = (s - warm) / max(1, steps - warm)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    model.train()
    t0 = time.time()
    ema = None
    for s in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(s)
        starts = rng.integers(0, len(stream) - SEQ - 1, size=batch)
        w = np.stack([stream[i:i + SEQ + 1] for i in starts]).astype(np.int64)
        x, y = torch.from_numpy(w[:, :-1]), torch.from_numpy(w[:, 1:])
        logits = model(input_ids=x, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = float(loss.detach())
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        if (s + 1) % log_every == 0 or s == 0:
            el = time.time() - t0
            print(f"  step {s + 1:5d}/{steps} loss {lv:.3f} (ema {ema:.3f}) "
                  f"lr {lr_at(s):.2e} {el:.0f}s ({el / (s + 1):.2f}s/step)", flush=True)
    model.eval()
    return time.time() - t0


# ------------------------------------------------------------------------------------ package

def hf_text_names(torch) -> list[str]:
    """Tensor names of the text tower as Qwen3_5ForConditionalGeneration.state_dict() has them."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
    full = Qwen3_5Config(text_config=text_config_kwargs(),
                         vision_config=dict(depth=1, hidden_size=32, intermediate_size=32,
                                            num_heads=2, out_hidden_size=HIDDEN),
                         **pkgw.mini_special_ids())
    with torch.device("meta"):
        m = Qwen3_5ForConditionalGeneration(full)
    return sorted(k for k in m.state_dict() if k.startswith(TEXT_PREFIX))


def write_package(torch, model, readout, prompts, info: dict) -> dict:
    from safetensors.torch import save_file

    sd = {k[len("model."):]: v for k, v in model.state_dict().items() if k.startswith("model.")}
    names = hf_text_names(torch)
    ours = sorted(TEXT_PREFIX + k for k in sd)
    assert names == ours, set(names) ^ set(ours)

    if PKG_OUT.exists():
        shutil.rmtree(PKG_OUT)
    PKG_OUT.mkdir(parents=True)

    tensors = {TEXT_PREFIX + k: v.detach().to(torch.bfloat16).contiguous() for k, v in sd.items()}
    save_file(tensors, str(PKG_OUT / "model.safetensors"), metadata={"format": "pt"})
    save_file({"weight": readout.detach().to(torch.float32).contiguous()},
              str(PKG_OUT / "readout.safetensors"), metadata={"format": "pt"})

    pkgw.write_config_json(PKG_OUT, text_config_kwargs())
    dc = pkgw.write_decision_config(PKG_OUT, "d3stream/trained-tiny", "causal")
    pkgw.write_tokenizer_and_template(PKG_OUT, "trained-tiny")
    (PKG_OUT / "prompts.json").write_text(json.dumps({
        "source": "King James Bible (Debian bible-kjv-text), held-out chapters "
                  f"(chapter index % {HOLDOUT_MOD} == {HOLDOUT_REM}); whole consecutive verses "
                  "joined by \\n",
        "tokenizer": "tokenizer.json (tokenizers.Tokenizer.from_file, no special tokens added)",
        "prompts": prompts}, indent=0, ensure_ascii=False) + "\n", encoding="utf-8")
    (PKG_OUT / "README.md").write_text(README.format(**info), encoding="utf-8")

    # SPEC e.3 / e.4 (prompts.json and README.md are listed too: nothing here is unhashed)
    n_text = sum(int(v.numel()) for v in tensors.values())
    n_readout = N_CODES * HIDDEN
    model_sha = pkgw.write_manifest(
        PKG_OUT, dc, "trained-tiny", n_text, n_readout,
        [{"component": "trained-tiny test weights", "licence": "Apache-2.0"},
         {"component": "training text and prompts.json: King James Bible (1611)",
          "licence": "public domain (outside the UK)"}])
    return {"n_text": n_text, "n_readout": n_readout, "model_sha256": model_sha, "dc": dc}


README = """# trained-tiny (test fixture)

Generated by `tests/tools/train_tiny_qwen35.py`; do not edit by hand (the hashes in
MODEL_MANIFEST.json cover every file here). Regenerate with

    apt-get install -y bible-kjv-text
    python3 tests/tools/train_tiny_qwen35.py

(torch on CPU, one thread, transformers {transformers} / torch {torch}; {steps} steps of
{batch} x {seq} tokens, seed {seed}).

A small Qwen3.5 text model **trained on real text**: Qwen3_5ForCausalLM, hidden {hidden},
6 layers [lin, lin, lin, full, lin, full] (4 Gated DeltaNet + 2 gated full attention),
vocab 4048 = the qwen35-mini tokenizer, {n_text} text-tower parameters (plus the untied
lm_head, not stored), in the upstream package layout (SPEC e).

* Text: the King James Bible (1611) as Debian's `bible-kjv-text` package ships it
  (`bible -f Gen1:1-Rev22:21`, 31,102 verses, verse references dropped). The KJV text is in
  the public domain everywhere except the United Kingdom, where the Crown's letters patent
  restrict its printing; the Debian package's copyright file states its copyright expired.
* Split: chapter k (0..1188, canonical order) is held out when k % 20 == 10 ({n_held_ch}
  chapters, {n_held_tok} tokens); training used the other {n_train_tok} tokens.
* Training: {train_s:.0f} s wall on one CPU thread ({host}).
* Held-out next-token loss: **{loss_fp32:.3f} nats** (fp32 weights), **{loss_bf16:.3f} nats**
  with the BF16 weights stored here; the unigram baseline (training-token frequencies) scores
  {unigram_xent:.3f} nats on the same targets (held-out unigram entropy {unigram_ent:.3f}).
* `readout.safetensors` row i = the trained lm_head row of the token of answer code i
  (`decision_config.json` codes / token_ids), so the readout's option probabilities are the
  language model's own next-token probabilities restricted to those code tokens.
  `attention_mode` is `causal` (the model was trained causally).
* `prompts.json`: {n_prompts} held-out passages (consecutive whole verses of held-out
  chapters joined by newlines, {pmin}..{pmax} tokens, {ptok} tokens in all) with their
  token ids, for `tests/test_accuracy.c` (exact vs fast profile).

**chat_template.jinja is a placeholder whose SHA-256 is NOT one of SPEC e.5's pinned
templates** (the pinned ones are Qwen's own template files, which this repository does not
carry), so `d3stream` warns about it (it never executes the template and renders the d3
prompt itself) and a strict upstream loader would refuse the package.
"""


def check_readout(torch, model_bf16, readout, prompts, codes_ids) -> dict:
    """The readout's probabilities are the LM's next-token distribution over the code tokens."""
    worst = 0.0
    nontrivial = 0
    ids_t = torch.tensor(codes_ids)
    for p in prompts[:20]:
        x = torch.tensor([p["ids"]])
        with torch.no_grad():
            out = model_bf16(input_ids=x, use_cache=False, output_hidden_states=True)
        h = out.hidden_states[-1][0, -1]  # final-norm output at the last position
        lm = out.logits[0, -1].double()
        ro = (h.double() @ readout.double().T)
        worst = max(worst, float((ro - lm[ids_t]).abs().max()))
        p3 = torch.softmax(ro[:3], 0)
        nontrivial += bool((p3 - 1 / 3).abs().max() > 0.05)
    assert worst < 1e-4, worst  # fp32 logits of magnitude ~10 vs the same sum in double
    return {"readout_vs_lm": worst, "nontrivial_p3": nontrivial}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=950)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--no-write", action="store_true", help="train and evaluate only")
    ap.add_argument("--save-state", type=Path, help="also save the trained fp32 state here")
    ap.add_argument("--load-state", type=Path,
                    help="skip training: a --save-state file of the same settings")
    args = ap.parse_args()

    import platform

    import torch
    import transformers
    from tokenizers import Tokenizer

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, 1 thread")

    tok = Tokenizer.from_file(str(MINI / "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    assert eot is not None
    chapters = kjv_chapters()
    train_ids, held_ids = [], []
    n_held_ch = 0
    for k, ch in enumerate(chapters):
        ids = tok.encode(chapter_text(ch)).ids + [eot]
        if is_heldout(k):
            held_ids += ids
            n_held_ch += 1
        else:
            train_ids += ids
    train_s = np.asarray(train_ids, dtype=np.int32)
    held_s = np.asarray(held_ids, dtype=np.int32)
    assert train_s.max() < VOCAB and held_s.max() < VOCAB
    print(f"text: {len(chapters)} chapters; train {len(train_s)} tokens, held out {n_held_ch} "
          f"chapters / {len(held_s)} tokens")

    # unigram baseline: training frequencies (add-0.5) on the held-out targets
    cnt = np.bincount(train_s, minlength=VOCAB).astype(np.float64) + 0.5
    pu = cnt / cnt.sum()
    tgt = held_s[1:]
    unigram_xent = float(-np.log(pu[tgt]).mean())
    hc = np.bincount(tgt, minlength=VOCAB).astype(np.float64)
    hp = hc[hc > 0] / hc.sum()
    unigram_ent = float(-(hp * np.log(hp)).sum())
    print(f"unigram baseline on held-out: cross-entropy {unigram_xent:.3f} nats, "
          f"held-out unigram entropy {unigram_ent:.3f} nats")

    cfg, model = build_model(torch)
    n_all = sum(p.numel() for p in model.parameters())
    print(f"model: {n_all} parameters (with lm_head {VOCAB * HIDDEN})")
    if args.load_state:
        saved = torch.load(args.load_state, weights_only=True)
        assert saved["settings"] == [args.steps, args.batch, args.lr, SEED], saved["settings"]
        model.load_state_dict(saved["model"])
        model.eval()
        train_sec = float(saved["train_sec"])
        print(f"loaded {args.load_state} (trained in {train_sec:.0f} s)")
    else:
        train_sec = train(torch, model, train_s, args.steps, args.batch, args.lr, args.log_every)
    if args.save_state:
        torch.save({"settings": [args.steps, args.batch, args.lr, SEED], "train_sec": train_sec,
                    "model": model.state_dict()}, args.save_state)
    loss32 = eval_loss(torch, model, held_s)
    import copy
    model16 = copy.deepcopy(model)
    with torch.no_grad():
        for p in model16.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    loss16 = eval_loss(torch, model16, held_s)
    print(f"trained {args.steps} steps in {train_sec:.0f} s; held-out loss {loss32:.6f} nats "
          f"(BF16 weights {loss16:.6f}) vs unigram {unigram_xent:.4f}")
    assert loss16 < unigram_xent - 1.0, "the model did not learn clearly more than unigrams"

    # a glimpse of what it learned (greedy, from a held-out opening)
    x = torch.tensor([tok.encode("And the LORD said unto Moses,").ids])
    with torch.no_grad():
        for _ in range(30):
            nxt = int(model16(input_ids=x, use_cache=False).logits[0, -1].argmax())
            x = torch.cat([x, torch.tensor([[nxt]])], 1)
    print("sample:", repr(tok.decode(x[0].tolist())))

    if args.no_write:
        return 0
    rng = np.random.Generator(np.random.PCG64(SEED + 2))
    prompts = make_prompts(tok, chapters, rng)
    lens = [len(p["ids"]) for p in prompts]
    print(f"prompts: {len(prompts)}, tokens {min(lens)}..{max(lens)}, mean {np.mean(lens):.0f}")

    mini_dc = json.loads((MINI / "decision_config.json").read_text(encoding="utf-8"))
    codes_ids = mini_dc["token_ids"]
    # the package's readout is the fp32 lm_head; check it against the LM on the BF16 tower
    model16.lm_head.weight.data.copy_(model.lm_head.weight.data)
    readout = model.lm_head.weight.detach()[torch.tensor(codes_ids)].clone()
    chk = check_readout(torch, model16, readout, prompts, codes_ids)
    print(f"readout check: max |readout logit - LM logit| {chk['readout_vs_lm']:.2e}; "
          f"{chk['nontrivial_p3']}/20 prompts with p3 away from uniform")

    info = dict(transformers=transformers.__version__, torch=torch.__version__,
                steps=args.steps, batch=args.batch, seq=SEQ, seed=SEED, hidden=HIDDEN,
                n_text=sum(v.numel() for k, v in model.state_dict().items()
                           if k.startswith("model.")),
                n_held_ch=n_held_ch, n_held_tok=len(held_s), n_train_tok=len(train_s),
                train_s=train_sec, host=platform.processor() or platform.machine(),
                loss_fp32=loss32, loss_bf16=loss16, unigram_xent=unigram_xent,
                unigram_ent=unigram_ent, n_prompts=len(prompts), pmin=min(lens), pmax=max(lens),
                ptok=sum(lens))
    res = write_package(torch, model16, readout, prompts, info)
    print(f"package: text params {res['n_text']}, readout {res['n_readout']}, "
          f"model_sha256 {res['model_sha256']}")
    tot = 0
    for p in sorted(PKG_OUT.iterdir()):
        tot += p.stat().st_size
        assert p.stat().st_size <= MAX_FILE_BYTES, (p, p.stat().st_size)
        print(f"  {p.relative_to(REPO)}  {p.stat().st_size}")
    print(f"  total {tot} bytes")
    assert tot <= MAX_FIXTURE_BYTES, tot
    return 0


if __name__ == "__main__":
    sys.exit(main())
