"""Exceptions raised by magi-compiler.

Four kinds, defined by the C++ core and translated in one place (``python/csrc/bind_errors.cpp``):

* :class:`UserError` (a ``ValueError``): bad input; the message says what was wrong and how to fix it.
* :class:`UnsupportedError` (a ``NotImplementedError``): a construct we cannot compile.
* :class:`InternalError` (a ``RuntimeError``): a bug in magi-compiler; please report it.
* :class:`DeviceError` (a ``RuntimeError``): the GPU failed in a way that does not say whose code
  caused it (a device fault reported at a later call, such as a device-side assert; no device
  memory left). The message says how to find the kernel.
"""

from magi_compiler._C import DeviceError, InternalError, UnsupportedError, UserError

__all__ = ["UserError", "UnsupportedError", "InternalError", "DeviceError"]
