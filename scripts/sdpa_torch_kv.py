"""PyTorch CPU attention timings for a few query rows against many keys (decoding steps), or
under a mask, to compare with `attnscope bench sdpa --seq L --seq-kv S --kv-heads G --mask M`
in the same run: what ../shared/bench/sdpa_torch.py measures, with the key length, the
key/value heads and the mask apart.

usage: python sdpa_torch_kv.py --seq 1 --seq-kv 4096 --heads 8 [--kv-heads 8] --head-dim 64
       [--dtype f32|bf16] [--threads 2] [--reps 300] [--mask none|float|bool|padding] [--backward]
--mask as attnscope bench sdpa makes it: float, an additive [L, S] mask of normal values
times 0.5; bool, an [L, S] mask with each key visible with probability 0.9; padding, the last
tenth of each sequence's keys hidden (a boolean [B, 1, 1, S] mask here: SDPA has no key
padding of its own).
--backward times forward + backward (gradients of q, k, v; not of the mask), as
../shared/bench/sdpa_torch.py does.
Prints one JSON line: {"impl": ..., "ms": median, "gflops": ...}; FLOPs = 4*B*H*L*S*d, times 3.5
with --backward.
Needs: pip install torch
"""
import argparse, json, time
import torch
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--seq", type=int, default=1)
p.add_argument("--seq-kv", type=int, default=4096)
p.add_argument("--heads", type=int, default=8)
p.add_argument("--kv-heads", type=int)
p.add_argument("--head-dim", type=int, default=64)
p.add_argument("--batch", type=int, default=1)
p.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
p.add_argument("--threads", type=int, default=2)
p.add_argument("--reps", type=int, default=300)
p.add_argument("--mask", default="none", choices=["none", "float", "bool", "padding"])
p.add_argument("--backward", action="store_true")
a = p.parse_args()
kv_heads = a.kv_heads or a.heads
torch.set_num_threads(a.threads)
dt = torch.float32 if a.dtype == "f32" else torch.bfloat16
g = torch.Generator().manual_seed(0)
q = torch.randn(a.batch, a.heads, a.seq, a.head_dim, generator=g).to(dt)
k, v = (torch.randn(a.batch, kv_heads, a.seq_kv, a.head_dim, generator=g).to(dt) for _ in range(2))
mask = None
if a.mask == "float":
    mask = (0.5 * torch.randn(a.seq, a.seq_kv, generator=g)).to(dt)
elif a.mask == "bool":
    mask = torch.rand(a.seq, a.seq_kv, generator=g) < 0.9
elif a.mask == "padding":
    mask = torch.ones(a.batch, 1, 1, a.seq_kv, dtype=torch.bool)
    mask[..., a.seq_kv - a.seq_kv // 10:] = False


def forward():
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=kv_heads != a.heads)


step = forward
if a.backward:
    for x in (q, k, v):
        x.requires_grad_()
    dout = torch.randn(a.batch, a.heads, a.seq, a.head_dim, generator=g).to(dt)
    step = lambda: forward().backward(dout)
with torch.set_grad_enabled(a.backward):
    step()
    ts = []
    for _ in range(a.reps):
        t = time.perf_counter(); step(); ts.append(time.perf_counter() - t)
ts.sort()
med = ts[len(ts) // 2]
flops = 4 * a.batch * a.heads * a.seq * a.seq_kv * a.head_dim * (3.5 if a.backward else 1.0)
print(json.dumps(dict(impl="torch-sdpa", dtype=a.dtype, seq=a.seq, seq_kv=a.seq_kv, heads=a.heads, kv_heads=kv_heads,
                      head_dim=a.head_dim, mask=a.mask, backward=a.backward, threads=a.threads, ms=med * 1e3, gflops=flops / med / 1e9)))
