"""The recompute planner on CPU (``_recompute.py`` over ``passes/plan_recompute.h``): training
compiles under each policy give eager's forward and gradients, the partitioned forward saves
exactly what the plan says, HEURISTIC saves the compute-bound outputs, hand-checked plans of a
tiny graph, budgets that behave monotonically, dropout masks never re-drawn, errors, dumps,
``custom_compute_sensitive_ops``, and the compiled graphs' simulated peak (fusion included)
held to AUTOSEARCH's budget.

Budget sweeps re-plan one captured joint graph (``_recompute.plan_for``) instead of compiling
once per budget: the same graph for every budget, in milliseconds. Every numeric check compares
against eager PyTorch on fresh random float32 inputs. Models are tiny: the file must stay fast
on 2 cores.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import math
import operator
import os

import pytest
import torch
import torch.nn.functional as F
from blocks import GPT2Block, LlamaBlock, init_weights_
from magi_compiler import _dump, _recompute, inspection, magi_compile
from magi_compiler.config import RecomputeConfig, RecomputePolicy
from magi_compiler.errors import UserError
from torch import nn

B, S, H = 2, 32, 64  # seq 32: activations outweigh the weight gradients in the simulated peak
RTOL = 1e-4

BLOCKS = {
    "llama": lambda: LlamaBlock(H, 4, 2, 2 * H),
    "gpt2": lambda: GPT2Block(H, 4),
}

aten = torch.ops.aten
SDPA_OPS = {
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
}
MATMUL_OPS = {aten.mm.default, aten.addmm.default, aten.bmm.default}


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Captured:
    """One partition call: the joint graph the planner saw and the forward PyTorch cut."""

    joint: torch.fx.GraphModule
    num_fwd_outputs: int
    config: object
    forward: torch.fx.GraphModule

    def node(self, name: str) -> torch.fx.Node:
        (node,) = [n for n in self.joint.graph.nodes if n.name == name]
        return node

    def replan(self, **recompute) -> dict:
        """The planner's plan for this joint graph under another recompute_config."""
        config = dataclasses.replace(self.config, recompute_config=RecomputeConfig(**recompute))
        return _recompute.plan_for(self.joint, self.num_fwd_outputs, config)

    def forward_saves(self) -> set[str]:
        """Names of the tensors the partitioned forward hands to the backward (graph inputs
        left out: they are alive anyway)."""
        (out,) = self.forward.graph.find_nodes(op="output")
        names = set()
        for arg in out.args[0][self.num_fwd_outputs :]:
            if isinstance(arg, torch.fx.Node) and arg.op != "placeholder":
                if isinstance(arg.meta.get("val"), torch.Tensor):
                    names.add(arg.name)
        return names


@contextlib.contextmanager
def capturing():
    """Records every call of the partition function (_backend.py calls it by module attribute)."""
    got: list[Captured] = []
    real = _recompute.partition

    def spy(joint_module, joint_inputs, *, num_fwd_outputs, config, **kwargs):
        fw, bw = real(
            joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs, config=config, **kwargs
        )
        got.append(Captured(joint_module, num_fwd_outputs, config, fw))
        return fw, bw

    mp = pytest.MonkeyPatch()
    mp.setattr(_recompute, "partition", spy)
    try:
        yield got
    finally:
        mp.undo()


@dataclasses.dataclass
class Trained:
    plan: dict
    cap: Captured
    out: torch.Tensor
    x_grad: torch.Tensor
    compiled: nn.Module


