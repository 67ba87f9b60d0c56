"""The compiled-module cache on disk (docs/cache.md): each test runs fresh Python processes
(_cache_driver.py) over one cache directory, as a restarted server would, and checks what the
second process loaded, captured and compiled, and that its results equal eager's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

DRIVER = Path(__file__).with_name("_cache_driver.py")
ROOT = Path(__file__).resolve().parents[2]

MODEL = """
import torch
from torch import nn

import magi_compiler


def gate(h):
    return torch.sigmoid(h) * SCALE


SCALE = 1.0


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, x):
        h = self.up(x)
        return self.down(torch.relu(h) * gate(h)) + x


def register_op(compute_sensitive):
    @magi_compiler.magi_register_custom_op(
        name="cachetest::twice", is_compute_sensitive=compute_sensitive
    )
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2
"""


def _workdir(tmp_path: Path, model: str = MODEL) -> Path:
    (tmp_path / "cache_model.py").write_text(model)
    return tmp_path


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MAGI_COMPILE_DISABLE_CACHE", None)
    env["MAGI_CACHE_DIR"] = str(tmp_path / "kernels")  # the kernel cache, warm after the first run
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), env.get("PYTHONPATH", "")])
    return env


def _start(tmp_path: Path, env: dict[str, str] | None = None, **spec) -> subprocess.Popen:
    spec = {"dir": str(tmp_path), "shapes": [[4, 16], [6, 16]], **spec}
    return subprocess.Popen(
        [sys.executable, str(DRIVER), json.dumps(spec)],
        env={**_env(tmp_path), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=240)
    assert process.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    for error in result["errors"]:
        assert error <= 1e-5, result
    return result


def _run(tmp_path: Path, **spec) -> dict:
    return _finish(_start(tmp_path, **spec))


def _entries(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / "modules").rglob("*.entry"))


def _logged(result: dict, text: str) -> list[str]:
    return [line for line in result["log"] if text in line]


def test_a_warm_process_neither_captures_nor_compiles(tmp_path):
    _workdir(tmp_path)
    cold = _run(tmp_path, shapes=[[4, 16], [6, 16], [1, 16]])
    assert cold["counters"]["captures"] == 2  # batch 4 (dynamic), batch 1 (specialised)
    assert cold["counters"]["disk_cache_writes"] == 2
    assert len(_entries(tmp_path)) == 1

    warm = _run(tmp_path, shapes=[[5, 16], [1, 16], [9, 16], [9, 16], [7, 16]])
    counters = warm["counters"]
    assert counters["captures"] == 0
    assert counters["compiles"] == 0
    assert counters["cpu_compiles"] == 0 and counters["cuda_compiles"] == 0
    assert counters["disk_cache_hits"] == 1
    assert counters["cache_loaded_graphs"] == 2
    assert counters["disk_cache_writes"] == 0
    assert "torch._functorch.aot_autograd" in cold["imported"]
    assert warm["imported"] == []  # neither AOTAutograd nor Dynamo's minifier is imported
    # Direct calls work from loaded entries: the second call of a signature learns the
    # direct path (as in a cold process), the calls after it take it.
    assert counters["direct_calls"] == 2
    assert _logged(warm, "loaded 2 compiled graph(s)")


def test_a_warm_process_chunks_rows_as_the_cold_one_did(tmp_path):
    """chunk_rows outlines a symbolic row count by the compiling call's size; the entry keeps
    those sizes, so a warm process runs the same pieces in row chunks, with eager's numbers."""
    _workdir(tmp_path)
    patch = {"chunk_rows": 2}
    cold = _run(tmp_path, shapes=[[8, 16], [6, 16]], patch=patch)
    assert cold["chunked"] == 1, cold  # the model's MLP, over the symbolic batch
    warm = _run(tmp_path, shapes=[[9, 16], [5, 16]], patch=patch)
    assert warm["counters"]["captures"] == 0 and warm["counters"]["cache_loaded_graphs"] == 1
    assert warm["chunked"] == 1, warm


