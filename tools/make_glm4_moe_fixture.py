#!/usr/bin/env python3
"""Writes a glm4_moe golden fixture in the golden-fixture contract format (docs/fixtures.md).

Runs where torch + transformers 5.17 exist (the GPU machine). CPU is enough: the models are tiny.

  python3 tools/make_glm4_moe_fixture.py --variant a --out tests/fixtures/glm4_moe_tiny_a

What it does, and why (pitfalls seen in practice):
  1. builds a tiny Glm4MoeForCausalLM with non-trivial init (router scaled up, non-zero correction bias,
     so expert selection has clear margins and the bias path is exercised) plus an MTP layer at index L;
  2. saves it in bf16 and RELOADS the saved checkpoint in float32 (casting a model object to bf16 would
     also round its RoPE inv_freq buffer and skew every position);
  3. for each case: teacher-forced fp32 logits, a greedy continuation, and MTP logits built from
     transformers' own decoder-layer module with the layer-L weights;
  4. resamples prompts until every routing decision (top-k and group boundary) has a margin > 2e-3 and
     every greedy argmax a margin > 2e-3, so fp32 rounding cannot flip a choice.
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

import transformers
from transformers import Glm4MoeConfig, Glm4MoeForCausalLM
from transformers.models.glm4_moe import modeling_glm4_moe as hf

MARGIN = 2e-3

VARIANTS = {
    # a: qk-norm on, grouped routing (4 groups, keep 2), one dense first layer, 1 shared expert,
    #    norm_topk_prob on, untied embeddings, q/k/v bias, MTP layer.
    "a": dict(vocab_size=384, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
              num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
              partial_rotary_factor=0.5, rope_theta=10000.0, use_qk_norm=True, attention_bias=True,
              first_k_dense_replace=1, n_routed_experts=16, num_experts_per_tok=4, n_group=4,
              topk_group=2, n_shared_experts=1, norm_topk_prob=True, routed_scaling_factor=2.5,
              tie_word_embeddings=False, rms_norm_eps=1e-5, max_position_embeddings=512,
              num_nextn_predict_layers=1),
    # b: qk-norm off, no groups, MoE from layer 0, 2 shared experts, norm_topk_prob off,
    #    tied embeddings, no attention bias, 8 query heads over 1 KV head, MTP layer.
    "b": dict(vocab_size=320, hidden_size=48, intermediate_size=64, moe_intermediate_size=24,
              num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=1, head_dim=16,
              partial_rotary_factor=0.5, rope_theta=1000000.0, use_qk_norm=False, attention_bias=False,
              first_k_dense_replace=0, n_routed_experts=8, num_experts_per_tok=2, n_group=1,
              topk_group=1, n_shared_experts=2, norm_topk_prob=False, routed_scaling_factor=1.0,
              tie_word_embeddings=True, rms_norm_eps=1e-5, max_position_embeddings=512,
              num_nextn_predict_layers=1),
}
CASE_LENGTHS = [1, 5, 17, 64, 80]
GREEDY_TOKENS = 8


def init_weights(model, cfg, gen):
    """Non-trivial scales: std 0.08 for projections, router ~N(0, (2/sqrt(H))^2), bias U(-0.6, 0.6)."""
    H = cfg.hidden_size
    # e_score_correction_bias is a buffer, not a parameter: include buffers or it silently stays zero.
    tensors = list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers()
                                               if n.endswith("e_score_correction_bias")]
    for name, p in tensors:
        with torch.no_grad():
            if name.endswith("e_score_correction_bias"):
                p.copy_((torch.rand(p.shape, generator=gen) - 0.5) * 1.2)
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * (2.0 / H ** 0.5))
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.08)


def to_bf16_and_back(t):
    return t.to(torch.bfloat16).to(torch.float32)


def routing_margin(router_logits, bias, cfg):
    """Smallest margin of any selection in a [T, E] router-logit tensor (group boundary and top-k)."""
    s = torch.sigmoid(router_logits.float())
    sc = s + bias.float()
    T, E = sc.shape
    worst = float("inf")
    if cfg.n_group > 1:
        g = sc.view(T, cfg.n_group, E // cfg.n_group)
        gs = g.topk(2, dim=-1).values.sum(-1)  # [T, n_group]
        srt = gs.sort(dim=-1, descending=True).values
        worst = min(worst, (srt[:, cfg.topk_group - 1] - srt[:, cfg.topk_group]).min().item())
        keep = gs.topk(cfg.topk_group, dim=-1).indices
        mask = torch.zeros(T, cfg.n_group, dtype=torch.bool)
        mask.scatter_(1, keep, True)
        mask = mask.unsqueeze(-1).expand(T, cfg.n_group, E // cfg.n_group).reshape(T, E)
        sc = sc.masked_fill(~mask, float("-inf"))
    srt = sc.sort(dim=-1, descending=True).values
    k = cfg.num_experts_per_tok
    if k < E:
        gap = srt[:, k - 1] - srt[:, k]
        gap = torch.where(torch.isfinite(gap), gap, torch.full_like(gap, float("inf")))
        worst = min(worst, gap.min().item())
    return worst


def argmax_margin(logits):
    top2 = logits.float().topk(2, dim=-1).values
    return (top2[..., 0] - top2[..., 1]).min().item()


class RouterProbe:
    """Captures router logits of every MoE layer through forward hooks on `mlp.gate`."""

    def __init__(self):
        self.records = []

    def hook(self, module, inputs, output):
        logits = output[0] if isinstance(output, tuple) else output
        self.records.append((logits.detach().reshape(-1, logits.shape[-1]), module.e_score_correction_bias.detach()))

    def attach(self, modules):
        return [m.register_forward_hook(self.hook) for m in modules]


def build_mtp_layer(cfg, gen):
    L = cfg.num_hidden_layers
    layer = hf.Glm4MoeDecoderLayer(cfg, layer_idx=L)
    mods = torch.nn.ModuleDict({
        "enorm": hf.Glm4MoeRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps),
        "hnorm": hf.Glm4MoeRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps),
        "eh_proj": torch.nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False),
        "shared_head_norm": hf.Glm4MoeRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps),
        "layer": layer,
    })
    init_weights(mods, cfg, gen)
    with torch.no_grad():  # the checkpoint stores bf16: compute the reference from the rounded values
        for name, p in mods.named_parameters():
            if not name.endswith("e_score_correction_bias"):
                p.copy_(to_bf16_and_back(p))
    return mods.float().eval()


def mtp_state_dict_for_checkpoint(mods, cfg):
    """Layer-L tensors under HF on-disk names (per-expert keys, as save_pretrained writes them)."""
    L = cfg.num_hidden_layers
    pre = f"model.layers.{L}."
    out = {
        pre + "enorm.weight": mods["enorm"].weight,
        pre + "hnorm.weight": mods["hnorm"].weight,
        pre + "eh_proj.weight": mods["eh_proj"].weight,
        pre + "shared_head.norm.weight": mods["shared_head_norm"].weight,
    }
    I = cfg.moe_intermediate_size
    bufs = [(n, b) for n, b in mods["layer"].named_buffers() if n.endswith("e_score_correction_bias")]
    assert bufs, "the MTP layer has no e_score_correction_bias buffer"
    for name, p in list(mods["layer"].named_parameters()) + bufs:
        if name == "mlp.experts.gate_up_proj":          # [E, 2I, H]: rows 0..I-1 gate, I..2I-1 up
            for e in range(p.shape[0]):
                out[pre + f"mlp.experts.{e}.gate_proj.weight"] = p[e, :I]
                out[pre + f"mlp.experts.{e}.up_proj.weight"] = p[e, I:]
        elif name == "mlp.experts.down_proj":           # [E, H, I]
            for e in range(p.shape[0]):
                out[pre + f"mlp.experts.{e}.down_proj.weight"] = p[e]
        else:
            out[pre + name] = p
    res = {}
    for k, v in out.items():
        v = v.detach().contiguous()
        res[k] = v.float() if k.endswith("e_score_correction_bias") else v.to(torch.bfloat16)
    return res


def causal_mask(T):
    m = torch.full((T, T), torch.finfo(torch.float32).min)
    return torch.triu(m, diagonal=1)[None, None]


def run_mtp(model, mods, input_ids, h_post_norm):
    """mtp_logits[t] = lm_head(shared_head.norm(Layer_L(eh_proj(cat(enorm(embed(x[t+1])), hnorm(h[t]))))))."""
    T = input_ids.shape[0]
    if T < 2:
        return torch.zeros(0, model.config.vocab_size)
    e = model.model.embed_tokens(input_ids[1:][None])               # [1, T-1, H]
    h = h_post_norm[: T - 1][None]                                    # [1, T-1, H]
    x = mods["eh_proj"](torch.cat([mods["enorm"](e), mods["hnorm"](h)], dim=-1))
    pos = torch.arange(T - 1)[None]
    cos_sin = model.model.rotary_emb(x, pos)
    y = mods["layer"](x, attention_mask=causal_mask(T - 1), position_ids=pos, position_embeddings=cos_sin)
    if isinstance(y, tuple):
        y = y[0]
    y = mods["shared_head_norm"](y)
    return model.lm_head(y)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    gen = torch.Generator().manual_seed(args.seed)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")

    cfg = Glm4MoeConfig(**VARIANTS[args.variant])
    cfg._attn_implementation = "eager"
    model = Glm4MoeForCausalLM(cfg).float().eval()
    init_weights(model, cfg, gen)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    mods = build_mtp_layer(cfg, gen)

    os.makedirs(args.out, exist_ok=True)
    # Real checkpoints keep e_score_correction_bias in fp32 (transformers' _keep_in_fp32_modules_strict).
    biases = {n: b.detach().clone() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")}
    assert biases and all(b.abs().max() > 0 for b in biases.values()), "correction bias not initialised"
    model.to(torch.bfloat16)
    for n, b in model.named_buffers():
        if n in biases:
            b.data = biases[n]
    model.save_pretrained(args.out, safe_serialization=True)
    # Append the MTP layer's tensors to the saved checkpoint (transformers does not model them).
    st_path = os.path.join(args.out, "model.safetensors")
    tensors = load_file(st_path)
    tensors.update(mtp_state_dict_for_checkpoint(mods, cfg))
    save_file(tensors, st_path, metadata={"format": "pt"})
    print("checkpoint tensors:", len(tensors))

    # Reload the saved bf16 checkpoint in float32: this is the reference model.
    ref = Glm4MoeForCausalLM.from_pretrained(args.out, dtype=torch.float32, attn_implementation="eager").eval()
    if hasattr(ref.config, "_experts_implementation"):
        ref.config._experts_implementation = "eager"
    # The MTP layer's weights as stored (bf16 rounded), loaded back into the module.
    L = cfg.num_hidden_layers
    probe = RouterProbe()
    gates = [l.mlp.gate for l in ref.model.layers if hasattr(l.mlp, "gate")] + [mods["layer"].mlp.gate]
    probe.attach(gates)

    rng = torch.Generator().manual_seed(args.seed + 1)
    out = {}
    for i, T in enumerate(CASE_LENGTHS):
        for attempt in range(2000):
            ids = torch.randint(0, cfg.vocab_size, (T,), generator=rng)
            probe.records.clear()
            with torch.no_grad():
                ref.model(ids[None])
            if min(routing_margin(lg_, b, cfg) for lg_, b in probe.records) <= MARGIN:
                continue
            probe.records.clear()
            with torch.no_grad():
                seq = ids.clone()
                for _ in range(GREEDY_TOKENS):       # greedy by full recompute (no cache involved)
                    lg = ref(seq[None]).logits[0, -1]
                    seq = torch.cat([seq, lg.argmax()[None]])
                probe.records.clear()
                full = ref(seq[None], output_hidden_states=True)
                h_post = ref.model(seq[None]).last_hidden_state[0]
                mtp = run_mtp(ref, mods, seq, h_post)
            margins = [routing_margin(lg_, b, cfg) for lg_, b in probe.records]
            am = argmax_margin(full.logits[0, T - 1:])
            mm = argmax_margin(mtp) if mtp.shape[0] else float("inf")
            if min(margins) > MARGIN and am > MARGIN and mm > MARGIN:
                break
        else:
            sys.exit(f"case {i}: no prompt of length {T} with routing margins > {MARGIN} in 2000 tries")
        print(f"case {i}: T={T} attempt={attempt} routing margin={min(margins):.4f} greedy margin={am:.4f}")
        with torch.no_grad():
            logits = ref(ids[None]).logits[0].float()
            h_post = ref.model(ids[None]).last_hidden_state[0]
            mtp_l = run_mtp(ref, mods, ids, h_post).float()
        out[f"case.{i}.input_ids"] = ids.to(torch.int64).contiguous()
        out[f"case.{i}.logits"] = logits.contiguous()
        out[f"case.{i}.greedy"] = seq[T:].to(torch.int64).contiguous()
        if cfg.num_nextn_predict_layers:
            out[f"case.{i}.mtp_logits"] = mtp_l.contiguous()
    save_file(out, os.path.join(args.out, "reference.safetensors"),
              metadata={"generator": "tools/make_glm4_moe_fixture.py", "variant": args.variant,
                        "transformers": transformers.__version__, "torch": torch.__version__})
    for f in sorted(os.listdir(args.out)):
        print(f, os.path.getsize(os.path.join(args.out, f)))


if __name__ == "__main__":
    main()
