#!/usr/bin/env bash
# Our prefill beside llama.cpp's, on the same synthetic weights, in one run.
#
#   tests/bench/llama_side_by_side.sh [options]
#
#   --package DIR   a d3stream safetensors package (default: build/_bench/nano-st,
#                   made with `d3stream make-package --size nano` if missing)
#   --ours DIR      the package our side runs (default: --package's); e.g. the
#                   q4nx package `make-package --format q4nx` writes from the
#                   same seed, so that both sides run 4-bit weights of the same
#                   synthetic model (llama.cpp always gets --package's weights)
#   --size S        tiny|nano: the default package of that size
#                   (build/_bench/S-st); tiny is a quick check of the machinery
#   --tokens LIST   comma-separated prompt sizes, from d3stream bench's single
#                   question rows (128,330,1024,4096,15854,31491,32768);
#                   default 128,330,1024,4096
#   --quick         128,330,1024
#   --singles       ours runs only the one-question rows of --tokens (one
#                   `d3stream bench --row "1 x N"` each, a load apiece),
#                   not every row up to the largest size with the scheduler
#                   rows: for the long sizes alone (15854, 32768)
#   --runs N        runs per size, the median is reported (default 3)
#   --types LIST    llama.cpp types (default q4_0,q4_1,q4_k_m)
#   --ubatch LIST   llama.cpp batch sizes to try, capped at the prompt size
#                   (default 512,2048; n_batch = n_ubatch; causal attention only)
#   --attention M   auto|causal|noncausal: llama.cpp's attention on the
#                   full-attention layers (default auto: the package's own
#                   attention_mode, as `d3stream inspect` says, so both sides do
#                   the same work; d3-nano's is noncausal_full_attention, which
#                   llama.cpp runs as LLAMA_ATTENTION_TYPE_NON_CAUSAL with the
#                   whole prompt in one ubatch)
#   --profile P     our side's numerics profile, exact (default) or fast
#                   (`d3stream bench --profile P`; docs/profiles.md)
#   --no-peak       skip bench_amx_peak (the machine's AMX/AVX-512 peaks)
#   --json          print one JSON object instead of the table
#   --help
#
# What it does, one step after the other (never two measurements at once):
#  1. a pinned virtualenv in build/_fetch/llama-venv (LLAMA_VENV=DIR to move it):
#     llama-cpp-python 0.3.36 compiled here with CMAKE_ARGS=-DGGML_NATIVE=ON
#     (AVX-512, VNNI, AMX where the CPU has them), gguf 0.19.0, numpy;
#  2. the package, and its GGUF files (tests/tools/st_to_gguf.py: llama.cpp's
#     qwen35 architecture, the BF16 weights written as they are and quantised
#     by llama.cpp's own llama_model_quantize), cached in
#     build/_bench/gguf/<package>/ and remade when the package or the
#     converter changes;
#  3. `d3stream bench --json --runs N` ($D3STREAM, default build/d3stream): our
#     1 x N rows (it also runs its scheduler rows; they are reported as ours
#     only);
#  4. llama.cpp's prefill through the Python bindings' C API: for each type,
#     each size and each batch size, a fresh context (n_ctx = the size,
#     n_threads = n_threads_batch = the online CPUs, the package's attention
#     mode, defaults otherwise: flash attention auto, F16 KV cache, llama.cpp's
#     AMX/repacked weight buffers), a short warm-up decode, then N
#     runs of: clear the KV cache, decode the prompt (random token ids, as
#     many as ours) in n_batch chunks with logits for the last token only,
#     synchronise; the median of the wall times, best batch size kept;
#  5. bench_amx_peak --json (next to $D3STREAM in tests/): the machine's AMX
#     int8/bf16 and AVX-512 peaks, and the fraction of the bf16 peak that
#     each side's projections reach (2 x projection parameters FLOP per token;
#     attention's T^2 work left out, so the fraction is a lower bound).
# The table: tokens, ours s and tok/s, each llama.cpp type's s and tok/s,
# and ours/theirs = our tok/s over the fastest llama.cpp type's.
#
# A benchmark, not a test (ctest never runs it): the figures depend on the
# machine and on whatever else runs on it; compare ratios from one run.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

