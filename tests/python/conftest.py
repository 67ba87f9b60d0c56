"""CPU tier settings. Shared helpers and fixtures (``examples/`` on ``sys.path``,
``assert_close_rel``, ``counters``, fresh random inputs) live in ``tests/conftest.py``.

ATen's OpenMP team is cut to one thread unless ``OMP_NUM_THREADS`` says otherwise: on small
shared CI machines (2 cores, a build running beside the tests) its spinning threads made a
64x128x512 matmul 300 times slower than single-threaded, and the suite with it.
"""

from __future__ import annotations

import os

import torch

if "OMP_NUM_THREADS" not in os.environ:
    torch.set_num_threads(1)
