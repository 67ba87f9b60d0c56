"""Written-out attention in training captures, rewritten before AOTAutograd.

The C++ pass ``recognize_attention`` (docs/passes.md) rewrites attention written out as
matmuls and a softmax in inference graphs only: in a training graph the softmax's output is
saved for the backward, which AOTAutograd has already derived from the written-out chain. This
module rewrites the chain one step earlier, in the graph Dynamo captured, into one
``F.scaled_dot_product_attention`` call, so that AOTAutograd derives the fused backward
(flash or memory-efficient attention's) and neither pass of the step holds the [.., L, S]
scores.

Recognised, from each softmax over the last dim (``F.softmax``, ``torch.softmax``,
``x.softmax``): back to ``q @ k.transpose(-2, -1)`` (or ``torch.matmul``) through constant
positive scales (``*``, ``/``), ``masked_fill(mask, -inf)`` with a boolean mask, one additive
mask in the query's dtype (every scale applied before it) and an upcast to float32; forward to
``@ v`` through a cast back and ``F.dropout`` (its probability becomes ``dropout_p`` while
training, so the dropped entries differ from eager's draw, as with any fused attention). A
``torch.tril(torch.ones(L, L)) == 0`` mask alone becomes ``is_causal``; other boolean masks are
combined and handed over negated (SDPA keeps the true entries). A query row whose keys are all
masked gets NaN in eager and 0 from SDPA; every other row matches within rounding. Anything
else is left as written, with the reason, in :func:`magi_compiler.inspection.attention_patterns`.
"""

from __future__ import annotations

import math
import operator
import re
from typing import Any

import torch
import torch.nn.functional as F

from magi_compiler._logging import logger

patterns: list[dict[str, Any]] = []  # the decisions of this process, oldest first

_MATMUL = (operator.matmul, torch.matmul)
_SOFTMAX = (F.softmax, torch.softmax)
_DROPOUT = (F.dropout, torch.dropout)
_CASTS = ("float", "to", "type", "type_as", "half", "bfloat16")


def _is_method(node: torch.fx.Node, *names: str) -> bool:
    return node.op == "call_method" and node.target in names


def _is_call(node: torch.fx.Node, targets: tuple) -> bool:
    return node.op == "call_function" and node.target in targets


def _value(node: Any) -> Any:
    return node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None


def _where(node: torch.fx.Node) -> str:
    found = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', node.meta.get("stack_trace") or "")
    if not found:
        return node.name
    path, line, fn = found[-1]
    return f"{node.name} ({path.rsplit('/', 1)[-1]}:{line} in {fn})"


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _scale_of(node: torch.fx.Node) -> tuple[float, torch.fx.Node] | None:
    """``x * c``, ``c * x`` or ``x / c`` with a positive constant: (factor, x)."""
    if node.op != "call_function" or len(node.args) != 2 or node.kwargs:
        return None  # torch.div(x, c, rounding_mode=...) is no scale
    a, b = node.args
    if node.target in (operator.mul, torch.mul):
        for c, x in ((b, a), (a, b)):
            if _number(c) is not None and _number(c) > 0 and isinstance(x, torch.fx.Node):
                return _number(c), x
    if node.target in (operator.truediv, torch.div) and isinstance(a, torch.fx.Node):
        if _number(b) is not None and _number(b) > 0:
            return 1.0 / _number(b), a
    return None


def _is_upcast(node: torch.fx.Node) -> bool:
    if _is_method(node, "float"):
        return True
    if _is_method(node, "to", "type"):
        return torch.float32 in node.args[1:] or node.kwargs.get("dtype") is torch.float32
    return False


def _is_causal_mask(cond: Any, length: Any) -> bool:
    """``torch.tril(torch.ones(L, L)) == 0``: the entries above the diagonal."""
    if not (isinstance(cond, torch.fx.Node) and _is_method(cond, "__eq__", "eq")):
        return False
    tril, zero = cond.args
    if _number(zero) != 0 or not isinstance(tril, torch.fx.Node):
        return False
    if not (
        _is_call(tril, (torch.tril,)) and len(tril.args) == 1 and not tril.kwargs.get("diagonal")
    ):
        return False
    ones = tril.args[0]
    if not (isinstance(ones, torch.fx.Node) and _is_call(ones, (torch.ones,))):
        return False
    sizes = (
        ones.args[0]
        if len(ones.args) == 1 and isinstance(ones.args[0], (tuple, list))
        else ones.args
    )
    return len(sizes) == 2 and sizes[0] == sizes[1] == length


