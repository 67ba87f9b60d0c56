"""What the grid benchmarks share (``long_prefill.py``, ``decode.py``, ``attention.py``): one
JSON file of rows, one row per point of a grid, written after each row so a run cut short keeps
what it measured, and ``--append`` for a run split over several commands.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch


def git_commit() -> str | None:
    """The repository's short commit, with "+dirty" when the code a run measures (python, src,
    include, kernels, benchmarks but its results) has uncommitted changes; None outside a git
    checkout.
    ``MAGI_GIT_COMMIT`` overrides it: for a copy of a working tree whose git metadata is not
    the tree's own (the GPU machine's copy of this checkout), the caller names the commit."""
    if os.environ.get("MAGI_GIT_COMMIT"):
        return os.environ["MAGI_GIT_COMMIT"]
    root = Path(__file__).resolve().parents[1]
    try:
        git = ["git", "-C", str(root)]
        run: dict[str, Any] = dict(capture_output=True, text=True, timeout=10)
        rev = subprocess.run([*git, "rev-parse", "--short", "HEAD"], **run).stdout.strip()
        paths = ["python", "src", "include", "kernels", "benchmarks", ":!benchmarks/results"]
        dirty = subprocess.run([*git, "status", "--porcelain", "--", *paths], **run).stdout.strip()
        return (rev + ("+dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def time_calls(fn: Callable[[], Any], device: str, runs: int) -> float:
    """Median ms per call of ``fn`` over ``runs`` calls after one warm-up call: CUDA events on
    CUDA, the host clock on the CPU."""
    fn()
    times = []
    for _ in range(runs):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def run_meta(benchmark: str, device: str, argv: list[str] | None, **fields: Any) -> dict:
    """The meta of a run of ``benchmarks/<benchmark>.py``: device, torch version, date, commit
    and command line, then ``fields``."""
    args = argv if argv is not None else sys.argv[1:]
    return {
        "benchmark": benchmark,
        "device_type": device,
        "device_name": (
            torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
        ),
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit() or "?",
        "command": " ".join(["python", f"benchmarks/{benchmark}.py", *_measuring(args)]),
        **fields,
    }


def _measuring(args: list[str]) -> list[str]:
    """The options of a command line that decide what it measured (without ``--out FILE`` and
    ``--append``, which say where the rows went)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--out":
            skip = True
        elif a != "--append" and not a.startswith("--out="):
            out.append(a)
    return out


class Results:
    """The rows of one run: with ``append``, the rows of ``out`` whose key (``key(row)``) this
    run does not ask for are kept, and the meta lists every command that wrote the file. Each
    row carries the commit it was measured at (``git_commit``) and the meta fields named in
    ``per_row`` (measurements of the run beside it, such as the copy bandwidth); the meta's
    ``git_commit`` names the commits among the rows, earlier runs first (``a + b``)."""

    def __init__(
        self,
        meta: dict,
        out: str | None,
        append: bool,
        key: Callable[[dict], tuple],
        asked: Iterable[tuple],
        order: Callable[[dict], tuple],
        per_row: Iterable[str] = (),
    ) -> None:
        self.out, self.order = out, order
        self.stamp = {f: meta[f] for f in ("git_commit", *per_row)}
        self.doc: dict[str, Any] = {"benchmark": meta["benchmark"], "meta": meta, "rows": []}
        if append and out and Path(out).exists():
            old = json.loads(Path(out).read_text())
            asked = set(asked)
            self.doc["rows"] = [r for r in old.get("rows", []) if key(r) not in asked]
            old_meta = old.get("meta", {})
            for r in self.doc["rows"]:  # rows written before rows carried these fields
                for field in self.stamp:
                    r.setdefault(field, old_meta.get(field, "?" if field == "git_commit" else None))
            meta["commands"] = [
                *old_meta.get("commands", [old_meta.get("command")]),
                meta["command"],
            ]
        # Commits in the order their runs came: the kept rows' (in row order), then this run's.
        self.commits = list(dict.fromkeys([*(r["git_commit"] for r in self.doc["rows"]),
                                           self.stamp["git_commit"]]))  # fmt: skip

    def add(self, row: dict) -> None:
        """Adds a row, keeps the rows in order and writes the file."""
        meta = self.doc["meta"]
        for field, value in self.stamp.items():
            row.setdefault(field, value)
        self.doc["rows"].append(row)
        present = {r["git_commit"] for r in self.doc["rows"]}
        meta["git_commit"] = " + ".join(c for c in self.commits if c in present)
        self.doc["rows"].sort(key=self.order)
        if self.out:
            Path(self.out).write_text(json.dumps(self.doc, indent=1))


def parser(doc: str) -> argparse.ArgumentParser:
    """A grid benchmark's command line with the options all of them take (--device, --out,
    --append); the benchmark adds its own. ``doc``: its module docstring."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=None, help="result JSON (default: print only)")
    p.add_argument("--append", action="store_true", help="keep the rows already in --out")
    return p


def failure(e: BaseException) -> str:
    """A row's ``error``: a failure is a row, and the next point still runs."""
    if isinstance(e, torch.OutOfMemoryError):
        return "out of memory"
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def release(device: str) -> None:
    """Frees what a point left behind (collected models, Dynamo's caches, cached device memory)
    before the next one."""
    gc.collect()
    torch._dynamo.reset()
    if device == "cuda":
        torch.cuda.empty_cache()


def parse_list(text: str | None, default: Iterable[Any], cast: Callable = str) -> list[Any]:
    """A comma-separated option as a list (``default`` when not given)."""
    return [cast(x) for x in text.split(",") if x] if text else list(default)


def check_known(parser: Any, name: str, given: list[str], known: Iterable[str]) -> None:
    """``parser.error`` naming the values of ``given`` that are not ``known``."""
    known = tuple(known)
    unknown = [g for g in given if g not in known]
    if unknown:
        parser.error(f"unknown {name} {', '.join(unknown)}; known: {', '.join(known)}")
