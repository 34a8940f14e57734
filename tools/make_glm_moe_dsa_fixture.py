#!/usr/bin/env python3
"""Writes a glm_moe_dsa (GLM-5.x: MLA + DSA indexer + MoE + MTP) golden fixture in the docs/fixtures.md format.

Runs where torch + transformers 5.17 exist (the GPU machine). CPU is enough: the models are tiny.

  python3 tools/make_glm_moe_dsa_fixture.py --variant a --out tests/fixtures/glm_moe_dsa_tiny_a

Same recipe as tools/make_glm4_moe_fixture.py, plus what DSA needs:
  1. a tiny GlmMoeDsaForCausalLM with index_topk SMALLER than the longer prompts (so the sparse selection
     matters), a mix of "full" and "shared" indexer layers, dense first layer(s), and an MTP layer at index L
     built from transformers' own GlmMoeDsaDecoderLayer (its own full indexer, a sparse MoE);
  2. saved in bf16; routed experts rewritten as per-expert keys (mlp.experts.{e}.{gate,up,down}_proj.weight) if
     save_pretrained wrote fused ones; the reference is a fresh fp32 model loaded by hand from exactly the saved
     tensors (from_pretrained is run as a cross-check of the same logits);
  3. prompts resampled until every routing decision, every indexer top-k boundary (score gap between the
     k-th and (k+1)-th causal key, every full layer and the MTP layer), and every greedy argmax has a
     margin > 2e-3, so fp32 rounding cannot flip a decision;
  4. extra debug tensors `debug.case.{i}.topk.layer.{l}` (i64 [T, k], the selected key set per row, sorted,
     -1 padded) for the full indexer layers of the teacher-forced pass; verify-fixture ignores them.
"""
import argparse
import copy
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import transformers
from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM
from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as hf

# Decision margins (router top-k / group boundaries, indexer top-k boundaries, greedy argmax) must exceed this:
# 200x the fp32 CPU-vs-transformers logit error (~1e-6), so fp32 rounding cannot flip a decision. (2e-3, the
# glm4_moe value, left no 48-token prompt in 4000 tries with 4 router layers + 3 indexers per row.)
MARGIN = 2e-4
MAX_ATTEMPTS = 150

COMMON = dict(rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}, max_position_embeddings=512,
              rms_norm_eps=1e-5, attention_bias=False, hidden_act="silu", num_nextn_predict_layers=1,
              rope_interleave=True, indexer_rope_interleave=True)
VARIANTS = {
    # a: 4 layers, indexer full/shared/full/shared, one dense first layer, grouped routing (2 groups keep 1),
    #    norm_topk_prob on, untied embeddings, index_topk 6 < prompts of 17 and 48 tokens.
    "a": dict(vocab_size=384, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
              num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
              q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24,
              index_topk=6, index_head_dim=16, index_n_heads=4,
              indexer_types=["full", "shared", "full", "shared"],
              mlp_layer_types=["dense", "sparse", "sparse", "sparse"], first_k_dense_replace=1,
              n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
              norm_topk_prob=True, routed_scaling_factor=2.5, tie_word_embeddings=False),
    # b: 3 layers, indexer full/full/shared, MoE from layer 0, no groups, norm_topk_prob off, 2 shared experts,
    #    tied embeddings, 8 heads, index_topk 4 with 2 index heads and a wider rope part.
    "b": dict(vocab_size=320, hidden_size=48, intermediate_size=64, moe_intermediate_size=24,
              num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=8,
              q_lora_rank=32, kv_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=16, v_head_dim=12,
              index_topk=4, index_head_dim=24, index_n_heads=2,
              indexer_types=["full", "full", "shared"],
              mlp_layer_types=["sparse", "sparse", "sparse"], first_k_dense_replace=0,
              n_routed_experts=8, num_experts_per_tok=3, n_group=1, topk_group=1, n_shared_experts=2,
              norm_topk_prob=False, routed_scaling_factor=1.0, tie_word_embeddings=True),
}
CASE_LENGTHS = [1, 5, 12, 20]  # index_topk (6 / 4) < 12 and 20: the sparse selection matters
GREEDY_TOKENS = 8


