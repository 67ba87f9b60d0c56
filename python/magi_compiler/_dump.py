"""What a compile did: one INFO log line per compile and, with ``MAGI_ENABLE_FX_GRAPH_VIZ=1``,
one dump directory per compile with an index page (docs/debugging.md).

Switches, read at each compile:

- ``MAGI_ENABLE_FX_GRAPH_VIZ=1`` turns dumps on. Off (the default), nothing is written.
- ``MAGI_DUMP_DIR``: where dump directories go (default ``<cache_root_dir>/dumps``).
- ``MAGI_FX_GRAPH_VIZ_NODE_DESC``: what graph pictures show per node: ``op``, ``shape``
  (default: plus result names and types) or ``source`` (plus the user's source line).

A dump directory, named ``<model_tag>-rank<R>-<N>``::

    index.html            the page that links everything below
    dynamo_graph.py       the graph Dynamo captured, as code
    aten_<kind>.py        the ATen graphs AOTAutograd made (forward, backward or inference)
    ir/<kind>/NN_<stage>  our IR after import and after each pass that changed it:
                          .txt (text), .dot (Graphviz), .svg (when `dot` is on PATH)
    kernels/<kind>/       every generated kernel source, written after the graph's first run
    timeline.txt/.json    milliseconds per compile stage
    summary.json, config.json

The backend reports through three calls: :func:`compile_scope` around a Dynamo graph's
compile, :func:`lowering` for each ATen graph lowered to the C++ executor, and the
:class:`Lowering` methods at the steps of that lowering. Dumps write files only from here.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import json
import logging
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from magi_compiler import _C
from magi_compiler._logging import logger
from magi_compiler.errors import UserError

ENABLE_ENV = "MAGI_ENABLE_FX_GRAPH_VIZ"
DIR_ENV = "MAGI_DUMP_DIR"
DETAIL_ENV = "MAGI_FX_GRAPH_VIZ_NODE_DESC"
DETAILS = ("op", "shape", "source")
MAX_RENDERED_NODES = 2500  # bigger graphs keep their DOT only: `dot` would take minutes

_tls = threading.local()
_lock = threading.Lock()
_by_compile_id: collections.OrderedDict[str, Report] = collections.OrderedDict()
_last_dir: str | None = None
_last_by_tag: dict[str, Report] = {}  # the latest report with a dump, per model tag


def enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def detail() -> str:
    value = os.environ.get(DETAIL_ENV, "").strip().lower() or "shape"
    if value not in DETAILS:
        raise UserError(
            f"{DETAIL_ENV}={os.environ[DETAIL_ENV]!r} is not one of {', '.join(DETAILS)} "
            "(how much graph pictures show per node)"
        )
    return value


def dump_root(cache_root_dir: str) -> str:
    return os.environ.get(DIR_ENV) or os.path.join(cache_root_dir, "dumps")


def last_dump_dir() -> str | None:
    """The directory of the most recent dump in this process, or None."""
    return _last_dir


def rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


@contextlib.contextmanager
def capture(model_tag: str) -> Iterator[None]:
    """Marks a capture of ``model_tag`` starting now (api.py): names the dump and times Dynamo."""
    previous = getattr(_tls, "capture", None)
    _tls.capture = (model_tag, time.perf_counter())
    try:
        yield
    finally:
        _tls.capture = previous


def _compile_id() -> str | None:
    from torch._guards import CompileContext

    cid = CompileContext.current_compile_id()
    return None if cid is None else str(cid)


@dataclasses.dataclass
class Stage:
    name: str
    ms: float
    note: str = ""


class Report:
    """One compile of one Dynamo graph: its lowered graphs, timeline and (if on) dump."""

    def __init__(self, gm: Any, config: Any, model_tag: str, start: float):
        self.config = config
        self.model_tag = model_tag
        self.start = start
        self.total_ms: float | None = None  # set when the backend returns
        self.stages: list[Stage] = []  # inside the compile, in order
        self.later: list[Stage] = []  # after it: page writing, first runs, lazy backward
        self.lowerings: list[Lowering] = []
        self.recompute_plans: list[dict[str, Any]] = []  # training compiles: _recompute.py
        self.dump_ms = 0.0  # time spent writing dump files during the compile
        self.error: str | None = None
        self.in_scope = True
        self.aot_start = start
        self.dir: str | None = None
        self.write_failed = False
        self.detail = "shape"
        self.cache_tag = model_tag
        if enabled():
            self.detail = detail()
            root = dump_root(config.cache_root_dir)
            try:
                self.dir = _make_dir(root, model_tag)
            except OSError as e:
                logger.warning(
                    "no dump for this compile: cannot create a directory in %s: %s", root, e
                )
                return
            with self.writing():
                self.write("dynamo_graph.py", _readable(gm))

    # --- files -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            ms = (time.perf_counter() - t) * 1e3
            if self.in_scope:
                self.dump_ms += ms

    def write(self, relpath: str, text: str) -> str:
        """Writes one file of the dump. A dump that cannot be written (full disk, no
        permission) warns once and never fails the compile."""
        assert self.dir is not None
        path = os.path.join(self.dir, relpath)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            # Whole or not at all: a page rewritten while it is open is never seen half-written.
            partial = f"{path}.{os.getpid()}.{threading.get_ident()}.partial"
            with open(partial, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(partial, path)
        except OSError as e:
            if not self.write_failed:
                self.write_failed = True
                logger.warning("could not write the dump file %s: %s", path, e)
        return relpath

    # --- end of the compile ----------------------------------------------------------------
    def finish(self, end: float) -> None:
        """Closes the compile's timeline at ``end`` (the backend returning), logs, writes."""
        self.total_ms = (end - self.start) * 1e3
        self.in_scope = False
        # AOTAutograd's own time: its call, less the lowerings it called (dumps included).
        lowered = sum(lo.wall_ms for lo in self.lowerings if lo.in_scope)
        aot = Stage(
            "AOTAutograd", (end - self.aot_start) * 1e3 - lowered, "functionalise, partition"
        )
        head = 1 if self.stages and self.stages[0].name == "dynamo capture" else 0
        self.stages.insert(head, aot)
        if self.dump_ms:
            self.stages.append(Stage("dump writing", self.dump_ms, ENABLE_ENV + "=1"))
        other = self.total_ms - sum(s.ms for s in self.stages)
        self.stages.append(Stage("other", other, "not attributed to a stage above"))
        self.log()
        self.write_all()

    def log(self) -> None:
        kernels = sum(lo.num_kernels for lo in self.lowerings)
        kinds = "+".join(lo.kind for lo in self.lowerings) or "no graph lowered"
        where = f"; dump: {os.path.join(self.dir, 'index.html')}" if self.dir else ""
        logger.info(
            "compiled %s (%s): %d fused kernels, %d ATen calls, %.1f ms%s",
            self.model_tag,
            kinds,
            kernels,
            sum(lo.num_aten_calls for lo in self.lowerings),
            self.total_ms or 0.0,
            where,
        )
        if logger.isEnabledFor(logging.DEBUG):
            for lo in self.lowerings:
                lo.log_fallbacks(self.model_tag)

    def write_all(self) -> None:
        """(Re)writes the timeline, summary and index page; renders pending SVGs."""
        global _last_dir
        if self.dir is None:
            return
        from magi_compiler import _dump_page

        t = time.perf_counter()
        _render_svgs(self.dir)
        self.write("timeline.txt", _timeline_text(self))
        self.write("timeline.json", json.dumps(_timeline_json(self), indent=2))
        summary = [lo.summary() for lo in self.lowerings]
        self.write("summary.json", json.dumps(summary, indent=2))
        self.write("config.json", config_json(self.config))
        self.write("index.html", _dump_page.render(self))
        _last_dir = self.dir
        with _lock:
            _last_by_tag[self.cache_tag] = self
        logger.debug("dump pages written in %.1f ms", (time.perf_counter() - t) * 1e3)


