"""``scaled_dot_product_attention`` as a ``torch.autograd.Function`` on attnscope's fused
forward and backward kernels: a drop-in for CPU training."""

from __future__ import annotations

import torch as _torch

from . import _ONE_DTYPE, _check_shapes, _check_tensor, _native, _options

__all__ = ["scaled_dot_product_attention"]


def _flat(x):
    """A contiguous float32 tensor's numpy view, its leading dims folded into one batch."""
    return x.reshape((-1,) + tuple(x.shape[-3:])).numpy()


class _Sdpa(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, mask, options, shape):
        q, k, v = (x.detach().contiguous().float() for x in (query, key, value))
        out, lse, _ = _native.sdpa(_flat(q), _flat(k), _flat(v), options)
        ctx.save_for_backward(q, k, v)
        ctx.out, ctx.lse, ctx.options = out, lse, options
        ctx.mask_dtype = None if mask is None else mask.dtype
        return _torch.from_numpy(out).reshape(shape).to(query.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        dout = grad_out.detach().contiguous().float()
        options = dict(ctx.options, float_mask_grad=ctx.needs_input_grad[3])
        dq, dk, dv, dmask = _native.sdpa_backward(_flat(q), _flat(k), _flat(v), ctx.out, ctx.lse,
                                                  _flat(dout), options)
        grads = [_torch.from_numpy(g).reshape(x.shape).to(t.dtype)
                 for g, x, t in ((dq, q, q), (dk, k, k), (dv, v, v))]
        dm = None if dmask is None else _torch.from_numpy(dmask).to(ctx.mask_dtype)
        return grads[0], grads[1], grads[2], dm, None, None


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, **attnscope):
    """``torch.nn.functional.scaled_dot_product_attention`` on CPU tensors, differentiable in
    query, key, value and a float ``attn_mask`` (a learned bias; up to four dims when it needs
    a gradient); ``attnscope`` takes ``sdpa``'s own options (causal, window, alibi, softcap,
    key_padding_mask, seed)."""
    for name in ("return_lse", "return_weights"):
        if name in attnscope:
            raise ValueError(f"{name} is for attnscope.sdpa; the autograd function returns the output")
    # Checked here, converted once in forward.
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, _torch.Tensor):
            raise ValueError(f"{name} is a {type(x).__name__}; the autograd function takes torch tensors")
        _check_tensor(x, name)
    if not (query.dtype == key.dtype == value.dtype):
        raise ValueError(_ONE_DTYPE)
    _check_shapes(query, key, value)
    options = _options(query, key, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                       attnscope.pop("causal", None), attnscope.pop("window", None),
                       attnscope.pop("alibi", None), attnscope.pop("softcap", None),
                       attnscope.pop("key_padding_mask", None), attnscope.pop("seed", None),
                       None)
    if attnscope:
        raise ValueError(f"unknown option(s): {', '.join(sorted(attnscope))}")
    learned = isinstance(attn_mask, _torch.Tensor) and attn_mask.requires_grad
    if learned:
        if attn_mask.dtype == _torch.bool:
            raise ValueError("a boolean attn_mask has no gradient")
        if options["float_mask"] is None or options["float_mask"].shape != tuple(attn_mask.shape):
            raise ValueError(f"attn_mask {list(attn_mask.shape)} needs a gradient: give it at most "
                             "four dims, broadcast over query's")
    shape = tuple(query.shape[:-1]) + (value.shape[-1],)
    return _Sdpa.apply(query, key, value, attn_mask if learned else None, options, shape)
