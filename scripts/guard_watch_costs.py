#!/usr/bin/env python
"""What the default guard mode's watch saves and costs, on the CPU (no GPU needed).

For Llama-style stacks of 1, 4 and 8 layers (tiny widths: the guard tree's size depends on the
structure, not the shapes) compiled with ``magi_compile``, after the direct call is learned:
Dynamo's guard check of the cache entry (``RootGuardManager.check`` on the frame's locals, what
the default mode ran on every call before the watch), the walk that lists what the tree reads
(``_guard_watch.plan``, run after each check that passes), and the size of that list. Also the
check of a one-line function's tree, the fixed part every tree pays. Medians of many calls.
Writes a findings JSON for ``benchmarks/report.py``.

    python scripts/guard_watch_costs.py --out benchmarks/results/extra/cpu_guard_watch_costs.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
from blocks import LlamaStack  # noqa: E402
from magi_compiler import _guard_watch, magi_compile  # noqa: E402


def median_us(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def guard_root(code) -> object:
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    (entry,) = _debug_get_cache_entry_list(code)
    return entry.guard_manager.root


def stack_row(n_layers: int) -> list[str]:
    torch._dynamo.reset()
    model = LlamaStack(n_layers, hidden=64, n_heads=4, n_kv_heads=2, intermediate=128).eval()
    compiled = magi_compile(model)
    x = torch.randn(4, 32, 64)
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
    root = guard_root(type(model).forward.__code__)
    frame = {"self": model, "x": x}
    assert root.check(frame)
    check = median_us(lambda: root.check(frame), 5000)
    args = (
        root,
        frame,
        type(model).forward.__globals__,
        ["self", "x"],
        {},
        list(model.parameters()),
        True,
    )
    plan = _guard_watch.plan(*args)
    assert not isinstance(plan, str), plan
    walk = median_us(lambda: _guard_watch.plan(*args), 20) / 1e3
    dicts, pins = plan[0], plan[1]
    return [str(n_layers), f"{check:.2f}", f"{walk:.2f}", str(len(dicts)), str(len(pins))]


def trivial_check() -> float:
    torch._dynamo.reset()

    def f(x):
        return x * 2 + 1

    compiled = magi_compile(f)
    x = torch.randn(4, 32, 64)
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
    root = guard_root(f.__code__)
    frame = {"x": x}
    assert root.check(frame)
    return median_us(lambda: root.check(frame), 20000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with torch.no_grad():  # the guards were made under no_grad: they check grad mode
        rows = [stack_row(n) for n in (1, 4, 8)]
        trivial = trivial_check()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    doc = {
        "benchmark": "findings",
        "title": "Dynamo's guard check and the guard watch's walk (CPU)",
        "meta": {
            "device_name": f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)",
            "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"),
            "git_commit": commit,
        },
        "scripts": ["scripts/guard_watch_costs.py"],
        "notes": [
            "Dynamo's guard check is what the default fast_dispatch_guards mode ran on every "
            "direct call before the watch; since, a call compares the listed dicts and "
            "identities instead, and the walk runs only after a check that passed (the "
            "first call of a layout, or after the listed state moved).",
            f"A one-line function's guard tree (global state, two Python lambda guards, one "
            f"tensor): {trivial:.2f} us per check.",
        ],
        "tables": [
            {
                "caption": "Llama-style stack, per number of layers (medians)",
                "header": ["layers", "guard check (us)", "walk (ms)", "dicts listed", "pins"],
                "rows": rows,
            }
        ],
    }
    text = json.dumps(doc, indent=1) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
