#!/usr/bin/env python3
"""Makes every checkpoint tests/model/test_independent_ckpt.cpp loads, for each committed fixture:
<out>/<fixture>_fp8_hf (transformers' Fp8Quantize op on every Linear, MTP layer included),
<out>/<fixture>_fp8_hf_saved (transformers' from_pretrained(FineGrainedFP8Config) + save_pretrained) and
<out>/<fixture>_mxfp4_quark (an independent numpy writer of AMD Quark's MXFP4 layout). Run on a machine with a
CUDA GPU, torch and transformers 5.x; copy <out> to tests/data/independent_ckpt/ (the outputs are small: the
fixtures are tiny).

    python3 tools/independent_ckpt/make_all.py --fixtures tests/fixtures --out $OUT/independent_ckpt
"""
import argparse
import os
import subprocess
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import fp8_hf  # noqa: E402
import mxfp4_quark  # noqa: E402

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", required=True, help="the directory holding the fixture directories")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    mxfp4_quark.self_check()
    failures = 0
    with open(os.path.join(a.out, "VERSIONS.txt"), "w") as v:
        import torch
        import transformers
        v.write(f"torch {torch.__version__}\ntransformers {transformers.__version__}\n")
        v.write(subprocess.run(["git", "-C", HERE, "rev-parse", "HEAD"], capture_output=True, text=True).stdout)
    for fx in sorted(os.listdir(a.fixtures)):
        src = os.path.join(a.fixtures, fx)
        if not os.path.exists(os.path.join(src, "model.safetensors")):
            continue
        for kind, fn in (("mxfp4_quark", mxfp4_quark.write), ("fp8_hf", fp8_hf.write),
                         ("fp8_hf_saved", fp8_hf.write_saved)):
            dst = os.path.join(a.out, f"{fx}_{kind}")
            try:
                print(f"{dst}: {fn(src, dst)}", flush=True)
            except Exception:  # one failure must not hide the others; the log names it
                failures += 1
                print(f"FAILED {dst}:\n{traceback.format_exc()}", flush=True)
    sys.exit(1 if failures else 0)