def init_weights(model, cfg, gen):
    """std 0.08 projections, router ~N(0, (2/sqrt(H))^2), correction bias U(-0.6, 0.6), norms ~1+N(0,0.2^2);
    indexer projections larger (std 0.25) so index scores are O(1) and top-k gaps are clear."""
    H = cfg.hidden_size
    tensors = list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers()
                                               if n.endswith("e_score_correction_bias")]
    for name, p in tensors:
        with torch.no_grad():
            if name.endswith("e_score_correction_bias"):
                p.copy_((torch.rand(p.shape, generator=gen) - 0.5) * 1.2)
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * (2.0 / H ** 0.5))
            elif "norm" in name and name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif "indexer" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.25)
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
        gs = g.topk(2, dim=-1).values.sum(-1)
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


def index_scores(ix, hidden_states, q_resid, cos_sin):
    """[S, T] causal index scores of one (uncached, batch 1) indexer call, recomputed as the module does."""
    S = hidden_states.shape[1]
    cos, sin = cos_sin
    q = ix.wq_b(q_resid).view(1, S, ix.n_heads, ix.head_dim)
    q_rot, q_pass = torch.split(q, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim], dim=-1)
    k = ix.k_norm(ix.wk(hidden_states)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim], dim=-1)
    q_rot, k_rot = hf.apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    scores = F.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * ix.softmax_scale)
    w = ix.weights_proj(hidden_states.to(ix.weights_proj.weight.dtype)).float() * (ix.n_heads ** -0.5)
    sc = torch.matmul(w.unsqueeze(-2), scores).squeeze(-2)[0]  # [S, S]
    return sc.masked_fill(torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1), float("-inf"))


class Probe:
    """Router logits of every MoE gate, index-score margins and selected sets of every indexer call."""

    def __init__(self, topk):
        self.topk = topk
        self.routers = []
        self.index_margins = []
        self.index_sets = []  # (indexer module, [S, k] sorted selected keys, -1 padded)

    def clear(self):
        self.routers.clear()
        self.index_margins.clear()
        self.index_sets.clear()

    def router_hook(self, module, inputs, output):
        logits = output[0] if isinstance(output, tuple) else output
        self.routers.append((logits.detach().reshape(-1, logits.shape[-1]), module.e_score_correction_bias.detach()))

    def indexer_hook(self, module, args, kwargs, output):
        hidden_states, q_resid, cos_sin = args[0], args[1], args[2]
        assert hidden_states.shape[0] == 1 and kwargs.get("past_key_values") is None, "probe expects no cache"
        sc = index_scores(module, hidden_states, q_resid, cos_sin)
        S = sc.shape[0]
        k = self.topk
        sel = torch.full((S, min(k, S)), -1, dtype=torch.int64)
        worst = float("inf")
        for s in range(S):
            n = s + 1
            if n <= k:
                sel[s, :n] = torch.arange(n)
                continue
            vals, idx = sc[s, :n].sort(descending=True)
            gap = (vals[k - 1] - vals[k]).item()
            worst = min(worst, gap)
            sel[s] = idx[:k].sort().values
            got = output[0, s].long().sort().values
            # Near a tie either choice is legitimate (and the prompt is rejected by the margin check).
            assert gap <= 1e-5 or torch.equal(got, sel[s]), f"recomputed top-k differs from the module's at row {s}"
        self.index_margins.append(worst)
        self.index_sets.append((module, sel))

    def attach(self, gates, indexers):
        for g in gates:
            g.register_forward_hook(self.router_hook)
        for ix in indexers:
            ix.register_forward_hook(self.indexer_hook, with_kwargs=True)


def mtp_config(cfg):
    """The MTP layer is decoder layer L: extend the per-layer lists (its indexer is full, its MLP sparse)."""
    c = copy.deepcopy(cfg)
    c.indexer_types = list(cfg.indexer_types) + ["full"]
    c.mlp_layer_types = list(cfg.mlp_layer_types) + ["sparse"]
    c.layer_types = list(cfg.layer_types) + [cfg.layer_types[-1]]
    return c


