"""What a workload leaves to ATen under magi_compile, per compiled graph, from the dump's
summary.json: the ATen calls other than views and matmuls (the ones a fusion could take),
grouped by op and reason. Diagnostic, on any device:

    python scripts/gpu/fallback_summary.py llama_train [--preset full] [--device cuda]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (str(ROOT / "examples"), str(ROOT)):
    sys.path.insert(0, p)

DUMPS = tempfile.mkdtemp(prefix="magi_fallbacks_")
os.environ["MAGI_ENABLE_FX_GRAPH_VIZ"] = "1"
os.environ["MAGI_DUMP_DIR"] = DUMPS

import torch  # noqa: E402

from benchmarks import harness, workloads  # noqa: E402

FREE = {"aten::view", "aten::_unsafe_view", "aten::t", "aten::unsqueeze", "aten::squeeze.dim",
        "aten::transpose.int", "aten::permute", "aten::expand", "aten::slice.Tensor",
        "aten::select.int", "aten::alias", "aten::detach", "aten::mm", "aten::addmm", "aten::bmm"}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workload")
    ap.add_argument("--preset", default="full")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dtype = torch.bfloat16
    case = workloads.BY_NAME[args.workload].build(args.preset, torch.device(args.device), dtype)
    fn, hook = harness.make_variant("magi", case.module)
    with torch.enable_grad() if case.kind == "train" else torch.no_grad():
        case.step(fn, case.inputs[0], hook)
    for summary in sorted(Path(DUMPS).glob("*/summary.json")):
        for graph in json.loads(summary.read_text()):
            counts = collections.Counter(
                (f["op"], f["reason"][:70]) for f in graph["aten_fallbacks"] if f["op"] not in FREE
            )
            print(f"== {summary.parent.name} {graph['kind']}: {graph['fused_kernel_calls']} fused "
                  f"kernel calls ({graph['fused_ops']} ops), {graph['operator_calls']} operator calls")  # fmt: skip
            for (op, reason), n in counts.most_common():
                print(f"  {n:3d} x {op}: {reason}")


if __name__ == "__main__":
    main()
