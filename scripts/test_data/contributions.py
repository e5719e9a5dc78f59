"""The norm-based (Kobayashi et al. 2020) and ALTI (Ferrando et al. 2022) contributions of
all-MiniLM-L6-v2 and of the random task checkpoints' encoders, written from the formulas with
transformers' own modules and tensors (forward hooks), independently of attnscope's code.

  contributions/<name>.safetensors  for each text n: ids<n>, norm<n> and alti<n> ([layers, T, T],
                                    row i the receiving token, column j the source), with the
                                    texts in the metadata.

For layer l, x_j the value projection's input (BERT: the layer's input; GPT-2: ln_1 of it),
A^h the head's weights, f^h(x_j) = v_j^h · W_O^h (W_O^h the head's rows of the output
projection, its bias no token's share):
  norm[i][j] = ‖Σ_h A^h[i][j] f^h(x_j)‖₂
  T_i(x_j) = L_i(Σ_h A^h[i][j] f^h(x_j) + δ_ij x_i), c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁)
  normalised over j (a row of zeros stays zeros), with L_i the linear part of the attention output's LayerNorm (σ_i of its
  input held fixed) and y_i its output for BERT; for GPT-2 no LayerNorm, x_i the residual
  stream entering the layer and y_i the stream after attention.
"""
import json, os

import torch
from safetensors.torch import save_file
from transformers import AutoModel, PreTrainedTokenizerFast

TEXTS = ["The cat that ate the mouse ran away", "Where is the Eiffel Tower?"]


def blocks(model):
    """Per layer: (value module, output projection weight as [H, dh, d], bias, LayerNorm or None,
    attention module), for BERT/RoBERTa, DistilBERT and GPT-2 base models."""
    cfg = model.config
    d = cfg.hidden_size
    h = getattr(cfg, "num_attention_heads", None) or cfg.n_head
    dh = d // h
    if cfg.model_type in ("bert", "roberta"):
        for layer in model.encoder.layer:
            w = layer.attention.output.dense.weight  # [out, in]
            yield (layer.attention.self.value, w.T.reshape(h, dh, d), layer.attention.output.dense.bias,
                   layer.attention.output.LayerNorm, None)
    elif cfg.model_type == "distilbert":
        for layer in model.transformer.layer:
            w = layer.attention.out_lin.weight
            yield layer.attention.v_lin, w.T.reshape(h, dh, d), layer.attention.out_lin.bias, layer.sa_layer_norm, None
    elif cfg.model_type == "gpt2":
        for block in model.h:
            w = block.attn.c_proj.weight  # Conv1D: [in, out]
            yield block.attn.c_attn, w.reshape(h, dh, d), block.attn.c_proj.bias, None, block.attn
    else:
        raise ValueError(cfg.model_type)


def contributions(model, ids):
    cfg = model.config
    d = cfg.hidden_size
    captured = {}
    hooks = []
    for l, (value, _, _, ln, attn) in enumerate(blocks(model)):
        hooks.append(value.register_forward_hook(lambda m, i, o, l=l: captured.__setitem__(("v", l), o)))
        if ln is not None:
            hooks.append(ln.register_forward_hook(
                lambda m, i, o, l=l: captured.update({("pre", l): i[0], ("y", l): o})))
        else:
            hooks.append(attn.register_forward_hook(lambda m, i, o, l=l: captured.__setitem__(("attn", l), o[0])))
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True, output_hidden_states=True)
    for hk in hooks:
        hk.remove()
    # In float64 from here: the reference's own rounding stays far below the tests' 1e-4.
    norms, altis = [], []
    for l, (_, w_o, b_o, ln, attn) in enumerate(blocks(model)):
        w_o, b_o = w_o.double(), b_o.double()
        heads, dh, _ = w_o.shape
        v = captured[("v", l)][0].double()
        if attn is not None:
            v = v[:, 2 * d:]  # c_attn gives q | k | v
        v = v.reshape(-1, heads, dh)  # [T, H, dh]
        f = torch.einsum("thv,hvd->htd", v, w_o)  # f^h(x_j)
        a = out.attentions[l][0].double()  # [H, T, T]
        s = torch.einsum("hij,hjd->ijd", a, f)  # Σ_h A^h[i][j] f^h(x_j)
        norms.append(s.norm(dim=-1))
        x = out.hidden_states[l][0].double()  # the layer's input, [T, d]
        t = x.shape[0]
        vectors = s + torch.einsum("ij,jd->ijd", torch.eye(t, dtype=torch.float64), x)  # + δ_ij x_i
        if ln is not None:
            gamma, beta = ln.weight.double(), ln.bias.double()
            pre = captured[("pre", l)][0].double()
            sigma = torch.sqrt(pre.var(-1, unbiased=False) + ln.eps)  # [T]
            vectors = (vectors - vectors.mean(-1, keepdim=True)) * gamma / sigma[:, None, None]
            y = captured[("y", l)][0].double()
            # The transformed vectors, the bias's share and β add up to the LayerNorm's output.
            bias_share = (b_o - b_o.mean()) * gamma / sigma[:, None]
            assert torch.allclose(vectors.sum(1) + bias_share + beta, y, atol=1e-4)
        else:
            y = x + captured[("attn", l)][0].double()
            assert torch.allclose(vectors.sum(1) + b_o, y, atol=1e-4)
        c = (y.abs().sum(-1)[:, None] - (y[:, None, :] - vectors).abs().sum(-1)).clamp(min=0)
        # A row where no source comes within ‖y_i‖₁ of y_i (seen in the width-8 checkpoints)
        # stays 0, as attnscope gives it, instead of 0/0.
        total = c.sum(-1, keepdim=True)
        altis.append(torch.where(total > 0, c / total.clamp(min=1e-300), torch.zeros_like(c)))
    return torch.stack(norms), torch.stack(altis)


def write(model_dir, out_path, texts=TEXTS):
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32).eval()
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(model_dir, "tokenizer.json"))
    tensors = {}
    for n, text in enumerate(texts):
        ids = torch.tensor([tok(text)["input_ids"]])
        norm, alti = contributions(model, ids)
        tensors[f"ids{n}"] = ids[0].to(torch.int64)
        tensors[f"norm{n}"] = norm.float().contiguous()
        tensors[f"alti{n}"] = alti.float().contiguous()
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    save_file(tensors, out_path, metadata={"texts": json.dumps(texts)})


def all_models(minilm_dir, heads_dir, out_dir):
    write(minilm_dir, os.path.join(out_dir, "minilm.safetensors"))
    for name in ["bert-cls", "distilbert-cls", "roberta-cls", "gpt2-cls"]:
        write(os.path.join(heads_dir, name), os.path.join(out_dir, f"{name}.safetensors"))
