#!/usr/bin/env python3
"""FP8 block checkpoint of a bf16 fixture made by Hugging Face transformers' own FP8 quantization.

transformers quantizes on load (FineGrainedFP8Config: e4m3 weights, one f32 weight_scale_inv per
br x bc block, activation_scheme dynamic) and save_pretrained writes the quantized weights. Needs a CUDA GPU
(compute capability >= 9), torch and transformers 5.x. The block size is the largest power of two <= 128
dividing every Linear dimension of the fixture (transformers requires whole blocks; the tiny fixtures are
smaller than 128). transformers does not load the MTP layer (it is not part of its Glm4Moe model), so the
output has none; mxserve compares the main logits only.

If transformers saves routed experts fused per layer (mlp.experts.gate_up_proj [E, 2I, H] and down_proj
[E, H, I], with their _scale_inv), they are split back into the per-expert names of the fixture
(mlp.experts.E.{gate,up,down}_proj.weight): a renaming and slicing of transformers' bytes, never a
requantization (the block size divides I, so no scale block straddles gate and up).
"""
import argparse
import json
import math
import os
import re
import shutil

import torch
from safetensors.torch import load_file, save_file


def block_size(fixture):
    t = load_file(os.path.join(fixture, "model.safetensors"))
    g = 0
    for name, w in t.items():
        if w.dim() == 2 and name.endswith("_proj.weight"):
            g = math.gcd(g, math.gcd(w.shape[0], w.shape[1]))
    b = 1
    while b * 2 <= min(g, 128) and g % (b * 2) == 0:
        b *= 2
    return b


def unfuse_experts(tensors, moe_inter):
    """Per-expert tensors from fused [E, ...] ones (see the module docstring); returns (tensors, n_split)."""
    out, n = {}, 0
    for name, t in tensors.items():
        m = re.match(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)(_scale_inv)?$", name)
        if not m or t.dim() != 3:
            out[name] = t
            continue
        prefix, kind, scale = m.group(1), m.group(2), m.group(3) or ""
        suffix = ".weight" + ("_scale_inv" if scale else "")
        for e in range(t.shape[0]):
            if kind == "down_proj":
                out[f"{prefix}.{e}.down_proj{suffix}"] = t[e].contiguous()
            else:
                rows = t.shape[1] // 2  # I rows of gate, I of up (in blocks for the scale)
                out[f"{prefix}.{e}.gate_proj{suffix}"] = t[e, :rows].contiguous()
                out[f"{prefix}.{e}.up_proj{suffix}"] = t[e, rows:].contiguous()
        n += 1
    return out, n


def write(fixture, out):
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config
    b = block_size(fixture)
    qc = FineGrainedFP8Config(weight_block_size=(b, b))
    model = AutoModelForCausalLM.from_pretrained(fixture, quantization_config=qc, dtype=torch.float32,
                                                 device_map="cuda")
    tmp = out + ".hf"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    cfg = json.load(open(os.path.join(tmp, "config.json")))
    tensors = {}
    for f in sorted(os.listdir(tmp)):
        if f.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(tmp, f)))
    tensors, n_split = unfuse_experts(tensors, cfg.get("moe_intermediate_size"))
    n_fp8 = sum(1 for t in tensors.values() if t.dtype == torch.float8_e4m3fn)
    if n_fp8 == 0:
        raise SystemExit(f"{tmp}: transformers saved no float8_e4m3fn tensor; nothing to test")
    os.makedirs(out, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt", "writer": "transformers FineGrainedFP8Config via tools/independent_ckpt/fp8_hf.py"})
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    if os.path.exists(os.path.join(fixture, "generation_config.json")):
        shutil.copy(os.path.join(fixture, "generation_config.json"), out)
    names = sorted(tensors)
    with open(os.path.join(out, "LAYOUT.txt"), "w") as f:
        f.write(f"block {b}x{b}; {n_fp8} float8_e4m3fn tensors; fused expert tensors split: {n_split}\n")
        f.write("quantization_config: " + json.dumps(cfg.get("quantization_config")) + "\n")
        for n in names:
            f.write(f"{n} {str(tensors[n].dtype)} {list(tensors[n].shape)}\n")
    shutil.rmtree(tmp, ignore_errors=True)
    return b, n_fp8, n_split


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    b, n, s = write(a.fixture, a.out)
    print(f"{a.out}: block {b}x{b}, {n} FP8 tensors, {s} fused expert tensors split")
