"""attnscope: exact, fast attention on the CPU, and what real models attend to.

``sdpa`` is a drop-in for ``torch.nn.functional.scaled_dot_product_attention`` on CPU that also
takes numpy arrays, with attnscope's options (bottom-right causal masks, windows, ALiBi,
softcapping, key padding, weights on demand). ``Model`` runs a real model and returns its
attention as numpy arrays; in Jupyter the result shows the offline explorer inline.
"""

from __future__ import annotations

import html as _html
import json as _json
import math as _math
import random as _random
import sys as _sys
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as _np

from . import _native

__all__ = ["sdpa", "set_threads", "Model", "Attentions"]


def set_threads(n: int) -> None:
    """Sizes the thread pool every kernel and model runs on (once, before the first call)."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"threads: must be a whole number from 1, not {n!r}")
    _native.set_threads(n)


def _torch():
    """torch, when the program imported it (a torch tensor cannot exist otherwise)."""
    return _sys.modules.get("torch")


def _is_torch(x: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _check_tensor(x: Any, name: str) -> None:
    """Refuses a torch tensor attnscope cannot read: off the CPU, or of another dtype."""
    torch = _torch()
    # `is_cpu` rather than `device.type`, which builds a device object: a call's cost is
    # measured in microseconds.
    if not x.is_cpu:
        raise ValueError(f"{name} is on {x.device}; attnscope runs on the CPU")
    if x.dtype is not torch.float32 and x.dtype is not torch.bfloat16:
        raise ValueError(f"{name} has dtype {x.dtype}; attnscope takes float32 or bfloat16")


def _as_array(x: Any, name: str) -> Tuple[_np.ndarray, bool]:
    """A contiguous float32 array, or the bits of a bfloat16 tensor (uint16), read in place
    where the memory allows; and whether the input was bfloat16."""
    if _is_torch(x):
        _check_tensor(x, name)
        torch = _torch()
        if x.requires_grad:
            x = x.detach()
        if x.dtype is torch.float32:
            a = x.numpy()
            return (a if a.flags.c_contiguous else _np.ascontiguousarray(a)), False
        return x.contiguous().view(torch.int16).numpy().view(_np.uint16), True
    a = _np.asarray(x)
    if a.dtype != _np.float32:
        raise ValueError(f"{name} has dtype {a.dtype}; attnscope takes float32 (or a bfloat16 torch tensor)")
    return (a if a.flags.c_contiguous else _np.ascontiguousarray(a)), False


def _mask_array(mask: Any) -> _np.ndarray:
    if _is_torch(mask):
        mask = mask.detach()
        torch = _torch()
        if mask.dtype == torch.bfloat16:
            mask = mask.float()
        mask = mask.numpy()
    return _np.asarray(mask)


def _to_4d(x: _np.ndarray) -> _np.ndarray:
    return x if x.ndim == 4 else x.reshape((-1,) + x.shape[-3:])


def _options(q, k, attn_mask, dropout_p, is_causal, scale, enable_gqa, causal, window, alibi,
             softcap, key_padding_mask, seed, return_weights):
    if q.shape[-3] != k.shape[-3] and not enable_gqa:
        raise ValueError(
            f"query has {q.shape[-3]} heads and key {k.shape[-3]}: pass enable_gqa=True for "
            "grouped-query attention (as torch does)")
    if (attn_mask is None and not dropout_p and not is_causal and scale is None and causal is None
            and window is None and alibi is None and softcap is None and key_padding_mask is None
            and return_weights is None):
        return dict(_PLAIN)
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"dropout_p={dropout_p}: expected 0 <= p < 1")
    if causal is True:
        causal = "top_left"
    elif causal is False:
        causal = None
    if is_causal:
        if causal not in (None, "top_left"):
            raise ValueError(f"is_causal=True is top-left causal; causal={causal!r} asks for another")
        causal = "top_left"
    batch = _math.prod(q.shape[:-3])
    seq_q, seq_kv = q.shape[-2], k.shape[-2]
    bool_mask = float_mask = None
    if attn_mask is not None:
        m = _mask_array(attn_mask)
        full = q.shape[:-2] + (seq_q, seq_kv)
        if m.ndim > 4 or (q.ndim > 4 and m.ndim > 2):
            # Leading dims beyond attnscope's four: broadcast, then fold them into the batch.
            try:
                m = _np.broadcast_to(m, full)
            except ValueError:
                raise ValueError(
                    f"attn_mask has shape {list(m.shape)}, which does not broadcast to {list(full)}"
                ) from None
            m = m.reshape((batch,) + m.shape[-3:])
        if m.dtype == _np.bool_:
            bool_mask = _np.ascontiguousarray(m)
        elif m.dtype.kind == "f":
            float_mask = _np.ascontiguousarray(m, dtype=_np.float32)
        else:
            raise ValueError(f"attn_mask has dtype {m.dtype}; expected bool (True = may attend) or a float dtype (added to the scores)")
    key_real = None
    if key_padding_mask is not None:
        kp = _mask_array(key_padding_mask)
        if kp.dtype != _np.bool_:
            raise ValueError("key_padding_mask must be boolean: True marks a padding key (as in nn.MultiheadAttention)")
        if kp.ndim != 2:
            raise ValueError(f"key_padding_mask has shape {list(kp.shape)}; expected [batch, seq_kv]")
        key_real = _np.ascontiguousarray(~kp)
    if dropout_p > 0 and seed is None:
        seed = _random.getrandbits(64)
    if seed is not None and not (isinstance(seed, int) and 0 <= seed < 2 ** 64):
        raise ValueError(f"seed={seed!r}: expected a whole number from 0 to 2**64 - 1")
    if window is not None:
        if (len(window) != 2 or
                not all(w is None or (isinstance(w, int) and w >= 0) for w in window)):
            raise ValueError(f"window={window!r}: expected (left, right), each a whole number "
                             "from 0 or None (unbounded)")
        window = (window[0], window[1])
    if alibi is not None:
        alibi = [float(s) for s in _np.asarray(_mask_array(alibi), dtype=_np.float64).reshape(-1)]
    if isinstance(return_weights, (list, tuple, range)):
        return_weights = [int(r) for r in return_weights]
    return {
        "scale": None if scale is None else float(scale),
        "causal": causal,
        "window": window,
        "align": None,
        "alibi": alibi,
        "softcap": None if softcap is None else float(softcap),
        "bool_mask": bool_mask,
        "float_mask": float_mask,
        "key_real": key_real,
        "dropout_p": float(dropout_p),
        "seed": 0 if seed is None else int(seed),
        "weights": return_weights,
        "float_mask_grad": False,
    }


# The options of a call that sets none.
_PLAIN = {"scale": None, "causal": None, "window": None, "align": None, "alibi": None,
          "softcap": None, "bool_mask": None, "float_mask": None, "key_real": None,
          "dropout_p": 0.0, "seed": 0, "weights": None, "float_mask_grad": False}


_ONE_DTYPE = "query, key and value must have one dtype: float32 or bfloat16"


def _check_shapes(q, k, v) -> None:
    """Refuses q, k and v (arrays or tensors) whose shapes cannot be read as
    ``[..., heads, seq, dim]`` with one batch."""
    for name, x in (("query", q), ("key", k), ("value", v)):
        if x.ndim < 3:
            raise ValueError(f"{name} has shape {list(x.shape)}; expected [..., heads, seq, dim]")
    if q.ndim != k.ndim or q.ndim != v.ndim:
        raise ValueError(
            f"query, key and value have {q.ndim}, {k.ndim} and {v.ndim} dims; they need the same")
    if tuple(q.shape[:-3]) != tuple(k.shape[:-3]) or tuple(q.shape[:-3]) != tuple(v.shape[:-3]):
        raise ValueError(
            f"query {list(q.shape)}, key {list(k.shape)} and value {list(v.shape)} differ in their batch dims")


def _prepare(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, causal,
             window, alibi, softcap, key_padding_mask, seed, return_weights):
    q, q16 = _as_array(query, "query")
    k, k16 = _as_array(key, "key")
    v, v16 = _as_array(value, "value")
    if not (q16 == k16 == v16):
        raise ValueError(_ONE_DTYPE)
    _check_shapes(q, k, v)
    options = _options(q, k, attn_mask, dropout_p, is_causal, scale, enable_gqa, causal, window,
                       alibi, softcap, key_padding_mask, seed, return_weights)
    return _to_4d(q), _to_4d(k), _to_4d(v), options, q16


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
         enable_gqa=False, *, causal=None, window=None, alibi=None, softcap=None,
         key_padding_mask=None, seed=None, return_lse=False, return_weights=None):
    """Scaled dot-product attention, exactly as ``torch.nn.functional.scaled_dot_product_attention``
    computes it on the arguments both take, plus attnscope's options.

    query ``[..., heads, seq_q, dim]``, key and value ``[..., kv_heads, seq_kv, dim]``: numpy
    float32 arrays or CPU torch tensors (float32, bfloat16), read without a copy where they are
    contiguous. ``attn_mask``: bool (True = may attend) or float (added to the scores),
    broadcastable to ``[..., heads, seq_q, seq_kv]``. ``is_causal``: top-left causal.

    attnscope's options: ``causal="top_left" | "bottom_right"``, ``window=(left, right)`` (keys
    before and after the diagonal a query sees; None for unbounded), ``alibi`` (a slope per
    head), ``softcap`` (``c·tanh(score/c)``), ``key_padding_mask`` ``[batch, seq_kv]`` (True = a
    padding key, as in ``nn.MultiheadAttention``), ``seed`` (dropout's; attnscope's dropout draws
    its own mask, not torch's), ``return_lse`` (natural-log sum of exp per query row),
    ``return_weights="all" | "head_average" | [rows]`` (recomputed from the log-sum-exp).

    Returns the output, of the kind and dtype given; with ``return_lse`` or ``return_weights``
    a tuple ``(out, lse?, weights?)`` in that order.
    """
    q, k, v, options, bf16 = _prepare(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                      enable_gqa, causal, window, alibi, softcap,
                                      key_padding_mask, seed, return_weights)
    out, lse, weights = _native.sdpa(q, k, v, options)
    shape = tuple(query.shape)
    if len(shape) != 4:
        lead = shape[:-3]
        out = out.reshape(lead + out.shape[1:])
        lse = lse.reshape(lead + lse.shape[1:])
    as_torch = _is_torch(query)
    if as_torch:
        torch = _torch()
        out = torch.from_numpy(out)
        if bf16:
            out = out.to(torch.bfloat16)
    if not return_lse and return_weights is None:
        return out
    result = [out]
    if return_lse:
        result.append(torch.from_numpy(lse) if as_torch else lse)
    if return_weights is not None:
        result.append(torch.from_numpy(weights) if as_torch else weights)
    return tuple(result)


class Attentions:
    """One text's attention: ``tokens`` and ``weights`` (numpy ``[layers, heads, T, T]``).
    In Jupyter it shows the offline explorer (head, model, heatmap and neuron views)."""

    def __init__(self, model: "Model", text: str, pair: Optional[str], tokens, weights):
        self._model = model
        self.text = text
        self.pair = pair
        self.tokens = tokens
        self.weights = weights

    def __repr__(self) -> str:
        layers, heads, t, _ = self.weights.shape
        return f"Attentions({self._model.name}, {t} tokens, {layers} layers × {heads} heads)"

    def html(self) -> str:
        """The explorer as one self-contained HTML document (what ``attnscope html`` writes)."""
        return self._model._native.page(self.text, self.pair)

    def _repr_html_(self) -> str:
        # A document of its own in an iframe: its script, style and policy stay apart from the
        # notebook's, and it needs nothing from the network.
        page = _html.escape(self.html(), quote=True)
        return (f'<iframe srcdoc="{page}" style="width:100%;height:720px;border:0" '
                'sandbox="allow-scripts allow-downloads"></iframe>')


class Model:
    """A model: the default all-MiniLM-L6-v2 (fetched on first use, as the command line does),
    a directory in the Hugging Face layout, or a Hugging Face cache id (``org/name``)."""

    def __init__(self, path_or_id: Optional[str] = None):
        self._native = _native.Model(None if path_or_id is None else str(path_or_id))

    @property
    def name(self) -> str:
        return self._native.name

    @property
    def n_layers(self) -> int:
        return self._native.n_layers

    @property
    def n_heads(self) -> int:
        return self._native.n_heads

    def __repr__(self) -> str:
        return f"Model({self.name!r}: {self.n_layers} layers × {self.n_heads} heads)"

    def tokenize(self, text: str, pair: Optional[str] = None) -> list:
        """The tokens the model reads, special tokens included."""
        return self._native.tokenize(text, pair)

    def attentions(self, text: str, pair: Optional[str] = None) -> Attentions:
        """Every layer's and head's attention weights on ``text`` (and ``pair``)."""
        tokens, weights = self._native.attentions(text, pair)
        return Attentions(self, text, pair, tokens, weights)

    def embed(self, texts: Union[str, Sequence[str]]) -> _np.ndarray:
        """Sentence embeddings ``[N, d]`` (one text gives ``[1, d]``)."""
        if isinstance(texts, str):
            texts = [texts]
        return self._native.embed(list(texts))

    def generate(self, prompt: str, max_new_tokens: int = 20) -> str:
        """The greedy continuation of ``prompt`` (a causal model)."""
        text, _ = self._native.generate(prompt, max_new_tokens)
        return text

    def explain(self, text: str, focus: Optional[str] = None, *, pair: Optional[str] = None,
                layer: Optional[int] = None, head: Optional[int] = None, rollout: bool = False,
                tokens: bool = False, special: bool = False, top: Optional[int] = None) -> dict:
        """What ``attnscope explain --json`` prints: the focus word's attention over the words."""
        return _json.loads(self._native.explain(text, focus, pair, layer, head, rollout, tokens,
                                                special, top))
