"""``scaled_dot_product_attention`` as a ``torch.autograd.Function`` on attnscope's fused
forward and backward kernels: a drop-in for CPU training."""

from __future__ import annotations

import torch as _torch

from . import _native, _prepare

__all__ = ["scaled_dot_product_attention"]


class _Sdpa(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, options, shape):
        q, k, v = (x.contiguous().float() for x in (query, key, value))
        qn, kn, vn = (x.reshape((-1,) + tuple(x.shape[-3:])).numpy() for x in (q, k, v))
        out, lse, _ = _native.sdpa(qn, kn, vn, options)
        ctx.save_for_backward(q, k, v)
        ctx.out, ctx.lse, ctx.options = out, lse, options
        return _torch.from_numpy(out).reshape(shape).to(query.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        flat = lambda x: x.reshape((-1,) + tuple(x.shape[-3:])).numpy()
        dout = grad_out.detach().contiguous().float()
        dq, dk, dv = _native.sdpa_backward(flat(q), flat(k), flat(v), ctx.out, ctx.lse,
                                           flat(dout), ctx.options)
        grads = [_torch.from_numpy(g).reshape(x.shape) for g, x in ((dq, q), (dk, k), (dv, v))]
        return grads[0], grads[1], grads[2], None, None


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, **attnscope):
    """``torch.nn.functional.scaled_dot_product_attention`` on CPU tensors, differentiable in
    query, key and value (a float mask gets no gradient); ``attnscope`` takes ``sdpa``'s own
    options (causal, window, alibi, softcap, key_padding_mask, seed)."""
    for name in ("return_lse", "return_weights"):
        if name in attnscope:
            raise ValueError(f"{name} is for attnscope.sdpa; the autograd function returns the output")
    options = _prepare(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                       attnscope.pop("causal", None), attnscope.pop("window", None),
                       attnscope.pop("alibi", None), attnscope.pop("softcap", None),
                       attnscope.pop("key_padding_mask", None), attnscope.pop("seed", None),
                       None)[3]
    if attnscope:
        raise ValueError(f"unknown option(s): {', '.join(sorted(attnscope))}")
    shape = tuple(query.shape[:-1]) + (value.shape[-1],)
    return _Sdpa.apply(query, key, value, options, shape)