def test_each_key_part_is_a_miss_that_names_itself(tmp_path):
    _workdir(tmp_path)
    _run(tmp_path, op_flag=False)
    changes = [
        ({"patch": {"max_recaptures": 9}}, "config"),
        ({"op_flag": True}, "custom ops"),
        ({"fake": {"torch": "2.99.0"}}, "torch"),
        ({"fake": {"device": "NVIDIA Imaginary sm_120"}}, "device"),
    ]
    for change, part in changes:
        changed = _run(tmp_path, **{"op_flag": False, **change})
        assert changed["counters"]["disk_cache_hits"] == 0, part
        assert changed["counters"]["captures"] == 1, part
        (line,) = _logged(changed, "compiled-module cache miss: no entry")
        assert line.endswith(f"closest cached entry of this function in: {part}"), line
    assert len(_entries(tmp_path)) == 1 + len(changes)  # every key is kept

    _workdir(tmp_path, MODEL.replace("+ x\n", "- x\n"))
    edited = _run(tmp_path, op_flag=False)
    assert edited["counters"]["captures"] == 1
    (line,) = _logged(edited, "compiled-module cache miss: no entry")
    assert line.endswith("closest cached entry of this function in: source"), line


def test_an_edited_helper_the_trace_inlined_is_a_miss(tmp_path):
    # gate() is not part of the key; Dynamo's checksums of the traced source ranges catch it.
    _workdir(tmp_path)
    _run(tmp_path)
    _workdir(tmp_path, MODEL.replace("torch.sigmoid(h) * SCALE", "torch.tanh(h) * SCALE"))
    edited = _run(tmp_path)
    assert edited["counters"]["disk_cache_hits"] == 0 and edited["counters"]["captures"] == 1
    (line,) = _logged(edited, "cache miss: the entry did not load")
    assert "Source code changes detected for cache_model" in line
    # The entry is replaced by the new capture: a third process loads it.
    third = _run(tmp_path)
    assert third["counters"]["captures"] == 0 and third["counters"]["disk_cache_hits"] == 1


def test_a_changed_global_the_trace_read_is_a_guard_miss(tmp_path):
    _workdir(tmp_path)
    _run(tmp_path)
    _workdir(tmp_path, MODEL.replace("SCALE = 1.0", "SCALE = 2.0"))
    changed = _run(tmp_path)
    # The key and the traced lines are the same; the guard on SCALE fails, so the call is
    # captured again, and the result is the new one (checked against eager by the driver).
    assert changed["counters"]["disk_cache_hits"] == 1
    assert changed["counters"]["captures"] == 1


def test_static_sizes_and_dtypes_that_differ_capture_again(tmp_path):
    # MagiCompiler's [1, 8] -> [1, 16] case: a static dim that differs must not load the
    # graph of the other size. Batch 1 specialises dim 0 and the columns are static.
    model = MODEL.replace("nn.Linear(16, 32)", "nn.LazyLinear(32)").replace(
        "self.down(torch.relu(h) * gate(h)) + x", "self.down(torch.relu(h) * gate(h)) + x.sum()"
    )
    _workdir(tmp_path, model)
    _run(tmp_path, shapes=[[1, 8]])
    wider = _run(tmp_path, shapes=[[1, 16]])
    assert wider["counters"]["disk_cache_hits"] == 1
    assert wider["counters"]["captures"] == 1
    again = _run(tmp_path, shapes=[[1, 16]], dtype="float64")
    assert again["counters"]["captures"] == 1


def test_concurrent_processes_share_one_entry(tmp_path):
    _workdir(tmp_path)
    processes = [_start(tmp_path) for _ in range(8)]
    results = [_finish(p) for p in processes]
    assert all(
        r["counters"]["captures"] + r["counters"]["cache_loaded_graphs"] >= 1 for r in results
    )
    (entry,) = _entries(tmp_path)
    assert not [p for p in entry.parent.iterdir() if ".tmp." in p.name]
    warm = _run(tmp_path)
    assert warm["counters"]["captures"] == 0 and warm["counters"]["disk_cache_hits"] == 1


