"""Does where a memory-bound kernel's buffers land in device memory move its bandwidth?

RMSNorm and add+RMSNorm (16384 x 8192 bf16) under magi_compile and torch.compile, timed as
the bandwidth benchmark times them, after a pad allocation of each size below (the caching
allocator's segments are freed first, so each pad moves where the next buffers land). With
``--move outputs`` (the default) the inputs stay and the pad goes ahead of the outputs; with
``--move inputs`` the inputs are allocated anew after the pad, the outputs after them. Prints %
of the copy bandwidth measured the same way, and where (virtual address, MiB) the first
workload's two inputs and its first variant's output lie.

    python scripts/gpu/placement_probe.py [--move inputs|outputs] [variant ...]
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bandwidth  # noqa: E402

ROWS, COLS = 16384, 8192
p = argparse.ArgumentParser()
p.add_argument("--move", choices=["inputs", "outputs"], default="outputs")
p.add_argument("variants", nargs="*", default=["magi_compile", "torch.compile"])
args = p.parse_args()
workloads = [w for w in bandwidth.WORKLOADS if w.name in ("rmsnorm", "add_rmsnorm")]


def new_inputs() -> dict:
    return {
        w.name: [w.inputs(ROWS, COLS, torch.bfloat16, "cuda") for _ in range(2)] for w in workloads
    }


inputs = new_inputs()
fns = {(v, w.name): bandwidth.make_variant(v, w) for v in args.variants for w in workloads}
for (_v, name), f in fns.items():
    f(*inputs[name][0])
torch.cuda.synchronize()
copy = bandwidth.copy_bandwidth(ROWS, COLS, torch.bfloat16, "cuda", 5, 120)["gbps"]
print(f"copy {copy:.0f} GB/s; moving the {args.move}")
for pad_mib in (0, 2, 64, 130, 256, 0):
    torch.cuda.synchronize()
    if args.move == "inputs":
        inputs = None
    torch.cuda.empty_cache()
    pad = torch.empty(pad_mib * 2**20 + 1, dtype=torch.uint8, device="cuda")
    if args.move == "inputs":
        inputs = new_inputs()
    line = [f"pad {pad_mib:4d} MiB:"]
    name = workloads[0].name
    out = fns[(args.variants[0], name)](*inputs[name][0])
    out = out[0] if isinstance(out, tuple) else out
    # Virtual addresses in MiB (the physical pages behind them are the driver's choice).
    x_mib = [s[0].data_ptr() >> 20 for s in inputs[name]]
    line.append(f"[x@{x_mib[0]},{x_mib[1]} out@{out.data_ptr() >> 20}]")
    del out
    for w in workloads:
        for v in args.variants:
            t = bandwidth.time_interleaved(
                {"f": fns[(v, w.name)]}, inputs[w.name], "cuda", 5, 120, 1
            )["f"]
            nbytes = w.bytes_moved(ROWS, COLS, 2)
            line.append(f"{w.name}/{v} {100 * nbytes / t / 1e9 / copy:.1f}%")
    print("  ".join(line), flush=True)
    del pad