PKG=""
OURS=""
SIZE=nano
TOKENS=128,330,1024,4096
RUNS=3
TYPES=q4_0,q4_1,q4_k_m
UBATCH=512,2048
ATTN=auto
PEAK=1
JSON=0
QUICK=0
SINGLES=0
while [ $# -gt 0 ]; do
  case "$1" in
  --package) PKG="$2"; shift 2 ;;
  --ours) OURS="$2"; shift 2 ;;
  --size) SIZE="$2"; shift 2 ;;
  --tokens) TOKENS="$2"; shift 2 ;;
  --quick) QUICK=1; TOKENS=128,330,1024; shift ;;
  --singles) SINGLES=1; shift ;;
  --runs) RUNS="$2"; shift 2 ;;
  --types) TYPES="$2"; shift 2 ;;
  --ubatch) UBATCH="$2"; shift 2 ;;
  --attention) ATTN="$2"; shift 2 ;;
  --profile) PROFILE="$2"; shift 2 ;;
  --no-peak) PEAK=0; shift ;;
  --json) JSON=1; shift ;;
  -h | --help) usage; exit 0 ;;
  *) echo "llama_side_by_side: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$SIZE" in tiny | lite | nano) ;; *) echo "llama_side_by_side: --size tiny|lite|nano" >&2; exit 2 ;; esac
for t in ${TOKENS//,/ }; do
  case "$t" in 128 | 330 | 1024 | 4096 | 15854 | 31491 | 32768) ;;
  *) echo "llama_side_by_side: --tokens: $t is not a d3stream bench row size" >&2; exit 2 ;;
  esac
done
case "$ATTN" in auto | causal | noncausal) ;; *) echo "llama_side_by_side: --attention auto|causal|noncausal" >&2; exit 2 ;; esac
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || { echo "llama_side_by_side: --runs N (N >= 1)" >&2; exit 2; }
log() { echo "llama_side_by_side: $*" >&2; }

BIN="${D3STREAM:-$ROOT/build/d3stream}"
[ -x "$BIN" ] || { log "no d3stream at $BIN (build it, or set D3STREAM)"; exit 1; }
PEAKBIN="$(dirname "$BIN")/tests/bench_amx_peak"

# ---- 1. the virtualenv ----------------------------------------------------
VENV="${LLAMA_VENV:-$ROOT/build/_fetch/llama-venv}"
PINS=(llama-cpp-python==0.3.36 gguf==0.19.0 numpy==2.4.6)
STAMP="$VENV/.d3-pins"
if ! { [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "${PINS[*]} native" ] &&
  "$VENV/bin/python" -c 'import llama_cpp, gguf, numpy' 2>/dev/null; }; then
  PY=/usr/bin/python3
  [ -x "$PY" ] || PY="$(command -v python3)" || { log "no python3; run ops/setup-deps.sh"; exit 1; }
  "$PY" -c 'import ensurepip, venv' 2>/dev/null ||
    { log "$PY has no venv/ensurepip; run ops/setup-deps.sh (python3-venv)"; exit 1; }
  command -v c++ >/dev/null || { log "llama-cpp-python builds llama.cpp: needs a C++ compiler (g++)"; exit 1; }
  log "creating $VENV: ${PINS[*]}; llama.cpp compiles here with -DGGML_NATIVE=ON (15-30 min on 2 cores)"
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PINS[@]:1}"
  CMAKE_ARGS="-DGGML_NATIVE=ON" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
    --no-binary llama-cpp-python "${PINS[0]}"
  "$VENV/bin/python" -c 'import llama_cpp, gguf, numpy'
  printf '%s' "${PINS[*]} native" >"$STAMP"
fi
VPY="$VENV/bin/python"

# ---- 2. the package and its GGUF files ---------------------------------------
if [ -z "$PKG" ]; then
  PKG="$ROOT/build/_bench/$SIZE-st"
  if [ ! -f "$PKG/MODEL_MANIFEST.json" ]; then
    log "making $PKG (d3stream make-package --size $SIZE --seed 1)"
    "$BIN" make-package --size "$SIZE" --format safetensors --seed 1 --out "$PKG" --force >&2
  fi
