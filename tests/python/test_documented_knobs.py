"""Every environment variable the library reads is documented: each quoted ``MAGI_...`` name in
the C++ sources, the kernels and the Python package appears in backquotes in docs/ or the
README (docs/config.md holds the table)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"[\"']((?:MAGI)_[A-Z0-9_]+)[\"']")


def _names_read() -> dict[str, str]:
    found: dict[str, str] = {}
    for folder, patterns in [
        ("src", ("*.cpp", "*.h")),
        ("include", ("*.h",)),
        ("kernels", ("*.cuh", "*.h")),
        ("python/magi_compiler", ("*.py",)),
    ]:
        for pattern in patterns:
            for path in sorted((ROOT / folder).rglob(pattern)):
                for name in NAME.findall(path.read_text(errors="replace")):
                    found.setdefault(name, str(path.relative_to(ROOT)))
    return found


def test_every_environment_variable_read_is_documented():
    names = _names_read()
    assert "MAGI_VECTOR_IO" in names and "MAGI_CACHE_DIR" in names, sorted(names)
    docs = "".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    docs += (ROOT / "README.md").read_text()
    missing = {n: where for n, where in names.items() if f"`{n}" not in docs}
    assert not missing, f"read but not documented in docs/ or the README: {missing}"
