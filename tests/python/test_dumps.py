"""Compile dumps (MAGI_ENABLE_FX_GRAPH_VIZ): the files a compile writes and what they say, the
timeline, the detail levels of graph pictures, DOT without Graphviz, and nothing written
anywhere when dumps are off. Logging: one INFO line per compile, fallbacks explained at DEBUG."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil

import pytest
import torch
from magi_compiler import _dump, _logging, inspection, magi_compile, magi_register_custom_op
from magi_compiler.errors import UserError
from torch import nn


@magi_register_custom_op(name="magi_t_dump::boundary_scale", is_subgraph_boundary=True)
def boundary_scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0


class DumpModel(nn.Module):
    """Two fusible chains on either side of a subgraph boundary: two pieces, two kernels."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.sigmoid(self.proj(x)) * x + 1.0
        h = boundary_scale(h)
        return torch.tanh(h) * 0.5 - h


def compile_and_run(model: nn.Module, *shapes: tuple[int, ...], **patch) -> nn.Module:
    """Compiles and calls ``model`` on inputs of each shape, after clearing Dynamo's caches (a
    new instance of a class compiled before would reuse its capture and compile nothing)."""
    torch._dynamo.reset()
    compiled = magi_compile(model, config_patch=patch or None)
    with torch.no_grad():
        for shape in shapes:
            compiled(torch.randn(*shape))
    return compiled


def only_dump(root) -> str:
    dirs = sorted(os.listdir(root))
    assert len(dirs) == 1, dirs
    return os.path.join(root, dirs[0])


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def files_under(root) -> set[str]:
    out = set()
    for folder, _, files in os.walk(root):
        out.update(os.path.relpath(os.path.join(folder, f), root) for f in files)
    return out


