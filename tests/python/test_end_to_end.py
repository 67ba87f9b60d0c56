"""``magi_compile`` end to end on CPU: Dynamo → AOTAutograd → C++ import → pipeline → executor.

Every comparison is against eager PyTorch on fresh random inputs. The batch dim is dynamic by
default, so three batch sizes must share one capture.
"""

from __future__ import annotations

import copy

import magi_compiler
import pytest
import torch
from blocks import GPT2Block, LlamaBlock, LlamaStack, init_weights_
from magi_compiler import magi_compile

HIDDEN, SEQ = 128, 16
BATCHES = (2, 3, 5)


def llama(seed: int = 0) -> LlamaBlock:
    return init_weights_(
        LlamaBlock(hidden=HIDDEN, n_heads=4, n_kv_heads=2, intermediate=256), seed=seed
    )


def gpt2(seed: int = 0) -> GPT2Block:
    return init_weights_(GPT2Block(hidden=HIDDEN, n_heads=4), seed=seed)


BLOCKS = {"llama": (LlamaBlock, llama), "gpt2": (GPT2Block, gpt2)}


def check_batches(compiled, eager, assert_close_rel, counters, rtol=1e-5):
    with torch.no_grad():
        for b in BATCHES:
            x = torch.randn(b, SEQ, HIDDEN)
            assert_close_rel(compiled(x), eager(x), rtol)
    c = counters()
    assert c.captures == 1, c
    assert c.compiles == 1, c  # one inference graph


@pytest.mark.parametrize("name", BLOCKS)
def test_instance_form(name, assert_close_rel, counters):
    eager = BLOCKS[name][1]()
    compiled = magi_compile(copy.deepcopy(eager))
    check_batches(compiled, eager, assert_close_rel, counters)


@pytest.mark.parametrize("name", BLOCKS)
def test_class_form(name, assert_close_rel, counters):
    cls, make = BLOCKS[name]

    @magi_compile
    class Compiled(cls):
        pass

    eager = make()
    compiled = Compiled(
        hidden=HIDDEN,
        n_heads=4,
        **({"n_kv_heads": 2, "intermediate": 256} if name == "llama" else {}),
    )
    compiled.load_state_dict(eager.state_dict())
    check_batches(compiled, eager, assert_close_rel, counters)


def test_class_form_instances_share_one_capture(assert_close_rel, counters):
    @magi_compile
    class Compiled(LlamaBlock):
        pass

    kwargs = dict(hidden=HIDDEN, n_heads=4, n_kv_heads=2, intermediate=256)
    layers = [init_weights_(Compiled(**kwargs), seed=s) for s in (1, 2)]
    eagers = [init_weights_(LlamaBlock(**kwargs), seed=s) for s in (1, 2)]
    with torch.no_grad():
        for b in (2, 4):
            x = torch.randn(b, SEQ, HIDDEN)
            for layer, eager in zip(layers, eagers, strict=True):
                assert_close_rel(layer(x), eager(x), 1e-5)
    assert counters().captures == 1, counters()


def test_stack(assert_close_rel, counters):
    eager = init_weights_(
        LlamaStack(2, hidden=HIDDEN, n_heads=4, n_kv_heads=2, intermediate=256), seed=3
    )
    compiled = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        x = torch.randn(3, SEQ, HIDDEN)
        assert_close_rel(compiled(x), eager(x), 1e-5)
    assert counters().captures == 1


def test_function_form(assert_close_rel, counters):
    def f(x, w):
        return torch.nn.functional.silu(x @ w).sum(-1)

    g = magi_compile(f, dynamic_arg_dims={"x": 0})
    w = torch.randn(8, 6)
    for b in BATCHES:
        x = torch.randn(b, 8)
        assert_close_rel(g(x, w), f(x, w), 1e-6)
    assert counters().captures == 1


