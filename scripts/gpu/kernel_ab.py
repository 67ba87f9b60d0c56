"""A/B of generated row kernels' CUDA sources on the GPU, in one process: each source (the
preamble included) is compiled by NVRTC (magi_compiler._C.compile_cuda_to_cubin), loaded and
launched through the driver API (ctypes) exactly as the runtime launches a row kernel (one block
of `--threads` threads per row, MagiArgs by value), and timed in interleaved rounds with CUDA
events against torch.compile's kernel for the same function, over two rotating input sets.

    python scripts/gpu/kernel_ab.py --workload rmsnorm --threads 256 a.cu:symbol b.cu:symbol

Each output is checked against eager first (normwise relative error printed).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bandwidth  # noqa: E402
from magi_compiler import _C  # noqa: E402

MAX_IO, MAX_RANK = 16, 8


class MagiArgs(ctypes.Structure):
    _fields_ = [
        ("ptr", ctypes.c_void_p * MAX_IO),
        ("numel", ctypes.c_longlong),
        ("rows", ctypes.c_longlong),
        ("cols", ctypes.c_longlong),
        ("rank", ctypes.c_longlong),
        ("sizes", ctypes.c_longlong * MAX_RANK),
        ("strides", (ctypes.c_longlong * MAX_RANK) * MAX_IO),
        ("workspace", ctypes.c_void_p),
        ("splits", ctypes.c_longlong),
        ("phase", ctypes.c_longlong),
        ("div_magic", ctypes.c_uint * MAX_RANK),
        ("div_shift", ctypes.c_uint * MAX_RANK),
        ("cols_magic", ctypes.c_uint),
        ("cols_shift", ctypes.c_uint),
    ]


cuda = ctypes.CDLL("libcuda.so.1")


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what} failed with CUresult {rc}")


def load(source: str, symbol: str):
    cubin = _C.compile_cuda_to_cubin(source, symbol, 90)
    module, fn = ctypes.c_void_p(), ctypes.c_void_p()
    check(cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(cubin)), "cuModuleLoadData")
    check(
        cuda.cuModuleGetFunction(ctypes.byref(fn), module, symbol.encode()), "cuModuleGetFunction"
    )
    return fn


def launcher(fn, threads: int):
    def run(*tensors):
        inputs, out = tensors, torch.empty_like(tensors[0])
        a = MagiArgs()
        for i, t in enumerate((*inputs, out)):
            a.ptr[i] = t.data_ptr()
        a.rows, a.cols = inputs[0].shape[0], inputs[0].shape[1]
        a.numel, a.rank = a.rows * a.cols, 2
        a.sizes[0], a.sizes[1] = a.rows, a.cols
        params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(a), ctypes.c_void_p))
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        check(
            cuda.cuLaunchKernel(fn, a.rows, 1, 1, threads, 1, 1, 0, stream, params, None),
            "cuLaunchKernel",
        )
        return out

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="rmsnorm")
    ap.add_argument("--threads", type=int, default=256)
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--cols", type=int, default=8192)
    ap.add_argument("kernels", nargs="+", help="FILE:SYMBOL[:THREADS]")
    args = ap.parse_args()
    (wl,) = [w for w in bandwidth.WORKLOADS if w.name == args.workload]
    sets = [wl.inputs(args.rows, args.cols, torch.bfloat16, "cuda") for _ in range(2)]
    fns = {"torch.compile": torch.compile(bandwidth.fresh_function(wl.fn, "ab"))}
    for spec in args.kernels:
        path, symbol, *threads = spec.split(":")
        fn = load(Path(path).read_text(), symbol)
        fns[Path(path).stem] = launcher(fn, int(threads[0]) if threads else args.threads)
    want = wl.fn(*sets[0])
    for name, fn in fns.items():
        got = fn(*sets[0])
        err = ((got.double() - want.double()).norm() / want.double().norm()).item()
        print(f"{name}: relative error {err:.2e}")
    nbytes = wl.bytes_moved(args.rows, args.cols, 2)
    copy = bandwidth.copy_bandwidth(args.rows, args.cols, torch.bfloat16, "cuda", 10, 100)
    times = {name: [] for name in fns}
    for r in range(8):
        names = list(fns)[r % len(fns) :] + list(fns)[: r % len(fns)]
        for name in names:
            times[name] += bandwidth.time_block(fns[name], sets, "cuda", 25)
    print(f"copy {copy['gbps']:.0f} GB/s")
    for name, t in times.items():
        gbps = nbytes / statistics.median(t) / 1e9
        print(
            f"{name:>24}: {statistics.median(t) * 1e6:8.1f} us  {100 * gbps / copy['gbps']:6.1f}% of copy"
        )


if __name__ == "__main__":
    main()
