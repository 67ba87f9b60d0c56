"""Do torch's cuDNN and flash attention backwards take grouped key/value heads?

For each backend: the forward and backward ATen ops called with 16 query and 8 key/value heads
(the layout a Llama training graph traces: [b, s, h, d] projections transposed to
[b, h, s, d]), the gradients compared with float32 autograd of SDPA(enable_gqa=True), and the
grouped backward timed against the repeated one plus the sum over each group (what a training
graph does today). Run it in a process of its own: a fault poisons the CUDA context."""

import sys

import torch

B, S, HQ, HKV, D = 2, 2048, 16, 8, 128
R = HQ // HKV
torch.manual_seed(0)
dev, dt = "cuda", torch.bfloat16


def layout(h: int) -> torch.Tensor:
    return torch.randn(B, S, h, D, device=dev, dtype=dt).transpose(1, 2)


def repeat(x: torch.Tensor) -> torch.Tensor:
    return x[:, :, None].expand(B, HKV, R, S, D).reshape(B, HQ, S, D)


def time_ms(fn, n: int = 30) -> float:
    for _ in range(3):
        fn()
    ev = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(n)
    ]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) for a, b in ev)[n // 2]


q, k, v, go = layout(HQ), layout(HKV), layout(HKV), layout(HQ)
qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
ref = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=True, enable_gqa=True)
ref.backward(go.float())
refs = {"dq": qf.grad, "dk": kf.grad, "dv": vf.grad}


def report(name: str, grads: dict) -> None:
    errs = []
    for key, g in grads.items():
        r = refs[key]
        errs.append(f"{key} {tuple(g.shape)} err {((g.float() - r).norm() / r.norm()).item():.2e}")
    print(f"{name}: " + ", ".join(errs))


def attend(op, grouped: bool):
    """Forward and backward through autograd (which calls the backward ATen op); the
    gradients of q, k, v in their [b, h, s, d] view."""
    leaves = [t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v)]
    qq, kk, vv = (t.transpose(1, 2) for t in leaves)
    if not grouped:
        kk, vv = repeat(kk), repeat(vv)
    op(qq, kk, vv).backward(go)
    return [t.grad.transpose(1, 2) for t in leaves]


def cudnn(qq, kk, vv):
    return torch.ops.aten._scaled_dot_product_cudnn_attention(qq, kk, vv, None, True, 0.0, True)[0]


def flash(qq, kk, vv):
    return torch.ops.aten._scaled_dot_product_flash_attention(qq, kk, vv, 0.0, True)[0]


failed = False
for name, fn in (("cudnn", cudnn), ("flash", flash)):
    try:
        dq, dk, dv = attend(fn, grouped=False)
        report(f"{name} repeated", {"dq": dq, "dk": dk, "dv": dv})
        dq, dk, dv = attend(fn, grouped=True)
        torch.cuda.synchronize()
        report(f"{name} grouped", {"dq": dq, "dk": dk, "dv": dv})
        t_rep = time_ms(lambda fn=fn: attend(fn, grouped=False))
        t_grp = time_ms(lambda fn=fn: attend(fn, grouped=True))
        print(
            f"{name} forward+backward: repeated + copies + sums {t_rep:.3f} ms, grouped {t_grp:.3f} ms"
        )
    except Exception as e:  # noqa: BLE001 - the probe reports whatever fails
        print(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        failed = True
sys.exit(1 if failed else 0)
