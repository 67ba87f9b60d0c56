"""Gather the JSON files of one scripts/gpu/sweep_env.sh run into one document for
benchmarks/report.py (benchmark "env_sweep"): per setting, magi_compile and torch.compile as %
of copy, side by side as each process measured them.

    python scripts/gpu/collect_sweep.py OUT.json "NOTE" "SETTING_1" SWEEP_1.json ...
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> None:
    out, note, pairs = argv[0], argv[1], argv[2:]
    runs, meta = [], None
    for setting, path in zip(pairs[::2], pairs[1::2], strict=True):
        doc = json.load(open(path))
        meta = meta or doc["meta"]
        bw = doc["bandwidth"]
        cells = {}
        for w in bw["workloads"]:
            cells[w["workload"]] = {
                v: round(r["pct_of_copy"], 2) if r.get("status") == "ok" else None
                for v, r in w["variants"].items()
            }
        runs.append(
            {
                "setting": setting or "defaults",
                "shape": f"{bw['rows']} x {bw['cols']} {bw['dtype']}",
                "copy_gbps": round(bw["copy"]["gbps"], 1),
                "workloads": cells,
            }
        )
    json.dump(
        {"benchmark": "env_sweep", "meta": meta, "note": note, "runs": runs},
        open(out, "w"),
        indent=1,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
