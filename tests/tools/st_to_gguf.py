#!/usr/bin/env python3
"""A d3stream package's text tower as a llama.cpp GGUF (architecture qwen35).

    st_to_gguf.py PACKAGE OUT.gguf [--outtype bf16|f32|q8_0|q4_0|q4_1|q4_k_m]
                                   [--quantizer auto|llama|gguf] [--threads N]

Reads PACKAGE/config.json (text_config) and PACKAGE/model.safetensors (BF16 or
F32, Hugging Face Qwen3_5 names, `model.language_model.` or `model.` prefix)
and writes the tower with llama.cpp's qwen35 tensor names, metadata keys and
weight transforms, as llama.cpp's own convert_hf_to_gguf.py does for
Qwen3_5ForConditionalGeneration (conversion/qwen.py, class Qwen3_5TextModel,
read at llama-cpp-python 0.3.36's vendored llama.cpp; facts only, no code):

  * names: embed_tokens -> token_embd, norm -> output_norm, input_layernorm ->
    blk.N.attn_norm, post_attention_layernorm -> blk.N.post_attention_norm,
    self_attn.{q,k,v,o}_proj -> attn_{q,k,v,output}, q_norm/k_norm ->
    attn_{q,k}_norm, linear_attn.in_proj_qkv -> attn_qkv, in_proj_z ->
    attn_gate, in_proj_a -> ssm_alpha, in_proj_b -> ssm_beta, A_log -> ssm_a,
    dt_bias -> ssm_dt.bias, conv1d -> ssm_conv1d, linear_attn.norm ->
    ssm_norm, out_proj -> ssm_out, mlp.{gate,up,down}_proj -> ffn_*;
  * transforms: every RMSNorm weight but linear_attn.norm gets +1 (Qwen3.5's
    norms scale by 1 + w); ssm_a = -exp(A_log); conv1d squeezed to
    (channels, kernel); when there are fewer key than value heads in the
    linear-attention layers, the value heads go from grouped-by-key order to
    tiled order (the V rows of in_proj_qkv and conv1d, in_proj_z, in_proj_a,
    in_proj_b, A_log, dt_bias rows, out_proj columns);
  * F32 for 1-D tensors, norms, ssm_conv1d, ssm_a and ssm_dt.bias; matrices
    in the requested type.

There is no lm_head in a d3 package (the readout replaces it), so llama.cpp
ties the output to token_embd. The vocabulary is llama.cpp's "none" tokenizer
with `qwen35.vocab_size` dummy tokens: the benchmark feeds token ids, so the
token count is exactly ours.

Quantised types: --quantizer llama (the default when llama_cpp imports)
writes a BF16 GGUF next to OUT and turns it into OUT with llama.cpp's own
llama_model_quantize (llama-quantize's recipes: Q4_K_M's mix of Q4_K and
Q6_K, Q6_K output, fallbacks for rows that do not divide); --quantizer gguf
quantises q8_0/q4_0/q4_1 with the gguf package's numpy quantisers (every
matrix whose rows divide by 32, token_embd too). gguf has no Q4_K quantiser.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - a message, not a trace
    sys.exit("st_to_gguf: needs the gguf package (pip install gguf==0.19.0)")

ARCH = "qwen35"

# llama.cpp's enum llama_ftype (include/llama.h).
LLAMA_FTYPES = {"f32": 0, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q4_k_m": 15, "bf16": 32}
GGUF_QTYPES = {
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
    "q4_1": gguf.GGMLQuantizationType.Q4_1,
}
GGUF_FILE_TYPES = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "bf16": gguf.LlamaFileType.MOSTLY_BF16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
}

LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.A_log": "ssm_a",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


class SafeTensors:
    """Memory-mapped safetensors reader: name -> (dtype, shape, array)."""

    def __init__(self, path):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            self.header = json.loads(f.read(n))
        self.header.pop("__metadata__", None)
        self.base = 8 + n
        self.mm = np.memmap(path, dtype=np.uint8, mode="r")

    def names(self):
        return list(self.header)

    def raw(self, name):
        """(dtype string, shape, raw array: uint16 for BF16, float32 for F32)."""
        h = self.header[name]
        lo, hi = h["data_offsets"]
        buf = self.mm[self.base + lo : self.base + hi]
        if h["dtype"] == "BF16":
            arr = buf.view(np.uint16)
        elif h["dtype"] == "F32":
            arr = buf.view(np.float32)
        elif h["dtype"] == "F16":
            arr = buf.view(np.float16)
        else:
            raise SystemExit(f'st_to_gguf: tensor "{name}": dtype {h["dtype"]} not supported')
        return h["dtype"], tuple(h["shape"]), arr.reshape(h["shape"])


def to_f32(dtype, arr):
    if dtype == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32)


def to_bf16_bits(dtype, arr):
    """BF16 bits (uint16), rounding to nearest even from F32/F16."""
    if dtype == "BF16":
        return arr
    u = np.ascontiguousarray(arr, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def tiled_v_heads(arr, axis, n_k, n_v_per_k, head_dim):
    """Value heads from grouped-by-key order [K0: v0..vr-1, K1: ...] to tiled
    order [v0 of K0, v0 of K1, ..., v1 of K0, ...] along axis (ggml's
    broadcast repeats the key heads, so llama.cpp wants V tiled)."""
    arr = np.moveaxis(arr, axis, 0)
    shape = arr.shape
    arr = arr.reshape((n_k, n_v_per_k, head_dim) + shape[1:]).swapaxes(0, 1)
    return np.moveaxis(np.ascontiguousarray(arr).reshape(shape), 0, axis)


def load_text_config(pkg):
    with open(os.path.join(pkg, "config.json")) as f:
        cfg = json.load(f)
    tc = cfg.get("text_config", cfg)
    if tc.get("model_type") not in ("qwen3_5_text", "qwen3_5", None):
        print(f'st_to_gguf: warning: text_config.model_type is "{tc.get("model_type")}"',
              file=sys.stderr)
    return tc


def add_metadata(w, tc, n_vocab, file_type):
    n_layer = tc["num_hidden_layers"]
    head_dim = tc.get("head_dim") or tc["hidden_size"] // tc["num_attention_heads"]
    rope = tc.get("rope_parameters") or {}
    w.add_name("d3stream synthetic package")
    w.add_block_count(n_layer)
    w.add_context_length(tc.get("max_position_embeddings", 32768))
    w.add_embedding_length(tc["hidden_size"])
    w.add_feed_forward_length(tc["intermediate_size"])
    w.add_head_count(tc["num_attention_heads"])
    w.add_head_count_kv(tc["num_key_value_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(tc.get("rms_norm_eps", 1e-6))
    w.add_rope_freq_base(rope.get("rope_theta", tc.get("rope_theta", 10000000.0)))
    w.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 0.25)))
    sections = list(rope.get("mrope_section", [11, 11, 10]))[:4]
    w.add_rope_dimension_sections(sections + [0] * (4 - len(sections)))
    # Gated DeltaNet (llama.cpp keeps them under ssm.*).
    w.add_ssm_conv_kernel(tc["linear_conv_kernel_dim"])
    w.add_ssm_state_size(tc["linear_key_head_dim"])
    w.add_ssm_group_count(tc["linear_num_key_heads"])
    w.add_ssm_time_step_rank(tc["linear_num_value_heads"])
    w.add_ssm_inner_size(tc["linear_value_head_dim"] * tc["linear_num_value_heads"])
    layer_types = tc.get("layer_types")
    interval = tc.get("full_attention_interval", 4)
    w.add_full_attention_interval(interval)
    if layer_types is not None:
        if len(layer_types) != n_layer:
            raise SystemExit(f"st_to_gguf: layer_types has {len(layer_types)} entries, "
                             f"num_hidden_layers is {n_layer}")
        w.add_array(f"{ARCH}.attention.recurrent_layers",
                    [t == "linear_attention" for t in layer_types])
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("none")
    w.add_file_type(file_type)


def convert(pkg, out, outtype):
    """Writes OUT with matrices in outtype (f32, bf16 or a gguf quant type)."""
    tc = load_text_config(pkg)
    st = SafeTensors(os.path.join(pkg, "model.safetensors"))
    n_k = tc["linear_num_key_heads"]
    n_v = tc["linear_num_value_heads"]
    dk = tc["linear_key_head_dim"]
    dv = tc["linear_value_head_dim"]
    reorder = n_k != n_v
    r = n_v // n_k if n_k else 1

    def strip(name):
        for p in ("model.language_model.", "model."):
            if name.startswith(p):
                return name[len(p):]
        return name

    names = {strip(n): n for n in st.names()}
    if "embed_tokens.weight" not in names:
        raise SystemExit(f'st_to_gguf: "{pkg}/model.safetensors" has no embed_tokens.weight')
    n_vocab = st.header[names["embed_tokens.weight"]]["shape"][0]

    w = gguf.GGUFWriter(out, ARCH)
    add_metadata(w, tc, n_vocab, GGUF_FILE_TYPES[outtype])

    order = []
    for short in names:
        if short in ("embed_tokens.weight", "norm.weight", "lm_head.weight"):
            order.append((short, {"embed_tokens.weight": "token_embd.weight",
                                  "norm.weight": "output_norm.weight",
                                  "lm_head.weight": "output.weight"}[short]))
            continue
        parts = short.split(".", 2)
        if len(parts) == 3 and parts[0] == "layers" and parts[1].isdecimal():
            if parts[2] not in LAYER_NAMES:
                raise SystemExit(f'st_to_gguf: tensor "{names[short]}" has no qwen35 name')
            order.append((short, f"blk.{parts[1]}.{LAYER_NAMES[parts[2]]}"))
        elif short.startswith("mtp."):
            continue  # multi-token prediction head: not used for prefill
        elif short.startswith("visual."):
            continue  # the vision tower: llama.cpp keeps it in a separate mmproj file
        else:
            raise SystemExit(f'st_to_gguf: tensor "{names[short]}" has no qwen35 name')

    for short, gname in order:
        dtype, shape, arr = st.raw(names[short])
        tail = short.split(".", 2)[-1] if short.startswith("layers.") else short
        is_norm = tail.endswith("norm.weight")
        f32 = (len(shape) <= 1 or is_norm or gname.endswith("ssm_conv1d.weight")
               or not gname.endswith(".weight"))
        if f32 or outtype == "f32" or (reorder and "linear_attn." in tail):
            data = to_f32(dtype, arr)
        else:
            data = arr
        if is_norm and tail != "linear_attn.norm.weight":
            data = data + np.float32(1.0)
        if tail == "linear_attn.A_log":
            data = -np.exp(data)
        if tail == "linear_attn.conv1d.weight":
            data = data.reshape(shape[0], shape[-1])
        if reorder and "linear_attn." in tail:
            if tail == "linear_attn.in_proj_qkv.weight":
                qk = 2 * n_k * dk
                data = np.concatenate([data[:qk], tiled_v_heads(data[qk:], 0, n_k, r, dv)])
            elif tail == "linear_attn.conv1d.weight":
                qk = 2 * n_k * dk
                data = np.concatenate([data[:qk], tiled_v_heads(data[qk:], 0, n_k, r, dv)])
            elif tail == "linear_attn.in_proj_z.weight":
                data = tiled_v_heads(data, 0, n_k, r, dv)
            elif tail in ("linear_attn.in_proj_a.weight", "linear_attn.in_proj_b.weight",
                          "linear_attn.A_log", "linear_attn.dt_bias"):
                data = tiled_v_heads(data, 0, n_k, r, 1)
            elif tail == "linear_attn.out_proj.weight":
                data = tiled_v_heads(data, 1, n_k, r, dv)
        data = np.ascontiguousarray(data)
        if f32 or outtype == "f32":
            w.add_tensor(gname, data.astype(np.float32, copy=False))
            continue
        if outtype == "bf16":
            bits = to_bf16_bits("BF16" if data.dtype == np.uint16 else "F32", data)
            w.add_tensor(gname, bits, raw_shape=bits.shape,
                         raw_dtype=gguf.GGMLQuantizationType.BF16)
            continue
        qtype = GGUF_QTYPES[outtype]
        block, _ = gguf.GGML_QUANT_SIZES[qtype]
        f = to_f32("BF16", data) if data.dtype == np.uint16 else data
        if f.shape[-1] % block != 0:
            w.add_tensor(gname, f.astype(np.float32, copy=False))
            continue
        q = gguf.quants.quantize(f, qtype)
        w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=qtype)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()


def llama_quantize(src, out, outtype, threads):
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPES[outtype]
    params.nthread = threads
    rc = llama_cpp.llama_model_quantize(src.encode(), out.encode(), params)
    if rc != 0:
        raise SystemExit(f'st_to_gguf: llama_model_quantize "{src}" -> "{out}" failed ({rc})')


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 1)[1])
    ap.add_argument("package", help="d3stream package directory (config.json, model.safetensors)")
    ap.add_argument("out", help="GGUF file to write")
    ap.add_argument("--outtype", default="bf16", choices=sorted(LLAMA_FTYPES))
    ap.add_argument("--quantizer", default="auto", choices=["auto", "llama", "gguf"])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--bf16-cache", help="with --quantizer llama: the BF16 GGUF to reuse or "
                    "write (default OUT.bf16.gguf, removed afterwards)")
    args = ap.parse_args()

    quantizer = args.quantizer
    if quantizer == "auto":
        try:
            import llama_cpp  # noqa: F401
            quantizer = "llama"
        except ImportError:
            quantizer = "gguf"
    if args.outtype in ("f32", "bf16"):
        quantizer = "gguf"
    if quantizer == "gguf" and args.outtype not in GGUF_FILE_TYPES:
        raise SystemExit(f"st_to_gguf: the gguf package cannot quantise {args.outtype}; "
                         "use --quantizer llama (llama-cpp-python)")

    tmp = args.out + ".part"
    if quantizer == "gguf":
        convert(args.package, tmp, args.outtype)
    else:
        src = args.bf16_cache or args.out + ".bf16.gguf"
        if not os.path.exists(src):
            convert(args.package, src + ".part", "bf16")
            os.replace(src + ".part", src)
        llama_quantize(src, tmp, args.outtype, args.threads)
        if not args.bf16_cache:
            os.remove(src)
    os.replace(tmp, args.out)
    print(f"st_to_gguf: wrote {args.out} ({args.outtype}, {quantizer} quantiser, "
          f"{os.path.getsize(args.out) / 1e6:.1f} MB)", file=sys.stderr)


if __name__ == "__main__":
    main()
