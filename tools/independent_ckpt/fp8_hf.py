#!/usr/bin/env python3
"""FP8 block checkpoints of a bf16 fixture made by Hugging Face transformers' own FP8 quantization.

Two outputs per fixture (tests/data/independent_ckpt/README.md says what each is for):

<fx>_fp8_hf (write): transformers' quantization op itself (transformers.integrations.finegrained_fp8.Fp8Quantize,
  the op FineGrainedFP8Config runs on load; e4m3 weights, one f32 weight_scale_inv per br x bc block) applied
  to every Linear weight of the fixture's safetensors, in transformers' layout (X.weight float8_e4m3fn
  [out, in] + X.weight_scale_inv f32 [out/br, in/bc]). The Linears are those replace_with_fp8_linear converts:
  self_attn / mlp / shared_experts / routed experts *_proj, and the MTP (NextN) layer's too, eh_proj included
  (transformers does not model that layer; an nn.Linear there would be converted like any other). Not
  converted, as in transformers: lm_head (and the MTP shared_head.head copy), embeddings, norms, biases, the
  router mlp.gate (not an nn.Linear). Float tensors keep the fixture's dtype. Runs on CPU.

<fx>_fp8_hf_saved (write_saved): AutoModelForCausalLM.from_pretrained(fixture, FineGrainedFP8Config) then
  save_pretrained, as a user would. Needs a CUDA GPU (compute capability >= 9). transformers drops the MTP
  layer (not part of its Glm4Moe model), so this one has none. transformers 5.17 writes FP8-block(e4m3(w)):
  the weight cast to e4m3 without a scale first; LAYOUT.txt records, per tensor, which of FP8-block(w) and
  FP8-block(e4m3(w)) the saved bytes equal.

The block size is the largest power of two <= 128 dividing every Linear dimension of the fixture
(transformers quantizes only whole blocks; the tiny fixtures are smaller than 128).
"""
import argparse
import json
import math
import os
import re
import shutil
import types

import torch
from safetensors.torch import load_file, save_file

# The Linear weights replace_with_fp8_linear converts (see the module docstring).
LINEAR = re.compile(r".*\.(q|k|v|o|gate|up|down|eh)_proj\.weight$")


def block_size(fixture):
    t = load_file(os.path.join(fixture, "model.safetensors"))
    g = 0
    for name, w in t.items():
        if w.dim() == 2 and LINEAR.match(name):
            g = math.gcd(g, math.gcd(w.shape[0], w.shape[1]))
    b = 1
    while b * 2 <= min(g, 128) and g % (b * 2) == 0:
        b *= 2
    return b


def quantize_op(b):
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import Fp8Quantize
    qc = FineGrainedFP8Config(weight_block_size=[b, b])
    return qc, Fp8Quantize(types.SimpleNamespace(quantization_config=qc))


