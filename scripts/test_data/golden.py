"""Reference vectors for the attention kernels and models.

Made with PyTorch (CPU, float64 math where weights are computed by hand) and
Hugging Face transformers. Every case is one .safetensors file: input tensors,
expected outputs, and its parameters as string metadata (`__metadata__`).

Conventions fixed by these files (the library must follow them):
  * masks: boolean True = may attend; float masks are added to the scaled scores.
  * causal "top_left": query i sees keys j <= i  (PyTorch is_causal).
    causal "bottom_right": query i sees keys j <= i + (S - L) (FlashAttention,
    KV-cache decoding).
  * a query row with no visible key yields output 0, weights 0, lse -inf.
  * lse[b,h,i] = log(sum_j exp(score_ij)) over visible keys (natural log).
  * sliding window (left, right): query i (after causal alignment offset
    o = S - L for bottom_right, 0 otherwise) sees j with i+o-left <= j <= i+o+right.
  * alibi: score_ij += -slope_h * |i + o - j|  (o as above).
  * softcap c > 0: score = c * tanh(score / c), applied after scaling, before masks.
"""
import json, math, os, sys
import numpy as np
import torch
from safetensors.torch import save_file

torch.set_default_dtype(torch.float64)


def reference(q, k, v, *, scale=None, mask=None, causal=None, window=None,
              alibi=None, softcap=None, key_padding=None, gqa=False):
    """Plain float64 attention with every option; returns out, weights, lse."""
    B, H, L, d = q.shape
    Hk, S = k.shape[1], k.shape[2]
    if gqa and Hk != H:
        rep = H // Hk
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    off = (S - L) if causal == "bottom_right" else 0
    i = torch.arange(L).view(L, 1) + off
    j = torch.arange(S).view(1, S)
    allowed = torch.ones(B, H, L, S, dtype=torch.bool)
    if causal:
        allowed &= (j <= i)
    if window is not None:
        left, right = window
        allowed &= (j >= i - left) & (j <= i + right)
    if alibi is not None:
        s = s - torch.tensor(alibi).view(1, H, 1, 1) * (i - j).abs()
    if mask is not None:
        if mask.dtype == torch.bool:
            allowed &= mask.expand(B, H, L, S)
        else:
            s = s + mask
    if key_padding is not None:
        allowed &= key_padding.view(B, 1, 1, S)
    s = s.masked_fill(~allowed, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    z = e.sum(-1, keepdim=True)
    w = torch.where(z > 0, e / z, torch.zeros_like(e))
    lse = torch.where(z[..., 0] > 0, (m + torch.log(z))[..., 0], torch.full_like(z[..., 0], float("-inf")))
    return w @ v, w, lse


def f32(t):
    return t.to(torch.float32).contiguous()


def save(path, tensors, meta):
    save_file({k: (v.contiguous() if v.dtype == torch.bool else f32(v)) for k, v in tensors.items()},
              path, metadata={k: json.dumps(v) for k, v in meta.items()})


def sdpa_cases(out_dir, seed, extra):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)
    cases = []
    # The seed's 3-word example with its 4-d embeddings.
    X = torch.tensor([[0.2, 0.1, 0.5, 0.3], [0.5, 0.8, 0.2, 0.1], [0.1, 0.3, 0.9, 0.4]])
    Wq, Wk, Wv = r(4, 4), r(4, 4), r(4, 4)
    cases.append(("the_cat_sat", dict(q=(X @ Wq)[None, None], k=(X @ Wk)[None, None], v=(X @ Wv)[None, None]), {}))
    shapes = [(2, 4, 7, 7, 16, 16), (2, 3, 5, 9, 8, 12), (1, 2, 33, 65, 64, 64), (1, 2, 128, 128, 64, 64),
              (1, 1, 200, 200, 128, 128)] + extra
    for (B, H, L, S, d, dv) in shapes:
        base = dict(q=r(B, H, L, d), k=r(B, H, S, d), v=r(B, H, S, dv))
        tag = f"b{B}h{H}l{L}s{S}d{d}v{dv}"
        cases.append((f"plain_{tag}", base, {}))
        cases.append((f"scale_{tag}", base, dict(scale=0.3)))
        cases.append((f"causal_tl_{tag}", base, dict(causal="top_left")))
        cases.append((f"causal_br_{tag}", base, dict(causal="bottom_right")))
        bm = torch.rand(B, 1, L, S, generator=g) > 0.3
        cases.append((f"boolmask_{tag}", dict(base, mask=bm), {}))
        fm = r(B, H, L, S) * 2.0
        cases.append((f"floatmask_{tag}", dict(base, mask=fm), {}))
        kp = torch.ones(B, S, dtype=torch.bool)
        for b in range(B):
            kp[b, S - 1 - b * (S // 3):] = False
        kp[:, 0] = True
        cases.append((f"keypad_{tag}", dict(base, key_padding=kp), {}))
        cases.append((f"window_{tag}", base, dict(causal="bottom_right", window=[3, 0])))
        cases.append((f"window2_{tag}", base, dict(window=[2, 1])))
        cases.append((f"alibi_{tag}", base, dict(causal="top_left", alibi=[2.0 ** (-8 * (h + 1) / H) for h in range(H)])))
        cases.append((f"softcap_{tag}", dict(base, q=base["q"] * 6), dict(softcap=5.0)))
        big = dict(base, q=base["q"] * 300)  # logits ~1e4: must stay finite
        # f32 rounding of scores near 1e4 alone moves weights by ~1e-4 (PyTorch's own f32 result too)
        cases.append((f"hugelogits_{tag}", big, dict(tolerance=1e-3)))
    # Fully masked rows.
    q, k, v = r(1, 2, 4, 8), r(1, 2, 5, 8), r(1, 2, 5, 8)
    m = torch.ones(1, 1, 4, 5, dtype=torch.bool); m[..., 1, :] = False; m[..., 3, :] = False
    cases.append(("fully_masked_rows", dict(q=q, k=k, v=v, mask=m), {}))
    # Grouped-query attention: 8 query heads over 2 key/value heads.
    cases.append(("gqa_h8_kv2", dict(q=r(2, 8, 16, 32), k=r(2, 2, 24, 32), v=r(2, 2, 24, 32)), dict(gqa=True, causal="bottom_right")))
    cases.append(("mqa_h4_kv1", dict(q=r(1, 4, 10, 16), k=r(1, 1, 10, 16), v=r(1, 1, 10, 16)), dict(gqa=True)))
    # Single query row against a long cache (decoding).
    cases.append(("decode_l1_s300", dict(q=r(1, 4, 1, 64), k=r(1, 4, 300, 64), v=r(1, 4, 300, 64)), dict(causal="bottom_right")))
    os.makedirs(out_dir, exist_ok=True)
    for name, t, opt in cases:
        t = {key: (x.float().double() if x.is_floating_point() else x) for key, x in t.items()}  # exact f32 inputs
        kw = {key: x for key, x in opt.items() if key != "tolerance"}
        out, w, lse = reference(t["q"], t["k"], t["v"], mask=t.get("mask"), key_padding=t.get("key_padding"), **kw)
        tensors = dict(t, expected_out=out, expected_weights=w, expected_lse=lse.nan_to_num(neginf=-3.0e38))
        save(os.path.join(out_dir, f"{name}.safetensors"), tensors, dict(opt, case=name,
             note="expected_lse uses -3.0e38 for rows with no visible key (true value -inf)"))
    return len(cases)


def mha_cases(out_dir, seed):
    g = torch.manual_seed(seed)
    n = 0
    os.makedirs(out_dir, exist_ok=True)
    specs = [dict(E=16, H=4, kdim=None, vdim=None, bias=True, L=5, S=5, self_attn=True),
             dict(E=32, H=8, kdim=None, vdim=None, bias=False, L=7, S=11, self_attn=False),
             dict(E=24, H=3, kdim=10, vdim=14, bias=True, L=6, S=9, self_attn=False),
             dict(E=64, H=8, kdim=None, vdim=None, bias=True, L=20, S=20, self_attn=True)]
    for si, sp in enumerate(specs):
        mha = torch.nn.MultiheadAttention(sp["E"], sp["H"], bias=sp["bias"], kdim=sp["kdim"], vdim=sp["vdim"],
                                          batch_first=True).double().eval()
        B = 2
        x = torch.randn(B, sp["L"], sp["E"]).float().double()
        key = x if sp["self_attn"] else torch.randn(B, sp["S"], sp["kdim"] or sp["E"]).float().double()
        val = x if sp["self_attn"] else torch.randn(B, sp["S"], sp["vdim"] or sp["E"]).float().double()
        kpm = torch.zeros(B, sp["S"], dtype=torch.bool); kpm[1, -2:] = True  # PyTorch: True = ignore
        causal = torch.triu(torch.ones(sp["L"], sp["S"], dtype=torch.bool), 1)  # PyTorch: True = masked
        for variant in ["plain", "keypad", "causal_avg", "causal_per_head"]:
            kwargs = {}
            if variant == "keypad":
                kwargs["key_padding_mask"] = kpm
            if variant.startswith("causal"):
                kwargs["attn_mask"] = causal
            avg = variant != "causal_per_head"
            with torch.no_grad():
                out, w = mha(x, key, val, need_weights=True, average_attn_weights=avg, **kwargs)
            t = {f"state.{k}": v for k, v in mha.state_dict().items()}
            t.update(query=x, key=key, value=val, expected_out=out, expected_weights=w)
            if "key_padding_mask" in kwargs:
                t["key_padding_mask_ignore"] = kpm
            if "attn_mask" in kwargs:
                t["attn_mask_ignore"] = causal
            meta = dict(embed_dim=sp["E"], num_heads=sp["H"], kdim=sp["kdim"] or sp["E"], vdim=sp["vdim"] or sp["E"],
                        bias=sp["bias"], average_attn_weights=avg, batch_first=True,
                        note="PyTorch nn.MultiheadAttention semantics: masks named *_ignore are True where attention is NOT allowed")
            save(os.path.join(out_dir, f"mha{si}_{variant}.safetensors"), t, meta)
            n += 1
    return n


def grad_cases(out_dir, seed):
    """Gradients of sum(out * dout) with respect to q, k, v (float64 autograd through `reference`)."""
    os.makedirs(out_dir, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)
    specs = [("plain", (2, 3, 9, 9, 16, 16), {}), ("causal_br", (1, 4, 33, 65, 32, 32), dict(causal="bottom_right")),
             ("causal_tl", (1, 2, 64, 64, 64, 64), dict(causal="top_left")), ("gqa", (1, 4, 17, 17, 16, 16), dict(gqa=True)),
             ("alibi", (1, 2, 20, 20, 8, 8), dict(causal="top_left", alibi=[0.5, 0.25])),
             ("window", (1, 2, 40, 40, 16, 24), dict(window=[5, 2])), ("softcap", (1, 2, 12, 12, 16, 16), dict(softcap=3.0)),
             ("keypad", (2, 2, 10, 12, 8, 8), {})]
    for name, (B, H, L, S, d, dv), opt in specs:
        Hk = 2 if name == "gqa" else H
        f = lambda x: x.float().double().requires_grad_()  # exact f32 inputs
        q, k, v = f(r(B, H, L, d)), f(r(B, Hk, S, d)), f(r(B, Hk, S, dv))
        if name == "softcap":
            q = f(q.detach() * 4)
        kp = None
        if name == "keypad":
            kp = torch.ones(B, S, dtype=torch.bool); kp[1, -4:] = False
        out, w, lse = reference(q, k, v, key_padding=kp, **opt)
        dout = r(*out.shape).float().double()
        dq, dk, dv_ = torch.autograd.grad((out * dout).sum(), (q, k, v))
        t = dict(q=q.detach(), k=k.detach(), v=v.detach(), dout=dout, expected_out=out.detach(),
                 expected_lse=lse.detach(), expected_dq=dq, expected_dk=dk, expected_dv=dv_)
        if kp is not None:
            t["key_padding"] = kp
        save(os.path.join(out_dir, f"grad_{name}.safetensors"), t, dict(opt, case=f"grad_{name}"))
    return len(specs)
