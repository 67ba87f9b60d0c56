"""One log level for Python and C++: ``MAGI_LOGGING_LEVEL`` (trace, debug, info, warning,
error, off; default warning) sets both the ``magi_compiler`` Python logger and the C++ core's."""

from __future__ import annotations

import logging
import os

from magi_compiler import _C

logger = logging.getLogger("magi_compiler")

_PY_LEVELS = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.ERROR,
    "off": logging.CRITICAL + 10,
    "none": logging.CRITICAL + 10,
}


def set_level(level: str) -> None:
    """Sets the level of both loggers, e.g. ``set_level("debug")``."""
    key = level.strip().lower()
    if key not in _PY_LEVELS:
        raise ValueError(
            f"log level {level!r} is not one of trace, debug, info, warning, error, off"
        )
    _C.set_log_level(key)
    logger.setLevel(_PY_LEVELS[key])


def init_from_env() -> None:
    value = os.environ.get("MAGI_LOGGING_LEVEL", "")
    if not value:
        logger.setLevel(logging.WARNING)
        return
    try:
        set_level(value)
    except ValueError as e:
        raise ValueError(f"MAGI_LOGGING_LEVEL: {e}") from None
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[magi %(levelname)s] %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
