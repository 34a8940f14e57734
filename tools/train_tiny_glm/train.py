#!/usr/bin/env python3
"""Trains the tiny glm4_moe of issue 22 (models/tiny-glm-trained) on the GPU machine and writes its checkpoint,
config, tokenizer, golden fixture and training metrics. One call, deterministic for a fixed --steps.

  bash tools/train_tiny_glm/run_gpu.sh            # smoke run, then the real run into $OUT (see that script)
  python3 tools/train_tiny_glm/train.py --data tools/train_tiny_glm/data --out DIR [--time-budget 330] [--steps N]

Inputs (made here by prep_data.mjs): token ids of the Brown-corpus splits and chat examples, tokenizer.json,
tokenizer_config.json. Steps: (1) train the model (glm_model.py) with next-token loss + 0.3 x the MTP layer's
next-next-token loss, bf16 autocast, AdamW, cosine LR, aux-loss-free expert balancing; the number of steps comes
from the time budget (measured speed) unless --steps fixes it; the checkpoint kept is the one with the best
validation loss; (2) round to bf16, save model.safetensors (HF names, MTP layer at index L); (3) held-out
perplexity (sliding windows, fp32) vs a unigram model; (4) with transformers: reload the checkpoint in fp32,
compare its logits with this implementation's, and write reference.safetensors in the fixture format of
docs/fixtures.md with tools/make_glm4_moe_fixture.py's own helpers (prompts = held-out text windows).
Outputs in --out: model.safetensors, reference.safetensors, tiny-glm-trained.tar (config.json,
generation_config.json, tokenizer.json, tokenizer_config.json, metrics.json), metrics.json. Written atomically.
Exit code 3: everything but the transformers stage succeeded (the error is in metrics.json and the log).
"""
import argparse
import io
import json
import math
import os
import sys
import shutil
import tarfile
import tempfile
import time
import traceback

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (before CUDA starts)
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from glm_model import TinyGlm, hf_tensors, round_to_bf16_  # noqa: E402
from safetensors_io import write_safetensors  # noqa: E402

T0 = time.time()
VOCAB = 4096
CONFIG = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
              num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
              partial_rotary_factor=0.5, rope_theta=10000.0, use_qk_norm=True, attention_bias=True,
              first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1,
              n_shared_experts=1, norm_topk_prob=True, routed_scaling_factor=2.5, tie_word_embeddings=False,
              rms_norm_eps=1e-5, max_position_embeddings=2048, num_nextn_predict_layers=1)
CASE_LENGTHS = [1, 8, 24, 48]
GREEDY_TOKENS = 8
MTP_WEIGHT = 0.3


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


