#!/usr/bin/env bash
# Quality and MTP-acceptance tables of the tiny trained GLM on a GPU machine (issue 22, docs/quality/): held-out
# perplexity at bf16 / FP8-block / MXFP4 weights on the CPU reference and on CUDA, KL / top-1 / relative L2 of each
# against the CPU bf16 reference, and MTP acceptance (chain N = 1..4, tree) with the decode speed-up on CUDA.
#   tools/train_tiny_glm/quality_tables.sh BIN [OUT_MD]     (BIN: an mxserve built with CUDA)
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:?usage: quality_tables.sh BIN [OUT_MD]}
MD=${2:-docs/quality/tiny-glm-trained.md}
M=models/tiny-glm-trained
T=tests/data/tiny_glm/heldout_sample.txt
J=$(mktemp -d)
[ -f "$M/model.safetensors" ] || { echo "no $M/model.safetensors" >&2; exit 2; }
for be in cpu cuda; do
  for q in none fp8-block mxfp4; do
    "$BIN" eval perplexity --model "$M" --text "$T" --backend "$be" --quantization "$q" --json "$J/ppl_${be}_$q.json"
  done
done
for be in cpu cuda; do
  for q in fp8-block mxfp4; do
    "$BIN" eval compare --model "$M" --text "$T" --backend cpu --backend-b "$be" --quantization "$q" --max-tokens 4096 \
      --json "$J/cmp_${be}_$q.json"
  done
done
"$BIN" eval compare --model "$M" --text "$T" --backend cpu --backend-b cuda --max-tokens 4096 --json "$J/cmp_cuda_none.json"
for n in 1 2 3 4; do
  "$BIN" eval acceptance --model "$M" --text "$T" --backend cuda --speculative-num-steps "$n" --prompts 8 \
    --prompt-len 128 --gen-tokens 256 --json "$J/acc_chain_$n.json" || echo "(exit $?: mismatched_outputs in the JSON)"
done
"$BIN" eval acceptance --model "$M" --text "$T" --backend cuda --speculative-num-steps 3 --speculative-eagle-topk 4 \
  --speculative-num-draft-tokens 8 --prompts 8 --prompt-len 128 --gen-tokens 256 --json "$J/acc_tree_3_4_8.json" \
  || echo "(exit $?: mismatched_outputs in the JSON)"
python3 - "$J" "$MD" "${MXSERVE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}" "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" <<'PY'
import glob, json, os, sys, datetime
j, md, commit, gpu = sys.argv[1:5]
L = lambda p: json.load(open(os.path.join(j, p)))
out = [f"# Quality of the tiny trained GLM (models/tiny-glm-trained)", "",
       f"{datetime.date.today()}, {gpu}, commit {commit}; `tools/train_tiny_glm/quality_tables.sh`. Text: "
       "tests/data/tiny_glm/heldout_sample.txt (3 held-out Brown documents, never trained on). Activations: f32 on cpu, "
       "bf16 on cuda; KV cache in the activation dtype (FP8 KV is not in this build).", "",
       "| weights | backend | perplexity | KL vs cpu bf16 | top-1 agreement | logits rel. L2 |", "|---|---|---|---|---|---|"]
for be in ("cpu", "cuda"):
    for q in ("none", "fp8-block", "mxfp4"):
        p = L(f"ppl_{be}_{q}.json")
        c = None if (be, q) == ("cpu", "none") else L(f"cmp_{be}_{q}.json")
        cols = ["-", "-", "-"] if c is None else [f"{c['kl_mean']:.2e}", f"{100*c['top1_agreement']:.2f}%", f"{c['logits_rel_l2']:.2e}"]
        out.append(f"| {'bf16' if q == 'none' else q} | {be} | {p['perplexity']:.3f} | " + " | ".join(cols) + " |")
out += ["", "MTP speculative decoding on CUDA, batch 1, greedy, 8 prompts x 128 tokens, 256 generated each:", "",
        "| mode | draft steps | acceptance length | accepted per position | plain tok/s | spec tok/s | speed-up | greedy outputs equal to plain |", "|---|---|---|---|---|---|---|---|"]
for f in sorted(glob.glob(os.path.join(j, "acc_*.json"))):
    a = json.load(open(f))
    mode = a["mode"] + ("" if a["mode"] == "chain" else f" (topk {a['topk']}, {a['num_draft_tokens']} tokens)")
    pos = ", ".join(f"{100*x:.0f}%" for x in a["accepted_per_position"])
    out.append(f"| {mode} | {a['num_steps']} | {a['acceptance_length']:.3f} | {pos} | {a['decode_tok_s_plain']:.0f} | "
               f"{a['decode_tok_s_spec']:.0f} | x{a['speedup']:.2f} | {a['prompts'] - a['mismatched_outputs']}/{a['prompts']} |")
open(md, "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
