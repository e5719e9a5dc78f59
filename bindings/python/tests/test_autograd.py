"""attnscope.torch.scaled_dot_product_attention: gradients against torch autograd."""

import pytest
import torch
import torch.nn.functional as F

from attnscope.torch import scaled_dot_product_attention as sdpa


@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 1, 8, 8), (2, 4, 2, 9, 13, 16, 24), (1, 8, 8, 64, 64, 64, 64),
                                   (2, 2, 1, 33, 17, 32, 32)])
@pytest.mark.parametrize("case", ["plain", "causal", "bool", "float", "scale"])
def test_gradients_match_torch(shape, case):
    b, hq, hkv, l, s, d, dv = shape
    g = torch.Generator().manual_seed(l * 31 + s)
    q, k, v = (torch.randn(b, hq, l, d, generator=g), torch.randn(b, hkv, s, d, generator=g),
               torch.randn(b, hkv, s, dv, generator=g))
    dout = torch.randn(b, hq, l, dv, generator=g)
    kwargs = {"enable_gqa": hq != hkv}
    if case == "causal":
        kwargs["is_causal"] = True
    elif case == "bool":
        kwargs["attn_mask"] = torch.rand(l, s, generator=g) > 0.2
        kwargs["attn_mask"][:, 0] = True  # every row sees a key: torch's NaN rows aside
    elif case == "float":
        kwargs["attn_mask"] = torch.randn(hq, l, s, generator=g)
    elif case == "scale":
        kwargs["scale"] = 0.2

    def grads(fn, dtype):
        xs = [x.detach().clone().to(dtype).requires_grad_() for x in (q, k, v)]
        extra = {k_: (m.to(dtype) if isinstance(m, torch.Tensor) and m.is_floating_point() else m)
                 for k_, m in kwargs.items()}
        out = fn(*xs, **extra)
        (out * dout.to(dtype)).sum().backward()
        return out, [x.grad for x in xs]

    out, got = grads(sdpa, torch.float32)
    want_out, want = grads(F.scaled_dot_product_attention, torch.float64)
    assert torch.allclose(out.double(), want_out, atol=1e-5, rtol=1e-5)
    for name, a, w in zip("qkv", got, want):
        err = ((a.double() - w).abs() / w.abs().clamp(min=1)).max().item()
        assert err <= 1e-4, f"d{name}: {err}"


def test_options_reach_the_backward():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g) for _ in range(3))
    q1, k1, v1 = (x.clone().requires_grad_() for x in (q, k, v))
    sdpa(q1, k1, v1, causal="bottom_right", window=(2, 0), softcap=3.0).sum().backward()
    # The same rule written out in torch: softcap, then the band 0 <= i - j <= 2.
    q2, k2, v2 = (x.double().requires_grad_() for x in (q, k, v))
    s = q2 @ k2.transpose(-1, -2) / 8 ** 0.5
    s = 3.0 * torch.tanh(s / 3.0)
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    s = s.masked_fill(~((j <= i) & (j >= i - 2)), float("-inf"))
    (torch.softmax(s, -1) @ v2).sum().backward()
    for a, b in ((q1, q2), (k1, k2), (v1, v2)):
        assert torch.allclose(a.grad.double(), b.grad, atol=1e-5)


def test_rejects_what_only_sdpa_returns():
    q = torch.randn(1, 1, 2, 4)
    with pytest.raises(ValueError, match="return_lse"):
        sdpa(q, q, q, return_lse=True)
    with pytest.raises(ValueError, match="unknown option"):
        sdpa(q, q, q, windw=(1, 1))


def test_rejects_inputs_it_cannot_read():
    q = torch.randn(1, 1, 2, 4)
    with pytest.raises(ValueError, match="query is a ndarray; the autograd function takes torch tensors"):
        sdpa(q.numpy(), q, q)
    with pytest.raises(ValueError, match="key has dtype torch.float64"):
        sdpa(q, q.double(), q)
    with pytest.raises(ValueError, match="must have one dtype"):
        sdpa(q, q, q.bfloat16())
    with pytest.raises(ValueError, match="differ in their batch dims"):
        sdpa(q, torch.randn(2, 1, 2, 4), q)
    with pytest.raises(ValueError, match="enable_gqa"):
        sdpa(q, torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 4))


@pytest.mark.parametrize("mask_shape", [(5, 7), (2, 1, 5, 7), (3, 5, 7)])
def test_a_learned_float_mask_gets_torchs_gradient(mask_shape):
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g), torch.randn(2, 3, 7, 8, generator=g),
               torch.randn(2, 3, 7, 8, generator=g))
    bias = torch.randn(*mask_shape, generator=g)
    dout = torch.randn(2, 3, 5, 8, generator=g)
    b1 = bias.clone().requires_grad_()
    (sdpa(q, k, v, b1) * dout).sum().backward()
    b2 = bias.double().requires_grad_()
    (F.scaled_dot_product_attention(q.double(), k.double(), v.double(), b2) * dout.double()).sum().backward()
    assert b1.grad.shape == bias.shape
    assert ((b1.grad.double() - b2.grad).abs().max()) <= 1e-5


def test_bfloat16_inputs_get_bfloat16_gradients():
    q = torch.randn(1, 2, 4, 8).bfloat16().requires_grad_()
    sdpa(q, q, q).float().sum().backward()
    assert q.grad.dtype == torch.bfloat16