def dequantize(q, s, b):
    """q [r, c] e4m3, s the [r/b, c/b] grid (any squeezing) -> f32 [r, c]."""
    r, c = q.shape
    return (q.float().reshape(r // b, b, c // b, b) * s.float().reshape(r // b, 1, c // b, 1)).reshape(r, c)


def copy_side_files(fixture, out, qc, tensors, b, notes):
    cfg = json.load(open(os.path.join(fixture, "config.json")))
    cfg["quantization_config"] = qc
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    if os.path.exists(os.path.join(fixture, "generation_config.json")):
        shutil.copy(os.path.join(fixture, "generation_config.json"), out)
    n_fp8 = sum(1 for t in tensors.values() if t.dtype == torch.float8_e4m3fn)
    with open(os.path.join(out, "LAYOUT.txt"), "w") as f:
        f.write(f"block {b}x{b}; {n_fp8} float8_e4m3fn tensors\n")
        f.write("quantization_config: " + json.dumps(qc) + "\n")
        for line in notes:
            f.write(line + "\n")
        for n in sorted(tensors):
            f.write(f"{n} {str(tensors[n].dtype)} {list(tensors[n].shape)}\n")
    return n_fp8


def write(fixture, out):
    """<fx>_fp8_hf: transformers' Fp8Quantize on every Linear of the fixture, MTP layer included."""
    b = block_size(fixture)
    qc, op = quantize_op(b)
    src = load_file(os.path.join(fixture, "model.safetensors"))
    tensors, worst = {}, 0.0
    for name, w in src.items():
        if not (w.dim() == 2 and LINEAR.match(name)):
            tensors[name] = w
            continue
        got = op.convert({name: w})
        scale_name = name[: -len(".weight")] + ".weight_scale_inv"
        if set(got) != {name, scale_name} or got[name].dtype != torch.float8_e4m3fn:
            raise SystemExit(f"{name} {list(w.shape)}: transformers' Fp8Quantize returned {sorted(got)} "
                             f"(block {b}x{b} should divide it)")
        # transformers' own reading of its output: every element within 1/16 of its block's amax.
        err = (dequantize(got[name], got[scale_name], b) - w.float()).abs()
        amax = w.float().abs().reshape(w.shape[0] // b, b, w.shape[1] // b, b).amax(dim=(1, 3))
        rel = (err.reshape(w.shape[0] // b, b, w.shape[1] // b, b) / amax.clamp(min=1e-30)[:, None, :, None]).max()
        if rel > 1 / 16:
            raise SystemExit(f"{name}: dequantized error {rel:.4f} of the block amax exceeds e4m3's 1/16")
        worst = max(worst, float(rel))
        tensors.update({k: v.contiguous() for k, v in got.items()})
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt", "writer": "transformers Fp8Quantize via tools/independent_ckpt/fp8_hf.py"})
    qd = qc.to_dict()
    qd["weight_block_size"] = [b, b]
    n = copy_side_files(fixture, out, qd, tensors, b,
                        [f"producer: transformers Fp8Quantize per Linear (MTP layer included); worst "
                         f"|dequant - w| / block amax {worst:.5f}"])
    return b, n


def unfuse_experts(tensors):
    """Per-expert tensors from fused [E, ...] ones, if transformers saved any; returns (tensors, n_split).

    A renaming and slicing of transformers' bytes, never a requantization (the block size divides I, so no
    scale block straddles gate and up)."""
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


def write_saved(fixture, out):
    """<fx>_fp8_hf_saved: from_pretrained(FineGrainedFP8Config) + save_pretrained (see the module docstring)."""
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
    tensors, n_split = unfuse_experts(tensors)
    if not any(t.dtype == torch.float8_e4m3fn for t in tensors.values()):
        raise SystemExit(f"{tmp}: transformers saved no float8_e4m3fn tensor; nothing to test")
    # Which quantization the saved bytes are: FP8-block(w) or FP8-block(e4m3(w)) (transformers 5.17).
    _, op = quantize_op(b)
    src = load_file(os.path.join(fixture, "model.safetensors"))
    same = {"fp8_block(w)": 0, "fp8_block(e4m3(w))": 0, "neither": 0}
    for name, q in tensors.items():
        if q.dtype != torch.float8_e4m3fn:
            continue
        s = tensors[name[: -len(".weight")] + ".weight_scale_inv"].cpu()
        w = src[name].float()
        direct = op.convert({name: w})
        cast = op.convert({name: w.to(torch.float8_e4m3fn).float()})
        key = "neither"
        for k, ref in (("fp8_block(w)", direct), ("fp8_block(e4m3(w))", cast)):
            if torch.equal(ref[name].view(torch.uint8), q.cpu().view(torch.uint8)) and \
                    torch.equal(list(v for n, v in ref.items() if n != name)[0].flatten(), s.flatten()):
                key = k
                break
        same[key] += 1
    os.makedirs(out, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt", "writer": "transformers FineGrainedFP8Config via tools/independent_ckpt/fp8_hf.py"})
    n = copy_side_files(fixture, out, cfg["quantization_config"], tensors, b,
                        [f"producer: from_pretrained + save_pretrained; fused expert tensors split: {n_split}",
                         "saved FP8 tensors equal to: " + json.dumps(same)])
    # The rest of transformers' config (it may differ from the fixture's beyond quantization_config).
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    shutil.rmtree(tmp, ignore_errors=True)
    return b, n, n_split, same


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--out", required=True, help="the <fx>_fp8_hf directory")
    ap.add_argument("--saved-out", help="also write the save_pretrained one here (needs CUDA)")
    a = ap.parse_args()
    print(f"{a.out}: block, FP8 tensors = {write(a.fixture, a.out)}")
    if a.saved_out:
        print(f"{a.saved_out}: block, FP8 tensors, fused split, provenance = {write_saved(a.fixture, a.saved_out)}")