def _swaps_last_two(node: Any, rank: int) -> bool:
    """``k.transpose(-2, -1)``, ``torch.transpose(k, -2, -1)``, ``k.mT`` or a permute that
    swaps the last two dims of a tensor of ``rank``."""
    if not isinstance(node, torch.fx.Node):
        return False
    if _is_method(node, "transpose") or _is_call(node, (torch.transpose,)):
        dims = node.args[1:3]
        return len(dims) == 2 and {d % rank for d in dims} == {rank - 2, rank - 1}
    if _is_method(node, "permute") or _is_call(node, (torch.permute,)):
        if "dims" in node.kwargs:
            dims = node.kwargs["dims"]
        else:
            dims = node.args[1:] if len(node.args) > 2 else node.args[1]
        want = list(range(rank - 2)) + [rank - 1, rank - 2]
        return [d % rank for d in dims] == want
    return node.op == "call_function" and node.target is getattr and node.args[1:] == ("mT",)


class _Chain:
    def __init__(self, softmax: torch.fx.Node) -> None:
        self.softmax = softmax
        self.q = self.k = self.v = self.out = None
        self.scale = 1.0
        self.masked: list[torch.fx.Node] = []
        self.bias: torch.fx.Node | None = None
        self.causal = False
        self.dropout = 0.0
        self.nodes: list[torch.fx.Node] = []  # what the call replaces, in graph order reversed


def _match(softmax: torch.fx.Node) -> tuple[_Chain | None, str]:
    """The chain around ``softmax``, or None with the reason it is not one we rewrite."""
    c = _Chain(softmax)
    dim = softmax.kwargs.get("dim", softmax.args[1] if len(softmax.args) > 1 else None)
    x = softmax.args[0]
    value = _value(x)
    if not isinstance(x, torch.fx.Node) or value is None:
        return None, "not a tensor softmax"
    if dim not in (-1, value.dim() - 1):
        return None, "the softmax is not over the last dim"
    steps: list[tuple[str, Any, bool]] = []  # (kind, mask, a scale applies after it)
    scaled = False
    for _ in range(16):
        c.nodes.append(x)
        if len(x.users) != 1:
            return None, "a value between the matmul and the softmax has another reader"
        if _is_call(x, _MATMUL):
            break
        if _is_upcast(x):
            x = x.args[0]
        elif (s := _scale_of(x)) is not None:
            c.scale *= s[0]
            x, scaled = s[1], True
        elif _is_method(x, "masked_fill") or _is_call(x, (torch.masked_fill,)):
            if len(x.args) != 3 or x.kwargs:
                return None, "masked_fill with keyword arguments"
            fill = _number(x.args[2])
            if fill is None or not (math.isinf(fill) and fill < 0):
                return None, "masked_fill with a value other than -inf"
            steps.append(("fill", x.args[1], scaled))
            x = x.args[0]
        elif _is_call(x, (operator.add, torch.add)) or _is_method(x, "add", "__add__"):
            a, b = x.args[0], x.args[1]
            out = _value(x)
            scores_first = (
                _value(a) is not None and out is not None and _value(a).shape == out.shape
            )
            scores, bias = (a, b) if scores_first else (b, a)
            if len(x.args) > 2 or x.kwargs or not isinstance(scores, torch.fx.Node):
                return None, "an addition that is not a mask bias"
            steps.append(("add", bias, scaled))
            x = scores
        else:
            return (
                None,
                f"the softmax reads {getattr(x.target, '__name__', x.target)} of the scores",
            )
    else:
        return None, "no matmul feeds the softmax"
    if not _is_call(x, _MATMUL):
        return None, "no matmul feeds the softmax"
    q, kt = x.args
    qv, ktv = _value(q), _value(kt)
    if qv is None or ktv is None or qv.dim() < 3 or qv.dim() != ktv.dim():
        return None, "the matmul is not one of 3-D or 4-D operands"
    if not _swaps_last_two(kt, qv.dim()):
        return None, "the key side of the matmul is not a transposed key"
    c.q, c.k = q, kt.args[0]
    c.nodes.append(kt)
    scores = _value(x)
    for kind, mask, scaled_after in steps:
        mv = _value(mask)
        if mv is None:
            return None, "a mask that is not a tensor"
        try:
            if torch.broadcast_shapes(mv.shape, scores.shape) != scores.shape:
                return None, "a mask that does not broadcast to the scores"
        except RuntimeError:
            return None, "a mask that does not broadcast to the scores"
        if kind == "fill":
            if mv.dtype != torch.bool:
                return None, "a masked_fill whose mask is not boolean"
            c.masked.append(mask)
        else:
            if c.bias is not None:
                return None, "two additive masks"
            if mv.dtype != qv.dtype:
                return None, "an additive mask in another dtype than the query"
            if scaled_after:
                return None, "a scale applied after the additive mask"
            c.bias = mask
    if len(c.masked) == 1 and c.bias is None and _is_causal_mask(c.masked[0], scores.shape[-1]):
        if scores.shape[-1] == scores.shape[-2]:
            eq = c.masked[0]
            c.nodes += [eq, eq.args[0], eq.args[0].args[0]]  # == 0, tril, ones
            c.masked, c.causal = [], True
    # Forward: a cast back, dropout, then the matmul with the value.
    y = softmax
    forward = [softmax]
    for _ in range(4):
        if len(y.users) != 1:
            return None, "the attention weights have another reader"
        (user,) = y.users
        forward.append(user)
        if _is_method(user, *_CASTS):
            y = user
        elif _is_call(user, _DROPOUT):
            p = user.kwargs.get("p", user.args[1] if len(user.args) > 1 else 0.5)
            # F.dropout(x, p, training=True); torch.dropout(x, p, train) names it train.
            training = user.args[2] if len(user.args) > 2 else True
            training = user.kwargs.get("training", user.kwargs.get("train", training))
            if _number(p) is None or not isinstance(training, bool):
                return None, "dropout whose probability or mode is not a constant"
            c.dropout = _number(p) if training else 0.0
            y = user
        elif _is_call(user, _MATMUL) and len(user.args) == 2 and user.args[0] is y:
            c.v, c.out = user.args[1], user
            break
        else:
            return None, "the attention weights are not read by a matmul alone"
    if c.out is None:
        return None, "the attention weights are not read by a matmul alone"
    c.nodes = forward[::-1] + c.nodes
    vv, ov = _value(c.v), _value(c.out)
    if vv is None or ov is None or vv.dim() != qv.dim() or ov.dtype != qv.dtype:
        return None, "the matmul with the value is not one of the query's rank and dtype"
    if not (qv.dtype == _value(c.k).dtype == vv.dtype and qv.dtype.is_floating_point):
        return None, "query, key and value differ in dtype"
    return c, ""