@contextlib.contextmanager
def compile_scope(gm: Any, config: Any) -> Iterator[Report]:
    """Around the backend's compile of one Dynamo graph (AOTAutograd and lowering inside)."""
    entered = time.perf_counter()
    tag, start = getattr(_tls, "capture", None) or ("model", entered)
    report = Report(gm, config, re.sub(r"[^A-Za-z0-9_.-]+", "_", tag), start)
    report.cache_tag = tag  # the tag the compiled-module cache records its events under
    if start != entered:
        report.stages.append(Stage("dynamo capture", (entered - start) * 1e3, "bytecode to FX"))
    cid = _compile_id()
    if cid is not None and report.dir is not None:  # for a backward graph lowered later
        with _lock:
            _by_compile_id[cid] = report
            while len(_by_compile_id) > 64:
                _by_compile_id.popitem(last=False)
    previous = getattr(_tls, "report", None)
    _tls.report = report
    report.aot_start = time.perf_counter()
    try:
        yield report
    except BaseException as e:
        report.error = f"{type(e).__name__}: {e}"
        raise
    finally:
        end = time.perf_counter()
        _tls.report = previous
        report.finish(end)


def refresh_page(model_tag: str) -> None:
    """Rewrites the index page of ``model_tag``'s latest dump (the compiled-module cache wrote
    or refused its entry after the compile's page was written)."""
    with _lock:
        report = _last_by_tag.get(model_tag)
    if report is not None and report.dir is not None:
        from magi_compiler import _dump_page

        try:
            page = _dump_page.render(report)
        except Exception as e:  # noqa: BLE001 - the dump must never fail a call; say why
            logger.warning("%s: could not render the dump's index page again: %r", model_tag, e)
            return
        report.write("index.html", page)


