"""The environment variables the library reads: each quoted ``MAGI_...`` name in the C++
sources, the kernels and the Python package appears in backquotes in docs/ or the README
(docs/config.md holds the table); besides the ``MAGI_COMPILE_*`` mirror of ``CompileConfig``
there are at most ten of them; and the docs name no variable the library does not read."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUOTED = re.compile(r"[\"']((?:MAGI)_[A-Z0-9_]+)[\"']")
DOCUMENTED = re.compile(r"`(MAGI_[A-Z0-9_]+)")
DEFINED = re.compile(r"#define\s+(MAGI_[A-Z0-9_]+)")
MAX_VARIABLES = 10


def _names(folders, regex) -> dict[str, str]:
    found: dict[str, str] = {}
    for folder, patterns in folders:
        for pattern in patterns:
            for path in sorted((ROOT / folder).rglob(pattern)):
                for name in regex.findall(path.read_text(errors="replace")):
                    found.setdefault(name, str(path.relative_to(ROOT)))
    return found


LIBRARY = [
    ("src", ("*.cpp", "*.h")),
    ("include", ("*.h",)),
    ("kernels", ("*.cuh", "*.h")),
    ("python/magi_compiler", ("*.py",)),
]


def _variables_read() -> dict[str, str]:
    return {n: p for n, p in _names(LIBRARY, QUOTED).items() if not n.startswith("MAGI_COMPILE")}


def _docs() -> str:
    text = "".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    return text + (ROOT / "README.md").read_text()


def test_every_environment_variable_read_is_documented():
    names = _variables_read()
    assert "MAGI_LOGGING_LEVEL" in names and "MAGI_CACHE_DIR" in names, sorted(names)
    docs = _docs()
    missing = {n: where for n, where in names.items() if f"`{n}" not in docs}
    assert not missing, f"read but not documented in docs/ or the README: {missing}"


def test_at_most_ten_variables_besides_the_config_mirror():
    names = _variables_read()
    assert len(names) <= MAX_VARIABLES, (
        f"{len(names)} MAGI_* variables (at most {MAX_VARIABLES}): {sorted(names)}; "
        "a measured choice becomes fixed behaviour, a setting a CompileConfig field"
    )


def test_docs_name_no_variable_the_library_does_not_read():
    read = _variables_read()
    # Macros of the C++ sources and settings of the test suites are not library variables.
    macros = _names(LIBRARY, DEFINED)
    tests = _names([("tests", ("*.py", "*.cpp", "*.h"))], QUOTED)
    stale = {
        n
        for n in DOCUMENTED.findall(_docs())
        if not n.startswith("MAGI_COMPILE") and n not in read and n not in macros and n not in tests
    }
    assert not stale, f"documented but not read by the library: {sorted(stale)}"