@contextlib.contextmanager
def logs_at(level: str):
    """Sets magi's log level (Python and C++) and collects its records; restores the level."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("magi_compiler")
    before = logger.level
    logger.addHandler(handler)
    _logging.set_level(level)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        _logging.set_level("warning")
        logger.setLevel(before)


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    """One compile of DumpModel with dumps on (detail: shape), logs captured at DEBUG."""
    root = tmp_path_factory.mktemp("dumps")
    mp = pytest.MonkeyPatch()
    mp.setenv(_dump.ENABLE_ENV, "1")
    mp.setenv(_dump.DIR_ENV, str(root))
    mp.delenv(_dump.DETAIL_ENV, raising=False)
    mp.delenv("RANK", raising=False)
    try:
        with logs_at("debug") as records:
            compile_and_run(DumpModel(), (4, 32))
        graph = inspection.last_compiled().graph
    finally:
        mp.undo()
    return only_dump(root), graph, records


def test_one_directory_per_compile_named_by_tag_rank_and_counter(dumped):
    directory, _, _ = dumped
    assert re.fullmatch(r"DumpModel-rank0-0", os.path.basename(directory))
    files = files_under(directory)
    for name in (
        "index.html",
        "dynamo_graph.py",
        "aten_inference.py",
        "ir/inference/00_imported.txt",
        "ir/inference/00_imported.dot",
        "timeline.txt",
        "timeline.json",
        "summary.json",
        "config.json",
    ):
        assert name in files, (name, sorted(files))
    assert not [f for f in files if f.endswith(".partial")]  # each file written whole, renamed
    # The IR after each pass that changed it: splitting and fusion both change this model.
    assert any(re.fullmatch(r"ir/inference/\d\d_split_at_boundaries\.txt", f) for f in files)
    assert any(re.fullmatch(r"ir/inference/\d\d_fuse_groups\.dot", f) for f in files)


def test_counter_and_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    assert _dump.rank() == 3
    first = _dump._make_dir(str(tmp_path), "tag")
    second = _dump._make_dir(str(tmp_path), "tag")
    assert [os.path.basename(first), os.path.basename(second)] == ["tag-rank3-0", "tag-rank3-1"]


def test_graph_text_names_the_models_ops(dumped):
    directory, _, _ = dumped
    assert "sigmoid" in read(os.path.join(directory, "dynamo_graph.py"))
    aten = read(os.path.join(directory, "aten_inference.py"))
    assert "torch.ops.aten.sigmoid" in aten and "magi_t_dump.boundary_scale" in aten
    imported = read(os.path.join(directory, "ir/inference/00_imported.txt"))
    for op in ("aten::sigmoid", "aten::tanh", "magi_t_dump::boundary_scale"):
        assert op in imported
    assert "test_dumps.py:" in imported  # user source lines
    final = sorted(f for f in files_under(directory) if f.endswith("fuse_groups.txt"))[-1]
    assert "piece_0 = graph(" in read(os.path.join(directory, final))


def test_pictures_name_the_nodes_and_show_boundaries_pieces_and_fusions(dumped):
    directory, graph, _ = dumped
    final = sorted(f for f in files_under(directory) if f.endswith("fuse_groups.dot"))[-1]
    dot = read(os.path.join(directory, final))
    names = re.findall(r"%(\w+):", read(os.path.join(directory, final[:-4] + ".txt")))
    assert names
    for name in names:  # every value of the text dump is a node of the picture
        assert re.search(rf'"(?:[^"]*/)?{re.escape(name)}"', dot), name
    assert "magi_t_dump::boundary_scale\\n[boundary]" in dot and "#cc0000" in dot
    assert len(re.findall(r'subgraph "cluster_piece_\d+" \{', dot)) == 2
    assert len(re.findall(r'subgraph "cluster_piece_\d+/fusion_\w+" \{', dot)) == 2
    assert dot.count("fused kernel: 3 ops") == 2
    if shutil.which("dot"):
        svg = read(os.path.join(directory, final[:-4] + ".svg"))
        assert "<svg" in svg and "sigmoid" in svg and "boundary_scale" in svg


def test_kernel_sources_name_the_ops_and_lines_they_fuse(dumped):
    directory, _, _ = dumped
    kernels = [f for f in files_under(directory) if f.startswith("kernels/inference/")]
    assert len(kernels) == 2, kernels
    text = "\n".join(read(os.path.join(directory, k)) for k in kernels)
    for op in ("aten::sigmoid", "aten::mul.Tensor", "aten::add.Tensor", "aten::tanh"):
        assert re.search(rf"^// fuses: .*{re.escape(op)}", text, flags=re.M), op
    assert "from test_dumps.py:" in text


def test_timeline_stages_add_up_to_the_compile_time(dumped):
    directory, _, _ = dumped
    timeline = json.loads(read(os.path.join(directory, "timeline.json")))
    stages = {s["name"]: s["ms"] for s in timeline["stages"]}
    for name in (
        "dynamo capture",
        "AOTAutograd",
        "inference: import FX graph to IR",
        "inference: pass fuse_groups",
        "inference: executor build",
        "inference: step plan_padding",
        "inference: step fold_constants",
        "inference: step plan_memory_arena",
        "dump writing",
        "other",
    ):
        assert name in stages, sorted(stages)
    total = timeline["total_ms"]
    measured = sum(ms for name, ms in stages.items() if name != "other")
    assert abs(measured - total) <= 0.1 * total, (measured, total, stages)
    assert abs(sum(stages.values()) - total) < 1e-6 * total
    first_runs = [s for s in timeline["after_compile"] if s["name"] == "inference: first run"]
    assert first_runs and "compiles" in first_runs[0]["note"]
    assert "sum of stages" in read(os.path.join(directory, "timeline.txt"))


def test_summary_config_and_index(dumped):
    directory, _, _ = dumped
    (summary,) = json.loads(read(os.path.join(directory, "summary.json")))
    assert summary["kind"] == "inference"
    assert summary["pieces"] == 2 and summary["boundary_ops"] == ["magi_t_dump::boundary_scale"]
    assert summary["fusion_groups"] == 2 and summary["fused_ops"] >= 5
    assert summary["kernels_compiled"] == 2
    assert all(f["reason"] for f in summary["aten_fallbacks"])
    assert json.loads(read(os.path.join(directory, "config.json")))["backend"] == "magi"
    page = read(os.path.join(directory, "index.html"))
    for f in files_under(directory) - {"index.html"}:
        assert f'href="{f}"' in page, f
    assert 'id="summary"' in page and "offload/inference.json" in page
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org", "")


def test_info_line_per_compile_and_fallbacks_at_debug(dumped):
    _, _, records = dumped
    info = [r.getMessage() for r in records if r.levelno == logging.INFO]
    assert len(info) == 1, info
    assert re.match(r"compiled DumpModel \(inference\): 2 fused kernels, \d+ ATen calls", info[0])
    assert "index.html" in info[0]
    debug = [r.getMessage() for r in records if r.levelno == logging.DEBUG]
    assert any("stays an ATen call: not fusible:" in m for m in debug), debug


def test_detail_levels_change_the_pictures(dumped):
    _, graph, _ = dumped
    op, shape, source = (graph.to_dot(d) for d in ("op", "shape", "source"))
    assert len({op, shape, source}) == 3
    assert "f32[" not in "".join(re.findall(r'label="[^"]*"', op))
    assert "f32[" in shape and "test_dumps.py:" not in "".join(re.findall(r'label="[^"]*"', shape))
    assert "test_dumps.py:" in "".join(re.findall(r'label="[^"]*"', source))
    with pytest.raises(UserError, match="one of op, shape, source"):
        graph.to_dot("everything")


def path_without_dot(tmp_path) -> str:
    """A PATH with every program of the current one except Graphviz's `dot`."""
    farm = tmp_path / "bin"
    farm.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for entry in os.scandir(folder):
            target = farm / entry.name
            if entry.name != "dot" and not target.exists():
                target.symlink_to(entry.path)
    return str(farm)


