#!/usr/bin/env bash
# Compares the device code of two source trees kernel by kernel: the PTX body and the ptxas resource line
# (registers, barriers, stack, spills) of every kernel in every .cu under SUBDIR. Names are normalized
# (the anonymous-namespace component nvcc derives from the file name and hash, basic-block label numbers,
# .loc/.file lines), so moving a kernel to another translation unit compares equal when its code is.
# For refactors that must not change the kernels (e.g. issue 15: the MoE variant list and one translation
# unit per design). Uses the build's nvcc flags (sm_90a); needs no GPU.
# Usage: dev/kernels/compare_ptx.sh OLD_ROOT NEW_ROOT [SUBDIR]   (default src/kernels/cuda/moe_mxfp4)
#   e.g. git worktree add /tmp/base main && dev/kernels/compare_ptx.sh /tmp/base .
# Exit status 0: every kernel of either tree exists in both with identical PTX and resources.
set -euo pipefail
OLD=$(cd "$1" && pwd); NEW=$(cd "$2" && pwd); SUB=${3:-src/kernels/cuda/moe_mxfp4}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
for side in old new; do
  root=$OLD; [ $side = new ] && root=$NEW
  for f in "$root/$SUB"/*.cu; do
    name=$(basename "$f" .cu); out=$WORK/$side/$name
    mkdir -p "$out"
    nice "$NVCC" -I"$root/src" -isystem=/usr/local/cuda/include -O3 -DNDEBUG \
      --generate-code=arch=compute_90a,code=[compute_90a,sm_90a] -Xcompiler=-fPIC --expt-relaxed-constexpr \
      -lineinfo -Xptxas=-v -std=c++17 -x cu -c "$f" -o "$out/$name.o" --keep --keep-dir "$out" > "$out.ptxas.txt" 2>&1 ||
      { cat "$out.ptxas.txt"; echo "compile failed: $f"; exit 2; }
  done
done
python3 - "$WORK" <<'PY'
import glob, re, sys
work = sys.argv[1]
def norm(name):  # drop <len>_GLOBAL__N__<file hash> (a length-prefixed mangled component)
    out, i = [], 0
    while True:
        j = name.find('_GLOBAL__N__', i)
        if j < 0:
            out.append(name[i:]); return ''.join(out)
        k = j
        while k > 0 and name[k - 1].isdigit(): k -= 1
        out.append(name[i:k]); out.append('ANON'); i = j + int(name[k:j])
def resources(side):
    res, cur = {}, None
    for f in glob.glob(f'{work}/{side}/*.ptxas.txt'):
        for line in open(f):
            m = re.search(r"(?:Compiling entry function '|Function properties for )([^' ]+)", line)
            if m: cur = norm(m.group(1).strip()); res.setdefault(cur, []); continue
            if cur and ('Used' in line or 'stack frame' in line):
                res[cur].append(re.sub(r'ptxas info\s*:\s*', '', line.strip()))
    return res
def bodies(side):
    out = {}
    for f in glob.glob(f'{work}/{side}/*/*.ptx'):
        text = re.sub(r'\d+_GLOBAL__N__\w+', lambda m: norm(m.group(0)), open(f).read())
        text = re.sub(r'__local_depot\d+', '__local_depot', re.sub(r'\$L__BB\d+_', '$L__BB_', text))
        cur, buf = None, []
        for l in text.split('\n'):
            if l.strip().startswith(('.loc', '.file', '//')): continue
            m = re.match(r'\s*(?:\.visible |\.weak )?\.entry (\S+)\(', l)
            if m: cur, buf = m.group(1), []
            if cur is not None:
                buf.append(l)
                if l.strip() == '}': out[cur] = '\n'.join(buf); cur = None
    return out
ro, rn, po, pn = resources('old'), resources('new'), bodies('old'), bodies('new')
bad = 0
for k in sorted(set(ro) | set(rn)):
    if ro.get(k) != rn.get(k): bad += 1; print('resources differ:', k, ro.get(k), '->', rn.get(k))
for k in sorted(set(po) | set(pn)):
    if po.get(k) != pn.get(k): bad += 1; print('PTX differs:', k, '(old only)' if k not in pn else '(new only)' if k not in po else '')
print(f'{len(po)} kernels old, {len(pn)} new; {sum(po.get(k) == pn[k] for k in pn)} identical PTX bodies; '
      f'{sum(ro.get(k) == rn[k] for k in rn)} identical resource lines; {bad} differences')
sys.exit(1 if bad else 0)
PY
