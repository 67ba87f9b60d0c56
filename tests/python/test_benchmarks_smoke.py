"""Smoke test of the benchmark suite (benchmarks/run.py) and of benchmarks/report.py.

Runs a few workloads of the suite at tiny shapes on the CPU, in this process, with eager and
magi_compile only (torch.compile's CPU compile would take most of a minute): correctness and
first-call times, no timing and no thresholds on time. Then renders a report section from the
JSON, and checks that RESULTS.md and the README's headline are report.py's output on the runs kept
in benchmarks/results/.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WORKLOADS = ["micro_add_rmsnorm", "gpt2_decode", "llama_train"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    from benchmarks import run

    out = tmp_path_factory.mktemp("bench") / "smoke.json"
    argv = ["--device", "cpu", "--smoke", "--in-process", "--only", ",".join(WORKLOADS)]
    argv += ["--variants", "eager,magi", "--out", str(out)]
    doc = run.main(argv)
    return doc, out


def test_suite_checks_magi_against_eager(smoke_run):
    doc, out = smoke_run
    assert json.loads(out.read_text()) == json.loads(json.dumps(doc, default=str))
    assert sorted(w["name"] for w in doc["workloads"]) == sorted(WORKLOADS)
    for w in doc["workloads"]:
        assert "error" not in w, w["error"]
        for variant in ("eager", "magi"):
            r = w["variants"][variant]
            assert r["status"] == "ok", f"{w['name']}/{variant}: {r}"
            assert r["correct"], f"{w['name']}/{variant}: error {r['norm_rel_err']:.2e}"
            assert r["first_call_s"] > 0
    assert doc["meta"]["torch"] and doc["meta"]["device"] == "cpu"


def test_report_renders_a_suite_run(smoke_run):
    from benchmarks import report

    doc, _ = smoke_run
    text = report.suite_section(doc, "smoke.json")
    assert text.startswith("## CPU: whole models and kernels (smoke shapes)")
    assert "source `smoke.json`" in text and f"commit {report.stamp(doc)['commit']}" in text
    assert "Error against eager" in text and "magi_compile" in text
    # A run restricted to some workloads or variants is never reported as the latest.
    assert not report.is_complete(doc)


def _kept_runs():
    from benchmarks import report

    return report.latest_runs(sorted((ROOT / "benchmarks" / "results").glob("*.json")))


def test_results_md_is_generated_from_the_kept_runs():
    """benchmarks/RESULTS.md is report.py's output on benchmarks/results/, and every JSON kept
    there that report.py knows is the latest complete run of its benchmark and device kind
    (nothing stale)."""
    from benchmarks import report

    runs = _kept_runs()
    kept = [
        p
        for p in sorted((ROOT / "benchmarks" / "results").glob("*.json"))
        if report.benchmark_of(json.loads(p.read_text())) is not None
    ]
    assert sorted(p for _, p in runs.values()) == kept
    text = report.render(runs)
    assert (ROOT / "benchmarks" / "RESULTS.md").read_text() == text, (
        "RESULTS.md is stale: run python benchmarks/report.py"
    )
    # Device, torch version, date and commit are stated once above each run's tables.
    for doc, path in runs.values():
        line = report.stamp_line(doc, f"benchmarks/results/{path.name}")
        assert line in text and "commit ?" not in line and "torch ?" not in line


def test_readme_shows_the_headline_table():
    from benchmarks import report

    head = report.headline(_kept_runs())
    assert head and head in (ROOT / "README.md").read_text(), (
        "README's numbers differ from python benchmarks/report.py --headline"
    )


def test_report_takes_the_latest_complete_run_per_device_kind(tmp_path):
    from benchmarks import report

    def suite(name: str, date: str, command: str) -> dict:
        meta = {"device": "cuda", "device_name": name, "date": date, "command": command}
        return {"meta": meta, "suite": {}, "workloads": []}

    docs = {
        "old.json": suite("NVIDIA H100 80GB HBM3", "2026-01-01T00:00:00", "run.py"),
        "new.json": suite("NVIDIA H100 PCIe", "2026-02-01T00:00:00", "run.py"),
        "partial.json": suite("NVIDIA H100", "2026-03-01T00:00:00", "run.py --only gpt2"),
        "h200.json": suite("NVIDIA H200", "2026-01-15T00:00:00", "run.py"),
        "bandwidth.json": {
            "meta": {"device": "cuda", "device_name": "NVIDIA H200", "date": "2026-01-02"},
            "bandwidth": {},
        },  # fmt: skip
        "unknown.json": {"benchmark": "something else"},
    }
    for name, doc in docs.items():
        (tmp_path / name).write_text(json.dumps(doc))
    runs = report.latest_runs(sorted(tmp_path.glob("*.json")))
    picked = {key: path.name for key, (_, path) in runs.items()}
    assert picked == {
        ("H100", "suite"): "new.json",
        ("H200", "suite"): "h200.json",
        ("H200", "bandwidth"): "bandwidth.json",
    }


def test_unknown_workload_is_a_clear_error():
    from benchmarks import workloads

    with pytest.raises(SystemExit, match="unknown workload"):
        workloads.select("no_such_workload")


@pytest.mark.slow
@pytest.mark.parametrize("rounds", [1, 2])
def test_recompute_benchmark_times_every_variant(rounds, tmp_path):
    """benchmarks/recompute.py at tiny shapes: eager and HEURISTIC checked against eager and
    timed, one after the other (rounds 1) or interleaved with all variants alive (rounds 2)."""
    from benchmarks import recompute

    out = tmp_path / "rc.json"
    argv = ["--device", "cpu", "--smoke", "--only", "llama4", "--variants", "magi_heuristic"]
    argv += ["--steps", "3", "--rounds", str(rounds), "--out", str(out)]
    doc = recompute.main(argv)
    assert json.loads(out.read_text())["settings"]["rounds"] == rounds
    (model,) = doc["models"]
    assert sorted(model["variants"]) == ["eager", "magi_heuristic"]
    for name, r in model["variants"].items():
        assert r["status"] == "ok", f"{name}: {r}"
        assert r["correct"], f"{name}: {r}"
        assert r["steps"] == 3 and 0 < r["min_ms"] <= r["median_ms"], r
    assert model["variants"]["magi_heuristic"]["plan"]["policy"] == "HEURISTIC"


def test_report_shows_device_memory_held_beside_the_allocated_peak():
    """GPU results with peak_reserved_bytes render a second table under the peak memory one
    (CUDA-graph replays keep intermediates in pools max_memory_allocated does not see)."""
    from benchmarks import report

    mib = 2**20

    def variant(peak: int, reserved: int | None) -> dict:
        r = {"status": "ok", "peak_mem_bytes": peak * mib}
        if reserved is not None:
            r["peak_reserved_bytes"] = reserved * mib
        return r

    doc = {
        "suite": {"variants": ["eager", "inductor_ro"]},
        "workloads": [
            {
                "name": "w",
                "title": "Workload W",
                "variants": {"eager": variant(800, 820), "inductor_ro": variant(496, 900)},
            }
        ],
    }
    text = report._memory(doc)
    allocated, _, held = text.partition("Device memory held")
    assert "496" in allocated and "900" not in allocated
    assert "900" in held and "820" in held
    for r in doc["workloads"][0]["variants"].values():
        del r["peak_reserved_bytes"]
    assert "Device memory held" not in report._memory(doc)


def _zoo_doc(date: str, rows: list[dict], failures: list[dict]) -> dict:
    command = "python benchmarks/zoo.py --models gpt2,bert,vit,t5 --out z.json --append"
    meta = {"device_type": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "dtype": "bfloat16",
            "torch": "2.9.0", "transformers": "5.17.0", "date": date, "git_commit": "abc1234",
            "command": command}  # fmt: skip
    return {"benchmark": "zoo", "meta": meta, "rows": rows, "failures": failures}


def _zoo_row(model: str, scenario: str, batch: int, **variants: dict) -> dict:
    return {"model": model, "size": "real", "scenario": scenario, "batch": batch,
            "inputs": {"input_ids": [batch, 128]}, "variants": variants}  # fmt: skip


def test_report_renders_the_model_zoo(tmp_path):
    """Of the zoo.py files of a device kind, the one with the fewest family scenarios not
    measured is reported (a failed family counts as measured), whatever --models/--append
    wrote it, with those gaps listed; the table has magi's captures, fallbacks, error and first
    call, every variant's ms and the ratios to torch.compile, marking where magi is slower;
    rows appended by runs of different commits say which."""
    from benchmarks import report

    def magi(ms: float | None, **extra) -> dict:
        rec = {"captures": 1, "fallbacks": 0, "fallback_reasons": [], "rel_err": 1e-3,
               "first_call_s": 3.0, "ms": ms}  # fmt: skip
        return {**rec, **extra}

    rows = [
        _zoo_row(
            "llama",
            "whole",
            1,
            eager={"ms": 20.0},
            inductor={"ms": 10.0},
            inductor_ro={"ms": 6.0},
            magi=magi(8.0, captures=2, rel_err=1.234e-3, first_call_s=12.345),
            magi_cg=magi(7.5),
        ),
        _zoo_row(
            "gpt2",
            "layers",
            8,
            eager={"ms": 4.0},
            inductor={"ms": 3.0},
            inductor_ro={
                "error": "timing: torch._dynamo.exc.BackendCompilerFailed: backend="
                "'inductor' raised:\nRuntimeError: cudagraph boom\n\nSet ..."
            },
            magi=magi(3.3, fallbacks=1, fallback_reasons=["GPT2Block: data-dependent | x"]),
            magi_cg={"error": "build: ValueError: no graphs\ntraceback"},
        ),
    ]
    rows += [
        _zoo_row(m, "whole", 1, eager={"ms": 1.0}, magi=magi(1.0)) for m in ("qwen3", "bert", "vit")
    ]
    t5_failed = [{"model": "t5", "error": "RuntimeError: t5 out of memory\ndetails"}]
    full = _zoo_doc("2026-03-01T00:00:00", rows, t5_failed)
    (tmp_path / "zoo_full.json").write_text(json.dumps(full))
    # Newer, but t5 is neither in the rows nor in the failures: an unfinished split run.
    (tmp_path / "zoo_five.json").write_text(json.dumps(_zoo_doc("2026-04-01T00:00:00", rows, [])))
    runs = report.latest_runs(sorted(tmp_path.glob("*.json")))
    assert {key: path.name for key, (_, path) in runs.items()} == {("H100", "zoo"): "zoo_full.json"}
    assert "t5 (every scenario)" in report.zoo_gaps(_zoo_doc("2026-04-01T00:00:00", rows, []))

    text = report.render(runs)
    assert "## H100: model zoo" in text
    assert "NVIDIA H100 80GB HBM3 · torch 2.9.0 · 2026-03-01 · commit abc1234" in text
    assert "transformers 5.17.0" in text
    lines = text.splitlines()
    assert ("| model | scenario | batch | captures | fallbacks | magi error | magi first call s "
            "| eager ms | torch.compile ms | reduce-overhead ms | magi ms | magi CUDA graphs ms "
            "| magi vs torch.compile | magi CUDA graphs vs reduce-overhead |") in lines  # fmt: skip
    # torch.compile 10 / magi 8 = 1.25x faster; reduce-overhead 6 / CUDA graphs 7.5 = 0.80x.
    assert ("| llama | whole | 1 | 2 | 0 | 1.2e-03 | 12.35 | 20.000 | 10.000 | 6.000 | 8.000 "
            "| 7.500 | 1.25× | 0.80× **slower** |") in lines  # fmt: skip
    # One-line fallback reason (no pipe to split the cell); 3.0 / 3.3 = 0.91x slower.
    assert ("| gpt2 | layers | 8 | 1 | 1: GPT2Block: data-dependent / x | 1.0e-03 | 3.00 "
            "| 4.000 | 3.000 | failed | 3.300 | failed | 0.91× **slower** | – |") in lines  # fmt: skip
    qwen3 = "| qwen3 | whole | 1 | 1 | 0 | 1.0e-03 | 3.00 | 1.000 | – | – | 1.000 | – | – | – |"
    assert qwen3 in lines
    # Rows in the families' order, whatever order the appends wrote them in.
    models = [m.group(1) for ln in lines if (m := re.match(r"\| (\w+) \| (whole|layers) \|", ln))]
    assert models == ["llama", "qwen3", "gpt2", "bert", "vit"]
    assert "magi is slower than torch.compile in 1 of 2 rows compared" in text
    assert "magi CUDA graphs is slower than reduce-overhead in 1 of 1 rows compared" in text
    # Dynamo's wrapper line gives way to the error it wraps.
    assert "- **gpt2** reduce-overhead (layers b8): `timing: RuntimeError: cudagraph boom`" in lines
    assert "- **gpt2** magi CUDA graphs (layers b8): `build: ValueError: no graphs`" in lines
    assert "- **t5** could not be run: `RuntimeError: t5 out of memory`" in lines
    # BERT and ViT have no cache scenario; a failed family is no gap.
    assert (
        "Not measured in this run: llama layers, cache; qwen3 layers, cache; gpt2 whole, cache; "
        "bert layers; vit layers."
    ) in lines
    assert not any(ln.startswith("Rows measured at different commits") for ln in lines)
    rows[1]["git_commit"] = "def5678"  # gpt2 layers appended by a later run
    text = report.render({("H100", "zoo"): (_zoo_doc("2026-03-01", rows, t5_failed), Path("z"))})
    assert (
        "Rows measured at different commits: abc1234: llama whole, qwen3 whole, bert whole, "
        "vit whole; def5678: gpt2 layers."
    ) in text.splitlines()


def test_report_shows_where_the_gpu_time_of_zoo_rows_goes():
    """tools/kernel_profile.py --zoo's file (kernel kinds by name) is reported after the zoo table:
    per row and variant the wall, busy and idle times, kernels per call, ms per kernel kind
    and the largest kernel without its template arguments."""
    import importlib.util

    from benchmarks import report

    spec = importlib.util.spec_from_file_location(
        "magi_profile_tool", ROOT / "tools/kernel_profile.py"
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    names = {
        "fused_add_native_layer_norm_1b3e756b_ccll_v1": "generated",
        "triton_per_fused_add_mean_0": "generated",
        "nvjet_tst_128x64_64x4_1x1_v_bz_coopA_TNT": "GEMM",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "GEMM",
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128> >(Flash_fwd_params)":
            "attention",
        "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)":
            "attention",
        "void at::native::elementwise_kernel<128, 4, direct_copy_kernel_cuda>(int, F)": "copy",
        "Memcpy DtoD (Device -> Device)": "copy",
        "void at::native::index_elementwise_kernel<128, 4>(long, F)": "other",
    }  # fmt: skip
    assert {n: tool.kernel_kind(n) for n in names} == names
    rows = [(n, [10.0 * (i + 1), 2.0]) for i, n in enumerate(names)]
    kinds = tool.kinds_of(rows)
    assert kinds == {"generated": 30.0, "GEMM": 70.0, "attention": 110.0, "copy": 150.0,
                     "other": 90.0}  # fmt: skip

    def table(wall: float, busy: float, kernels: list[tuple[str, float]]) -> dict:
        return {"wall_us": wall, "busy_us": busy, "idle_us": wall - busy, "kernels_per_step": 7,
                "kinds_us": tool.kinds_of([(n, [us, 1.0]) for n, us in kernels]),
                "kernels": [{"name": n, "us": us, "calls": 1.0} for n, us in kernels]}  # fmt: skip

    flash = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128> >(Flash_fwd_params)"
    doc = {
        "benchmark": "zoo_profile",
        "meta": {"device_type": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "torch": "2.11.0",
                 "date": "2026-12-07T10:00:00", "git_commit": "abc1234", "steps": 5,
                 "command": "python tools/kernel_profile.py --zoo gpt2:whole:8 --variants magi_cg"},
        "rows": [{"model": "gpt2", "scenario": "whole", "batch": 8, "variants": {
            "magi_cg": table(1700.0, 1500.0, [(flash, 900.0), ("nvjet_tst_x", 600.0)]),
            "inductor_ro": table(920.0, 900.0, [("nvjet_tst_x", 600.0), ("triton_poi_0", 300.0)]),
        }}],
    }  # fmt: skip
    assert report.is_complete(doc)  # --variants does not make a profile partial
    text = report.render({("H100", "zoo_profile"): (doc, Path("p.json"))})
    lines = text.splitlines()
    assert "## H100: model zoo, where the GPU time goes" in lines
    assert ("| gpt2 | whole | 8 | magi CUDA graphs | 1.700 | 1.500 | 0.200 | 7 | 0.600 | 0.900 "
            "| 0.000 | 0.000 | 0.000 | flash_fwd_kernel 0.900 ms × 1 |") in lines  # fmt: skip
    assert ("| gpt2 | whole | 8 | reduce-overhead | 0.920 | 0.900 | 0.020 | 7 | 0.600 | 0.000 "
            "| 0.300 | 0.000 | 0.000 | nvjet_tst_x 0.600 ms × 1 |") in lines  # fmt: skip
    # With the zoo table of the same device kind, each slower row the profile covers says where
    # it loses: more GPU time in a kernel kind, or a GPU waiting on the host.
    rec = {"captures": 1, "fallbacks": 0, "fallback_reasons": [], "rel_err": 1e-3,
           "first_call_s": 3.0}  # fmt: skip
    rows = [
        _zoo_row("gpt2", "whole", 8, eager={"ms": 9.0}, inductor={"ms": 3.0},
                 inductor_ro={"ms": 0.92}, magi={**rec, "ms": 2.8}, magi_cg={**rec, "ms": 1.7}),
        _zoo_row("bert", "whole", 8, eager={"ms": 9.0}, inductor={"ms": 3.0},
                 inductor_ro={"ms": 0.8}, magi={**rec, "ms": 3.3}, magi_cg={**rec, "ms": 0.9}),
    ]  # fmt: skip
    runs = {("H100", "zoo"): (_zoo_doc("2026-12-07", rows, []), Path("z.json")),
            ("H100", "zoo_profile"): (doc, Path("p.json"))}  # fmt: skip
    lines = report.render(runs).splitlines()
    assert (
        "- **gpt2 whole b8**, magi CUDA graphs vs reduce-overhead: GPU busy 1.500 vs 0.900 ms, "
        "wall 1.700 vs 0.920 ms, 7 vs 7 kernels; more GPU time in attention +0.900 ms."
    ) in lines
    assert "Slower rows not profiled: bert whole b8." in lines
    doc["rows"][0]["variants"]["magi_cg"] = table(1700.0, 880.0, [("nvjet_tst_x", 880.0)])
    lines = report.render(runs).splitlines()
    assert (
        "- **gpt2 whole b8**, magi CUDA graphs vs reduce-overhead: GPU busy 0.880 vs 0.900 ms, "
        "wall 1.700 vs 0.920 ms, 7 vs 7 kernels: the GPU waits on the host (0.820 ms idle "
        "between kernels)."
    ) in lines


def test_no_tool_shadows_a_standard_library_module():
    """tools/*.py run as scripts put tools/ first on sys.path: a tool named like a standard
    module (profile, trace, ...) would be imported in its place (cProfile imports profile)."""
    tools = {p.stem for p in (ROOT / "tools").glob("*.py")}
    assert not tools & set(sys.stdlib_module_names)


def test_report_keeps_a_warm_start_run_cut_short(tmp_path):
    """warm_start.py writes its file after each row: a run cut short (the last of its asked
    pairs missing) is reported when it has more rows than a complete run of fewer compilers,
    with the pairs it did not measure listed."""
    from benchmarks import report

    def row(model: str, compiler: str, cold: float, warm: float) -> dict:
        side = {"steady_ms": 1.0, "max_rel_error": 1e-3, "counters": {"captures": 0, "compiles": 0}}
        return {"model": model, "compiler": compiler, "cold": {**side, "first_call_s": cold},
                "warm": {**side, "first_call_s": warm}}  # fmt: skip

    def doc(date: str, rows: list[dict], pairs: list, complete: bool) -> dict:
        meta = {"benchmark": "warm_start", "device_type": "cuda", "torch": "2.11.0",
                "device_name": "NVIDIA H100 80GB HBM3", "date": date, "git_commit": "abc1234",
                "size": "real", "complete": complete, "pairs": pairs}  # fmt: skip
        return {"benchmark": "warm_start", "meta": meta, "rows": rows}

    old = doc("2026-12-01", [row("stack", "magi", 4, 0.3), row("llama", "magi", 11, 0.7)],
              [["stack", "magi"], ["llama", "magi"]], True)  # fmt: skip
    pairs = [["stack", "magi"], ["stack", "inductor"], ["llama", "magi"], ["llama", "inductor"]]
    cut = doc("2026-12-07", [row("stack", "magi", 4.0, 0.25), row("stack", "inductor", 14.0, 2.5),
                             row("llama", "magi", 11.0, 0.7)], pairs, False)  # fmt: skip
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "cut.json").write_text(json.dumps(cut))
    runs = report.latest_runs(sorted(tmp_path.glob("*.json")))
    assert runs[("H100", "warm_start")][1].name == "cut.json"
    lines = report.render(runs).splitlines()
    assert "Not measured (the run was cut short): HF LlamaForCausalLM torch.compile." in lines
    # 0.25 s warm against torch.compile's 2.5 s: 0.10x.
    assert any(ln.startswith("| 4-layer Llama stack | magi_compile | 4.00 | 0.25 | 0.06 | 0.10× |")
               for ln in lines), lines  # fmt: skip


def test_long_prefill_runs_each_variant_and_reports_time_and_peak(tmp_path):
    """long_prefill.py at 64 tokens on the CPU with eager and magi_compile: a row per
    (model, length, variant), magi's output checked against eager's; then a CUDA-shaped run
    (with an out-of-memory row) renders its table: ratios, the lowest peak, the error."""
    from benchmarks import long_prefill, report

    out = tmp_path / "lp.json"
    doc = long_prefill.main(["--device", "cpu", "--tokens", "64", "--runs", "1",
                             "--variants", "eager,magi", "--out", str(out)])  # fmt: skip
    assert json.loads(out.read_text()) == doc
    # A second run of one model with --append replaces its rows and keeps the other model's.
    again = long_prefill.main(["--device", "cpu", "--tokens", "64", "--runs", "1", "--models",
                               "llama", "--variants", "eager,magi", "--out", str(out),
                               "--append"])  # fmt: skip
    assert [(r["model"], r["variant"]) for r in again["rows"]] == [
        (r["model"], r["variant"]) for r in doc["rows"]
    ]
    assert again["rows"][0] == doc["rows"][0] and again["rows"][2] != doc["rows"][2]
    assert len(again["meta"]["commands"]) == 2
    doc = again
    assert [(r["model"], r["variant"]) for r in doc["rows"]] == [
        ("block", "eager"), ("block", "magi"), ("llama", "eager"), ("llama", "magi")
    ]  # fmt: skip
    for r in doc["rows"]:
        assert "error" not in r and r["ms"] > 0 and r["tokens"] == 64, r
        if r["variant"] == "magi":
            assert r["max_rel_err"] < 1e-4, r

    # FLOPs of the block at 64 tokens: its five linear layers, and causal attention 2 S^2 D.
    d, i, s = 64, 256, 64
    linear = 2 * s * (d * 3 * d + d * d + 2 * d * i + i * d)
    assert doc["rows"][0]["flop"] == linear + 2 * s * s * d
    assert doc["meta"]["matrix_tflops"] is None  # measured on CUDA only

    meta = {**doc["meta"], "device_type": "cuda", "device_name": "NVIDIA H100 80GB HBM3",
            "size": "real", "command": "python benchmarks/long_prefill.py --device cuda",
            "matrix_tflops": 800.0}  # fmt: skip
    rows = [
        {"model": "block", "tokens": 100000, "variant": "eager", "error": "out of memory",
         "flop": 1.6e14},
        {"model": "block", "tokens": 100000, "variant": "inductor", "ms": 300.0, "peak_gib": 40.0,
         "flop": 1.6e14},
        {"model": "block", "tokens": 100000, "variant": "magi", "ms": 200.0, "peak_gib": 12.5,
         "max_rel_err": 3e-3, "flop": 1.6e14},
    ]  # fmt: skip
    (tmp_path / "lp.json").write_text(json.dumps({"benchmark": "long_prefill", "meta": meta,
                                                  "rows": rows}))  # fmt: skip
    runs = report.latest_runs([tmp_path / "lp.json"])
    text = report.render(runs)
    assert "## H100: long-context prefill" in text, text
    assert (
        "| written-out attention block (hidden 2048, 16 heads, MLP 8192) | 100,000 | 160.0 | 200.0 "
        "| out of memory "
        "| 300.0 ms, 40.0 GiB | 200.0 ms, 12.5 GiB | 1.50× | magi | 3.0e-03 |"
    ) in text, text


def test_decode_grid_times_each_variant_and_reports_the_floor(tmp_path):
    """decode.py at the tiny size on the CPU with eager and magi_compile: a row per (batch,
    context, variant) with ms per token, tokens/s and the bytes a step reads, magi's greedy
    tokens equal to eager's; --append replaces only the points asked again; then a CUDA-shaped
    run renders its table: the floor from the copy bandwidth, the ratio to reduce-overhead."""
    from benchmarks import decode, report

    out = tmp_path / "decode.json"
    doc = decode.main(["--device", "cpu", "--batches", "1,2", "--contexts", "64", "--steps", "4",
                       "--runs", "1", "--variants", "eager,magi", "--out", str(out)])  # fmt: skip
    assert json.loads(out.read_text()) == doc
    assert [(r["batch"], r["variant"]) for r in doc["rows"]] == [
        (1, "eager"), (1, "magi"), (2, "eager"), (2, "magi")
    ]  # fmt: skip
    for r in doc["rows"]:
        assert "error" not in r and r["ms_per_token"] > 0 and r["context"] == 64, r
        assert r["tokens_per_s"] == pytest.approx(r["batch"] * 1e3 / r["ms_per_token"], rel=1e-3)
        if r["variant"] == "magi":
            assert r["tokens_agree"] == 1.0, r
    # The tiny model's weights (embedding tied to the LM head, counted once) and a float32
    # cache of 64 slots: 2 layers x (keys, values) x batch x 2 kv heads x 64 x head dim 16.
    model, _ = decode.build("tiny", "cpu", torch.float32, 1, 64)
    weights = sum(p.numel() for p in model.parameters()) * 4
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * 64 * head_dim * 4
    assert doc["rows"][0]["bytes"] == weights + kv
    assert doc["rows"][2]["bytes"] == weights + 2 * kv

    again = decode.main(["--device", "cpu", "--batches", "2", "--contexts", "64", "--steps", "4",
                         "--runs", "1", "--variants", "magi", "--out", str(out),
                         "--append"])  # fmt: skip
    assert [(r["batch"], r["variant"]) for r in again["rows"]] == [
        (1, "eager"), (1, "magi"), (2, "eager"), (2, "magi")
    ]  # fmt: skip
    assert again["rows"][:3] == doc["rows"][:3] and len(again["meta"]["commands"]) == 2
    with pytest.raises(SystemExit):  # a cache too short for the prompt and the steps
        decode.main(["--device", "cpu", "--contexts", "20", "--steps", "4"])

    meta = {**doc["meta"], "device_type": "cuda", "device_name": "NVIDIA H100 80GB HBM3",
            "size": "real", "command": "python benchmarks/decode.py --device cuda",
            "copy_gbps": 3000.0}  # fmt: skip
    rows = [
        {"batch": 1, "context": 1024, "variant": "eager", "bytes": 3e9, "ms_per_token": 10.0,
         "tokens_per_s": 100.0},
        {"batch": 1, "context": 1024, "variant": "inductor", "bytes": 3e9, "ms_per_token": 1.5,
         "tokens_per_s": 666.7},
        {"batch": 1, "context": 1024, "variant": "magi", "bytes": 3e9, "ms_per_token": 1.2,
         "tokens_per_s": 833.3, "tokens_agree": 0.97},
        {"batch": 32, "context": 32768, "variant": "magi", "error": "out of memory"},
    ]  # fmt: skip
    (tmp_path / "decode.json").write_text(
        json.dumps({"benchmark": "decode", "meta": meta, "rows": rows})
    )
    text = report.render(report.latest_runs([tmp_path / "decode.json"]))
    assert "## H100: KV-cache decode" in text and "(3,000 GB/s)" in text, text
    assert (
        "| 1 | 1,024 | 1.000 | 10.000 ms (100 tok/s) | 1.500 ms (667 tok/s) "
        "| 1.200 ms (833 tok/s) | 1.25× | 1.20× | – / 97% |"
    ) in text, text
    assert "| 32 | 32,768 | – | not run | not run | out of memory | – | – | – / – |" in text, text


def test_attention_benchmark_counts_visible_pairs_and_reports_tflops(tmp_path):
    """attention.py on the CPU: a row per (mask, length, variant) that applies there (magi and
    flash SDPA), FLOPs from the visible pairs (causal: S(S+1)/2), flash checked against magi;
    then a CUDA-shaped run renders forward / backward TFLOP/s and magi against the best other."""
    from benchmarks import attention, report

    out = tmp_path / "att.json"
    doc = attention.main(["--device", "cpu", "--tokens", "256", "--masks", "causal,block_causal",
                          "--runs", "1", "--out", str(out)])  # fmt: skip
    assert json.loads(out.read_text()) == doc
    assert [(r["mask"], r["variant"]) for r in doc["rows"]] == [
        ("causal", "magi"), ("causal", "flash"), ("block_causal", "magi")
    ]  # fmt: skip
    heads, dim = doc["meta"]["heads"], doc["meta"]["head_dim"]
    for r in doc["rows"]:
        assert "error" not in r and r["forward_ms"] > 0 and r["backward_ms"] > 0, r
    assert doc["rows"][0]["flop_forward"] == 4 * (256 * 257 // 2) * dim * heads
    assert doc["rows"][1]["max_rel_err"] < 1e-5
    assert doc["rows"][0]["kernels"] == "portable / portable"  # CPU tensors
    assert "kernels" not in doc["rows"][1]
    # One document of 256 tokens in blocks of 1,024: the whole square is visible.
    assert doc["rows"][2]["flop_forward"] == 4 * 256 * 256 * dim * heads
    # Overlapping slices are counted once per slice.
    q = torch.tensor([[0, 4], [0, 4]], dtype=torch.int32)
    assert attention.visible_pairs((q, q, torch.tensor([0, 1], dtype=torch.int32))) == 16 + 10

    meta = {**doc["meta"], "device_type": "cuda", "device_name": "NVIDIA H100 80GB HBM3",
            "command": "python benchmarks/attention.py --device cuda", "heads": 16,
            "head_dim": 128}  # fmt: skip
    rows = [
        {"mask": "causal", "tokens": 8192, "variant": "magi", "forward_tflops": 400.0,
         "backward_tflops": 300.0, "kernels": "cudnn / flash"},
        {"mask": "causal", "tokens": 8192, "variant": "cudnn", "forward_tflops": 500.0,
         "backward_tflops": 250.0},
        {"mask": "causal", "tokens": 8192, "variant": "flex", "error": "out of memory"},
    ]  # fmt: skip
    out.write_text(json.dumps({"benchmark": "attention", "meta": meta, "rows": rows}))
    text = report.render(report.latest_runs([out]))
    assert "## H100: range-mask attention" in text, text
    assert (
        "| causal | 8,192 | 400 / 300 (cudnn / flash) | 500 / 250 | out of memory | 0.80× / 1.20× |"
    ) in text, text


def test_attention_benchmark_names_the_kernels_range_attention_ran(monkeypatch):
    """The magi rows' kernels: flash in N merged calls for a prefix-LM mask, and for one dense
    document cuDNN in the directions whose first call chose it (flash's plan taken as on CUDA)."""
    from magi_compiler.attention import cudnn_path, flash_path, prefix_lm_slices, varlen_slices

    from benchmarks import attention

    monkeypatch.setattr(flash_path, "plan", lambda q, k, v, s, *rest: flash_path.layers(s, 64, 64))
    q = torch.randn(64, 4, 32)
    assert attention.magi_kernels(q, q, q, prefix_lm_slices([0, 30, 64], 8)) == (
        "flash x2 / flash x2"
    )
    dense = varlen_slices([0, 64], causal=True)
    monkeypatch.setattr(cudnn_path, "choices", lambda: [
        {"direction": "forward", "q": (64, 4, 32), "k": (64, 4, 32), "chosen": "cudnn"},
        {"direction": "backward", "q": (64, 4, 32), "k": (64, 4, 32), "chosen": "flash"},
    ])  # fmt: skip
    assert attention.magi_kernels(q, q, q, dense) == "cudnn / flash"
    assert attention.magi_kernels(q, q, q, varlen_slices([0, 30, 64])) == "flash / flash"


@pytest.mark.parametrize("script", ["decode", "attention", "long_prefill"])
def test_grid_benchmarks_start_as_plain_scripts(script):
    """Run as ``python benchmarks/<script>.py`` from elsewhere, with nothing on PYTHONPATH, a
    grid benchmark imports (the tests' own sys.path would hide a missing path entry)."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), "--help"],
        cwd="/", env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"usage: {script}.py"), done.stdout


def test_appended_rows_keep_the_commit_and_measurements_of_their_run(tmp_path):
    """A grid file appended to: the kept rows carry the commit and the per-row meta fields of
    the run that measured them (from the old meta when they predate per-row fields), new rows
    this run's, and the meta names the commits, earlier run first."""
    from benchmarks import grid

    out = tmp_path / "grid.json"
    old_meta = {"benchmark": "b", "git_commit": "old1234", "copy_gbps": 1000.0, "command": "c1"}
    out.write_text(json.dumps({"benchmark": "b", "meta": old_meta,
                               "rows": [{"n": 1, "ms": 5.0}, {"n": 2, "ms": 6.0}]}))  # fmt: skip
    meta = {"benchmark": "b", "git_commit": "new5678", "copy_gbps": 2000.0, "command": "c2"}
    results = grid.Results(meta, str(out), True, key=lambda r: (r["n"],), asked=[(2,)],
                           order=lambda r: (r["n"],), per_row=("copy_gbps",))  # fmt: skip
    results.add({"n": 2, "ms": 4.0})
    doc = json.loads(out.read_text())
    assert doc["rows"] == [
        {"n": 1, "ms": 5.0, "git_commit": "old1234", "copy_gbps": 1000.0},
        {"n": 2, "ms": 4.0, "git_commit": "new5678", "copy_gbps": 2000.0},
    ]
    assert doc["meta"]["git_commit"] == "old1234 + new5678"
    assert doc["meta"]["commands"] == ["c1", "c2"]
    meta = {"benchmark": "b", "git_commit": "new5678", "copy_gbps": 2000.0, "command": "c3"}
    results = grid.Results(meta, str(out), True, key=lambda r: (r["n"],),
                           asked=[(1,)], order=lambda r: (r["n"],), per_row=("copy_gbps",))  # fmt: skip
    results.add({"n": 1, "ms": 3.0})
    assert json.loads(out.read_text())["meta"]["git_commit"] == "new5678"
    assert grid._measuring(["--tokens", "8", "--out", "f.json", "--append", "--out=g"]) == [
        "--tokens", "8"
    ]  # fmt: skip