def build_mtp_layer(cfg, gen):
    L = cfg.num_hidden_layers
    layer = hf.GlmMoeDsaDecoderLayer(mtp_config(cfg), layer_idx=L)
    mods = torch.nn.ModuleDict({
        "enorm": hf.GlmMoeDsaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps),
        "hnorm": hf.GlmMoeDsaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps),
        "eh_proj": torch.nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False),
        "shared_head_norm": hf.GlmMoeDsaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps),
        "layer": layer,
    })
    init_weights(mods, cfg, gen)
    with torch.no_grad():  # the checkpoint stores bf16: compute the reference from the rounded values
        for name, p in mods.named_parameters():
            if not name.endswith("e_score_correction_bias"):
                p.copy_(to_bf16_and_back(p))
    return mods.float().eval()


def split_fused_experts(tensors, prefix, p_name, p, I):
    """Fused [E, 2I, H] gate_up / [E, H, I] down -> per-expert HF keys; returns False if not an expert tensor."""
    if p_name.endswith("mlp.experts.gate_up_proj"):
        base = prefix + p_name[: -len("gate_up_proj")]
        for e in range(p.shape[0]):
            tensors[base + f"{e}.gate_proj.weight"] = p[e, :I]
            tensors[base + f"{e}.up_proj.weight"] = p[e, I:]
        return True
    if p_name.endswith("mlp.experts.down_proj"):
        base = prefix + p_name[: -len("down_proj")]
        for e in range(p.shape[0]):
            tensors[base + f"{e}.down_proj.weight"] = p[e]
        return True
    return False


def mtp_state_dict_for_checkpoint(mods, cfg):
    """Layer-L tensors under HF on-disk names (per-expert keys)."""
    L = cfg.num_hidden_layers
    pre = f"model.layers.{L}."
    out = {
        pre + "enorm.weight": mods["enorm"].weight,
        pre + "hnorm.weight": mods["hnorm"].weight,
        pre + "eh_proj.weight": mods["eh_proj"].weight,
        pre + "shared_head.norm.weight": mods["shared_head_norm"].weight,
    }
    bufs = [(n, b) for n, b in mods["layer"].named_buffers() if n.endswith("e_score_correction_bias")]
    assert bufs, "the MTP layer has no e_score_correction_bias buffer"
    for name, p in list(mods["layer"].named_parameters()) + bufs:
        if not split_fused_experts(out, pre, name, p, cfg.moe_intermediate_size):
            out[pre + name] = p
    res = {}
    for k, v in out.items():
        v = v.detach().contiguous()
        res[k] = v.float() if k.endswith("e_score_correction_bias") else v.to(torch.bfloat16)
    return res


def normalise_saved_experts(tensors, cfg):
    """If save_pretrained wrote fused expert tensors, rewrite them as per-expert keys (the on-disk HF layout)."""
    out = {}
    for k, v in tensors.items():
        if not split_fused_experts(out, "", k, v, cfg.moe_intermediate_size):
            out[k] = v
    return {k: v.contiguous() for k, v in out.items()}


def reference_model(cfg, tensors):
    """A fresh fp32 GlmMoeDsaForCausalLM holding exactly the checkpoint's (bf16-rounded) tensors. Built by hand
    (per-expert keys stacked into the fused in-memory experts) so the reference never depends on how
    from_pretrained maps expert names; every parameter and persistent buffer must come from the checkpoint."""
    ref = GlmMoeDsaForCausalLM(cfg).float().eval()
    if hasattr(ref.config, "_experts_implementation"):
        ref.config._experts_implementation = "eager"
    E = cfg.n_routed_experts
    new = {}
    for k, v in ref.state_dict().items():
        if k in tensors:
            src = tensors[k]
        elif k.endswith("mlp.experts.gate_up_proj"):
            base = k[: -len("gate_up_proj")]
            src = torch.stack([torch.cat([tensors[f"{base}{e}.gate_proj.weight"], tensors[f"{base}{e}.up_proj.weight"]])
                               for e in range(E)])
        elif k.endswith("mlp.experts.down_proj"):
            base = k[: -len("down_proj")]
            src = torch.stack([tensors[f"{base}{e}.down_proj.weight"] for e in range(E)])
        elif k == "lm_head.weight" and cfg.tie_word_embeddings:
            src = tensors["model.embed_tokens.weight"]
        else:
            sys.exit(f"reference model tensor {k} is not in the checkpoint")
        assert tuple(src.shape) == tuple(v.shape), f"{k}: checkpoint {tuple(src.shape)} vs model {tuple(v.shape)}"
        new[k] = src.float()
    ref.load_state_dict(new, strict=True)
    return ref


