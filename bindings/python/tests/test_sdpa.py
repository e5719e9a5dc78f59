"""attnscope.sdpa against torch's scaled_dot_product_attention, the reference files, and
explicit torch formulas for the options torch lacks."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnscope
from conftest import DATA, read_safetensors

TOL = 1e-5


def close(a, b, tol=TOL):
    a = torch.as_tensor(np.asarray(a) if not isinstance(a, torch.Tensor) else a).double()
    b = torch.as_tensor(np.asarray(b) if not isinstance(b, torch.Tensor) else b).double()
    assert a.shape == b.shape, (a.shape, b.shape)
    err = ((a - b).abs() / b.abs().clamp(min=1)).max().item() if a.numel() else 0.0
    assert err <= tol, f"max relative error {err} > {tol}"


def qkv(b, hq, hkv, l, s, d, dv, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, hq, l, d, generator=g), torch.randn(b, hkv, s, d, generator=g),
            torch.randn(b, hkv, s, dv, generator=g))


SHAPES = [(1, 1, 1, 1, 1, 8, 8), (2, 4, 4, 7, 9, 16, 16), (2, 4, 2, 13, 5, 32, 24),
          (1, 8, 1, 64, 64, 64, 64), (3, 2, 2, 17, 33, 8, 4), (1, 3, 3, 130, 70, 128, 128)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("case", ["plain", "causal", "bool", "float", "scale", "bool_broadcast"])
def test_matches_torch(shape, case):
    b, hq, hkv, l, s, d, dv = shape
    q, k, v = qkv(*shape, seed=hash((shape, case)) % 1000)
    g = torch.Generator().manual_seed(7)
    kwargs = {"enable_gqa": hq != hkv}
    if case == "causal":
        kwargs["is_causal"] = True
    elif case == "bool":
        kwargs["attn_mask"] = torch.rand(b, hq, l, s, generator=g) > 0.3
    elif case == "bool_broadcast":
        kwargs["attn_mask"] = torch.rand(l, s, generator=g) > 0.5
    elif case == "float":
        kwargs["attn_mask"] = torch.randn(1, hq, l, s, generator=g)
    elif case == "scale":
        kwargs["scale"] = 0.37
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                          **{k_: (m.double() if isinstance(m, torch.Tensor) and m.is_floating_point() else m)
                                             for k_, m in kwargs.items()})
    if case in ("bool", "bool_broadcast"):
        # torch gives NaN where a row sees no key; attnscope gives 0, as its README says.
        want = torch.nan_to_num(want, nan=0.0)
    got = attnscope.sdpa(q, k, v, **kwargs)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    close(got, want)
    # The same on numpy arrays, which come back as numpy arrays.
    np_kwargs = {k_: (m.numpy() if isinstance(m, torch.Tensor) else m) for k_, m in kwargs.items()}
    got_np = attnscope.sdpa(q.numpy(), k.numpy(), v.numpy(), **np_kwargs)
    assert isinstance(got_np, np.ndarray)
    close(got_np, want)


def test_three_and_five_dims():
    q, k, v = qkv(6, 2, 2, 5, 7, 8, 8)
    for shape in [(2, 3), ()]:
        qs, ks, vs = (x.reshape(shape + x.shape[1:]) if shape else x[0] for x in (q, k, v))
        mask = torch.rand(qs.shape[:-1] + (7,)) > 0.2
        want = torch.nan_to_num(F.scaled_dot_product_attention(qs, ks, vs, mask), nan=0.0)
        close(attnscope.sdpa(qs, ks, vs, mask), want)


def test_strided_and_non_contiguous_inputs_are_copied_and_correct():
    q, k, v = qkv(2, 4, 4, 9, 9, 16, 16)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    ks = torch.randn(2, 4, 18, 16)[:, :, ::2]
    assert not qt.is_contiguous() and not ks.is_contiguous()
    close(attnscope.sdpa(qt, ks, v), F.scaled_dot_product_attention(qt, ks, v))
    close(attnscope.sdpa(qt.numpy(), ks.numpy(), v.numpy()), F.scaled_dot_product_attention(qt, ks, v))


def test_bfloat16_in_bfloat16_out():
    q, k, v = (x.bfloat16() for x in qkv(2, 4, 2, 33, 40, 64, 64))
    got = attnscope.sdpa(q, k, v, is_causal=True, enable_gqa=True)
    assert got.dtype == torch.bfloat16
    # The exact answer on the bf16 inputs, rounded once to bf16: within one bf16 step.
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True,
                                          enable_gqa=True)
    close(got.float(), want.float(), tol=2 ** -7)


def explicit(q, k, v, scale=None, bias=None, visible=None, softcap=None):
    """softmax(scale·q·kᵀ, capped, biased, masked)·v in float64: the README's order."""
    q, k, v = q.double(), k.double(), v.double()
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, -1)
    w = torch.softmax(s, -1)
    w = torch.nan_to_num(w, nan=0.0)
    return w @ v, lse, w


def test_bottom_right_causal_window_alibi_softcap_key_padding():
    b, hq, hkv, l, s, d = 2, 4, 2, 6, 11, 16
    q, k, v = qkv(b, hq, hkv, l, s, d, d)
    o = s - l
    i = torch.arange(l)[:, None]
    j = torch.arange(s)[None, :]
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    padding = torch.zeros(b, s, dtype=torch.bool)
    padding[1, -3:] = True  # the second sequence's last 3 keys are padding
    visible = (j <= i + o) & (j >= i + o - 3)
    visible = visible[None, None] & ~padding[:, None, None, :]
    bias = -(slopes[:, None, None] * (i + o - j).abs())[None]
    want, lse, w = explicit(q, k, v, bias=bias, visible=visible, softcap=5.0)
    got, got_lse, got_w = attnscope.sdpa(q, k, v, enable_gqa=True, causal="bottom_right",
                                         window=(3, None), alibi=slopes, softcap=5.0,
                                         key_padding_mask=padding, return_lse=True,
                                         return_weights="all")
    close(got, want)
    close(got_lse, lse)
    close(got_w, w)
    _, rows = attnscope.sdpa(q, k, v, enable_gqa=True, causal="bottom_right", return_weights=[0, 5])
    want_rows = explicit(q, k, v, visible=(j <= i + o)[None, None])[2][:, :, [0, 5]]
    close(rows, want_rows)
    _, avg = attnscope.sdpa(q, k, v, enable_gqa=True, return_weights="head_average")
    close(avg, explicit(q, k, v)[2].mean(1))


