"""A plain-torch glm4_moe (+ its MTP layer) for TRAINING the tiny model, computing what transformers 5.17 and
mxserve compute (research/models-formats.md sections 1-2), written for speed: the routed experts are evaluated
densely (all E experts for every token, then combined with the top-k routing weights), which is exact and fast
at E = 8.

It owns: the module tree, the forward (main model and MTP), the aux-loss-free balancing update of
e_score_correction_bias, and the mapping to Hugging Face tensor names (`hf_tensors`). The training loop and the
checks against transformers live in train.py. Invariant: with dropout 0 and float32, `forward` equals
transformers' Glm4MoeForCausalLM on the tensors `hf_tensors` writes (train.py measures it).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):  # as HF: normalise in fp32, cast back, then multiply by the weight
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_cos_sin(c, positions, device):
    """cos, sin [T, rd] of HF's GlmRotaryEmbedding (rd = head_dim * partial_rotary_factor, NeoX half split)."""
    rd = int(c["head_dim"] * c["partial_rotary_factor"])
    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, rd, 2, dtype=torch.int64, device=device).float() / rd))
    ang = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):  # x [B, heads, T, D]; rotates the first rd dims, the rest pass through
    rd = cos.shape[-1]
    xr, xp = x[..., :rd], x[..., rd:]
    x1, x2 = xr[..., : rd // 2], xr[..., rd // 2:]
    rot = torch.cat([-x2, x1], dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([xr * cos + rot * sin, xp], dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, D = c["hidden_size"], c["head_dim"]
        self.nh, self.nkv, self.d = c["num_attention_heads"], c["num_key_value_heads"], D
        b = c["attention_bias"]
        self.q_proj = nn.Linear(H, self.nh * D, bias=b)
        self.k_proj = nn.Linear(H, self.nkv * D, bias=b)
        self.v_proj = nn.Linear(H, self.nkv * D, bias=b)
        self.o_proj = nn.Linear(self.nh * D, H, bias=False)
        self.qk_norm = c["use_qk_norm"]
        if self.qk_norm:
            self.q_norm = RMSNorm(D, c["rms_norm_eps"])
            self.k_norm = RMSNorm(D, c["rms_norm_eps"])

    def forward(self, x, cos, sin):  # x [B, T, H]
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.d)
        k = self.k_proj(x).view(B, T, self.nkv, self.d)
        v = self.v_proj(x).view(B, T, self.nkv, self.d)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.nh // self.nkv  # query head h reads kv head h // rep (HF repeat_kv); expand: deterministic grads
        k = k[:, :, None].expand(B, self.nkv, rep, T, self.d).reshape(B, self.nh, T, self.d)
        v = v[:, :, None].expand(B, self.nkv, rep, T, self.d).reshape(B, self.nh, T, self.d)
        q, k = q.to(v.dtype), k.to(v.dtype)  # the qk-norm weight multiply promotes to fp32 under autocast
        # NOTE: explicit attention (fp32 softmax), not F.scaled_dot_product_attention: its fused backward kernels
        # are not deterministic, and this is the path the local CPU tests run.
        s = (q @ k.transpose(-1, -2)).float() * self.d ** -0.5
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        o = s.softmax(-1).to(v.dtype) @ v
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.d))