def _rewrite(graph: torch.fx.Graph, c: _Chain) -> None:
    with graph.inserting_before(c.out):
        attn_mask = None
        if c.masked:
            masked = c.masked[0]
            for m in c.masked[1:]:
                masked = graph.call_function(torch.logical_or, (masked, m))
            if c.bias is None:
                attn_mask = graph.call_function(torch.logical_not, (masked,))
            else:
                attn_mask = graph.call_function(torch.where, (masked, float("-inf"), c.bias))
        elif c.bias is not None:
            attn_mask = c.bias
        call = graph.call_function(
            F.scaled_dot_product_attention,
            (c.q, c.k, c.v),
            {"attn_mask": attn_mask, "dropout_p": c.dropout, "is_causal": c.causal,
             "scale": c.scale},
        )  # fmt: skip
    # The matmul's meta (its example value: the call's shape and dtype, read by a later chain
    # whose query, value or mask this output is).
    call.meta.update(c.out.meta)
    c.out.replace_all_uses_with(call)
    for node in c.nodes:  # later nodes first: each is dead once the ones after it are gone
        if not node.users:
            graph.erase_node(node)


def _fed_by_matmul(node: torch.fx.Node, depth: int = 8) -> bool:
    """Whether a matmul is among the tensors ``node`` is computed from, ``depth`` steps back:
    a softmax that is not attention (over a linear layer's logits) is no decision to report."""
    frontier = [node]
    for _ in range(depth):
        frontier = [a for n in frontier for a in n.args if isinstance(a, torch.fx.Node)]
        if any(_is_call(n, _MATMUL) for n in frontier):
            return True
    return False


def rewrite_attention(gm: torch.fx.GraphModule) -> int:
    """Rewrites each written-out attention of ``gm`` (a Dynamo capture) into one
    ``F.scaled_dot_product_attention`` call; returns how many. Records every decision."""
    # Matched and rewritten one at a time: a chain may read another's output (as its query,
    # value or mask), which the earlier rewrite replaces by its call.
    softmaxes = [n for n in gm.graph.nodes if _is_call(n, _SOFTMAX) or _is_method(n, "softmax")]
    chains = 0
    for node in softmaxes:
        if not _fed_by_matmul(node):
            continue
        try:
            chain, why = _match(node)
        except Exception as e:  # noqa: BLE001 - an unforeseen form: leave it, say why
            chain, why = None, f"not matched ({type(e).__name__}: {e})"
        if chain is None and why in ("not a tensor softmax",):
            continue
        at = _where(node)
        if chain is None:
            logger.info("recognize_attention (training capture): %s: left as written: %s", at, why)
            patterns.append({"where": at, "rewritten": False, "detail": why, "graph": "training"})
            continue
        _rewrite(gm.graph, chain)
        chains += 1
        detail = (
            f"F.scaled_dot_product_attention ({'causal, ' if chain.causal else ''}"
            f"{'boolean mask, ' if chain.masked else ''}"
            f"{'additive mask, ' if chain.bias is not None else ''}"
            f"{f'dropout {chain.dropout}, ' if chain.dropout else ''}scale {chain.scale:g})"
        )
        logger.info("recognize_attention (training capture): %s: rewritten as %s", at, detail)
        patterns.append({"where": at, "rewritten": True, "detail": detail, "graph": "training"})
    if chains:
        gm.recompile()
    return chains
