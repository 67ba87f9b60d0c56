"""Exceptions raised by magi-compiler.

Three kinds, defined by the C++ core and translated in one place (``python/csrc/bind_errors.cpp``):

* :class:`UserError` (a ``ValueError``): bad input; the message says what was wrong and how to fix it.
* :class:`UnsupportedError` (a ``NotImplementedError``): a construct we cannot compile.
* :class:`InternalError` (a ``RuntimeError``): a bug in magi-compiler; please report it.
"""

from magi_compiler._C import InternalError, UnsupportedError, UserError

__all__ = ["UserError", "UnsupportedError", "InternalError"]