def test_a_truncated_entry_is_a_miss_and_is_replaced(tmp_path):
    _workdir(tmp_path)
    _run(tmp_path)
    (entry,) = _entries(tmp_path)
    entry.write_bytes(entry.read_bytes()[:-100])
    broken = _run(tmp_path)
    assert broken["counters"]["captures"] == 1
    (line,) = _logged(broken, "is unusable")
    assert "truncated or corrupt" in line
    repaired = _run(tmp_path)
    assert repaired["counters"]["captures"] == 0 and repaired["counters"]["disk_cache_hits"] == 1


def test_disable_cache_reads_and_writes_nothing(tmp_path):
    _workdir(tmp_path)
    off = _run(tmp_path, patch={"disable_cache": True})
    assert off["counters"]["disk_cache_misses"] == 0 and off["counters"]["disk_cache_writes"] == 0
    assert not (tmp_path / "cache").exists()


def test_a_warm_training_process_neither_captures_nor_compiles(tmp_path):
    # The driver checks the output and the gradients of the input and of every parameter.
    _workdir(tmp_path)
    cold = _run(tmp_path, train=True, shapes=[[4, 16], [6, 16]])
    assert cold["counters"]["captures"] == 1 and cold["counters"]["disk_cache_writes"] == 1
    warm = _run(tmp_path, train=True, shapes=[[5, 16], [9, 16], [9, 16]])
    counters = warm["counters"]
    assert counters["captures"] == 0 and counters["compiles"] == 0
    assert counters["cpu_compiles"] == 0
    assert counters["cache_loaded_graphs"] == 2  # the forward and the backward
    # An inference call in the warm process is a new capture, added to the same entry.
    mixed = _run(tmp_path, shapes=[[5, 16]])
    assert mixed["counters"]["captures"] == 1 and mixed["counters"]["disk_cache_writes"] == 1
    both = _run(tmp_path, shapes=[[3, 16]])
    assert both["counters"]["captures"] == 0 and both["counters"]["cache_loaded_graphs"] == 3