def recompute_plan(plan: dict[str, Any]) -> None:
    """Records a training compile's recompute plan on its report; with dumps on, writes it to
    recompute_plan.txt (the report) and recompute_plan.json."""
    report = getattr(_tls, "report", None)
    if report is None:
        return
    report.recompute_plans.append(plan)
    if report.dir is None:
        return
    n = len(report.recompute_plans)
    stem = "recompute_plan" if n == 1 else f"recompute_plan_{n}"
    figures = {k: v for k, v in plan.items() if k not in ("report", "forward_names", "kept")}
    with report.writing():
        report.write(stem + ".txt", plan["report"])
        report.write(stem + ".json", json.dumps(figures, indent=2))


def _masks_note(patterns: list[dict[str, Any]]) -> str:
    """recognize_causal_masks' decisions in one line: how many attention calls took is_causal
    (or dropped a mask that keeps everything), and why the others kept their masks."""
    done = sum(p["rewritten"] for p in patterns)
    note = f"{done} attention mask{'s' if done != 1 else ''} replaced"
    kept = sorted({p["detail"].split(": ", 1)[-1] for p in patterns if not p["rewritten"]})
    if kept:
        note += f", {len(patterns) - done} kept ({'; '.join(kept)})"
    return note


def _patterns_note(patterns: list[dict[str, Any]]) -> str:
    """recognize_attention's decisions in one line: how many chains were rewritten, and why
    the others were left as written."""
    done = sum(p["rewritten"] for p in patterns)
    left = [p for p in patterns if not p["rewritten"]]
    note = f"{done} attention chain{'s' if done != 1 else ''} rewritten"
    if left:
        reasons = sorted({p["detail"] for p in left})
        note += f", {len(left)} left as written ({'; '.join(reasons)})"
    return note


def lowering(kind: str, gm: Any, config: Any) -> Lowering:
    """The record of one ATen graph's lowering, joined to its compile's report."""
    report = getattr(_tls, "report", None)
    if report is None:  # a backward graph lowered at the first backward, after its compile
        cid = _compile_id()
        with _lock:
            report = _by_compile_id.get(cid) if cid is not None else None
    return Lowering(kind, gm, config, report)


