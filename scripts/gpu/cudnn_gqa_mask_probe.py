"""Does cuDNN attention (torch's _scaled_dot_product_cudnn_attention) take grouped key/value
heads together with an attention mask? One call per case, each in this process until one
fails; run it in a process of its own (a fault poisons the CUDA context)."""

import sys

import torch

cases = {
    "grouped, no mask": (None, 8),
    "same heads, mask": ("mask", 32),
    "grouped, mask": ("mask", 8),
}
for name, (mask_kind, kv_heads) in cases.items():
    q = torch.randn(1, 32, 1, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, kv_heads, 256, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    mask = None
    if mask_kind:
        mask = torch.zeros(1, 1, 1, 256, device="cuda", dtype=torch.bfloat16)
        mask[..., 100:] = -1e4
    try:
        out = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, mask, False, 0.0, False, False
        )[0]
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.float(),
            k.float(),
            v.float(),
            attn_mask=None if mask is None else mask.float(),
            enable_gqa=True,
        )
        torch.cuda.synchronize()
        print(f"{name}: ok, max error {(out.float() - ref).abs().max().item():.3e}")
    except Exception as e:  # noqa: BLE001 - the probe reports whatever fails
        print(f"{name}: {type(e).__name__}: {str(e).splitlines()[0]}")
        sys.exit(1)