def test_training_gradients_match_eager(assert_close_rel, counters):
    eager = llama()
    compiled = magi_compile(copy.deepcopy(eager))
    for b in (2, 3):
        x = torch.randn(b, SEQ, HIDDEN)
        x_eager = x.clone().requires_grad_(True)
        x_comp = x.clone().requires_grad_(True)
        grad_out = torch.randn(b, SEQ, HIDDEN)
        eager(x_eager).backward(grad_out)
        out = compiled(x_comp)
        assert out.requires_grad
        out.backward(grad_out)
        assert_close_rel(x_comp.grad, x_eager.grad, 1e-4)
        named = dict(compiled.named_parameters())
        for name, p in eager.named_parameters():
            assert named[name].grad is not None, name
            assert_close_rel(named[name].grad, p.grad, 1e-4)
        eager.zero_grad()
        compiled.zero_grad()
    c = counters()
    assert c.captures == 1, c
    assert c.compiles == 2, c  # forward + backward


def test_first_call_at_batch_one_then_larger_batches_captures_twice(assert_close_rel, counters):
    # Batch 1 is captured with the size fixed; the first larger batch captures dim 0 dynamic,
    # and every later batch (and batch 1 again) reuses one of the two.
    eager = llama()
    compiled = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        for b in (1, 2, 5, 64, 1, 7):
            x = torch.randn(b, SEQ, HIDDEN)
            assert_close_rel(compiled(x), eager(x), 1e-5)
    assert counters().captures == 2


def test_later_size_one_call_gets_its_own_capture(assert_close_rel, counters):
    eager = llama()
    compiled = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        for b in (2, 1, 3):
            x = torch.randn(b, SEQ, HIDDEN)
            assert_close_rel(compiled(x), eager(x), 1e-5)
    assert counters().captures == 2


def test_static_dims_allow_size_one(assert_close_rel, counters):
    eager = gpt2()
    compiled = magi_compile(copy.deepcopy(eager), dynamic_arg_dims={"x": []})
    with torch.no_grad():
        x = torch.randn(1, SEQ, HIDDEN)
        assert_close_rel(compiled(x), eager(x), 1e-5)


def test_compiling_a_number_is_a_type_error():
    with pytest.raises(TypeError):
        magi_compile(42)


def test_compiling_a_class_without_forward_or_call_is_a_type_error():
    class NotCallable:
        def helper(self, x):
            return x

    with pytest.raises(TypeError, match="NotCallable has neither forward nor __call__"):
        magi_compile(NotCallable)


def test_method_name_on_a_function_is_a_value_error():
    def f(x):
        return x + 1

    with pytest.raises(ValueError, match="method_name"):
        magi_compile(f, method_name="x")


def test_unknown_method_name_on_a_module_is_a_value_error():
    with pytest.raises(ValueError, match="no_such_method"):
        magi_compile(gpt2(), method_name="no_such_method")


def test_dynamic_arg_dims_with_unknown_parameter_is_a_value_error():
    def f(x):
        return x + 1

    with pytest.raises(ValueError, match="'y'"):
        magi_compile(f, dynamic_arg_dims={"y": 0})
    with pytest.raises(ValueError, match="'hidden_states'"):
        magi_compile(gpt2(), dynamic_arg_dims={"hidden_states": 0})


def test_dynamic_arg_dims_out_of_range_is_a_value_error(counters):
    compiled = magi_compile(gpt2(), dynamic_arg_dims={"x": 3})
    with pytest.raises(ValueError, match="out of range"):
        compiled(torch.randn(2, SEQ, HIDDEN))


def test_errors_are_reexported():
    assert magi_compiler.errors.UserError is magi_compiler.UserError
    assert issubclass(magi_compiler.UserError, ValueError)
    assert issubclass(magi_compiler.UnsupportedError, NotImplementedError)
    assert issubclass(magi_compiler.InternalError, RuntimeError)
    assert magi_compiler.errors.DeviceError is magi_compiler.DeviceError
    assert issubclass(magi_compiler.DeviceError, RuntimeError)
    assert not issubclass(magi_compiler.DeviceError, magi_compiler.InternalError)


def test_backend_errors_keep_their_magi_type(counters):
    compiled = magi_compile(
        gpt2(), config_patch={"pass_config": {"disabled_passes": ["no_such_pass"]}}
    )
    with pytest.raises(magi_compiler.UserError, match="no_such_pass"):
        with torch.no_grad():
            compiled(torch.randn(2, SEQ, HIDDEN))