def train_compiled(model: nn.Module, x: torch.Tensor, grad: torch.Tensor, recompute: dict, **patch):
    """Compiles ``model`` for training under ``recompute`` (a recompute_config patch), runs one
    forward + backward, and checks that the partitioned forward saves exactly the plan's
    values and that this was the only training graph planned."""
    torch._dynamo.reset()
    inspection.clear()
    with capturing() as got:
        compiled = magi_compile(model, config_patch={"recompute_config": recompute, **patch})
        xc = x.detach().clone().requires_grad_(True)
        out = compiled(xc)
        out.backward(grad)
    assert len(got) == 1 and len(inspection.recompute_plans()) == 1, (
        got,
        inspection.recompute_plans(),
    )
    plan = inspection.last_recompute_plan()
    cap = got[0]
    assert plan["policy"] == recompute["recompute_policy"]
    # The partitioner honoured the tags: what the forward saves is the plan's `saved`.
    assert cap.forward_saves() == set(plan["saved"]), (cap.forward_saves(), plan["saved"])
    return Trained(plan, cap, out.detach(), xc.grad, compiled)


def train_eager(model: nn.Module, x: torch.Tensor, grad: torch.Tensor):
    xe = x.detach().clone().requires_grad_(True)
    out = model(xe)
    out.backward(grad)
    return out.detach(), xe.grad


def assert_matches_eager(assert_close_rel, trained: Trained, eager: nn.Module, out, x_grad):
    assert_close_rel(trained.out, out, RTOL)
    assert_close_rel(trained.x_grad, x_grad, RTOL)
    named = dict(trained.compiled.named_parameters())
    for name, p in eager.named_parameters():
        got = named[name].grad
        assert got is not None, name
        assert_close_rel(got, p.grad, RTOL)


def reseed() -> int:
    """A seed drawn from the (per-test, replayable) global RNG."""
    return int(torch.randint(0, 2**31 - 1, ()).item())


def source(node: torch.fx.Node) -> torch.fx.Node:
    """The op behind a getitem of a multi-output op."""
    if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
        return node.args[0]
    return node


def is_view(node: torch.fx.Node) -> bool:
    """A view op (its output aliases its first input), ``_unsafe_view`` included."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if target is aten._unsafe_view.default:
        return True
    returns = target._schema.returns
    return (
        bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write
    )


def root(node: torch.fx.Node) -> torch.fx.Node:
    """The node owning ``node``'s storage (views followed to their base)."""
    while is_view(node) and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def hint_bytes(node: torch.fx.Node) -> int:
    val = node.meta["val"]
    numel = math.prod(
        int(d.node.hint) if isinstance(d, torch.SymInt) else int(d) for d in val.shape
    )
    return numel * val.element_size()


def is_random(node: torch.fx.Node) -> bool:
    target = source(node).target
    return isinstance(target, torch._ops.OpOverload) and (
        torch.Tag.nondeterministic_seeded in target.tags
    )