def _cli(tmp_path: Path, *args: str) -> str:
    process = subprocess.run(
        [sys.executable, "-m", "magi_compiler", "cache", *args,
         "--root", str(tmp_path / "cache")],
        env=_env(tmp_path), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert process.returncode == 0, process.stderr
    return process.stdout


def test_cache_command_lists_shows_prunes_and_clears(tmp_path):
    _workdir(tmp_path)
    _run(tmp_path)
    _run(tmp_path)  # one hit
    _run(tmp_path, patch={"dynamic_dim_default": None})  # a second entry
    listing = _cli(tmp_path, "list")
    rows = [line for line in listing.splitlines() if "cache_model.Model.forward" in line]
    assert len(rows) == 2, listing
    assert sorted(row.split()[4] for row in rows) == ["0", "1"], listing  # hits per entry
    first = _entries(tmp_path)[0]
    info = _cli(tmp_path, "info", first.stem[:8])
    assert "torch:" in info and "source:" in info and str(first) in info
    total = sum(p.stat().st_size for p in _entries(tmp_path))
    pruned = _cli(tmp_path, "prune", "--max-size", str(total - 1))
    assert pruned.startswith("removed 1 entries"), pruned
    assert len(_entries(tmp_path)) == 1
    _cli(tmp_path, "clear")
    assert _entries(tmp_path) == []


def test_aot_precompiles_the_compile_sizes_at_the_first_call(tmp_path):
    _workdir(tmp_path)
    patch = {"aot": True, "compile_sizes": [1, 8]}
    cold = _run(tmp_path, shapes=[[4, 16]], patch=patch)
    # Batch 4 captures the dynamic graph, which serves 8; batch 1 is its own capture.
    assert cold["counters"]["captures"] == 2
    assert _logged(cold, "aot: precompiled batch sizes [1, 8]")
    warm = _run(tmp_path, shapes=[[1, 16], [8, 16], [3, 16]], patch=patch)
    assert warm["counters"]["captures"] == 0
    assert warm["counters"]["cache_loaded_graphs"] == 2


def test_the_dump_page_shows_what_the_cache_did(tmp_path):
    _workdir(tmp_path)
    dumps = tmp_path / "dumps"
    env = {"MAGI_ENABLE_FX_GRAPH_VIZ": "1", "MAGI_DUMP_DIR": str(dumps)}
    _run(tmp_path, env=env, shapes=[[4, 16]])
    (cold_page,) = dumps.rglob("index.html")
    cold = cold_page.read_text()
    section = cold[cold.index('id="cache"') :]
    assert "miss" in section and "first compile of this function with this cache" in section
    assert "written" in section and str(_entries(tmp_path)[0]) in section
    # A changed config field is a miss whose page names the key part that differed.
    _run(tmp_path, env=env, shapes=[[4, 16]], patch={"dynamic_dim_default": None})
    (changed_page,) = set(dumps.rglob("index.html")) - {cold_page}
    section = changed_page.read_text().split('id="cache"')[1]
    assert "key differs from the closest cached entry of this function in: config" in section


def test_grad_mode_with_no_output_needing_grad_is_an_inference_entry(tmp_path):
    # Grad is on and the weights require grad, but no output does: AOTAutograd compiles an
    # inference graph although the capture looked like training.
    _workdir(tmp_path, MODEL.replace(
        "return self.down(torch.relu(h) * gate(h)) + x",
        "return (self.down(torch.relu(h) * gate(h)) > 0).float() + x",
    ))  # fmt: skip
    cold = _run(tmp_path, grad=True, shapes=[[4, 16]])
    assert cold["counters"]["captures"] == 1 and cold["counters"]["disk_cache_writes"] == 1
    warm = _run(tmp_path, grad=True, shapes=[[5, 16]])
    assert warm["counters"]["captures"] == 0 and warm["counters"]["cache_loaded_graphs"] == 1


def test_a_cache_that_cannot_be_written_warns_once(tmp_path):
    """Each capture tries to write the entry again (a full disk may have room by then), but the
    same error is a warning once and INFO after that; the calls compile and run."""
    _workdir(tmp_path)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "modules").write_text("a file where the cache's folder belongs")
    result = _run(tmp_path, shapes=[[1, 16], [4, 16], [6, 16]])  # batch 1 specialises
    assert result["counters"]["captures"] == 2, result
    first = _logged(result, "could not be written: ")
    assert len(first) == 1 and "Error" in first[0], result["log"]
    assert len(_logged(result, "could not be written again: ")) == 1, result["log"]


def test_a_cached_graph_describes_its_values_without_fake_tensors():
    """A graph is stored with records of its values (dtype, device, sizes and strides, sympy
    expressions where symbolic) instead of fake tensors, which were most of a warm start's
    loading time to rebuild; lowering imports it exactly as it imports the original."""
    import torch
    from magi_compiler import _C, _cached_graph
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w):
        h = torch.relu(x @ w)
        return h.sum(-1), h[:, : x.shape[1] // 2].t(), x.shape[0] * 2

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(6, 8), torch.randn(8, 8))
    loaded = _cached_graph.unpickle_graph(_cached_graph.pickle_graph(gm))
    vals = [n.meta.get("val") for n in loaded.graph.nodes]
    assert not any(isinstance(v, torch.Tensor) for v in vals)
    records = [v for v in vals if isinstance(v, _cached_graph.TensorRecord)]
    assert len(records) >= 5 and any(not isinstance(s, int) for r in records for s in r.shape)
    assert any(isinstance(v, _cached_graph.SymRecord) for v in vals)
    original = _C.import_fx_graph(gm).to_string()
    # Symbolic sizes, strides and ints are part of what is compared.
    assert re.search(r"f32\[\((s\d+)//2\), (s\d+)\]\{1, \1\}", original), original
    assert re.search(r"int\(2\*s\d+\)", original), original
    assert _C.import_fx_graph(loaded).to_string() == original