@pytest.mark.parametrize("path", sorted((DATA / "sdpa").glob("*.safetensors")),
                         ids=lambda p: p.stem)
def test_reference_files(path):
    t, meta = read_safetensors(path)
    kp = t.get("key_padding")
    got = attnscope.sdpa(
        t["q"], t["k"], t["v"], t.get("mask"), scale=meta.get("scale"),
        enable_gqa=bool(meta.get("gqa")), causal=meta.get("causal"),
        window=meta.get("window"), alibi=meta.get("alibi"), softcap=meta.get("softcap"),
        key_padding_mask=None if kp is None else ~kp, return_lse=True, return_weights="all")
    out, lse, weights = got
    tol = meta.get("tolerance", 1e-5)
    close(out, t["expected_out"], tol)
    close(weights, t["expected_weights"], tol)
    want_lse = np.where(t["expected_lse"] <= -3e38, -np.inf, t["expected_lse"])
    finite = np.isfinite(want_lse)
    assert (np.isfinite(lse) == finite).all()
    close(lse[finite], want_lse[finite], max(tol, 1e-5))


BAD = [
    (lambda q, k, v: attnscope.sdpa(q, k[:, :2], v[:, :2]), "enable_gqa=True"),
    (lambda q, k, v: attnscope.sdpa(q[..., :3], k, v), "expected shape"),
    (lambda q, k, v: attnscope.sdpa(q.double(), k, v), "float32 or bfloat16"),
    (lambda q, k, v: attnscope.sdpa(q, k.bfloat16(), v), "one dtype"),
    (lambda q, k, v: attnscope.sdpa(q[0, 0, 0], k, v), "expected [..., heads, seq, dim]"),
    (lambda q, k, v: attnscope.sdpa(q, k, v, torch.ones(3, 3, dtype=torch.bool)), "mask"),
    (lambda q, k, v: attnscope.sdpa(q, k, v, dropout_p=1.5), "dropout_p"),
    (lambda q, k, v: attnscope.sdpa(q, k, v, causal="diagonal"), "top_left"),
    (lambda q, k, v: attnscope.sdpa(q, k, v, return_weights="some"), "return_weights"),
    (lambda q, k, v: attnscope.sdpa(q, k, v, return_weights=[99]), "99"),
    (lambda q, k, v: attnscope.sdpa(q, k, v, alibi=[1.0]), "alibi"),
    (lambda q, k, v: attnscope.sdpa(q, k, v, softcap=-1.0), "softcap"),
    (lambda q, k, v: attnscope.sdpa(q, k, v, key_padding_mask=torch.ones(2, 3, dtype=torch.bool)), "key_padding"),
    (lambda q, k, v: attnscope.sdpa(q * float("nan"), k, v), "finite"),
    (lambda q, k, v: attnscope.sdpa(q, k, v, is_causal=True, causal="bottom_right"), "is_causal"),
    (lambda q, k, v: attnscope.set_threads(0), "threads"),
    (lambda q, k, v: attnscope.set_threads(-1), "threads"),
    (lambda q, k, v: attnscope.sdpa(q, k, v, window=(-1, 0)), "window=(-1, 0)"),
    (lambda q, k, v: attnscope.sdpa(q, k, v, window=(1, 2, 3)), "window"),
    (lambda q, k, v: attnscope.sdpa(q, k, v, dropout_p=0.1, seed=-5), "seed"),
    (lambda q, k, v: attnscope.sdpa(q, k, v, torch.ones(5, 5, dtype=torch.int64)), "dtype int64"),
    (lambda q, k, v: attnscope.sdpa(q, k, v, torch.ones(2, 1, 2, 5, 5, dtype=torch.bool)), "does not broadcast"),
    (lambda q, k, v: attnscope.sdpa(q, k, v, scale=float("nan")), "scale"),
    (lambda q, k, v: attnscope.sdpa(q[..., :0], k[..., :0], v), "head_dim 0"),
]


@pytest.mark.parametrize("call,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_raises_value_error(call, message):
    q, k, v = qkv(2, 4, 4, 5, 5, 8, 8)
    with pytest.raises(ValueError) as info:
        call(q, k, v)
    assert message.lower() in str(info.value).lower(), str(info.value)


def test_the_gil_is_released_while_the_kernel_runs():
    import threading
    import time
    q = torch.randn(4, 8, 2048, 64)
    start = time.perf_counter()
    attnscope.sdpa(q, q, q)
    call = time.perf_counter() - start
    done = threading.Event()
    worker = threading.Thread(target=lambda: (attnscope.sdpa(q, q, q), done.set()))
    stamps = [time.perf_counter()]
    worker.start()
    while not done.is_set():
        stamps.append(time.perf_counter())
    worker.join()
    gap = max(b - a for a, b in zip(stamps, stamps[1:]))
    # Holding the GIL would stop this thread for the whole call.
    assert gap < 0.5 * call, f"this thread stopped for {gap * 1e3:.1f} ms of a {call * 1e3:.1f} ms call"