def cross_check_from_pretrained(ref, out_dir, cfg):
    """transformers' own loader on the written checkpoint must give the same logits (a warning if it cannot)."""
    try:
        hf_ref = GlmMoeDsaForCausalLM.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager").eval()
        if hasattr(hf_ref.config, "_experts_implementation"):
            hf_ref.config._experts_implementation = "eager"
        ids = torch.arange(24)[None] % cfg.vocab_size
        with torch.no_grad():
            a = ref(ids, use_cache=False).logits
            b = hf_ref(ids, use_cache=False).logits
        d = ((a - b).norm() / a.norm()).item()
        print(f"from_pretrained cross-check: rel diff {d:.2e}" + ("" if d < 1e-6 else "  <-- WARNING: differs"))
    except Exception as e:  # noqa: BLE001 - a diagnostic, not the reference
        print(f"WARNING: from_pretrained cross-check failed: {e!r}")


def causal_mask(T):
    m = torch.full((T, T), torch.finfo(torch.float32).min)
    return torch.triu(m, diagonal=1)[None, None]


def run_mtp(model, mods, input_ids, h_post_norm):
    """mtp_logits[t] = lm_head(shared_head.norm(Layer_L(eh_proj(cat(enorm(embed(x[t+1])), hnorm(h[t]))))))."""
    T = input_ids.shape[0]
    if T < 2:
        return torch.zeros(0, model.config.vocab_size)
    e = model.model.embed_tokens(input_ids[1:][None])
    h = h_post_norm[: T - 1][None]
    x = mods["eh_proj"](torch.cat([mods["enorm"](e), mods["hnorm"](h)], dim=-1))
    pos = torch.arange(T - 1)[None]
    cos_sin = model.model.rotary_emb(x, pos)
    y = mods["layer"](x, attention_mask=causal_mask(T - 1), position_ids=pos, position_embeddings=cos_sin,
                      past_key_values=None, prev_topk_indices=None)
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

    cfg = GlmMoeDsaConfig(**COMMON, **VARIANTS[args.variant])
    assert list(cfg.indexer_types) == VARIANTS[args.variant]["indexer_types"], cfg.indexer_types
    assert cfg.head_dim == cfg.qk_rope_head_dim, "RoPE dim must be qk_rope_head_dim"
    cfg._attn_implementation = "eager"
    model = GlmMoeDsaForCausalLM(cfg).float().eval()
    init_weights(model, cfg, gen)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    mods = build_mtp_layer(cfg, gen)

    os.makedirs(args.out, exist_ok=True)
    biases = {n: b.detach().clone() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")}
    assert biases and all(b.abs().max() > 0 for b in biases.values()), "correction bias not initialised"
    model.to(torch.bfloat16)
    for n, b in model.named_buffers():
        if n in biases:
            b.data = biases[n]
    model.save_pretrained(args.out, safe_serialization=True)
    st_path = os.path.join(args.out, "model.safetensors")
    tensors = normalise_saved_experts(load_file(st_path), cfg)
    tensors.update(mtp_state_dict_for_checkpoint(mods, cfg))
    save_file(tensors, st_path, metadata={"format": "pt"})
    print("checkpoint tensors:", len(tensors))
    for k in sorted(tensors):
        if ".layers.0." in k or f".layers.{cfg.num_hidden_layers}." in k:
            print(f"  {k} {tuple(tensors[k].shape)} {tensors[k].dtype}")

    ref = reference_model(cfg, tensors)
    cross_check_from_pretrained(ref, args.out, cfg)
    L = cfg.num_hidden_layers
    probe = Probe(cfg.index_topk)
    gates = [l.mlp.gate for l in ref.model.layers if hasattr(l.mlp, "gate")] + [mods["layer"].mlp.gate]
    indexers = [l.self_attn.indexer for l in ref.model.layers if l.self_attn.indexer is not None]
    indexers.append(mods["layer"].self_attn.indexer)
    assert len(indexers) == cfg.indexer_types.count("full") + 1
    probe.attach(gates, indexers)
    layer_of = {id(l.self_attn.indexer): i for i, l in enumerate(ref.model.layers) if l.self_attn.indexer is not None}

    def fwd(ids):
        return ref(ids[None], use_cache=False)

    def hidden(ids):
        return ref.model(ids[None], use_cache=False).last_hidden_state[0]

    rng = torch.Generator().manual_seed(args.seed + 1)
    out = {}
    for i, T in enumerate(CASE_LENGTHS):
        best = None  # (worst margin, ids, seq, routing, index, greedy) of the best prompt seen
        for attempt in range(MAX_ATTEMPTS):
            ids = torch.randint(0, cfg.vocab_size, (T,), generator=rng)
            probe.clear()
            with torch.no_grad():
                ref.model(ids[None], use_cache=False)
            cheap = min(min(routing_margin(lg_, b, cfg) for lg_, b in probe.routers), min(probe.index_margins))
            if best is not None and cheap <= best[0]:
                continue
            with torch.no_grad():
                seq = ids.clone()
                for _ in range(GREEDY_TOKENS):       # greedy by full recompute (no cache involved)
                    lg = fwd(seq).logits[0, -1]
                    seq = torch.cat([seq, lg.argmax()[None]])
                probe.clear()
                full = fwd(seq)
                h_post = hidden(seq)
                mtp = run_mtp(ref, mods, seq, h_post)
            rm = min(routing_margin(lg_, b, cfg) for lg_, b in probe.routers)
            am = argmax_margin(full.logits[0, T - 1:])
            mm = argmax_margin(mtp) if mtp.shape[0] else float("inf")
            im = min(probe.index_margins)
            worst = min(rm, am, mm, im)
            if best is None or worst > best[0]:
                best = (worst, ids, seq, rm, im, am)
            if worst > MARGIN:
                break
        worst, ids, seq, rm, im, am = best
        if worst <= MARGIN:
            sys.exit(f"case {i}: no prompt of length {T} with decision margins > {MARGIN} in {MAX_ATTEMPTS} tries "
                     f"(best {worst:.2e})")
        margins = [rm]
        print(f"case {i}: T={T} attempt={attempt} routing margin={min(margins):.4f} index margin={im:.4f} "
              f"greedy margin={am:.4f}")
        with torch.no_grad():
            probe.clear()
            logits = fwd(ids).logits[0].float()
            for module, sel in probe.index_sets:
                if id(module) in layer_of:
                    out[f"debug.case.{i}.topk.layer.{layer_of[id(module)]}"] = sel.contiguous()
            h_post = hidden(ids)
            mtp_l = run_mtp(ref, mods, ids, h_post).float()
        out[f"case.{i}.input_ids"] = ids.to(torch.int64).contiguous()
        out[f"case.{i}.logits"] = logits.contiguous()
        out[f"case.{i}.greedy"] = seq[T:].to(torch.int64).contiguous()
        out[f"case.{i}.mtp_logits"] = mtp_l.contiguous()
    save_file(out, os.path.join(args.out, "reference.safetensors"),
              metadata={"generator": "tools/make_glm_moe_dsa_fixture.py", "variant": args.variant,
                        "transformers": transformers.__version__, "torch": torch.__version__})
    for f in sorted(os.listdir(args.out)):
        print(f, os.path.getsize(os.path.join(args.out, f)))


if __name__ == "__main__":
    main()
