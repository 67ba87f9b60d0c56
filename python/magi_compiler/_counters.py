"""Process-wide counters of what the compiler did, for tests and for users who want to know
whether a call captured, compiled or hit a cache."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass


@dataclass
class Counters:
    captures: int = 0  # graphs Dynamo handed to our backend
    compiles: int = 0  # ATen graphs (forward, backward or inference) lowered to the executor
    guard_misses: int = 0  # calls whose inputs no longer matched a compiled entry
    cache_hits: int = 0  # compiled artifacts reused instead of rebuilt
    direct_calls: int = 0  # calls that went straight to a compiled graph (_fast_dispatch.py)
    disk_cache_hits: int = 0  # compiled-module cache entries loaded from disk (_compile_cache.py)
    disk_cache_misses: int = 0  # entries looked for and not found or not usable
    disk_cache_writes: int = 0  # entries written
    cache_loaded_graphs: int = 0  # graphs rebuilt from a disk entry instead of captured

    def __getitem__(self, key: str) -> int:
        return getattr(self, key)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


_lock = threading.Lock()
_counters = Counters()


def bump(name: str, by: int = 1) -> None:
    with _lock:
        setattr(_counters, name, getattr(_counters, name) + by)


def captures() -> int:
    """The capture count now, without waiting for cache writes (the call path's read)."""
    return _counters.captures


def count_direct_call() -> None:
    """bump("direct_calls") without the lock: the hot path's counter, kept exact by the GIL."""
    _counters.direct_calls += 1


def get_counters() -> Counters:
    """A snapshot of the counters (a copy: later compiles do not change it), taken once the
    compiled-module cache's pending writes are done, so ``disk_cache_writes`` counts them."""
    from magi_compiler import _C, _compile_cache

    _compile_cache.wait_for_writes()
    with _lock:
        snapshot = Counters(**asdict(_counters))
    # Direct calls made from C++ (_C.DirectEntry) are counted there.
    snapshot.direct_calls += _C.direct_entry_calls()
    return snapshot


def reset_counters() -> None:
    """Sets every counter back to zero."""
    global _counters
    from magi_compiler import _C

    with _lock:
        _counters = Counters()
        _C.reset_direct_entry_calls()
