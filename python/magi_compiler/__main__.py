"""``python -m magi_compiler cache {list,info,clear,prune}``: the compiled-module cache on disk
(docs/cache.md)."""

from __future__ import annotations

import argparse
import datetime
import re
import sys

from magi_compiler import _compile_cache
from magi_compiler.config import get_compile_config


def _size(text: str) -> int:
    """Bytes from ``"500M"``, ``"2G"``, ``"64K"`` or a plain number of bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size; write bytes (1000000) or a number with K, M, G or T (500M)"
        )
    scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[match[2].upper()]
    return int(float(match[1]) * scale)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _when(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M")


def _list(entries: list[_compile_cache.EntryInfo]) -> None:
    if not entries:
        print("no compiled-module cache entries")
        return
    print(f"{'key':<32}  {'size':>10}  {'graphs':>6}  {'hits':>5}  {'last used':<16}  function")
    for e in sorted(entries, key=lambda e: e.last_used, reverse=True):
        key = e.path.rsplit("/", 1)[-1].split(".")[0]
        print(
            f"{key:<32}  {_human(e.bytes):>10}  {e.graphs:>6}  {e.hits:>5}  "
            f"{_when(e.last_used):<16}  {e.function}"
        )
    total = sum(e.bytes for e in entries)
    print(f"{len(entries)} entries, {_human(total)}")


def _info(entries: list[_compile_cache.EntryInfo], key: str) -> int:
    found = [e for e in entries if e.path.rsplit("/", 1)[-1].startswith(key)]
    if len(found) != 1:
        print(f"{len(found)} entries have a key starting with {key!r}; give more of it",
              file=sys.stderr)  # fmt: skip
        return 1
    e = found[0]
    print(f"path: {e.path}")
    print(f"function: {e.function} (model tag {e.model_tag})")
    print(f"size: {_human(e.bytes)}, {e.graphs} graph(s), {e.hits} hit(s)")
    print(f"created: {_when(e.created)}, last used: {_when(e.last_used)}")
    print("key parts:")
    for name, value in e.parts.items():
        print(f"  {name}: {value}")
    return 0


def _prune(entries: list[_compile_cache.EntryInfo], max_size: int) -> None:
    total = sum(e.bytes for e in entries)
    removed = []
    for e in sorted(entries, key=lambda e: e.last_used):  # least recently used first
        if total <= max_size:
            break
        _compile_cache.remove_entry(e)
        total -= e.bytes
        removed.append(e)
    print(f"removed {len(removed)} entries ({_human(sum(e.bytes for e in removed))}); "
          f"{_human(total)} left")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m magi_compiler")
    commands = parser.add_subparsers(dest="area", required=True)
    cache = commands.add_parser("cache", help="the compiled-module cache on disk (docs/cache.md)")
    actions = cache.add_subparsers(dest="action", required=True)
    for name, text in (
        ("list", "entries with their size, graphs, hits and last use"),
        ("info", "one entry's key parts"),
        ("clear", "remove every entry"),
        ("prune", "remove the least recently used entries until the cache fits a size"),
    ):
        action = actions.add_parser(name, help=text)
        action.add_argument(
            "--root",
            default=None,
            help="the cache_root_dir (default: the config's, ~/.cache/magi_compiler)",
        )
        if name == "info":
            action.add_argument("key", help="the entry's key, or its first characters")
        if name == "prune":
            action.add_argument("--max-size", type=_size, required=True, help="e.g. 2G, 500M")
    args = parser.parse_args(argv)
    root = args.root or get_compile_config().cache_root_dir
    entries = _compile_cache.list_entries(root)
    if args.action == "list":
        _list(entries)
    elif args.action == "info":
        return _info(entries, args.key)
    elif args.action == "clear":
        for e in entries:
            _compile_cache.remove_entry(e)
        print(f"removed {len(entries)} entries ({_human(sum(e.bytes for e in entries))})")
    elif args.action == "prune":
        _prune(entries, args.max_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
