# TTFT as a client sees it (streamed /v1/completions, token-id prompts, max_tokens 1) for issue 18's two whole-model
# targets: a lone 10k prompt, and a 20k prompt whose first 12k tokens are already in the prefix cache (the 12k
# prefix is sent once first). Prints one line per request and a summary; exits 1 if a request fails.
#   usage: python3 ttft_prefix.py BASE_URL MODEL [REPEATS]
import json, random, sys, time, urllib.request

base, model = sys.argv[1], sys.argv[2]
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 3
rng = random.Random(18)

def ids(n):
    return [rng.randrange(1000, 100000) for _ in range(n)]

def ttft(prompt):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter(); first = None; cached = None
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            ev = json.loads(line[5:])
            if ev.get("choices") and first is None:
                first = time.perf_counter() - t0
            u = ev.get("usage")
            if u:
                cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
    return first, cached

ttft(ids(2048))  # warm-up (first-use allocations, cuBLAS handles)
lone, ext, cold20 = [], [], []
for i in range(repeats):
    t, c = ttft(ids(10000)); lone.append(t)
    print(f"lone 10k: TTFT {t*1e3:.0f} ms (cached {c})")
for i in range(repeats):
    prefix = ids(12000)
    t12, _ = ttft(prefix)
    t, c = ttft(prefix + ids(8000)); ext.append(t)
    print(f"20k with 12k cached: TTFT {t*1e3:.0f} ms (cached {c}; the 12k prefix alone took {t12*1e3:.0f} ms)")
for i in range(repeats):
    t, c = ttft(ids(20000)); cold20.append(t)
    print(f"20k cold: TTFT {t*1e3:.0f} ms (cached {c})")
med = lambda v: sorted(v)[len(v) // 2]
print(f"SUMMARY lone10k_ms={med(lone)*1e3:.0f} ext20k_12k_cached_ms={med(ext)*1e3:.0f} cold20k_ms={med(cold20)*1e3:.0f}")