class Mlp(nn.Module):
    def __init__(self, H, inter):
        super().__init__()
        self.gate_proj = nn.Linear(H, inter, bias=False)
        self.up_proj = nn.Linear(H, inter, bias=False)
        self.down_proj = nn.Linear(inter, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Moe(nn.Module):
    """Sigmoid router with e_score_correction_bias (select with biased scores, weight with unbiased ones)."""

    def __init__(self, c):
        super().__init__()
        H, I, E = c["hidden_size"], c["moe_intermediate_size"], c["n_routed_experts"]
        self.c, self.E, self.I = c, E, I
        self.gate_weight = nn.Parameter(torch.empty(E, H))               # HF mlp.gate.weight [E, H]
        self.register_buffer("e_score_correction_bias", torch.zeros(E))  # fp32, updated by balance_step
        self.gate_up = nn.Parameter(torch.empty(E, 2 * I, H))            # rows 0..I-1 gate, I..2I-1 up
        self.down = nn.Parameter(torch.empty(E, H, I))
        self.shared_experts = Mlp(H, I * c["n_shared_experts"])
        self.last_load = None  # [E] tokens routed to each expert in the last forward (for balance_step)

    def route(self, x):  # x [N, H] -> routing weights [N, E] (zero for unselected experts, fp32), selected [N, E]
        c = self.c
        with torch.autocast(device_type=x.device.type, enabled=False):
            scores = F.linear(x.float(), self.gate_weight.float()).sigmoid()
        biased = scores + self.e_score_correction_bias
        assert c["n_group"] == 1, "grouped routing is not used by the tiny model"
        idx = biased.topk(c["num_experts_per_tok"], dim=-1).indices
        # one-hot instead of gather/scatter: identical values, deterministic gradients on CUDA
        selected = (idx[:, :, None] == torch.arange(self.E, device=x.device)).any(1)  # [N, E]
        w = scores * selected
        if c["norm_topk_prob"]:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return w * c["routed_scaling_factor"], selected

    def forward(self, x):  # x [B, T, H]
        B, T, H = x.shape
        xf = x.reshape(B * T, H)
        comb, selected = self.route(xf)
        self.last_load = selected.sum(0).detach()
        gu = torch.einsum("nh,eoh->neo", xf, self.gate_up)                # all experts, [N, E, 2I]
        g, u = gu[..., : self.I], gu[..., self.I:]
        a = F.silu(g) * u                                                # [N, E, I]
        y = torch.einsum("nei,ehi->neh", a, self.down)                    # [N, E, H]
        out = (y * comb.unsqueeze(-1).to(y.dtype)).sum(1)
        return (out + self.shared_experts(xf).to(out.dtype)).view(B, T, H).to(x.dtype)

    @torch.no_grad()
    def balance_step(self, rate):  # aux-loss-free balancing: raise the bias of under-loaded experts
        if self.last_load is not None:
            load = self.last_load.float()
            self.e_score_correction_bias += rate * torch.sign(load.mean() - load)


class DecoderLayer(nn.Module):
    def __init__(self, c, moe, dropout):
        super().__init__()
        H, eps = c["hidden_size"], c["rms_norm_eps"]
        self.input_layernorm = RMSNorm(H, eps)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.self_attn = Attention(c)
        self.mlp = Moe(c) if moe else Mlp(H, c["intermediate_size"])
        self.drop = nn.Dropout(dropout)

    def forward(self, x, cos, sin):
        x = x + self.drop(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.drop(self.mlp(self.post_attention_layernorm(x)))


class TinyGlm(nn.Module):
    def __init__(self, c, dropout=0.0):
        super().__init__()
        H, V, L, eps = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["rms_norm_eps"]
        self.c = c
        self.embed_tokens = nn.Embedding(V, H)
        self.layers = nn.ModuleList([DecoderLayer(c, l >= c["first_k_dense_replace"], dropout) for l in range(L)])
        self.norm = RMSNorm(H, eps)
        self.lm_head = nn.Linear(H, V, bias=False)
        # MTP (NextN) layer, index L in the checkpoint
        self.enorm, self.hnorm, self.shared_head_norm = RMSNorm(H, eps), RMSNorm(H, eps), RMSNorm(H, eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.mtp_layer = DecoderLayer(c, True, dropout)
        self.drop = nn.Dropout(dropout)
        self.init_weights()

    def init_weights(self, std=0.02):
        n_res = 2 * (self.c["num_hidden_layers"] + 1)
        for name, p in self.named_parameters():
            with torch.no_grad():
                if "norm" in name and name.endswith("weight"):
                    p.fill_(1.0)
                elif name.endswith("bias"):
                    p.zero_()
                elif name.endswith(("o_proj.weight", "down_proj.weight")) or name.endswith(".down"):
                    p.normal_(0.0, std / math.sqrt(n_res))
                else:
                    p.normal_(0.0, std)

    def moe_blocks(self):
        return [m for m in self.modules() if isinstance(m, Moe)]

    def forward(self, ids):  # ids [B, T] -> (post-final-norm hidden [B, T, H], logits [B, T, V])
        T = ids.shape[1]
        cos, sin = rope_cos_sin(self.c, torch.arange(T, device=ids.device), ids.device)
        x = self.drop(self.embed_tokens(ids))
        for layer in self.layers:
            x = layer(x, cos, sin)
        h = self.norm(x)
        return h, self.lm_head(h)

    def forward_mtp(self, h, next_ids):
        """Row t: lm_head(shared_head.norm(Layer_L(eh_proj(cat(enorm(embed(x_{t+1})), hnorm(h_t)))))) at position t.
        h [B, T', H] the target's post-norm hidden states h_0..h_{T'-1}; next_ids [B, T'] = x_1..x_{T'}."""
        T = next_ids.shape[1]
        cos, sin = rope_cos_sin(self.c, torch.arange(T, device=h.device), h.device)
        e = self.enorm(self.embed_tokens(next_ids))
        x = self.eh_proj(torch.cat([e, self.hnorm(h).to(e.dtype)], dim=-1))
        x = self.mtp_layer(x, cos, sin)
        return self.lm_head(self.shared_head_norm(x))


def _layer_tensors(layer, prefix, c):
    out = {
        prefix + "input_layernorm.weight": layer.input_layernorm.weight,
        prefix + "post_attention_layernorm.weight": layer.post_attention_layernorm.weight,
    }
    a = layer.self_attn
    for n in ("q", "k", "v", "o"):
        proj = getattr(a, n + "_proj")
        out[prefix + f"self_attn.{n}_proj.weight"] = proj.weight
        if proj.bias is not None:
            out[prefix + f"self_attn.{n}_proj.bias"] = proj.bias
    if a.qk_norm:
        out[prefix + "self_attn.q_norm.weight"] = a.q_norm.weight
        out[prefix + "self_attn.k_norm.weight"] = a.k_norm.weight
    m = layer.mlp
    if isinstance(m, Mlp):
        for n in ("gate", "up", "down"):
            out[prefix + f"mlp.{n}_proj.weight"] = getattr(m, n + "_proj").weight
        return out
    out[prefix + "mlp.gate.weight"] = m.gate_weight
    out[prefix + "mlp.gate.e_score_correction_bias"] = m.e_score_correction_bias
    I = c["moe_intermediate_size"]
    for e in range(c["n_routed_experts"]):
        out[prefix + f"mlp.experts.{e}.gate_proj.weight"] = m.gate_up[e, :I]
        out[prefix + f"mlp.experts.{e}.up_proj.weight"] = m.gate_up[e, I:]
        out[prefix + f"mlp.experts.{e}.down_proj.weight"] = m.down[e]
    for n in ("gate", "up", "down"):
        out[prefix + f"mlp.shared_experts.{n}_proj.weight"] = getattr(m.shared_experts, n + "_proj").weight
    return out


def hf_tensors(model):
    """Every tensor under its Hugging Face on-disk name: bf16, except e_score_correction_bias (fp32, as HF keeps it)."""
    c = model.c
    L = c["num_hidden_layers"]
    t = {"model.embed_tokens.weight": model.embed_tokens.weight, "model.norm.weight": model.norm.weight,
         "lm_head.weight": model.lm_head.weight}
    for l, layer in enumerate(model.layers):
        t.update(_layer_tensors(layer, f"model.layers.{l}.", c))
    p = f"model.layers.{L}."
    t.update({p + "enorm.weight": model.enorm.weight, p + "hnorm.weight": model.hnorm.weight,
              p + "eh_proj.weight": model.eh_proj.weight, p + "shared_head.norm.weight": model.shared_head_norm.weight})
    t.update(_layer_tensors(model.mtp_layer, p, c))
    return {k: (v.detach().float() if k.endswith("e_score_correction_bias") else v.detach().to(torch.bfloat16)).contiguous()
            for k, v in t.items()}


def round_to_bf16_(model):
    """Rounds every parameter to bf16 precision in place (the checkpoint's values), keeping the fp32 storage."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
