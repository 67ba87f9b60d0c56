"""The attention kernels magi_compile picks (attention_backend="auto") for the Llama stack of
issue 6 at its two shapes, batch 1 x 4096 and 4 x 32 tokens: every backend's median time from
the probe, and which one won. Prints a table; --out writes the choices as JSON.

    python scripts/gpu/attention_choices.py --out $OUT/attention.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import torch  # noqa: E402
from blocks import LlamaStack, init_weights_  # noqa: E402
from magi_compiler import inspection, magi_compile  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    model = LlamaStack(4, hidden=2048, n_heads=16, n_kv_heads=8, intermediate=8192)
    model = init_weights_(model, seed=0).to("cuda", torch.bfloat16).eval()
    compiled = magi_compile(model, dynamic_arg_dims={})
    with torch.no_grad():
        for batch, tokens in ((1, 4096), (4, 32)):
            compiled(torch.randn(batch, tokens, 2048, device="cuda", dtype=torch.bfloat16))
    choices = inspection.attention_choices()
    for c in choices:
        timed = ", ".join(
            f"{k} {v:.3f} ms" for k, v in sorted(c["ms"].items(), key=lambda kv: kv[1])
        )
        print(f"{c['shape']}\n   traced {c['traced']}, chosen {c['chosen']}: {timed}")
        for r in c["rejected"]:
            print(f"   left out: {r}")
    if args.out:
        Path(args.out).write_text(json.dumps(choices, indent=1))


if __name__ == "__main__":
    main()
