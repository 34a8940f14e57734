#!/usr/bin/env python3
"""Pure-Python (no numpy / torch) fp64 re-implementation of transformers 5.17's glm_moe_dsa forward, written
line by line after modeling_glm_moe_dsa.py (expanded, non-absorbed MLA; HF's de-interleaving rotary layout;
indexer top-k; shared layers reuse the previous full layer's top-k; MTP as tools/make_glm_moe_dsa_fixture.py).

For a checkpoint of f32 / bf16 tensors (tiny models only: it is slow), writes reference.safetensors in the
fixture format so `mxserve verify-fixture DIR` can compare against it:

  python3 tools/glm_moe_dsa_pyref.py DIR --case 1,5,17 --greedy 4
"""
import argparse
import json
import math
import os
import struct


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[a:b]
        if info["dtype"] == "F32":
            vals = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        elif info["dtype"] == "BF16":
            vals = [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
        else:
            raise SystemExit(f"{name}: dtype {info['dtype']} not handled")
        shape = info["shape"]
        if len(shape) == 2:
            r, c = shape
            vals = [vals[i * c:(i + 1) * c] for i in range(r)]
        out[name] = vals
    return out


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, flat) in tensors.items():
        fmt = {"F32": "f", "I64": "q"}[dtype]
        raw = struct.pack(f"<{len(flat)}{fmt}", *flat)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def mv(W, x):  # W [out][in] @ x [in]
    return [sum(w * v for w, v in zip(row, x)) for row in W]


def rmsnorm(x, w, eps):
    r = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [wi * v * r for wi, v in zip(w, x)]


def layernorm(x, w, b, eps):
    m = sum(x) / len(x)
    var = sum((v - m) ** 2 for v in x) / len(x)
    r = 1.0 / math.sqrt(var + eps)
    return [(v - m) * r * wi + bi for v, wi, bi in zip(x, w, b)]


def silu(v):
    return v / (1.0 + math.exp(-v))


def rope_hf(x, pos, theta):
    """apply_rotary_pos_emb_interleave on one head: cat(x_even*cos - x_odd*sin, x_odd*cos + x_even*sin)."""
    d = len(x)
    inv = [1.0 / theta ** (i / d) for i in range(0, d, 2)]
    cos = [math.cos(pos * f) for f in inv]
    sin = [math.sin(pos * f) for f in inv]
    ev, od = x[0::2], x[1::2]
    return [e * c - o * s for e, o, c, s in zip(ev, od, cos, sin)] + [o * c + e * s for e, o, c, s in zip(ev, od, cos, sin)]


