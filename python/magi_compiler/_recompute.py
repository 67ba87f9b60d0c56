"""AOTAutograd's ``partition_fn``: the joint forward+backward graph goes to the C++ recompute
planner (``passes/plan_recompute.h``), which decides what the backward recomputes; this module
tags the FX nodes with that decision and lets PyTorch's partitioner cut the graph where the tags
say (it recomputes just in time, in the order the autograd engine would run the backward).

The planner predicts peaks op by op on the joint graph, but the compiled graphs run fusion
groups, whose outputs are allocated while everything they read is alive. So the forward and
backward graphs the partitioner makes are lowered here as the backend will lower them and
simulated (``passes::simulate_peak``); that is the peak reported, and under AUTOSEARCH a plan
whose compiled peak exceeds the budget is planned again against a budget lowered by the excess.

Glue only: the plan is made in C++. Policies and budgets: docs/training.md.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from magi_compiler import _C, _dump, inspection
from magi_compiler._logging import logger
from magi_compiler.config import CompileConfig
from magi_compiler.errors import InternalError, UnsupportedError


def partition(
    joint_module: torch.fx.GraphModule,
    joint_inputs: Any,
    *,
    num_fwd_outputs: int,
    config: CompileConfig,
    **kwargs: Any,
):
    from torch._functorch import partitioners

    def split():
        return partitioners.default_partition(
            joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs
        )

    plan = plan_for(joint_module, num_fwd_outputs, config, report=False)
    if plan is None:
        return split()
    _tag(joint_module, plan)
    graphs = split()
    rc = config.recompute_config
    budget = int(rc.memory_budget_bytes) if plan["policy"] == "AUTOSEARCH" else 0
    hints = size_hints(joint_module.graph)
    target = budget
    for attempt in range(MAX_REPLANS + 1):
        # backend="eager" runs the FX graphs in Python: nothing fuses, no lowering to simulate.
        peak = None if config.backend == "eager" else compiled_peak(*graphs, hints, config)
        if peak is None:
            break
        plan.update(peak)
        if not budget or plan["compiled_peak_bytes"] <= budget or attempt == MAX_REPLANS:
            break
        again, target = _lower_plan(joint_module, num_fwd_outputs, config, plan, target, budget)
        if again is None:
            break
        plan = again
        _tag(joint_module, plan)
        graphs = split()
    if budget and "compiled_peak_bytes" in plan:
        # The verdict is on the user's budget, not on the lowered target the last plan was for.
        compiled = plan["compiled_peak_bytes"]
        plan["budget_met"] = compiled <= budget
        plan["note"] = (
            ""
            if compiled <= budget
            else f"the compiled graphs' simulated activation peak {_size(compiled)} exceeds the "
            f"budget {_size(budget)} (the lowest peak the planner found is "
            f"{_size(plan['lowest_peak_bytes'])} before fusion)"
        )
    _report(plan)
    return graphs


def _lower_plan(
    joint_module: torch.fx.GraphModule,
    num_fwd_outputs: int,
    config: CompileConfig,
    plan: dict[str, Any],
    target: int,
    budget: int,
) -> tuple[dict[str, Any] | None, int]:
    """AUTOSEARCH, when ``plan`` compiles to more than ``budget``: a plan for a target lowered
    by the excess (what fusion adds to the joint graph's prediction), lowered further, doubling
    the step, until the planner answers with a different plan. (None, target) when it cannot."""
    step = plan["compiled_peak_bytes"] - budget
    for _ in range(MAX_LOWERINGS):
        target -= step
        if target <= 0:
            return None, target
        again = plan_for(joint_module, num_fwd_outputs, config, budget_bytes=target, report=False)
        if again is None:
            return None, target
        if set(again["recomputed"]) != set(plan["recomputed"]):
            return again, target
        step *= 2
    return None, target


MAX_REPLANS = 3  # AUTOSEARCH: plans made again when the compiled peak misses the budget
MAX_LOWERINGS = 8  # targets tried for each, the step doubling


def compiled_peak(
    forward: torch.fx.GraphModule,
    backward: torch.fx.GraphModule,
    hints: dict[str, int],
    config: CompileConfig,
) -> dict[str, Any] | None:
    """The simulated activation peak of the forward and backward graphs as the backend will
    lower them (import, pass pipeline, fusion): the forward from nothing to what it returns and
    saves, the backward from its saved tensors and tangents (primals, that is parameters and
    inputs, are not counted). None, with a debug line, when a graph cannot be lowered here."""
    out: dict[str, Any] = {}
    for kind, gm in (("forward", forward), ("backward", backward)):
        try:
            graph = _C.import_fx_graph(gm)
            graph.run_pipeline(list(config.pass_config.disabled_passes), list(config.splitting_ops))
            names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
            counted = [kind == "backward" and not n.startswith("primals") for n in names]
            if len(counted) != graph.num_inputs:
                counted = []  # count every input rather than guess which is which
            out[kind] = _C.simulate_peak(graph, hints, counted)
        except Exception as e:  # noqa: BLE001  a report: never what fails the compile
            # Whatever cannot be lowered here fails (or falls back) in the backend, which says
            # why; AOTAutograd may also never need the backward (dynamic shapes).
            logger.debug("recompute planner: no compiled peak for the %s graph: %s", kind, e)
            return None
    return {
        "compiled_peak_bytes": max(out["forward"]["bytes"], out["backward"]["bytes"]),
        "compiled_forward_peak_bytes": out["forward"]["bytes"],
        "compiled_backward_peak_bytes": out["backward"]["bytes"],
        "compiled_peak_where": max(out.values(), key=lambda p: p["bytes"])["where"],
    }


def forward_nodes(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The joint graph's forward nodes, as PyTorch's default partitioner counts them: every
    node but the tangents up to the last node tagged forward (or the last primal)."""
    from torch._functorch import partitioners as p

    last = None
    for node in graph.nodes:
        if p._has_tag_is_forward(node) or p._is_primal(node) or p._is_fwd_seed_offset(node):
            last = node
    out = []
    for node in graph.nodes:
        if node.op == "output":
            break
        if not p._is_tangent(node):
            out.append(node)
        if node is last:
            break
    return out


def size_hints(graph: torch.fx.Graph) -> dict[str, int]:
    """The example value of every symbolic dim, from the graph's shape environment."""
    for node in graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        env = None
        if isinstance(val, torch.SymInt):
            env = val.node.shape_env
        elif isinstance(val, torch.Tensor) and getattr(val, "fake_mode", None) is not None:
            env = val.fake_mode.shape_env
        if env is not None:
            values = getattr(env, "backed_var_to_val", None)
            if values is None:  # PyTorch before backed_var_to_val
                values = env.var_to_val
            return {str(sym): int(v) for sym, v in values.items()}
    return {}


def plan_for(
    joint_module: torch.fx.GraphModule,
    num_fwd_outputs: int,
    config: CompileConfig,
    *,
    budget_bytes: int | None = None,
    report: bool = True,
) -> dict[str, Any] | None:
    """The C++ planner's plan for this joint graph, or None (with a log line saying why) when
    the graph cannot be planned: then every value the backward reads is saved.
    ``budget_bytes`` replaces AUTOSEARCH's peak budget; ``report=False`` leaves the report to
    the caller (``partition`` reports once the compiled peak is known)."""
    from torch._functorch import partitioners

    rc = config.recompute_config
    graph = joint_module.graph
    if partitioners._is_functional_graph(graph)[0] is not None:
        logger.info(
            "recompute planner: the training graph mutates a tensor in place; saving every value "
            "the backward reads (no recomputation) for this graph"
        )
        return None
    forward = forward_nodes(graph)
    try:
        joint = _C.import_fx_graph(joint_module)
    except (UnsupportedError, InternalError) as e:
        # The forward and backward graphs still compile (or fall back) one by one.
        logger.warning(
            "recompute planner: cannot read the joint training graph (%s); saving every value "
            "the backward reads (no recomputation) for this graph",
            e,
        )
        return None
    plan = _C.plan_recompute(
        joint,
        policy=rc.recompute_policy.name,
        memory_budget=float(rc.memory_budget),
        memory_budget_bytes=int(rc.memory_budget_bytes if budget_bytes is None else budget_bytes),
        compute_sensitive_ops=list(rc.custom_compute_sensitive_ops),
        size_hints=size_hints(graph),
        forward_names=[n.name for n in forward],
        num_forward_outputs=num_fwd_outputs,
        disabled_passes=list(config.pass_config.disabled_passes),
    )
    plan["forward_names"] = [n.name for n in forward]
    if report:
        _report(plan)
    return plan


def _tag(joint_module: torch.fx.GraphModule, plan: dict[str, Any]) -> None:
    """Marks each forward op MUST_RECOMPUTE or MUST_SAVE. An output read through getitem of a
    multi-output op follows the op (the importer folds such getitems into the op's node)."""
    from torch.utils.checkpoint import CheckpointPolicy

    recompute = set(plan["recomputed"])
    known = recompute | set(plan["kept"])
    forward = set(plan["forward_names"])
    for node in joint_module.graph.nodes:
        if node.name not in forward or node.op != "call_function":
            continue
        name = node.name
        if name not in known and node.target is operator.getitem:
            source = node.args[0]
            if isinstance(source, torch.fx.Node):
                name = source.name
        recomputed = name in recompute
        node.meta["recompute"] = (
            CheckpointPolicy.MUST_RECOMPUTE if recomputed else CheckpointPolicy.MUST_SAVE
        )


def _report(plan: dict[str, Any]) -> None:
    line = (
        f"recompute plan ({plan['policy']}): saves {_size(plan['saved_bytes'])} "
        f"({_pct(plan['saved_bytes'], plan['no_recompute_bytes'])} of "
        f"{_size(plan['no_recompute_bytes'])} without recomputation), recomputes "
        f"{plan['num_recomputed_ops']} ops (~{plan['recompute_seconds'] * 1e3:.3f} ms), predicted "
        f"activation peak {_size(plan['predicted_peak_bytes'])}"
    )
    if "compiled_peak_bytes" in plan:
        line += (
            f" ({_size(plan['compiled_peak_bytes'])} in the compiled graphs, with fusion; at "
            f"{plan['compiled_peak_where']})"
        )
    if not plan["budget_met"]:
        logger.warning("%s; budget not met: %s", line, plan["note"])
    else:
        logger.info("%s", line)
    logger.debug("%s", plan["report"])
    inspection.record_recompute_plan(plan)
    _dump.recompute_plan(plan)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= scale:
            return f"{n / scale:.{2 if unit == 'GiB' else 1}f} {unit}"
    return f"{n / 1024:.1f} KiB"


def _pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:.0f}%" if b else "100%"
