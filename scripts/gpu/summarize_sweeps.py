#!/usr/bin/env python
"""Prints one table from the sweep_*.json files that scripts/gpu/sweep_*.sh wrote:
magi_compile's effective bandwidth per setting and workload, as % of the highest device copy
bandwidth measured by any of the runs (one process's copy figure can be low when it met a GPU
at idle clocks; the kernels' own GB/s do not depend on it).

    python scripts/gpu/summarize_sweeps.py DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(folder: str) -> None:
    rows: dict[str, dict[str, str]] = {}
    workloads: list[str] = []
    docs = {p: json.loads(p.read_text()) for p in sorted(Path(folder).glob("sweep_*.json"))}
    copy = max(
        (d["bandwidth"]["copy"]["gbps"] for d in docs.values() if "bandwidth" in d), default=0
    )
    print(f"highest copy bandwidth: {copy:.0f} GB/s")
    for path, doc in docs.items():
        cells = rows.setdefault(path.stem[len("sweep_") :], {})
        for wl in doc.get("bandwidth", {}).get("workloads", []):
            r = wl["variants"].get("magi_compile", {})
            if wl["workload"] not in workloads:
                workloads.append(wl["workload"])
            if r.get("status") != "ok":
                cells[wl["workload"]] = "error"
            else:
                pct = 100.0 * r["gbps"] / copy
                cells[wl["workload"]] = f"{pct:.1f}" + ("" if r["correct"] else "!")
    width = max((len(k) for k in rows), default=8) + 2
    print("% of copy".ljust(width) + "".join(f"{w:>13}" for w in workloads))
    for setting, cells in rows.items():
        print(setting.ljust(width) + "".join(f"{cells.get(w, '-'):>13}" for w in workloads))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
