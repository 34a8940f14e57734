#!/usr/bin/env python3
"""Writes an MXFP4 checkpoint of a bf16 fixture in AMD Quark's layout, with a writer independent of mxserve.

The format, from its definition (OCP MX v1.0; Quark's "even" scale rule, docs/quant.md, research notes
models-formats.md sections 4.1-4.5), written here in numpy:
  - per row, blocks of 32 consecutive input elements (the last block of a row may be partial: an mxserve
    extension the tiny fixtures need);
  - scale: a = (bits(amax) + 0x200000) & 0x7F800000, byte = clamp(exponent(a) - 2, 0, 254), X = 2^(byte - 127);
  - elements: x / X rounded to the nearest E2M1 value {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to the even code,
    saturating at 6; the sign bit is kept (negative values that round to 0 give -0, code 0x8);
  - packing: element 2i in the low nibble, 2i+1 in the high nibble; X.weight u8 [out, in/2],
    X.weight_scale u8 [out, ceil(in/32)].
Quantized: every Linear of the MLPs (routed experts, shared experts, dense MLP). Kept bf16 and listed in
quantization_config.exclude: attention (re:.*self_attn.*), the router (re:.*mlp.gate$), lm_head, and every
Linear of the MTP layer(s) (layer index >= num_hidden_layers) by its exact module name.
"""
import argparse
import json
import os
import shutil

import numpy as np
import torch
from safetensors.torch import load_file, save_file

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)


def even_scale_bytes(amax):
    """amax: float32 array -> E8M0 bytes under Quark's 'even' rule."""
    bits = amax.astype(np.float32).view(np.uint32).astype(np.uint64)
    a = (bits + 0x200000) & 0x7F800000
    e = (a >> 23).astype(np.int64)
    byte = np.clip(e - 2, 0, 254)
    byte[e == 255] = 254
    return byte.astype(np.uint8)


def e2m1_codes(scaled):
    """scaled: float32 array of x / X -> 4-bit codes (round to nearest, ties to the even code, saturate)."""
    mag = np.minimum(np.abs(scaled), 6.0)
    dist = np.abs(mag[..., None] - E2M1)  # [..., 8]
    best = dist.min(axis=-1, keepdims=True)
    is_best = dist == best
    # Ties: two grid points at the same distance; the even code (0, 2, 4, 6) wins.
    even_pref = np.where(is_best & (np.arange(8) % 2 == 0), 1, 0)
    has_even = even_pref.any(axis=-1, keepdims=True)
    choice = np.where(has_even, even_pref, is_best.astype(np.int64))
    code = choice.argmax(axis=-1).astype(np.uint8)
    sign = np.signbit(scaled).astype(np.uint8) << 3
    return code | sign


def quantize_mxfp4(w):
    """w: float32 [out, in] -> (packed u8 [out, in/2], scales u8 [out, ceil(in/32)])."""
    out_f, in_f = w.shape
    assert in_f % 2 == 0, "MXFP4 needs an even input width"
    n_blocks = (in_f + 31) // 32
    scales = np.zeros((out_f, n_blocks), dtype=np.uint8)
    codes = np.zeros((out_f, in_f), dtype=np.uint8)
    for b in range(n_blocks):
        blk = w[:, b * 32:(b + 1) * 32]
        s = even_scale_bytes(np.abs(blk).max(axis=1))
        scales[:, b] = s
        X = np.ldexp(np.float32(1.0), s.astype(np.int32) - 127).astype(np.float32)
        codes[:, b * 32:(b + 1) * 32] = e2m1_codes(blk / X[:, None])
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, scales


def is_mlp_linear(name):
    return name.endswith("_proj.weight") and ".mlp." in name and "self_attn" not in name


def write(fixture, out):
    cfg = json.load(open(os.path.join(fixture, "config.json")))
    n_layers = cfg["num_hidden_layers"]
    tensors = load_file(os.path.join(fixture, "model.safetensors"))
    result, exclude, n_quant = {}, ["lm_head", "re:.*self_attn.*", "re:.*mlp.gate$"], 0
    for name, t in sorted(tensors.items()):
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else -1
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        if layer >= n_layers:  # the MTP layer stays bf16, every Linear of it named in exclude
            result[name] = t
            if module and t.dim() == 2 and (name.endswith("_proj.weight") or ".eh_proj." in name):
                exclude.append(module)
            continue
        if is_mlp_linear(name) and t.dim() == 2:
            packed, scales = quantize_mxfp4(t.float().numpy())
            result[name] = torch.from_numpy(packed)
            result[module + ".weight_scale"] = torch.from_numpy(scales)
            n_quant += 1
        else:
            result[name] = t
    os.makedirs(out, exist_ok=True)
    save_file(result, os.path.join(out, "model.safetensors"), metadata={"format": "pt", "writer": "tools/independent_ckpt/mxfp4_quark.py"})
    weight_spec = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "ch_axis": -1, "is_dynamic": False,
                   "scale_format": "e8m0", "scale_type": "float", "scale_calculation_mode": "even",
                   "round_method": "half_even", "observer_cls": "PerBlockMXObserver", "symmetric": None,
                   "mx_element_dtype": None, "is_scale_quant": False}
    cfg["quantization_config"] = {
        "quant_method": "quark", "quant_mode": "eager_mode",
        "global_quant_config": {"weight": weight_spec, "input_tensors": None, "output_tensors": None, "bias": None,
                                "target_device": None},
        "exclude": exclude, "layer_quant_config": {}, "layer_type_quant_config": {}, "kv_cache_quant_config": {},
        "export": {"kv_cache_group": [], "min_kv_scale": 0.0, "pack_method": "reorder",
                   "weight_format": "real_quantized", "weight_merge_groups": None}}
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    if os.path.exists(os.path.join(fixture, "generation_config.json")):
        shutil.copy(os.path.join(fixture, "generation_config.json"), out)
    return n_quant, exclude


def self_check():
    """The writer's own unit checks (ties, saturation, signs, scales), run before writing anything."""
    assert list(e2m1_codes(np.array([0.25, 0.75, 2.5, 5.0, 7.0, -0.1, -6.0], dtype=np.float32))) == \
        [0x0, 0x2, 0x4, 0x6, 0x7, 0x8, 0xF]
    assert list(even_scale_bytes(np.array([6.0, 7.0, 0.0, 1.0], dtype=np.float32))) == [127, 128, 0, 125]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    self_check()
    n, excl = write(a.fixture, a.out)
    print(f"{a.out}: {n} MXFP4 tensors; exclude {excl}")
