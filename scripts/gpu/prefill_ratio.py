"""Prints one line for a benchmarks/run.py JSON of the Llama prefill: each variant's median
step in ms, magi's and magi_cg's ratio to torch.compile's, and the peaks.

    python scripts/gpu/prefill_ratio.py OUT.json LABEL
"""

import json
import sys

(w,) = [w for w in json.load(open(sys.argv[1]))["workloads"] if w["name"] == "llama_prefill"]
ms = {v: round(x["median_ms"], 4) for v, x in w["variants"].items() if "median_ms" in x}
ratios = " ".join(f"{v}/inductor {ms[v] / ms['inductor']:.3f}" for v in ms if v != "inductor")
peak = {v: x.get("peak_mem_bytes") for v, x in w["variants"].items()}
print(sys.argv[2], ms, ratios, "peak", peak)