class Lowering:
    """Timing, statistics and dumps of one graph's import, passes and executor build."""

    def __init__(self, kind: str, gm: Any, config: Any, report: Report | None):
        self.kind = kind
        self.config = config
        self.report = report
        self.in_scope = report is not None and report.in_scope
        self.start = self._mark = time.perf_counter()
        self.stages: list[Stage] = []
        self.snapshots: list[tuple[str, str]] = []  # (stage, relative path without suffix)
        self.graph = self.executable = None
        self.stats: dict[str, Any] | None = None  # set when the executor is built
        self.kernels: list[dict[str, Any]] = []
        self.first_run: dict[str, Any] | None = None
        self.attention_choices: list[dict[str, Any]] = []
        self.attention_patterns: list[dict[str, Any]] = []
        self._patterns_before = 0
        self.wall_ms = 0.0
        self.num_kernels = self.num_aten_calls = 0
        self.dumping = report is not None and report.dir is not None
        self.dump_ms = 0.0
        if self.dumping:
            with report.writing():
                self.aten_file = report.write(f"aten_{kind}.py", _readable(gm))
            self._mark = time.perf_counter()
            self.dump_ms = (self._mark - self.start) * 1e3
        if report is not None:
            report.lowerings.append(self)

    def _stage(self, name: str, note: str = "") -> None:
        now = time.perf_counter()
        self.stages.append(Stage(f"{self.kind}: {name}", (now - self._mark) * 1e3, note))
        self._mark = now

    def _snapshot(self, stage: str) -> None:
        if not self.dumping:
            return
        t = time.perf_counter()
        with self.report.writing():
            base = f"ir/{self.kind}/{len(self.snapshots):02d}_{stage}"
            self.report.write(base + ".txt", self.graph.to_string())
            splitting = list(self.config.splitting_ops)
            self.report.write(base + ".dot", self.graph.to_dot(self.report.detail, splitting))
            self.snapshots.append((stage, base))
        self._mark = time.perf_counter()
        self.dump_ms += (self._mark - t) * 1e3

    def imported(self, graph: Any) -> None:
        self._stage("import FX graph to IR")
        self.graph = graph
        self._snapshot("imported")
        self._patterns_before = len(_C.attention_patterns())
        self._pipeline_start, self._dump_ms_before = self._mark, self.dump_ms

    @property
    def after_pass(self) -> Callable[[str], None] | None:
        """The pipeline's callback after each pass that changed the graph (None: no dump)."""
        return self._snapshot if self.dumping else None

    def passes_done(self, records: list[dict[str, Any]]) -> None:
        # Snapshots taken between passes count as dump writing, not as pipeline time.
        wall = (time.perf_counter() - self._pipeline_start) * 1e3 - (
            self.dump_ms - self._dump_ms_before
        )
        ran = [r for r in records if r["ran"]]
        self.attention_patterns = _C.attention_patterns()[self._patterns_before :]
        for r in ran:
            note = "changed the graph" if r["changed"] else "no change"
            if r["name"] == "recognize_attention":
                chains = [p for p in self.attention_patterns if "pass" not in p]
                if chains:
                    note += "; " + _patterns_note(chains)
            if r["name"] == "recognize_causal_masks":
                masks = [p for p in self.attention_patterns if "pass" in p]
                if masks:
                    note += "; " + _masks_note(masks)
            self.stages.append(Stage(f"{self.kind}: pass {r['name']}", r["ms"], note))
        if self.dumping and self.attention_patterns:
            with self.report.writing():
                self.report.write(
                    f"attention_patterns/{self.kind}.json",
                    json.dumps(self.attention_patterns, indent=1),
                )
        overhead = wall - sum(r["ms"] for r in ran)
        self.stages.append(Stage(f"{self.kind}: verifier after each pass", overhead))
        self._mark = time.perf_counter()

    def built(self, executable: Any) -> None:
        # The named lowering steps get stages of their own; the rest of the build is one.
        steps = [s for s in executable.lowering_steps if s["ran"]]
        now = time.perf_counter()
        build_ms = (now - self._mark) * 1e3 - sum(s["ms"] for s in steps)
        note = "lowering to instructions, kernel specs, CUDA kernels compiled"
        self.stages.append(Stage(f"{self.kind}: executor build", build_ms, note))
        for s in steps:
            self.stages.append(
                Stage(f"{self.kind}: step {s['name']}", s["ms"], _step_note(s, executable))
            )
        self._mark = now
        self.wall_ms = (time.perf_counter() - self.start) * 1e3
        self.stats = _graph_stats(self.graph, self.config)
        self.stats["operator_calls"] = executable.num_operator_calls
        self.num_kernels = executable.num_fusions
        self.num_aten_calls = len(self.stats["aten_fallbacks"])
        # Keep no graph (and, once its kernels are dumped, no executable) alive past this.
        self.graph = None
        self.executable = executable if self.dumping else None
        if self.report is None:
            return
        if self.in_scope:
            self.report.stages.extend(self.stages)
        else:
            self.report.later.append(
                Stage(f"{self.kind}: lowered after the compile", self.wall_ms, "lazy backward")
            )
            self.report.later.extend(self.stages)
            self.report.write_all()

    def first_call_hook(self, call: Callable) -> Callable:
        """Wraps ``call`` to dump the kernels it compiles at its first run (dumps on only)."""
        if not self.dumping:
            return call
        done = False
        executable = self.executable
        offload_calls = 0

        def offload_report() -> None:
            # The offload plan changes over the first calls (calibration, cost model, measured)
            # and the fourth measures the last plan: the file is rewritten after each of them.
            nonlocal offload_calls
            offload_calls += 1
            report = executable.offload_report() if executable is not None else None
            if report is not None:
                with self.report.writing():
                    self.report.write(f"offload/{self.kind}.json", json.dumps(report, indent=1))

        def first(args: list[Any], **kwargs: Any) -> list[Any]:
            nonlocal done
            if done:
                outputs = call(args, **kwargs)
                if offload_calls < 4:
                    offload_report()
                return outputs
            done = True
            choices_before = len(_C.attention_choices())
            before, t = _C.compiler_stats(), time.perf_counter()
            outputs = call(args, **kwargs)
            ms = (time.perf_counter() - t) * 1e3
            after = _C.compiler_stats()
            self.first_run = {"ms": ms, **{k: after[k] - before[k] for k in after}}
            self.attention_choices = _C.attention_choices()[choices_before:]
            self._dump_kernels()
            self.executable = None
            offload_report()
            return outputs

        return first

    def _dump_kernels(self) -> None:
        report = self.report
        assert report is not None and self.executable is not None
        for k in self.executable.generated_kernels():
            suffix = "cu" if k["target"] == "cuda" else "cpp"
            header = (
                f"// {k['symbol']}: {k['target']} kernel of the {self.kind} graph\n"
                f"// fuses: {', '.join(k['fused_ops'])}\n"
            )
            path = report.write(f"kernels/{self.kind}/{k['symbol']}.{suffix}", header + k["source"])
            sources = re.findall(r"^//\s+from (.+)$", k["source"], flags=re.M)
            self.kernels.append({**k, "path": path, "from": sources})
        if self.attention_choices:
            # Attention kernels probed during the first run (attention_backend="auto").
            report.write(
                f"attention_choices/{self.kind}.json",
                json.dumps(self.attention_choices, indent=1),
            )
            for c in self.attention_choices:
                timed = ", ".join(f"{name} {ms:.3f} ms" for name, ms in c["ms"].items())
                report.later.append(
                    Stage(f"{self.kind}: attention {c['chosen']}", 0.0, f"{c['shape']}: {timed}")
                )
        fr = self.first_run or {}
        report.later.append(
            Stage(
                f"{self.kind}: first run",
                fr.get("ms", 0.0),
                f"kernels compile lazily here: {fr.get('cpu_compiles', 0)} CPU and "
                f"{fr.get('cuda_compiles', 0)} CUDA compiles, {fr.get('memory_hits', 0)} memory "
                f"and {fr.get('disk_hits', 0)} disk cache hits",
            )
        )
        report.write_all()

    # --- what the page and summary show ---------------------------------------------------
    def summary(self) -> dict[str, Any]:
        if self.stats is None:
            return {"kind": self.kind}
        return {
            "kind": self.kind,
            **self.stats,
            "fused_kernel_calls": self.num_kernels,
            "lowering_ms": self.wall_ms,
            "kernels_compiled": len(self.kernels),
        }

    def log_fallbacks(self, tag: str) -> None:
        if self.stats is None:
            return
        fallbacks = self.stats["aten_fallbacks"]
        grouped = collections.Counter((f["op"], f["reason"]) for f in fallbacks)
        for (op, reason), n in sorted(grouped.items()):
            logger.debug(
                "%s %s graph: %s x%d stays an ATen call: %s", tag, self.kind, op, n, reason
            )