@contextlib.contextmanager
def magi_records():
    """magi's log records (a handler on the logger itself: it may not propagate)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("magi_compiler")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


# --------------------------------------------------------------------------------------------
# Reference: one HEURISTIC training compile per block, its joint graph kept for re-planning
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Reference:
    plan: dict
    cap: Captured
    smallest_peak: int  # the lowest simulated peak any plan reaches
    no_recompute_peak: int


@pytest.fixture(scope="module")
def reference():
    refs: dict[str, Reference] = {}

    def get(kind: str) -> Reference:
        if kind not in refs:
            model = BLOCKS[kind]()
            x, g = torch.randn(B, S, H), torch.randn(B, S, H)
            t = train_compiled(model, x, g, {"recompute_policy": "HEURISTIC"})
            lowest = t.cap.replan(
                recompute_policy=RecomputePolicy.AUTOSEARCH, memory_budget_bytes=1
            )
            assert not lowest["budget_met"]
            refs[kind] = Reference(
                t.plan, t.cap, lowest["predicted_peak_bytes"], t.plan["no_recompute_peak_bytes"]
            )
            torch._dynamo.reset()
        return refs[kind]

    return get


def test_replanning_the_captured_graph_reproduces_the_compiles_plan(reference):
    ref = reference("llama")
    again = ref.cap.replan(recompute_policy=RecomputePolicy.HEURISTIC)
    for key in ("recomputed", "saved", "kept", "saved_bytes", "predicted_peak_bytes", "report"):
        assert again[key] == ref.plan[key], key


# --------------------------------------------------------------------------------------------
# 1. Every policy trains like eager
# --------------------------------------------------------------------------------------------

POLICIES = {
    "heuristic": {"recompute_policy": "HEURISTIC"},
    "handcraft-0": {"recompute_policy": "HANDCRAFT", "memory_budget": 0.0},
    "handcraft-0.5": {"recompute_policy": "HANDCRAFT", "memory_budget": 0.5},
    "autosearch-fits": {"recompute_policy": "AUTOSEARCH"},  # budget: between the peaks
    "autosearch-too-small": {"recompute_policy": "AUTOSEARCH"},  # budget: below the smallest
}


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("kind", list(BLOCKS))
def test_gradients_match_eager(kind, policy, reference, assert_close_rel):
    recompute = dict(POLICIES[policy])
    ref = reference(kind) if policy.startswith("autosearch") else None
    if policy == "autosearch-fits":
        assert ref.smallest_peak < ref.no_recompute_peak, "no room between the peaks to plan in"
        recompute["memory_budget_bytes"] = (ref.smallest_peak + ref.no_recompute_peak) // 2
    elif policy == "autosearch-too-small":
        recompute["memory_budget_bytes"] = ref.smallest_peak // 2

    model = init_weights_(BLOCKS[kind](), std=0.1, seed=reseed())
    eager = copy.deepcopy(model)
    x, grad = torch.randn(B, S, H), torch.randn(B, S, H)
    trained = train_compiled(model, x, grad, recompute)
    out, x_grad = train_eager(eager, x, grad)
    assert_matches_eager(assert_close_rel, trained, eager, out, x_grad)

    # Another batch size through the same (dynamic-batch) graphs.
    model.zero_grad()
    eager.zero_grad()
    x, grad = torch.randn(B + 1, S, H), torch.randn(B + 1, S, H)
    xc = x.clone().requires_grad_(True)
    out_c = model(xc)
    out_c.backward(grad)
    again = Trained(trained.plan, trained.cap, out_c.detach(), xc.grad, model)
    assert_matches_eager(assert_close_rel, again, eager, *train_eager(eager, x, grad))

    plan = trained.plan
    assert plan["saved_bytes"] <= plan["no_recompute_bytes"]
    if policy == "autosearch-fits":
        assert plan["budget_met"], plan["note"]
        assert plan["predicted_peak_bytes"] <= recompute["memory_budget_bytes"]
        assert plan["recomputed"] and plan["recompute_seconds"] > 0  # it had to recompute
    elif policy == "autosearch-too-small":
        assert not plan["budget_met"] and plan["note"]
        assert plan["predicted_peak_bytes"] == ref.smallest_peak  # the smallest is used
    elif policy == "handcraft-0.5":
        assert plan["budget_met"]
        assert plan["saved_bytes"] <= 0.5 * plan["no_recompute_bytes"]
    elif policy == "heuristic":
        assert plan["saved_bytes"] < plan["no_recompute_bytes"]


# --------------------------------------------------------------------------------------------
# 2. HEURISTIC saves the outputs of compute-bound ops, and only those
# --------------------------------------------------------------------------------------------


def test_heuristic_saves_exactly_the_compute_bound_outputs_of_a_llama_block(reference):
    ref = reference("llama")
    plan, cap = ref.plan, ref.cap
    forward = _recompute.forward_nodes(cap.joint.graph)
    mms = [n for n in forward if n.target is aten.mm.default]
    (attention,) = [n for n in forward if n.target in SDPA_OPS]
    assert len(mms) == 7  # q, k, v, o, gate, up, down

    saved = [cap.node(name) for name in plan["saved"]]
    assert all(source(n) in mms or source(n) is attention for n in saved), plan["saved"]
    # Every projection's output is read by the backward (through RoPE, the residual norm, silu
    # and the gating product) except down_proj's, which only feeds the residual add.
    assert {n for n in saved if n in mms} == set(mms[:-1])
    # Attention: its output and log-sum-exp, which the attention backward reads.
    assert sorted(n.args[1] for n in saved if source(n) is attention) == [0, 1]

    recomputed = {cap.node(name) for name in plan["recomputed"]}
    assert not any(n in mms or n is attention for n in recomputed)
    targets = {n.target for n in recomputed}
    assert {aten.silu.default, aten.rsqrt.default, aten.cos.default} <= targets, targets

    assert plan["saved_bytes"] == sum(hint_bytes(n) for n in saved)
    assert plan["saved_bytes"] < plan["no_recompute_bytes"]
    assert plan["budget_met"] and plan["policy"] == "HEURISTIC"


def test_heuristic_on_a_gpt2_block_saves_only_matmul_and_attention_outputs(reference):
    ref = reference("gpt2")
    saved = [ref.cap.node(name) for name in ref.plan["saved"]]
    targets = {source(n).target for n in saved}
    assert targets <= MATMUL_OPS | SDPA_OPS, targets
    assert any(t in SDPA_OPS for t in targets) and any(t in MATMUL_OPS for t in targets)
    recomputed = {ref.cap.node(name).target for name in ref.plan["recomputed"]}
    assert aten.gelu.default in recomputed
    assert ref.plan["saved_bytes"] < ref.plan["no_recompute_bytes"]


# --------------------------------------------------------------------------------------------
# 3. A tiny graph checked by hand
# --------------------------------------------------------------------------------------------

TB, TS, TD, TF = 2, 8, 16, 32  # batch, seq, model dim, hidden dim


class TinyMLP(nn.Module):
    """``tanh(gelu(x @ w1) @ w2)``: the backward reads gelu's input (gelu_backward), gelu's
    output (w2's gradient) and tanh's output (tanh_backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(TD, TF) / TD**0.5)
        self.w2 = nn.Parameter(torch.randn(TF, TD) / TF**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(F.gelu(x @ self.w1) @ self.w2)


def tiny_training(recompute: dict, assert_close_rel) -> Trained:
    model = TinyMLP()
    eager = copy.deepcopy(model)
    x, grad = torch.randn(TB, TS, TD), torch.randn(TB, TS, TD)
    trained = train_compiled(model, x, grad, recompute)
    assert_matches_eager(assert_close_rel, trained, eager, *train_eager(eager, x, grad))
    return trained


def tiny_ops(cap: Captured) -> dict[str, torch.fx.Node]:
    forward = _recompute.forward_nodes(cap.joint.graph)
    mm1, mm2 = [n for n in forward if n.target is aten.mm.default]
    (gelu,) = [n for n in forward if n.target is aten.gelu.default]
    (tanh,) = [n for n in forward if n.target is aten.tanh.default]
    return {"mm1": mm1, "mm2": mm2, "gelu": gelu, "tanh": tanh}


def saved_roots(t: Trained) -> set[torch.fx.Node]:
    return {root(t.cap.node(name)) for name in t.plan["saved"]}


MM1_BYTES, MM2_BYTES = TB * TS * TF * 4, TB * TS * TD * 4  # f32


def test_tiny_heuristic_saves_both_matmuls_and_recomputes_the_pointwise_ops(assert_close_rel):
    t = tiny_training({"recompute_policy": "HEURISTIC"}, assert_close_rel)
    ops = tiny_ops(t.cap)
    assert saved_roots(t) == {ops["mm1"], ops["mm2"]}, t.plan["saved"]
    assert set(t.plan["saved"]) == {ops["mm1"].name, ops["mm2"].name}
    assert {ops["gelu"].name, ops["tanh"].name} <= set(t.plan["recomputed"])
    assert ops["mm1"].name not in t.plan["recomputed"]
    assert ops["mm2"].name not in t.plan["recomputed"]
    assert t.plan["saved_bytes"] == MM1_BYTES + MM2_BYTES
    # Without recomputation: gelu's input and output (each MM1_BYTES) and tanh's output.
    assert t.plan["no_recompute_bytes"] == 2 * MM1_BYTES + MM2_BYTES


def untagged_default_partition_saves(cap: Captured) -> set[torch.fx.Node]:
    """The storages PyTorch's default partitioner saves for this joint graph when nothing is
    tagged, graph inputs (and views of them) left out; as nodes of ``cap.joint``."""
    from torch._functorch import partitioners

    joint = copy.deepcopy(cap.joint)
    for node in joint.graph.nodes:
        node.meta.pop("recompute", None)
    placeholders = [n for n in joint.graph.nodes if n.op == "placeholder"]
    fw, _ = partitioners.default_partition(joint, placeholders, num_fwd_outputs=cap.num_fwd_outputs)
    (out,) = fw.graph.find_nodes(op="output")
    by_name = {n.name: n for n in joint.graph.nodes}
    roots = set()
    for arg in out.args[0][cap.num_fwd_outputs :]:
        if not isinstance(arg, torch.fx.Node) or not isinstance(arg.meta.get("val"), torch.Tensor):
            continue
        r = root(by_name[arg.name])
        if r.op != "placeholder":
            roots.add(cap.node(r.name))
    return roots


@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")  # deepcopy of the joint graph
def test_tiny_handcraft_full_budget_saves_what_the_default_partitioner_saves(assert_close_rel):
    t = tiny_training({"recompute_policy": "HANDCRAFT", "memory_budget": 1.0}, assert_close_rel)
    ops = tiny_ops(t.cap)
    assert saved_roots(t) == {ops["mm1"], ops["gelu"], ops["tanh"]}, t.plan["saved"]
    assert saved_roots(t) == untagged_default_partition_saves(t.cap)
    assert not any(n in t.plan["recomputed"] for n in ("gelu", "tanh", "mm", "mm_1"))
    assert t.plan["saved_bytes"] == t.plan["no_recompute_bytes"] == 2 * MM1_BYTES + MM2_BYTES
    assert t.plan["recompute_seconds"] == 0 and t.plan["budget_met"]


def test_tiny_handcraft_zero_budget_recomputes_everything_from_the_inputs(assert_close_rel):
    t = tiny_training({"recompute_policy": "HANDCRAFT", "memory_budget": 0.0}, assert_close_rel)
    ops = tiny_ops(t.cap)
    assert t.plan["saved"] == [] and t.plan["saved_bytes"] == 0
    assert {n.name for n in ops.values()} <= set(t.plan["recomputed"])
    assert t.plan["budget_met"]
    assert t.plan["recompute_seconds"] > 0


class CastMLP(nn.Module):
    """``gelu(bf16(x @ w1)).float() @ w2``: the backward reads the matmul's output only through
    its bf16 copy, so HEURISTIC should save that copy (half the bytes)."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(TD, TF) / TD**0.5)
        self.w2 = nn.Parameter(torch.randn(TF, TD) / TF**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu((x @ self.w1).to(torch.bfloat16)).float() @ self.w2


# 3-D: the cast reads the mm through aten::_unsafe_view, a view its schema does not declare.
@pytest.mark.parametrize("shape", [(TB * TS, TD), (TB, TS, TD)], ids=["2d", "3d"])
def test_heuristic_saves_the_narrowing_cast_of_a_matmul_output(shape):
    x = torch.randn(*shape)
    t = train_compiled(
        CastMLP(), x, torch.randn(*shape[:-1], TD), {"recompute_policy": "HEURISTIC"}
    )
    saved = [t.cap.node(name) for name in t.plan["saved"]]
    assert [n.meta["val"].dtype for n in saved] == [torch.bfloat16], t.plan["saved"]
    assert [root(n.args[0]).target for n in saved] == [aten.mm.default]
    assert t.plan["saved_bytes"] == math.prod(shape[:-1]) * TF * 2


# --------------------------------------------------------------------------------------------
# 4. Budgets behave monotonically
# --------------------------------------------------------------------------------------------


def test_handcraft_budgets_are_monotonic(reference):
    ref = reference("llama")
    budgets = [0.0, 0.1, 0.25, 0.5, 0.75, 1.0]
    plans = [
        ref.cap.replan(recompute_policy=RecomputePolicy.HANDCRAFT, memory_budget=b) for b in budgets
    ]
    no_recompute = ref.plan["no_recompute_bytes"]
    for b, p in zip(budgets, plans, strict=True):
        assert p["no_recompute_bytes"] == no_recompute
        if p["budget_met"]:
            assert p["saved_bytes"] <= b * no_recompute, (b, p["saved_bytes"])
        else:
            assert p["note"]
    saved = [p["saved_bytes"] for p in plans]
    seconds = [p["recompute_seconds"] for p in plans]
    assert saved == sorted(saved), saved
    assert seconds == sorted(seconds, reverse=True), seconds
    assert saved[-1] == no_recompute and seconds[-1] == 0  # budget 1: no recomputation
    assert saved[0] < saved[-1] and seconds[0] > 0
    assert all(p["budget_met"] for p in plans[1:]), [p["note"] for p in plans]


def test_autosearch_budgets_are_met_and_monotonic(reference):
    ref = reference("llama")
    low, high = ref.smallest_peak, ref.no_recompute_peak
    assert low < high
    budgets = [low // 2, low - 1] + [low + (high - low) * k // 6 for k in range(7)] + [2 * high]
    plans = [
        ref.cap.replan(recompute_policy=RecomputePolicy.AUTOSEARCH, memory_budget_bytes=b)
        for b in budgets
    ]
    for b, p in zip(budgets, plans, strict=True):
        if b >= low:
            assert p["budget_met"], (b, p["note"])
            assert p["predicted_peak_bytes"] <= b, (b, p["predicted_peak_bytes"])
        else:
            assert not p["budget_met"] and p["note"], (b, p["note"])
            assert p["predicted_peak_bytes"] == low  # the smallest plan
    # A larger budget never gets a plan predicted to cost more (AUTOSEARCH minimises the
    # predicted step cost; the peak is only a bound, so it need not grow with the budget).
    costs = [p["step_seconds"] for p in plans]
    assert costs == sorted(costs, reverse=True), list(zip(budgets, costs, strict=True))
    assert costs[-1] < costs[2], list(zip(budgets, costs, strict=True))
    # With room for everything, the plan costs no more than saving everything the backward
    # reads: values that fusion keeps in registers are recomputed rather than written out.
    everything = ref.cap.replan(recompute_policy=RecomputePolicy.HANDCRAFT, memory_budget=1.0)
    assert everything["saved_bytes"] == ref.plan["no_recompute_bytes"]
    assert costs[-1] < everything["step_seconds"]


# --------------------------------------------------------------------------------------------
# 5. Dropout: masks are saved, never re-drawn
# --------------------------------------------------------------------------------------------


class DropoutMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(TD, TF)
        self.drop = nn.Dropout(p=0.5)
        self.fc2 = nn.Linear(TF, TD)
        self.norm = nn.LayerNorm(TD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.fc2(F.gelu(self.drop(self.fc1(x)))))


@pytest.mark.parametrize(
    "recompute",
    [
        {"recompute_policy": "HEURISTIC"},
        {"recompute_policy": "HANDCRAFT", "memory_budget": 0.0},
        {"recompute_policy": "HANDCRAFT", "memory_budget": 0.5},
        {"recompute_policy": "AUTOSEARCH", "memory_budget_bytes": 1},
    ],
    ids=["heuristic", "handcraft-0", "handcraft-0.5", "autosearch-1B"],
)
def test_dropout_masks_are_saved_not_redrawn(recompute, assert_close_rel):
    model = DropoutMLP().train()
    eager = copy.deepcopy(model)
    x, grad = torch.randn(TB, TS, TD), torch.randn(TB, TS, TD)
    t = train_compiled(model, x, grad, recompute)  # compiles
    model.zero_grad()

    seed = reseed()
    torch.manual_seed(seed)
    xc = x.clone().requires_grad_(True)
    out_c = model(xc)
    out_c.backward(grad)
    torch.manual_seed(seed)
    out_e, xe_grad = train_eager(eager, x, grad)
    trained = Trained(t.plan, t.cap, out_c.detach(), xc.grad, model)
    assert_matches_eager(assert_close_rel, trained, eager, out_e, xe_grad)

    cap = t.cap
    forward = _recompute.forward_nodes(cap.joint.graph)
    random_ops = [n for n in forward if n.target is not operator.getitem and is_random(n)]
    assert [n.target for n in random_ops] == [aten.native_dropout.default]
    assert not [n for n in t.plan["recomputed"] if is_random(cap.node(n))], t.plan["recomputed"]
    assert any(source(cap.node(n)) in random_ops for n in t.plan["saved"]), t.plan["saved"]
    # gelu reads the dropout's output: recomputing it needs no new mask
    if recompute["recompute_policy"] == "HEURISTIC":
        assert aten.gelu.default in {cap.node(n).target for n in t.plan["recomputed"]}


# --------------------------------------------------------------------------------------------
# 6. Errors and unmet budgets
# --------------------------------------------------------------------------------------------


def train_tiny_raw(recompute: dict):
    torch._dynamo.reset()
    inspection.clear()
    model = magi_compile(TinyMLP(), config_patch={"recompute_config": recompute})
    model(torch.randn(TB, TS, TD)).sum().backward()


def test_handcraft_budget_outside_unit_interval_is_a_user_error():
    with pytest.raises(UserError) as info:
        train_tiny_raw({"recompute_policy": "HANDCRAFT", "memory_budget": 1.5})
    assert "memory_budget=1.5" in str(info.value) and "outside [0, 1]" in str(info.value)
    assert inspection.last_recompute_plan() is None


def test_autosearch_without_a_byte_budget_is_a_user_error():
    with pytest.raises(UserError, match="memory_budget_bytes"):
        train_tiny_raw({"recompute_policy": "AUTOSEARCH"})
    assert inspection.last_recompute_plan() is None


def test_autosearch_budget_not_met_warns(assert_close_rel):
    with magi_records() as records:
        t = tiny_training(
            {"recompute_policy": "AUTOSEARCH", "memory_budget_bytes": 1}, assert_close_rel
        )
    plan = t.plan
    assert plan["budget_met"] is False and plan["note"]
    assert plan["predicted_peak_bytes"] > 1
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert any("budget not met" in m for m in warnings), [r.getMessage() for r in records]
    assert "budget not met" in plan["report"]


# --------------------------------------------------------------------------------------------
# 7. Dumps
# --------------------------------------------------------------------------------------------


def test_training_dump_writes_the_plan(tmp_path, monkeypatch, assert_close_rel):
    monkeypatch.setenv(_dump.ENABLE_ENV, "1")
    monkeypatch.delenv(_dump.DIR_ENV, raising=False)
    monkeypatch.delenv(_dump.DETAIL_ENV, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    model = TinyMLP()
    eager = copy.deepcopy(model)
    x, grad = torch.randn(TB, TS, TD), torch.randn(TB, TS, TD)
    t = train_compiled(
        model, x, grad, {"recompute_policy": "HEURISTIC"}, cache_root_dir=str(tmp_path)
    )
    assert_matches_eager(assert_close_rel, t, eager, *train_eager(eager, x, grad))
    root_dir = tmp_path / "dumps"
    (name,) = os.listdir(root_dir)
    directory = root_dir / name
    text = (directory / "recompute_plan.txt").read_text(encoding="utf-8")
    assert "recompute plan (HEURISTIC)" in text
    assert text == t.plan["report"]
    figures = json.loads((directory / "recompute_plan.json").read_text(encoding="utf-8"))
    assert figures["saved_bytes"] == inspection.last_recompute_plan()["saved_bytes"]
    assert figures["saved"] == t.plan["saved"] and figures["policy"] == "HEURISTIC"
    page = (directory / "index.html").read_text(encoding="utf-8")
    plans = page[page.index("Recompute and offload plans") :]
    assert "recompute plan (HEURISTIC)" in plans
    assert "not a training compile" not in page


# --------------------------------------------------------------------------------------------
# 8. custom_compute_sensitive_ops
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["aten::gelu", "torch.ops.aten.gelu.default"])
def test_custom_compute_sensitive_op_is_saved_not_recomputed(spelling, assert_close_rel):
    plain = tiny_training({"recompute_policy": "HEURISTIC"}, assert_close_rel)
    gelu = tiny_ops(plain.cap)["gelu"].name
    assert gelu in plain.plan["recomputed"] and gelu not in plain.plan["saved"]

    marked = tiny_training(
        {"recompute_policy": "HEURISTIC", "custom_compute_sensitive_ops": [spelling]},
        assert_close_rel,
    )
    ops = tiny_ops(marked.cap)
    assert ops["gelu"].name not in marked.plan["recomputed"]
    # gelu's output now saved; gelu_backward still reads the first matmul's output, and tanh
    # is still recomputed from the second's.
    assert saved_roots(marked) == {ops["mm1"], ops["gelu"], ops["mm2"]}, marked.plan["saved"]
    assert ops["tanh"].name in marked.plan["recomputed"]
    assert marked.plan["saved_bytes"] == plain.plan["saved_bytes"] + MM1_BYTES


# --------------------------------------------------------------------------------------------
# 9. The compiled graphs' simulated peak (fusion included) is recorded and held to the budget
# --------------------------------------------------------------------------------------------


def test_heuristic_plan_records_the_compiled_graphs_peak(assert_close_rel):
    plan = tiny_training({"recompute_policy": "HEURISTIC"}, assert_close_rel).plan
    forward, backward = plan["compiled_forward_peak_bytes"], plan["compiled_backward_peak_bytes"]
    for key in (
        "compiled_peak_bytes",
        "compiled_forward_peak_bytes",
        "compiled_backward_peak_bytes",
    ):
        assert isinstance(plan[key], int) and plan[key] > 0, (key, plan[key])
    assert plan["compiled_peak_bytes"] == max(forward, backward)
    assert isinstance(plan["compiled_peak_where"], str) and plan["compiled_peak_where"]
    # By hand: the forward's parameters and input are not counted; at the second matmul, the
    # first's output (saved), gelu's output (read by the matmul) and the matmul's own output.
    assert forward == 2 * MM1_BYTES + MM2_BYTES


# Budgets between the lowest peak any plan reaches and the no-recompute plan's peak (as the
# HEURISTIC plan predicts them), as a fraction of the way up.
@pytest.mark.parametrize("fraction", [0.0, 0.5], ids=["lowest", "halfway"])
@pytest.mark.parametrize("kind", list(BLOCKS))
def test_autosearch_holds_the_compiled_peak_to_the_budget(
    kind, fraction, reference, assert_close_rel
):
    heuristic = reference(kind).plan
    low, high = heuristic["lowest_peak_bytes"], heuristic["no_recompute_peak_bytes"]
    assert 0 < low < high, (low, high)
    budget = low + int((high - low) * fraction)

    model = init_weights_(BLOCKS[kind](), std=0.1, seed=reseed())
    eager = copy.deepcopy(model)
    x, grad = torch.randn(B, S, H), torch.randn(B, S, H)
    trained = train_compiled(
        model, x, grad, {"recompute_policy": "AUTOSEARCH", "memory_budget_bytes": budget}
    )
    assert_matches_eager(assert_close_rel, trained, eager, *train_eager(eager, x, grad))
    plan = trained.plan
    seen = (budget, plan["compiled_peak_bytes"], plan["note"])
    assert plan["compiled_peak_bytes"] <= budget, seen
    assert plan["budget_met"], seen