def test_detail_env_and_dot_only_without_graphviz(tmp_path, monkeypatch):
    root = tmp_path / "dumps"
    monkeypatch.setenv(_dump.ENABLE_ENV, "1")
    monkeypatch.setenv(_dump.DIR_ENV, str(root))
    monkeypatch.setenv(_dump.DETAIL_ENV, "op")
    monkeypatch.setenv("PATH", path_without_dot(tmp_path))
    assert shutil.which("dot") is None
    compile_and_run(DumpModel(), (4, 32))
    directory = only_dump(root)
    files = files_under(directory)
    assert not any(f.endswith(".svg") for f in files)
    dots = [f for f in files if f.endswith(".dot")]
    assert dots
    labels = "".join(re.findall(r'label="[^"]*"', read(os.path.join(directory, dots[0]))))
    assert "aten::sigmoid" in labels and "f32[" not in labels
    page = read(os.path.join(directory, "index.html"))
    assert '<pre class="dot">' in page and "digraph magi" in page

    monkeypatch.setenv(_dump.DETAIL_ENV, "everything")
    with pytest.raises(UserError, match=_dump.DETAIL_ENV):
        compile_and_run(DumpModel(), (4, 32))


@pytest.mark.parametrize("dims", [{"x": 0}, {}], ids=["backward-at-compile", "lazy-backward"])
def test_forward_and_backward_graphs_of_a_training_compile(tmp_path, monkeypatch, dims):
    """With a dynamic dim AOTAutograd lowers the backward graph during the compile; with static
    shapes it does so at the first backward call, and the dump gains it then."""
    monkeypatch.setenv(_dump.ENABLE_ENV, "1")
    monkeypatch.setenv(_dump.DIR_ENV, str(tmp_path))
    monkeypatch.delenv("RANK", raising=False)

    def mlp(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (torch.sigmoid(x @ w) * 2.0 + 1.0).sum()

    torch._dynamo.reset()
    fn = magi_compile(mlp, model_tag="mlp", dynamic_arg_dims=dims)
    w = torch.randn(8, 8, requires_grad=True)
    loss = fn(torch.randn(4, 8), w)
    directory = only_dump(tmp_path)
    assert os.path.basename(directory) == "mlp-rank0-0"
    assert ("aten_backward.py" in files_under(directory)) == bool(dims)
    loss.backward()
    files = files_under(directory)
    for kind in ("forward", "backward"):
        assert f"aten_{kind}.py" in files and f"ir/{kind}/00_imported.txt" in files
    assert "aten::sigmoid" in read(os.path.join(directory, "ir/forward/00_imported.txt"))
    page = read(os.path.join(directory, "index.html"))
    assert "forward graph after" in page and "backward graph after" in page
    timeline = json.loads(read(os.path.join(directory, "timeline.json")))
    lazy = [
        s["name"] for s in timeline["after_compile"] if "lowered after the compile" in s["name"]
    ]
    assert lazy == ([] if dims else ["backward: lowered after the compile"])


def test_nothing_written_when_off(tmp_path, monkeypatch):
    """Dumps off: no new file under the dump dir, the cache root or the working directory,
    through a compile, runs and a guard miss (which is logged at DEBUG)."""
    dump_dir, cache_root, cwd = (tmp_path / n for n in ("dumps", "cache", "cwd"))
    for d in (dump_dir, cache_root, cwd):
        d.mkdir()
    monkeypatch.delenv(_dump.ENABLE_ENV, raising=False)
    monkeypatch.setenv(_dump.DIR_ENV, str(dump_dir))
    monkeypatch.chdir(cwd)
    default_root = _dump.dump_root(os.path.expanduser("~/.cache/magi_compiler"))
    watched = [dump_dir, cache_root, cwd, default_root]
    before = [files_under(d) for d in watched]
    with logs_at("debug") as records:
        compile_and_run(DumpModel(), (4, 32), (3, 32), (4, 2, 32), cache_root_dir=str(cache_root))
    messages = [r.getMessage() for r in records]
    assert [files_under(d) for d in watched] == before
    assert any("guard miss" in m for m in messages), messages


def test_a_dump_that_cannot_be_written_warns_and_the_model_still_compiles(tmp_path, monkeypatch):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    monkeypatch.setenv(_dump.ENABLE_ENV, "1")
    monkeypatch.setenv(_dump.DIR_ENV, str(not_a_dir))
    with logs_at("warning") as records:
        model = compile_and_run(DumpModel(), (4, 32))
    assert any("no dump for this compile" in r.getMessage() for r in records)
    assert inspection.last_compiled().num_pieces == 2
    assert model is not None


def test_a_page_that_cannot_be_rendered_again_warns_and_keeps_the_last_one(dumped, monkeypatch):
    """The compiled-module cache rewrites the index page after its write; a failure to render
    it again says why and leaves the page the compile wrote."""
    from magi_compiler import _dump_page

    directory, _, _ = dumped
    before = open(os.path.join(directory, "index.html"), encoding="utf-8").read()

    def broken(report):
        raise RuntimeError("no page today")

    monkeypatch.setattr(_dump_page, "render", broken)
    with logs_at("warning") as records:
        _dump.refresh_page("DumpModel")
    assert any(
        "could not render the dump's index page again: RuntimeError('no page today')"
        in r.getMessage()
        for r in records
    )
    assert open(os.path.join(directory, "index.html"), encoding="utf-8").read() == before