def _step_note(step: dict[str, Any], executable: Any) -> str:
    """What a lowering step decided, for the timeline."""
    if step["name"] == "plan_padding":
        return executable.padding
    if step["name"] == "fold_constants":
        return f"{executable.num_constant_instructions} instructions run on the first call only"
    if step["name"] == "plan_memory_arena":
        return f"{executable.arena_stats['planned_values']} values planned"
    return ""


def _graph_stats(graph: Any, config: Any) -> dict[str, Any]:
    """Pieces, fusion groups and unfused ATen calls of a graph after the pipeline. Fusion
    groups and pieces are both kept in their owner's ``pieces``; each distinct piece counts
    once."""
    call_pieces: set[int] = set()
    fused_ops = groups = 0

    def count(owner: Any) -> None:
        nonlocal fused_ops, groups
        for kind, op, *_ in owner.nodes():
            if kind not in ("piece", "fusion"):
                continue
            index = int(op.rsplit("_", 1)[1])
            if kind == "fusion":
                groups += 1
                fused_ops += sum(n[0] == "aten" for n in owner.pieces[index].nodes())
            elif owner is graph and index not in call_pieces:
                call_pieces.add(index)
                count(owner.pieces[index])

    count(graph)
    return {
        "ir_nodes": graph.num_nodes,
        "pieces": len(call_pieces),
        "piece_calls": graph.num_piece_calls,
        "boundary_ops": list(graph.boundary_op_names(list(config.splitting_ops))),
        "fusion_groups": groups,
        "fused_ops": fused_ops,
        "aten_fallbacks": graph.aten_fallbacks(),
    }