fi
[ -f "$PKG/model.safetensors" ] && [ -f "$PKG/config.json" ] ||
  { log "$PKG is not a safetensors package (config.json, model.safetensors)"; exit 1; }
PKG="$(cd "$PKG" && pwd)"
GDIR="$ROOT/build/_bench/gguf/$(basename "$PKG")"
KEY="$(stat -c '%s %Y' "$PKG/model.safetensors") $(sha256sum <"$PKG/config.json" | cut -c1-16) $(sha256sum <tests/tools/st_to_gguf.py | cut -c1-16)"
if [ "$(cat "$GDIR/key" 2>/dev/null)" != "$KEY" ]; then
  rm -rf "$GDIR"
fi
mkdir -p "$GDIR"
for t in ${TYPES//,/ }; do
  [ -f "$GDIR/$t.gguf" ] && continue
  log "converting $PKG to $GDIR/$t.gguf"
  "$VPY" tests/tools/st_to_gguf.py "$PKG" "$GDIR/$t.gguf" --outtype "$t" --quantizer llama \
    --bf16-cache "$GDIR/bf16.gguf" >&2
done
rm -f "$GDIR/bf16.gguf"
printf '%s' "$KEY" >"$GDIR/key"

if [ "$ATTN" = auto ]; then
  # inspect exits 1 on a package whose manifest fails (bench does not
  # check it), and set -e would end the run here without a word.
  INSPECT="$("$BIN" inspect --model "$PKG" --json)" || {
    echo "llama_side_by_side: d3stream inspect refused $PKG (its manifest?); pass --attention" \
      "causal|noncausal to skip it" >&2
    exit 1
  }
  ATTN="$(printf '%s' "$INSPECT" | "$VPY" -c '
import json, sys
print("noncausal" if json.load(sys.stdin).get("attention_mode") == "noncausal_full_attention" else "causal")')"
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
MAXTOK=0
for t in ${TOKENS//,/ }; do [ "$t" -gt "$MAXTOK" ] && MAXTOK=$t; done

# ---- 3. ours ------------------------------------------------------------------
OURS="${OURS:-$PKG}"
QOPT=()
[ "$QUICK" = 1 ] && QOPT=(--quick)
[ -n "${PROFILE:-}" ] && QOPT+=(--profile "$PROFILE")
if [ "$SINGLES" = 1 ]; then
  log "ours: d3stream bench --runs $RUNS --row \"1 x N\" for each of $TOKENS ($OURS)"
  # one process per size, its row by name ("1 x 15,854"); the report reads
  # one machine line, the first
  : >"$WORK/ours.jsonl"
  for t in ${TOKENS//,/ }; do
    label="$(echo "$t" | sed ':a;s/\B[0-9]\{3\}\>/,&/;ta')"
    "$BIN" bench --model "$OURS" --json --runs "$RUNS" --row "1 x $label" \
      ${PROFILE:+--profile "$PROFILE"} >"$WORK/ours-$t.jsonl"
    if [ -s "$WORK/ours.jsonl" ]; then grep -v '"machine"' "$WORK/ours-$t.jsonl"; else cat "$WORK/ours-$t.jsonl"; fi \
      >>"$WORK/ours.jsonl"
  done
else
  log "ours: d3stream bench --runs $RUNS --max-tokens $MAXTOK ($OURS)"
  "$BIN" bench --model "$OURS" --json --runs "$RUNS" --max-tokens "$MAXTOK" ${QOPT[@]+"${QOPT[@]}"} \
    >"$WORK/ours.jsonl"
fi

# ---- 4. llama.cpp -------------------------------------------------------------
# Each type in its own process: ggml's AMX weight buffers (llama.cpp's default
# "extra buffer types" on an AMX CPU) crash in ggml_backend_amx_mul_mat on
# qwen35 with 0.3.36 (SIGSEGV, tiny and nano alike; cf. ggml-org/llama.cpp#20824),
# and then that type is measured again with the CPU_REPACK buffers only (the
# AVX-512 repacked Q4_0/Q4_K kernels, AMX off), then with plain CPU buffers;
# the report names the buffers each type ran with.
cat >"$WORK/llama_time.py" <<'EOF'
import ctypes, json, os, statistics, sys, time
import numpy as np
import llama_cpp as L

gdir, t, sizes, ubatches, runs, attention, bufs = sys.argv[1:]
sizes = [int(s) for s in sizes.split(",")]
ubatches = [int(u) for u in ubatches.split(",")]; runs = int(runs)
noncausal = attention == "noncausal"
nthreads = os.cpu_count() or 1

@L.llama_log_callback
def quiet(level, text, user_data):  # llama.cpp's load logs; errors kept
    if level >= 4 or b"error" in text.lower():
        sys.stderr.write(text.decode(errors="replace"))
L.llama_log_set(quiet, ctypes.c_void_p())
L.llama_backend_init()

class BuftOverride(ctypes.Structure):  # struct llama_model_tensor_buft_override
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]

def cpu_repack_buft():
    """ggml's CPU_REPACK buffer type (the CPU device's extra buffer types are
    AMX and CPU_REPACK on this build), through ggml's C API."""
    libdir = os.path.join(os.path.dirname(L.__file__), "lib")
    g = ctypes.CDLL(os.path.join(libdir, "libggml.so"))
    b = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"))
    g.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    g.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    b.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    b.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    b.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    b.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    b.ggml_backend_buft_name.restype = ctypes.c_char_p
    b.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    dev = g.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    fp = b.ggml_backend_reg_get_proc_address(b.ggml_backend_dev_backend_reg(dev),
                                             b"ggml_backend_dev_get_extra_bufts")
    arr = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(fp)(dev)
    i = 0
    while arr[i]:
        if b.ggml_backend_buft_name(arr[i]) == b"CPU_REPACK":
            return arr[i]
        i += 1
    return None

def repack_overrides(path):
    """The layer matrices ggml's x86 repack takes (Q4_0, Q4_K, IQ4_NL with
    rows % 8 == 0; ggml-cpu/repack.cpp), each pinned to CPU_REPACK."""
    import gguf
    ok = {gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_K,
          gguf.GGMLQuantizationType.IQ4_NL}
    return [tt.name for tt in gguf.GGUFReader(path).tensors
            if tt.name.startswith("blk.") and tt.tensor_type in ok and len(tt.shape) == 2
            and int(tt.shape[1]) % 8 == 0]

def batches(tokens, n_batch):
    """Prebuilt llama_batch chunks; logits for the prompt's last token only."""
    out = []
    for start in range(0, len(tokens), n_batch):
        chunk = tokens[start:start + n_batch]
        b = L.llama_batch_init(len(chunk), 0, 1)
        b.n_tokens = len(chunk)
        for i, tok in enumerate(chunk):
            b.token[i] = int(tok); b.pos[i] = start + i
            b.n_seq_id[i] = 1; b.seq_id[i][0] = 0
            b.logits[i] = start + i == len(tokens) - 1
        out.append(b)
    return out

def prefill(ctx, bs):
    L.llama_memory_clear(L.llama_get_memory(ctx), True)
    t0 = time.perf_counter()
    for b in bs:
        rc = L.llama_decode(ctx, b)
        if rc != 0:
            raise SystemExit(f"llama_decode failed ({rc})")
    L.llama_synchronize(ctx)
    return time.perf_counter() - t0

print(json.dumps({"info": {
    "llama_cpp_python": L.__version__, "threads": nthreads, "attention": attention,
    "system_info": L.llama_print_system_info().decode(errors="replace").strip()}}), flush=True)
rng = np.random.default_rng(1)
path = os.path.join(gdir, f"{t}.gguf")
mp = L.llama_model_default_params()
# bufs: all = llama.cpp's default (AMX, then CPU_REPACK, then plain CPU);
# repack = no AMX, repacked AVX-512 kernels where ggml has them; none = plain.
mp.use_extra_bufts = bufs == "all"
if bufs == "repack":
    buft = cpu_repack_buft()
    names = repack_overrides(path) if buft else []
    ov = (BuftOverride * (len(names) + 1))()
    keep = [("^" + n.replace(".", r"\.") + "$").encode() for n in names]
    for i, pat in enumerate(keep):
        ov[i].pattern = pat; ov[i].buft = buft
    mp.tensor_buft_overrides = ctypes.cast(ov, ctypes.c_void_p)
    if not names:
        bufs = "plain"  # nothing of this type repacks (Q4_1): plain CPU buffers
@L.llama_progress_callback
def no_dots(progress, user_data):  # the default callback prints a dot per step
    return True
mp.progress_callback = no_dots
model = L.llama_model_load_from_file(path.encode(), mp)
if not model:
    raise SystemExit(f"llama.cpp could not load {path}")
n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
for size in sizes:
    tokens = rng.integers(0, n_vocab, size)
    best = None
    # Non-causal attention sees the whole prompt, so it takes one ubatch.
    for ub in [size] if noncausal else sorted({min(u, size) for u in ubatches}):
        cp = L.llama_context_default_params()
        cp.n_ctx = size; cp.n_batch = ub; cp.n_ubatch = ub; cp.n_seq_max = 1
        cp.n_threads = nthreads; cp.n_threads_batch = nthreads
        cp.attention_type = 1 if noncausal else 0  # LLAMA_ATTENTION_TYPE_(NON_)CAUSAL
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            raise SystemExit(f"llama.cpp: no context for {t} n_ctx {size} n_ubatch {ub}")
        warm = batches(tokens[:min(size, 64)], ub)  # threads, graph, weights paged in
        prefill(ctx, warm)
        for b in warm:
            L.llama_batch_free(b)
        bs = batches(tokens, ub)
        times = [prefill(ctx, bs) for _ in range(runs)]
        for b in bs:
            L.llama_batch_free(b)
        L.llama_free(ctx)
        med = statistics.median(times)
        row = {"type": t, "tokens": size, "n_ubatch": ub, "runs": runs, "median_s": med,
               "tokens_per_s": size / med, "times_s": times, "buffers": bufs}
        print(json.dumps({"try": row}), flush=True)
        print(f"llama_side_by_side: llama.cpp {t} {size} tokens n_ubatch {ub}"
              f" ({bufs} buffers): {med:.3f} s ({size / med:.1f} tok/s)",
              file=sys.stderr, flush=True)
        if best is None or med < best["median_s"]:
            best = row
    print(json.dumps({"best": best}), flush=True)
L.llama_model_free(model)
EOF
log "llama.cpp: types $TYPES, sizes $TOKENS, batch sizes $UBATCH, $ATTN attention, $RUNS runs each"
: >"$WORK/llama.jsonl"
for t in ${TYPES//,/ }; do
  for bufs in all repack none; do
    rc=0
    "$VPY" "$WORK/llama_time.py" "$GDIR" "$t" "$TOKENS" "$UBATCH" "$RUNS" "$ATTN" "$bufs" \
      >"$WORK/llama-$t.jsonl" 2> >(tee "$WORK/llama-$t.err" >&2) || rc=$?
    wait # for tee: the .err file is complete
    [ "$rc" -eq 0 ] && break
    # ggml aborts when a context's compute buffer does not fit in memory (a
    # 32,768-token non-causal ubatch wants ~25 GB): a result for that size,
    # not a crash of the weight buffers; the sizes before it stay measured
    oom="$(grep -m1 'insufficient memory' "$WORK/llama-$t.err" || true)"
    if [ -n "$oom" ]; then
      log "llama.cpp $t: out of memory after the sizes it measured ($oom)"
      "$VPY" -c 'import json, sys; print(json.dumps({"failed": {"type": sys.argv[1], "buffers": sys.argv[2], "why": sys.argv[3]}}))' \
        "$t" "$bufs" "$oom" >>"$WORK/llama.jsonl"
      break
    fi
    if [ "$rc" -lt 128 ] || [ "$bufs" = none ]; then
      log "llama.cpp $t failed (exit $rc, $bufs buffers)"
      exit 1
    fi
    log "llama.cpp $t died with signal $((rc - 128)) with $bufs weight buffers; again with fewer"
    echo "{\"crash\": {\"type\": \"$t\", \"signal\": $((rc - 128)), \"buffers\": \"$bufs\"}}" >>"$WORK/llama.jsonl"
  done
  # its JSON lines only: an abort's backtrace (ggml runs gdb) goes to stdout too
  grep '^{' "$WORK/llama-$t.jsonl" >>"$WORK/llama.jsonl" || true
done

# ---- 5. the machine's peaks -------------------------------------------------
echo '{}' >"$WORK/peak.json"
if [ "$PEAK" = 1 ]; then
  if [ -x "$PEAKBIN" ]; then
    log "peaks: $PEAKBIN --json --no-matmul"
    "$PEAKBIN" --json --no-matmul >"$WORK/peak.json"
  else
    log "no $PEAKBIN: peaks skipped (build the bench_amx_peak target)"
  fi
fi

# ---- the report -----------------------------------------------------------------
"$VPY" - "$WORK" "$PKG" "$TOKENS" "$TYPES" "$JSON" "$OURS" <<'EOF'
import json, os, sys
work, pkg, sizes, types, as_json, ours_pkg = sys.argv[1:]
sizes = [int(s) for s in sizes.split(",")]; types = types.split(",")
ours_lines = [json.loads(l) for l in open(os.path.join(work, "ours.jsonl")) if l.strip()]
machine = ours_lines[0]
ours = {r["size"]: r for r in ours_lines[1:] if r.get("questions") == 1 and "median_s" in r}
other_rows = [r for r in ours_lines[1:] if r.get("questions", 1) != 1]
llama_lines = [json.loads(l) for l in open(os.path.join(work, "llama.jsonl")) if l.strip()]
info = next((l["info"] for l in llama_lines if "info" in l), {})
failures = [l["failed"] for l in llama_lines if "failed" in l]
best = {(l["best"]["type"], l["best"]["tokens"]): l["best"] for l in llama_lines if "best" in l}
tries = [l["try"] for l in llama_lines if "try" in l]
crashes = [l["crash"] for l in llama_lines if "crash" in l]
peak = json.load(open(os.path.join(work, "peak.json")))

with open(os.path.join(pkg, "config.json")) as f:
    cfg = json.load(f)
tc = cfg.get("text_config", cfg)
E, F = tc["hidden_size"], tc["intermediate_size"]
hd = tc.get("head_dim") or E // tc["num_attention_heads"]
nh, nkv = tc["num_attention_heads"], tc["num_key_value_heads"]
nk, nv = tc["linear_num_key_heads"], tc["linear_num_value_heads"]
dk, dv = tc["linear_key_head_dim"], tc["linear_value_head_dim"]
proj = 0
for lt in tc["layer_types"]:
    if lt == "linear_attention":
        proj += E * (2 * nk * dk + nv * dv) + E * nv * dv + 2 * E * nv + nv * dv * E
    else:
        proj += E * 2 * nh * hd + 2 * E * nkv * hd + nh * hd * E
    proj += 3 * E * F
flop_per_token = 2 * proj

def peak_of(kernel):
    rows = [r for r in peak.get("peaks", []) if r["kernel"] == kernel]
    return max(rows, key=lambda r: r["threads"]) if rows else None
bf16 = peak_of("amx-bf16")

rows = []
for s in sizes:
    o = ours.get(s)
    r = {"tokens": s, "ours_s": o["median_s"] if o else None,
         "ours_tok_s": o["tokens_per_s"] if o else None, "llama": {}}
    for t in types:
        b = best.get((t, s))
        if b:
            r["llama"][t] = {"s": b["median_s"], "tok_s": b["tokens_per_s"], "n_ubatch": b["n_ubatch"],
                             "buffers": b["buffers"]}
    if r["llama"]:
        ft = max(r["llama"], key=lambda t: r["llama"][t]["tok_s"])
        r["fastest_llama"] = ft
        if o:
            r["ours_over_theirs"] = o["tokens_per_s"] / r["llama"][ft]["tok_s"]
    if bf16:
        denom = bf16["cpu"] * 1e12
        if o:
            r["ours_proj_fraction_of_amx_bf16"] = o["tokens_per_s"] * flop_per_token / denom
        if r["llama"]:
            r["llama_proj_fraction_of_amx_bf16"] = r["llama"][ft]["tok_s"] * flop_per_token / denom
    rows.append(r)

out = {"package": pkg, "ours_package": ours_pkg, "ours_format": machine.get("format"), "model_id": machine.get("model_id"), "machine": machine.get("machine"),
       "our_kernels": machine.get("kernels"), "llama": info, "projection_flop_per_token": flop_per_token,
       "rows": rows, "llama_tries": tries, "llama_crashes_with_extra_bufts": crashes, "llama_failures": failures, "ours_other_rows": other_rows, "peaks": peak}
if as_json == "1":
    print(json.dumps(out))
    sys.exit(0)

print(f"package {pkg} ({machine.get('model_id')}); ours: {ours_pkg} ({machine.get('format')}), "
      f"{machine.get('kernels')} kernels, {machine.get('matmul_groups')} for q4nx tiles, "
      f"{machine.get('workers')}; llama.cpp: llama-cpp-python {info.get('llama_cpp_python')}, "
      f"{info.get('threads')} threads, {info.get('attention')} attention on the full-attention layers")
for c in crashes:
    print(f"llama.cpp {c['type']}: signal {c['signal']} with {c['buffers']} weight buffers "
          "(AMX: ggml_backend_amx_mul_mat, cf. ggml-org/llama.cpp#20824); measured with fewer")
for f in failures:
    print(f"llama.cpp {f['type']} ({f['buffers']} buffers) stopped: {f['why']}; "
          "the sizes without its figures did not fit in memory")
print(f"llama.cpp system info: {info.get('system_info')}")
head = f"{'tokens':>7} {'ours s':>8} {'tok/s':>8}"
for t in types:
    head += f" {t + ' s':>10} {'tok/s':>8}"
head += f" {'ours/theirs':>12}"
print(head)
for r in rows:
    line = f"{r['tokens']:>7} "
    line += f"{r['ours_s']:>8.3f} {r['ours_tok_s']:>8.1f}" if r["ours_s"] else f"{'-':>8} {'-':>8}"
    for t in types:
        l = r["llama"].get(t)
        line += f" {l['s']:>10.3f} {l['tok_s']:>8.1f}" if l else f" {'-':>10} {'-':>8}"
    if "ours_over_theirs" in r:
        line += f" {r['ours_over_theirs']:>8.2f} vs {r['fastest_llama']}"
    print(line)
print("ours/theirs: our tokens/s over the fastest llama.cpp type's at that size "
      "(> 1: we are faster); llama.cpp's best batch size per cell:",
      ", ".join(f"{r['tokens']}:" + "/".join(str(r['llama'][t]['n_ubatch']) for t in types if t in r['llama'])
                for r in rows))
bufs = sorted({f"{t}: {r['llama'][t]['buffers']}" for r in rows for t in r["llama"]})
print("llama.cpp weight buffers (all = AMX + CPU_REPACK, repack = CPU_REPACK only, plain = none):", ", ".join(bufs))
if other_rows:
    print("ours, scheduler rows:", "; ".join(f"{r['row']} {r['median_s']:.3f} s "
                                          f"({r['tokens_per_s']:.1f} tok/s)"
                                          for r in other_rows if "median_s" in r))
if peak.get("peaks"):
    print("peaks (bench_amx_peak, per CPU second, all threads): " + ", ".join(
        f"{p['kernel']} {p['cpu']:.2f} {p['unit']}" for p in peak["peaks"] if p["threads"] == peak["threads"]))
    if bf16:
        print(f"projections: {flop_per_token / 1e9:.3g} GFLOP per token; share of the AMX-BF16 peak "
              f"({bf16['cpu']:.2f} TFLOP/s, {bf16['threads']} threads) reached by the prefill:")
        for r in rows:
            parts = []
            if "ours_proj_fraction_of_amx_bf16" in r:
                parts.append(f"ours {100 * r['ours_proj_fraction_of_amx_bf16']:.1f}%")
            if "llama_proj_fraction_of_amx_bf16" in r:
                parts.append(f"llama.cpp {r['fastest_llama']} {100 * r['llama_proj_fraction_of_amx_bf16']:.1f}%")
            print(f"  {r['tokens']:>6} tokens: " + ", ".join(parts))
elif peak.get("skipped"):
    print(f"peaks skipped: {peak.get('reason')}")
EOF
