"""The transformers side of train.py: reload the saved bf16 checkpoint with Glm4MoeForCausalLM in float32 (the
reference), measure how far the training implementation (glm_model.py) is from it, and write the golden fixture
reference.safetensors (the fixture format: docs/fixtures.md) with tools/make_glm4_moe_fixture.py's own helpers: the MTP reference is
transformers' Glm4MoeDecoderLayer loaded with the layer-L tensors. Prompts are held-out text windows, chosen so
that every routing decision and greedy argmax has a margin (fp32 rounding cannot flip a choice); when no window
within the time budget clears the margin the best one is used and the metrics say so.
"""
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tools/: the fixture generator's helpers
import make_glm4_moe_fixture as fx  # noqa: E402
from safetensors_io import write_safetensors  # noqa: E402

MARGIN = 1e-3


def rel_l2(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def build_hf_mtp(cfg, tensors):
    """Layer-L modules of transformers (as fx.build_mtp_layer builds them) holding the checkpoint's tensors."""
    hf = fx.hf
    L, E, I = cfg.num_hidden_layers, cfg.n_routed_experts, cfg.moe_intermediate_size
    pre = f"model.layers.{L}."
    mods = torch.nn.ModuleDict({
        "enorm": hf.Glm4MoeRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps),
        "hnorm": hf.Glm4MoeRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps),
        "eh_proj": torch.nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False),
        "shared_head_norm": hf.Glm4MoeRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps),
        "layer": hf.Glm4MoeDecoderLayer(cfg, layer_idx=L),
    })
    sd = {}
    for k in mods["layer"].state_dict():
        if k == "mlp.experts.gate_up_proj":  # in-memory fused layout [E, 2I, H]: gate rows, then up rows
            sd[k] = torch.stack([torch.cat([tensors[pre + f"mlp.experts.{e}.gate_proj.weight"],
                                            tensors[pre + f"mlp.experts.{e}.up_proj.weight"]]) for e in range(E)])
        elif k == "mlp.experts.down_proj":   # [E, H, I]
            sd[k] = torch.stack([tensors[pre + f"mlp.experts.{e}.down_proj.weight"] for e in range(E)])
        elif pre + k in tensors:
            sd[k] = tensors[pre + k]
        else:
            raise SystemExit(f"MTP reference: transformers' decoder layer has '{k}', the checkpoint no '{pre + k}'")
    mods["layer"].load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
    for n, b in mods["layer"].named_buffers():  # in case the bias buffer is not part of state_dict
        if n.endswith("e_score_correction_bias"):
            b.data.copy_(tensors[pre + n].float())
    for name, key in (("enorm", "enorm.weight"), ("hnorm", "hnorm.weight"), ("eh_proj", "eh_proj.weight"),
                      ("shared_head_norm", "shared_head.norm.weight")):
        mods[name].weight.data.copy_(tensors[pre + key].float())
    return mods.float().eval()


@torch.no_grad()
def check_and_write(model, tensors, model_dir, out_dir, heldout, lengths, greedy_n, seconds, seed, metrics, log):
    import transformers
    from transformers import Glm4MoeForCausalLM

    t0 = time.time()
    tensors = {k: v.cpu() for k, v in tensors.items()}
    ref = Glm4MoeForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    if hasattr(ref.config, "_experts_implementation"):
        ref.config._experts_implementation = "eager"
    cfg = ref.config
    mods = build_hf_mtp(cfg, tensors)
    log(f"transformers {transformers.__version__}: reloaded the checkpoint in {time.time() - t0:.1f} s")

    # 1. the training implementation vs transformers, fp32 on the CPU, one held-out window
    cpu_model = model.to("cpu").float().eval()
    ids = heldout[1000:1000 + 96]
    mine_h, mine = cpu_model(ids[None])
    theirs = ref(ids[None]).logits[0]
    h_post = ref.model(ids[None]).last_hidden_state[0]
    mtp_theirs = fx.run_mtp(ref, mods, ids, h_post)
    mtp_mine = cpu_model.forward_mtp(mine_h[:, :-1], ids[None, 1:])[0]
    check = {"logits_rel_l2": rel_l2(mine[0], theirs), "mtp_logits_rel_l2": rel_l2(mtp_mine, mtp_theirs),
             "transformers": transformers.__version__}
    metrics["train_impl_vs_transformers"] = check
    log("training implementation vs transformers (fp32):", check)
    if check["logits_rel_l2"] > 1e-3 or check["mtp_logits_rel_l2"] > 1e-3:
        log("WARNING: the training implementation DIFFERS from transformers; the fixture below is transformers' "
            "(the truth mxserve is checked against), but the trained weights were optimised for another function")

    # 2. the fixture: held-out windows with clear routing and greedy margins
    probe = fx.RouterProbe()
    probe.attach([l.mlp.gate for l in ref.model.layers if hasattr(l.mlp, "gate")] + [mods["layer"].mlp.gate])
    gen = torch.Generator().manual_seed(seed + 1)
    out, cases = {}, []
    for i, T in enumerate(lengths):
        deadline = time.time() + seconds / len(lengths)
        best, tries = None, 0
        while True:
            tries += 1
            s = int(torch.randint(0, len(heldout) - T - 1, (1,), generator=gen))
            ids = heldout[s:s + T].clone()
            probe.records.clear()
            ref.model(ids[None])
            route0 = min(fx.routing_margin(lg, b, cfg) for lg, b in probe.records)
            if best is None or route0 > best[0]:
                seq = ids.clone()
                for _ in range(greedy_n):  # greedy by full recompute (no cache involved)
                    seq = torch.cat([seq, ref(seq[None]).logits[0, -1].argmax()[None]])
                probe.records.clear()
                full = ref(seq[None])
                hp = ref.model(seq[None]).last_hidden_state[0]
                fx.run_mtp(ref, mods, seq, hp)
                route = min(fx.routing_margin(lg, b, cfg) for lg, b in probe.records)
                am = fx.argmax_margin(full.logits[0, T - 1:])
                score = min(route, am)
                if best is None or score > best[0]:
                    best = (score, ids, seq, route, am)
            if (best is not None and best[0] > MARGIN) or time.time() > deadline:
                break
        score, ids, seq, route, am = best
        ok = score > MARGIN
        log(f"case {i}: T={T} tries={tries} routing margin={route:.2e} greedy margin={am:.2e}"
            + ("" if ok else f"  WARNING: below {MARGIN} (best found in the time budget)"))
        cases.append({"T": T, "tries": tries, "routing_margin": route, "greedy_margin": am, "margins_ok": ok})
        logits = ref(ids[None]).logits[0].float()
        hp = ref.model(ids[None]).last_hidden_state[0]
        out[f"case.{i}.input_ids"] = ids.to(torch.int64).contiguous()
        out[f"case.{i}.logits"] = logits.contiguous()
        out[f"case.{i}.greedy"] = seq[T:].to(torch.int64).contiguous()
        out[f"case.{i}.mtp_logits"] = fx.run_mtp(ref, mods, ids, hp).float().contiguous()
    write_safetensors(out, os.path.join(out_dir, "reference.safetensors"),
                      {"generator": "tools/train_tiny_glm/train.py", "transformers": transformers.__version__,
                       "torch": torch.__version__, "prompts": "held-out Brown text windows"})
    metrics["fixture"] = {"cases": cases, "margin": MARGIN, "seconds": round(time.time() - t0, 1)}
    log(f"wrote reference.safetensors ({len(lengths)} cases)")
