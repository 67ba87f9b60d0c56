"""magi-compiler: a compiler and runtime for PyTorch transformer models with a C++ core.

Two decorators are the user surface: :func:`magi_compile` and :func:`magi_register_custom_op`.
"""

from magi_compiler import _logging
from magi_compiler._counters import get_counters, reset_counters
from magi_compiler.api import magi_compile, magi_register_custom_op
from magi_compiler.config import CompileConfig, get_compile_config
from magi_compiler.errors import DeviceError, InternalError, UnsupportedError, UserError

_logging.init_from_env()

__version__ = "0.1.0"

__all__ = [
    "magi_compile",
    "magi_register_custom_op",
    "CompileConfig",
    "get_compile_config",
    "get_counters",
    "reset_counters",
    "UserError",
    "UnsupportedError",
    "InternalError",
    "DeviceError",
]