def atomic_write(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def atomic_json(path, obj):
    atomic_write(path, (json.dumps(obj, indent=1) + "\n").encode())


def load_ids(path):
    if not os.path.exists(path):
        sys.exit(f"missing {path}: run tools/train_tiny_glm/prep_data.mjs first")
    return torch.from_numpy(np.fromfile(path, dtype="<u2").astype(np.int64))


class Decoder:
    """Token ids -> text for samples: byte-level pieces of tokenizer.json mapped back through the GPT-2 alphabet."""

    def __init__(self, tok_json):
        bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
        cs = bs[:]
        n = 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        char_to_byte = {chr(c): b for b, c in zip(bs, cs)}
        self.pieces = {}
        for t, i in tok_json["model"]["vocab"].items():
            self.pieces[i] = bytes(char_to_byte[ch] for ch in t)
        for a in tok_json["added_tokens"]:
            self.pieces[a["id"]] = a["content"].encode()

    def __call__(self, ids):
        return b"".join(self.pieces.get(int(i), b"") for i in ids).decode("utf-8", errors="replace")


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--time-budget", type=float, default=330.0, help="seconds of training (steps from measured speed)")
    ap.add_argument("--steps", type=int, default=0, help="fix the number of steps (reproduces a run exactly)")
    ap.add_argument("--max-epochs", type=float, default=40.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--chat-fraction", type=float, default=0.25)
    ap.add_argument("--fixture-seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--smoke", action="store_true", help="tiny steps, same code path")
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers steps (local tests without it)")
    a = ap.parse_args()
    if a.smoke:
        a.batch, a.seq, a.time_budget, a.fixture_seconds = 4, 128, 4.0, 6.0
    return a


def sample_batch(streams, weights, B, T, gen, device):
    rows = []
    n_chat = int(round(B * weights))
    for i in range(B):
        s = streams["chat_train"] if i < n_chat else streams["train"]
        start = int(torch.randint(0, len(s) - T, (1,), generator=gen))
        rows.append(s[start:start + T])
    return torch.stack(rows).to(device)


def losses(model, x):
    V = model.c["vocab_size"]
    h, logits = model(x)
    main = F.cross_entropy(logits[:, :-1].reshape(-1, V).float(), x[:, 1:].reshape(-1))
    mtp = model.forward_mtp(h[:, :-1], x[:, 1:])  # row t predicts x_{t+2}
    mtp_loss = F.cross_entropy(mtp[:, :-1].reshape(-1, V).float(), x[:, 2:].reshape(-1))
    return main, mtp_loss, logits, mtp


@torch.no_grad()
def evaluate(model, stream, T, max_windows, device, autocast):
    """Mean main / MTP loss over non-overlapping windows, MTP top-1 accuracy and draft-vs-target agreement."""
    model.eval()
    n = min(max_windows, (len(stream) - 1) // T)
    tot = {"main": 0.0, "mtp": 0.0, "mtp_top1": 0.0, "draft_agree": 0.0}
    for w in range(n):
        x = stream[w * T:(w + 1) * T][None].to(device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            main, mtp_loss, logits, mtp = losses(model, x)
        draft = mtp[0, :-1].argmax(-1)                # MTP guess of x_{t+2} from h_t, x_{t+1}
        tot["main"] += main.item()
        tot["mtp"] += mtp_loss.item()
        tot["mtp_top1"] += (draft == x[0, 2:]).float().mean().item()
        tot["draft_agree"] += (draft == logits[0, 1:-1].argmax(-1)).float().mean().item()  # target's greedy x_{t+2}
    model.train()
    return {k: v / max(n, 1) for k, v in tot.items()}


@torch.no_grad()
def sliding_perplexity(model, ids, W, S, device):
    """Token-level perplexity: windows of W tokens every S; each token from index 1 on is scored once, with the
    longest context its window gives (the same definition as `mxserve eval perplexity`)."""
    model.eval()
    nll, n, prev_end, N = 0.0, 0, 0, len(ids)
    for begin in range(0, N, S):
        end = min(begin + W, N)
        x = ids[begin:end][None].to(device)
        logp = model(x)[1][0].float().log_softmax(-1)
        first = max(prev_end, begin + 1)
        tgt = ids[first:end].to(device)
        nll -= logp[first - begin - 1:end - begin - 1].gather(1, tgt[:, None]).sum().item()
        n += end - first
        prev_end = end
        if end == N:
            break
    return math.exp(nll / n), n


def unigram_perplexity(train_ids, ids, V):
    counts = torch.bincount(train_ids, minlength=V).double() + 1.0  # add-one smoothing
    logp = (counts / counts.sum()).log()
    return math.exp(-logp[ids[1:]].mean().item())


@torch.no_grad()
def samples(model, decode, probes, device, n_tokens=48, eos=()):
    model.eval()
    out = []
    g = torch.Generator().manual_seed(7)
    for kind in ("chat", "text"):
        for p in probes[kind]:
            for temp in (0.0, 0.8):
                seq = torch.tensor(p["ids"], dtype=torch.int64)
                for _ in range(n_tokens):
                    lg = model(seq[None].to(device))[1][0, -1].float().cpu()
                    nxt = lg.argmax() if temp == 0 else torch.multinomial((lg / temp).softmax(-1), 1, generator=g)[0]
                    seq = torch.cat([seq, nxt.view(1)])
                    if int(nxt) in eos:
                        break
                out.append({"prompt": p["text"], "temperature": temp, "completion": decode(seq[len(p["ids"]):])})
    return out


def train(args, streams, device, metrics, out_json):
    torch.manual_seed(args.seed)
    model = TinyGlm(CONFIG, dropout=args.dropout).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    metrics["parameters"] = n_params
    log(f"model: {n_params / 1e6:.2f} M parameters ({n_params * 2 / 1e6:.1f} MB in bf16)")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    fused = {"fused": True} if device.type == "cuda" and "fused" in torch.optim.AdamW.__init__.__code__.co_varnames else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **fused)
    gen = torch.Generator().manual_seed(args.seed)
    autocast = device.type == "cuda"
    tokens_per_step = args.batch * args.seq
    epoch_tokens = len(streams["train"]) + len(streams["chat_train"])
    max_steps = max(1, int(args.max_epochs * epoch_tokens / tokens_per_step))
    total = args.steps if args.steps > 0 else None
    warmup = 2 if args.smoke else 200
    eval_every = 4 if args.smoke else 200
    eval_windows = 2 if args.smoke else 1000
    best = (float("inf"), None, 0)
    curve = []
    t_start, t_measure = time.time(), None
    step = 0
    while True:
        if total is None and step == 20:  # measure speed over steps 10..19, then fix the schedule's length
            per_step = (time.time() - t_measure) / 10
            total = max(step + 1, min(max_steps, int(args.time_budget / per_step)))
            metrics["seconds_per_step"] = per_step
            log(f"speed: {per_step * 1000:.1f} ms/step ({tokens_per_step / per_step / 1e6:.2f} M tokens/s); "
                f"steps: {total} (budget {args.time_budget:.0f} s, cap {max_steps} = {args.max_epochs} epochs)")
        if step == 10:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t_measure = time.time()
        if total is not None and step >= total:
            break
        horizon = total if total is not None else max_steps
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / horizon))))
        for g_ in opt.param_groups:
            g_["lr"] = lr
        x = sample_batch(streams, args.chat_fraction, args.batch, args.seq, gen, device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            main, mtp_loss, _, _ = losses(model, x)
            loss = main + MTP_WEIGHT * mtp_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        for m in model.moe_blocks():
            m.balance_step(1e-3)
        step += 1
        if not math.isfinite(loss.item()):
            sys.exit(f"step {step}: loss is {loss.item()}: diverged")
        if step % eval_every == 0 or (total is not None and step == total):
            v = evaluate(model, streams["valid"], args.seq, eval_windows, device, autocast)
            rec = {"step": step, "seconds": round(time.time() - t_start, 1), "lr": lr, "train_loss": main.item(),
                   "train_mtp_loss": mtp_loss.item(), "grad_norm": float(gnorm), "valid_loss": v["main"],
                   "valid_mtp_loss": v["mtp"], "valid_mtp_top1": v["mtp_top1"], "valid_draft_agree": v["draft_agree"]}
            curve.append(rec)
            log(json.dumps(rec))
            if v["main"] < best[0]:
                best = (v["main"], {k: t.detach().clone() for k, t in model.state_dict().items()}, step)
            metrics["curve"] = curve
            out_json()
    metrics.update({"steps": step, "train_seconds": round(time.time() - t_start, 1), "tokens_per_step": tokens_per_step,
                    "epochs": step * tokens_per_step / epoch_tokens, "best_step": best[2], "best_valid_loss": best[0]})
    model.load_state_dict(best[1])
    expert_bias = [m.e_score_correction_bias.tolist() for m in model.moe_blocks()]
    metrics["e_score_correction_bias"] = expert_bias
    log(f"trained {step} steps; best valid loss {best[0]:.4f} at step {best[2]}")
    return model


def write_config_dir(args, d, tok_json_bytes, tok_cfg_bytes, special):
    """config.json (transformers' own save_pretrained when present), generation_config.json, tokenizer files."""
    os.makedirs(d, exist_ok=True)
    eos = [special["<|endoftext|>"], special["<|user|>"], special["<|observation|>"]]
    if not args.no_hf:
        import transformers
        from transformers import Glm4MoeConfig
        cfg = Glm4MoeConfig(**CONFIG, eos_token_id=eos, pad_token_id=eos[0])
        cfg.save_pretrained(d)
        path = os.path.join(d, "config.json")
        j = json.load(open(path))
        # save_pretrained of a bare config (not of a model) writes neither the class nor the checkpoint's dtype
        j["architectures"] = ["Glm4MoeForCausalLM"]
        j["dtype"] = "bfloat16"
        atomic_write(path, (json.dumps(j, indent=2, sort_keys=True) + "\n").encode())
        ver = transformers.__version__
    else:
        cfg = dict(architectures=["Glm4MoeForCausalLM"], model_type="glm4_moe", torch_dtype="bfloat16",
                   eos_token_id=eos, pad_token_id=eos[0], **CONFIG)
        atomic_json(os.path.join(d, "config.json"), cfg)
        ver = "none"
    atomic_json(os.path.join(d, "generation_config.json"),
                {"_from_model_config": True, "eos_token_id": eos, "pad_token_id": eos[0], "transformers_version": ver})
    atomic_write(os.path.join(d, "tokenizer.json"), tok_json_bytes)
    atomic_write(os.path.join(d, "tokenizer_config.json"), tok_cfg_bytes)


def write_tar(out, d, names):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for n in names:
            p = os.path.join(d, n)
            if os.path.exists(p):
                info = tf.gettarinfo(p, arcname=n)
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                with open(p, "rb") as f:
                    tf.addfile(info, f)
    atomic_write(os.path.join(out, "tiny-glm-trained.tar"), buf.getvalue())


def main():
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if hasattr(torch, "use_deterministic_algorithms"):
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:  # torch >= 2.1 fills uninitialised memory in deterministic mode; every weight is initialised here
            import torch.utils.deterministic as det
            det.fill_uninitialized_memory = False
        except ImportError:
            pass
    torch.set_num_threads(max(1, min(16, os.cpu_count() or 1)))
    os.makedirs(args.out, exist_ok=True)
    model_dir = tempfile.mkdtemp(prefix="tiny_glm_")  # outside --out: only the final files go there
    metrics = {"smoke": args.smoke, "args": vars(args), "config": CONFIG, "torch": torch.__version__,
               "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"}
    out_json = lambda: atomic_json(os.path.join(args.out, "metrics.json"), metrics)  # noqa: E731
    log(f"torch {torch.__version__} on {metrics['device']}; smoke={args.smoke}")

    streams = {k: load_ids(os.path.join(args.data, f"{k}.u16")) for k in ("train", "valid", "heldout", "chat_train", "heldout_file")}
    meta = json.load(open(os.path.join(args.data, "meta.json")))
    probes = json.load(open(os.path.join(args.data, "probes.json")))
    tok_json_bytes = open(os.path.join(args.data, "tokenizer.json"), "rb").read()
    tok_cfg_bytes = open(os.path.join(args.data, "tokenizer_config.json"), "rb").read()
    decode = Decoder(json.loads(tok_json_bytes))
    special = meta["special_ids"]
    assert meta["tokenizer_vocab"] <= VOCAB, "tokenizer larger than the model's vocabulary"
    metrics["data_tokens"] = {k: len(v) for k, v in streams.items()}
    log("data tokens:", metrics["data_tokens"])
    out_json()

    model = train(args, streams, device, metrics, out_json)
    round_to_bf16_(model)  # from here on: the checkpoint's values, computed in fp32
    model.float().eval()
    tensors = hf_tensors(model)
    write_config_dir(args, model_dir, tok_json_bytes, tok_cfg_bytes, special)
    write_safetensors(tensors, os.path.join(model_dir, "model.safetensors"), {"format": "pt"})
    shutil.copyfile(os.path.join(model_dir, "model.safetensors"), os.path.join(args.out, "model.safetensors.tmp"))
    os.replace(os.path.join(args.out, "model.safetensors.tmp"), os.path.join(args.out, "model.safetensors"))
    log(f"wrote model.safetensors ({len(tensors)} tensors, {os.path.getsize(os.path.join(args.out, 'model.safetensors')) / 1e6:.2f} MB)")
    write_tar(args.out, model_dir, ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"])

    W, S = (128, 64) if args.smoke else (1024, 512)
    held = streams["heldout_file"][: 2048 if args.smoke else None]
    ppl, n = sliding_perplexity(model, held, W, S, device)
    uni = unigram_perplexity(streams["train"], held, VOCAB)
    v = evaluate(model, streams["heldout"], W, 4 if args.smoke else 1000, device, autocast=False)
    metrics["heldout"] = {"text": "heldout.txt (25 Brown documents never trained on)", "tokens_scored": n,
                          "window": W, "stride": S, "perplexity": ppl, "unigram_perplexity": uni,
                          "mtp_loss": v["mtp"], "mtp_top1": v["mtp_top1"], "draft_agree_with_target_greedy": v["draft_agree"]}
    log("held-out:", json.dumps(metrics["heldout"]))
    eos = (special["<|endoftext|>"], special["<|user|>"], special["<|observation|>"])
    metrics["samples"] = samples(model, decode, probes, device, n_tokens=8 if args.smoke else 48, eos=eos)
    for smp in metrics["samples"]:
        log(f"sample T={smp['temperature']}: {smp['prompt']!r} -> {smp['completion']!r}")
    out_json()

    hf_failed = False
    if not args.no_hf:
        try:
            import hf_fixture
            hf_fixture.check_and_write(model, tensors, model_dir, args.out, streams["heldout"], CASE_LENGTHS,
                                       GREEDY_TOKENS, args.fixture_seconds, args.seed, metrics, log)
        except Exception:  # the trained model is already saved: keep it, say so loudly, exit 3 at the end
            hf_failed = True
            metrics["fixture_error"] = traceback.format_exc()
            log("ERROR in the transformers stage (no reference.safetensors):\n" + metrics["fixture_error"])
        out_json()
    atomic_json(os.path.join(model_dir, "metrics.json"), metrics)
    write_tar(args.out, model_dir, ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                    "metrics.json"])
    log("done:", sorted(os.listdir(args.out)))
    if hf_failed:
        sys.exit(3)


if __name__ == "__main__":
    main()
