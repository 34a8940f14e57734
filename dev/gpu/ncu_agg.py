# Sums Nsight Compute kernel durations by kernel name (ncu --csv --metrics gpu__time_duration.sum output) and
# prints the top 30 per forward pass. usage: ncu_agg.py FILE.csv PASSES (synthetic-weight fill kernels are skipped).
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
i0 = next(i for i, r in enumerate(rows) if r[0] == "ID")
hdr = rows[i0]; ki = hdr.index("Kernel Name"); vi = hdr.index("Metric Value")
tot = collections.Counter(); cnt = collections.Counter()
for r in rows[i0+1:]:
    if "fill_" in r[ki] or "synthetic" in r[ki].lower(): continue
    try: v = float(r[vi].replace(",", ""))
    except ValueError: continue
    name = r[ki][:110]; tot[name] += v; cnt[name] += 1
steps = float(sys.argv[2]) if len(sys.argv) > 2 else 12.0; all_ns = sum(tot.values())
print(f"  {sum(cnt.values())} kernels, {all_ns/steps/1e3:.1f} us of kernel time per forward pass (/{steps})")
for name, v in tot.most_common(30):
    print(f"  {v/steps/1e3:9.1f} us/step {100*v/all_ns:5.1f}%  x{cnt[name]/steps:5.1f}  {name}")