class Model:
    def __init__(self, d):
        self.c = json.load(open(os.path.join(d, "config.json")))
        self.w = {}
        for f in sorted(os.listdir(d)):
            if f.endswith(".safetensors") and f != "reference.safetensors":
                self.w.update(load_safetensors(os.path.join(d, f)))
        c = self.c
        self.theta = (c.get("rope_parameters") or {}).get("rope_theta", c.get("rope_theta"))
        self.L = c["num_hidden_layers"]
        self.full = c["indexer_types"]
        self.mlp_types = c.get("mlp_layer_types") or (["dense"] * c["first_k_dense_replace"] + ["sparse"] * self.L)

    def mlp(self, p, h):
        g, u = mv(self.w[p + "gate_proj.weight"], h), mv(self.w[p + "up_proj.weight"], h)
        return mv(self.w[p + "down_proj.weight"], [silu(a) * b for a, b in zip(g, u)])

    def moe(self, p, h):
        c = self.c
        E, K = c["n_routed_experts"], c["num_experts_per_tok"]
        logits = mv(self.w[p + "gate.weight"], h)
        s = [1.0 / (1.0 + math.exp(-v)) for v in logits]
        bias = self.w[p + "gate.e_score_correction_bias"]
        choice = [a + b for a, b in zip(s, bias)]
        G, TG = c.get("n_group", 1), c.get("topk_group", 1)
        per = E // G
        gscore = [sum(sorted(choice[g * per:(g + 1) * per], reverse=True)[:2]) for g in range(G)]
        keep = sorted(range(G), key=lambda g: -gscore[g])[:TG]
        masked = [choice[e] if e // per in keep else -math.inf for e in range(E)]
        top = sorted(range(E), key=lambda e: -masked[e])[:K]
        wts = [s[e] for e in top]
        if c.get("norm_topk_prob", True):
            den = sum(wts) + 1e-20
            wts = [v / den for v in wts]
        wts = [v * c["routed_scaling_factor"] for v in wts]
        out = self.mlp(p + "shared_experts.", h) if c.get("n_shared_experts", 1) else [0.0] * len(h)
        for e, wt in zip(top, wts):
            y = self.mlp(p + f"experts.{e}.", h)
            out = [o + wt * v for o, v in zip(out, y)]
        return out

    def attention(self, p, hs, prev_topk, full):
        c = self.c
        T, NH = len(hs), c["num_attention_heads"]
        NOPE, ROPE, V = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        KVL = c["kv_lora_rank"]
        scale = (NOPE + ROPE) ** -0.5
        q_resid = [rmsnorm(mv(self.w[p + "q_a_proj.weight"], h), self.w[p + "q_a_layernorm.weight"], 1e-6) for h in hs]
        queries, keys, values = [], [], []
        for s in range(T):
            q = mv(self.w[p + "q_b_proj.weight"], q_resid[s])
            ckv = mv(self.w[p + "kv_a_proj_with_mqa.weight"], hs[s])
            k_pass = rmsnorm(ckv[:KVL], self.w[p + "kv_a_layernorm.weight"], 1e-6)
            k_rot = rope_hf(ckv[KVL:], s, self.theta)
            kv = mv(self.w[p + "kv_b_proj.weight"], k_pass)
            qh, kh, vh = [], [], []
            for h in range(NH):
                qq = q[h * (NOPE + ROPE):(h + 1) * (NOPE + ROPE)]
                qh.append(qq[:NOPE] + rope_hf(qq[NOPE:], s, self.theta))
                kk = kv[h * (NOPE + V):(h + 1) * (NOPE + V)]
                kh.append(kk[:NOPE] + k_rot)
                vh.append(kk[NOPE:])
            queries.append(qh)
            keys.append(kh)
            values.append(vh)
        if full:
            topk = self.indexer(p + "indexer.", hs, q_resid)
        else:
            topk = prev_topk
        out = []
        for s in range(T):
            o = []
            for h in range(NH):
                ts = [t for t in range(s + 1) if t in topk[s]]
                sc = [sum(a * b for a, b in zip(queries[s][h], keys[t][h])) * scale for t in ts]
                m = max(sc)
                e = [math.exp(v - m) for v in sc]
                den = sum(e)
                o += [sum(e[i] / den * values[t][h][d] for i, t in enumerate(ts)) for d in range(V)]
            out.append(mv(self.w[p + "o_proj.weight"], o))
        return out, topk

    def indexer(self, p, hs, q_resid):
        c = self.c
        T, NH, D, R, K = len(hs), c["index_n_heads"], c["index_head_dim"], c["qk_rope_head_dim"], c["index_topk"]
        ks = []
        for s in range(T):
            k = layernorm(mv(self.w[p + "wk.weight"], hs[s]), self.w[p + "k_norm.weight"], self.w[p + "k_norm.bias"], 1e-6)
            ks.append(rope_hf(k[:R], s, self.theta) + k[R:])
        topk = []
        for s in range(T):
            q = mv(self.w[p + "wq_b.weight"], q_resid[s])
            qs = []
            for h in range(NH):
                qq = q[h * D:(h + 1) * D]
                qs.append(rope_hf(qq[:R], s, self.theta) + qq[R:])
            w = [v * NH ** -0.5 for v in mv(self.w[p + "weights_proj.weight"], hs[s])]
            score = []
            for t in range(s + 1):
                score.append(sum(w[h] * max(sum(a * b for a, b in zip(qs[h], ks[t])) * D ** -0.5, 0.0) for h in range(NH)))
            order = sorted(range(s + 1), key=lambda t: -score[t])
            topk.append(set(order[:min(K, s + 1)]))
        return topk

    def layer(self, l, x, prev_topk, full, moe):
        p = f"model.layers.{l}."
        eps = self.c["rms_norm_eps"]
        hs = [rmsnorm(v, self.w[p + "input_layernorm.weight"], eps) for v in x]
        a, topk = self.attention(p + "self_attn.", hs, prev_topk, full)
        x = [[u + v for u, v in zip(r, ar)] for r, ar in zip(x, a)]
        hs = [rmsnorm(v, self.w[p + "post_attention_layernorm.weight"], eps) for v in x]
        m = [self.moe(p + "mlp.", h) if moe else self.mlp(p + "mlp.", h) for h in hs]
        return [[u + v for u, v in zip(r, mr)] for r, mr in zip(x, m)], topk

    def head(self, x):
        W = self.w.get("lm_head.weight") or self.w["model.embed_tokens.weight"]
        return [mv(W, v) for v in x]

    def hidden(self, ids):
        x = [list(self.w["model.embed_tokens.weight"][i]) for i in ids]
        topk = None
        for l in range(self.L):
            x, topk = self.layer(l, x, topk, self.full[l] == "full", self.mlp_types[l] == "sparse")
        return [rmsnorm(v, self.w["model.norm.weight"], self.c["rms_norm_eps"]) for v in x]

    def mtp(self, ids, h_post):
        L, eps = self.L, self.c["rms_norm_eps"]
        p = f"model.layers.{L}."
        x = []
        for t in range(len(ids) - 1):
            e = rmsnorm(self.w["model.embed_tokens.weight"][ids[t + 1]], self.w[p + "enorm.weight"], eps)
            h = rmsnorm(h_post[t], self.w[p + "hnorm.weight"], eps)
            x.append(mv(self.w[p + "eh_proj.weight"], e + h))
        x, _ = self.layer(L, x, None, True, True)
        return self.head([rmsnorm(v, self.w[p + "shared_head.norm.weight"], eps) for v in x])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--ids", default="3,17,42,8,8,91,5,60,33,2,77,14,29,50,11,64,7")
    ap.add_argument("--case", default="1,5,17")
    ap.add_argument("--greedy", type=int, default=4)
    a = ap.parse_args()
    m = Model(a.dir)
    base = [int(v) for v in a.ids.split(",")]
    out = {}
    for i, T in enumerate(int(v) for v in a.case.split(",")):
        ids = base[:T]
        h = m.hidden(ids)
        logits = m.head(h)
        seq = list(ids)
        for _ in range(a.greedy):
            lg = m.head(m.hidden(seq)[-1:])[0]
            seq.append(max(range(len(lg)), key=lambda j: lg[j]))
        V = len(logits[0])
        out[f"case.{i}.input_ids"] = ("I64", [T], ids)
        out[f"case.{i}.logits"] = ("F32", [T, V], [v for r in logits for v in r])
        out[f"case.{i}.greedy"] = ("I64", [a.greedy], seq[T:])
        if T >= 2 and f"model.layers.{m.L}.eh_proj.weight" in m.w:
            mt = m.mtp(ids, h)
            out[f"case.{i}.mtp_logits"] = ("F32", [T - 1, V], [v for r in mt for v in r])
        print(f"case {i}: T={T} greedy {seq[T:]}")
    write_safetensors(os.path.join(a.dir, "reference.safetensors"), out)


if __name__ == "__main__":
    main()
