#!/usr/bin/env python
"""Prints one table from the sweep_*.json files that scripts/gpu/sweep_*.sh wrote:
magi_compile's effective bandwidth per setting and workload, as % of the highest device copy
bandwidth measured by any of the runs (one process's copy figure can be low when it met a GPU
at idle clocks; the kernels' own GB/s do not depend on it). With --json, also writes the
table for benchmarks/report.py.

    python scripts/gpu/summarize_sweeps.py DIR [--json OUT]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def collect(folder: str) -> dict:
    docs = {p: json.loads(p.read_text()) for p in sorted(Path(folder).glob("sweep_*.json"))}
    docs = {p: d for p, d in docs.items() if "bandwidth" in d}
    copy = max((d["bandwidth"]["copy"]["gbps"] for d in docs.values()), default=0.0)
    settings: dict[str, dict] = {}
    workloads: list[str] = []
    meta: dict = {}
    for path, doc in docs.items():
        meta = meta or doc.get("meta", {})
        bw = doc["bandwidth"]
        cells: dict[str, dict] = {}
        for wl in bw["workloads"]:
            r = wl["variants"].get("magi_compile", {})
            if wl["workload"] not in workloads:
                workloads.append(wl["workload"])
            if r.get("status") != "ok":
                cells[wl["workload"]] = {"status": "error"}
            else:
                cells[wl["workload"]] = {
                    "status": "ok",
                    "gbps": r["gbps"],
                    "pct_of_copy": 100.0 * r["gbps"] / copy,
                    "correct": r["correct"],
                }
        settings[path.stem[len("sweep_") :]] = {
            "shape": f"{bw['rows']} x {bw['cols']}",
            "workloads": cells,
        }
    return {
        "benchmark": "kernel_sweep",
        "meta": meta,
        "copy_gbps": copy,
        "workloads": workloads,
        "settings": settings,
    }


def print_table(doc: dict) -> None:
    print(f"highest copy bandwidth: {doc['copy_gbps']:.0f} GB/s")
    width = max((len(k) for k in doc["settings"]), default=8) + 2
    print("% of copy".ljust(width) + "".join(f"{w:>13}" for w in doc["workloads"]))
    for name, s in doc["settings"].items():
        cells = []
        for w in doc["workloads"]:
            c = s["workloads"].get(w)
            if c is None:
                cells.append("-")
            elif c["status"] != "ok":
                cells.append("error")
            else:
                cells.append(f"{c['pct_of_copy']:.1f}" + ("" if c["correct"] else "!"))
        print(name.ljust(width) + "".join(f"{c:>13}" for c in cells))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", nargs="?", default=".")
    p.add_argument("--json", help="also write the table as JSON here")
    args = p.parse_args()
    doc = collect(args.folder)
    print_table(doc)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