# --- helpers ---------------------------------------------------------------------------------
def _make_dir(root: str, tag: str) -> str:
    prefix = f"{tag}-rank{rank()}-"
    os.makedirs(root, exist_ok=True)
    while True:
        taken = [
            int(name[len(prefix) :])
            for name in os.listdir(root)
            if name.startswith(prefix) and name[len(prefix) :].isdigit()
        ]
        path = os.path.join(root, f"{prefix}{max(taken, default=-1) + 1}")
        try:
            os.mkdir(path)  # fails if another process took the number meanwhile
            return path
        except FileExistsError:
            continue


def _readable(gm: Any) -> str:
    try:
        return gm.print_readable(print_output=False)
    except Exception:  # noqa: BLE001 - a picture of the graph must not fail the compile
        return str(gm.graph)  # the node list (a graph from the cache has no compiled code)


def config_json(config: Any) -> str:
    def default(o: Any) -> Any:
        return o.value if isinstance(o, enum.Enum) else str(o)

    return json.dumps(dataclasses.asdict(config), indent=2, default=default)


def _render_svgs(directory: str) -> None:
    """Renders every .dot without an .svg when Graphviz's `dot` is on PATH, four at a time.
    A graph too big to lay out in reasonable time, or one `dot` fails on, keeps its DOT only."""
    dot = shutil.which("dot")
    if dot is None:
        return
    pending = []
    for folder, _, files in os.walk(directory):
        for name in sorted(files):
            if name.endswith(".dot") and name[:-4] + ".svg" not in files:
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    if f.read().count("tooltip=") <= MAX_RENDERED_NODES:  # one per node
                        pending.append(path)
    for start in range(0, len(pending), 4):
        running = []
        for path in pending[start : start + 4]:
            out = path[:-4] + ".svg"
            try:
                running.append((out, subprocess.Popen([dot, "-Tsvg", path, "-o", out])))
            except OSError as e:
                logger.warning("could not run %s: %s; the DOT files stay", dot, e)
        for out, proc in running:
            try:
                ok = proc.wait(timeout=120) == 0
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                ok = False
            if not ok:
                logger.warning("dot failed on %s; the DOT file stays", out[:-4] + ".dot")
                with contextlib.suppress(OSError):
                    os.remove(out)


def _timeline_json(report: Report) -> dict[str, Any]:
    return {
        "model_tag": report.model_tag,
        "total_ms": report.total_ms,
        "stages": [dataclasses.asdict(s) for s in report.stages],
        "after_compile": [dataclasses.asdict(s) for s in report.later],
    }


def _timeline_text(report: Report) -> str:
    lines = [f"compile of {report.model_tag}: {report.total_ms or 0.0:.1f} ms", ""]
    for s in report.stages:
        lines.append(f"{s.ms:10.2f} ms  {s.name}" + (f"  ({s.note})" if s.note else ""))
    lines.append(f"{sum(s.ms for s in report.stages):10.2f} ms  sum of stages")
    if report.later:
        lines += ["", "after the compile (not in the total):"]
        for s in report.later:
            lines.append(f"{s.ms:10.2f} ms  {s.name}" + (f"  ({s.note})" if s.note else ""))
    return "\n".join(lines) + "\n"
