"""Gradients of each model's target with respect to its input embeddings and its attention
weights, by PyTorch autograd through transformers' own models (eager attention, float32):
the reference for attnscope's backward pass and its gradient methods.

  gradients/<name>.safetensors  ids, embeddings (the word embeddings e, [T, hidden]); for each scale s of the word embeddings (inputs_embeds
                                = s · e): value<s> (the target y), d_embeddings<s> (∂y/∂x at
                                x = s · e, [T, hidden]); at scale 1 also attentions and
                                d_attentions ([layers, heads, T, T]); ig<N> and ig_gap<N>:
                                integrated gradients' scores s_j = Σ_d e_jd ∫ ∂y/∂x_jd with
                                N Gauss–Legendre points on [0, 1] (Captum's default), and
                                |Σ_j s_j − (y(e) − y(0))|. The target and text are in the
                                metadata.

Targets: a classifier's predicted label's logit; a causal LM's most likely next token's logit
at the last position; all-MiniLM-L6-v2's cosine between the text's mean-pooled embedding and
TARGET_TEXT's.
"""
import json, os

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import AutoModel, AutoModelForSequenceClassification, GPT2LMHeadModel, PreTrainedTokenizerFast

TEXT = "The movie was good but the ending was terrible"
TARGET_TEXT = "A dog lay on the rug"
SCALES = [1.0, 0.5]
STEPS = [8, 50]


def load(kind, model_dir):
    cls = dict(classifier=AutoModelForSequenceClassification, lm=GPT2LMHeadModel, embedding=AutoModel)[kind]
    return cls.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32).eval()


def run(model, kind, x, target):
    """y of inputs_embeds x ([1, T, d]), with the attentions kept for their gradients."""
    out = model(inputs_embeds=x, output_attentions=True)
    if kind == "classifier":
        y = out.logits[0, target]
    elif kind == "lm":
        y = out.logits[0, -1, target]
    else:
        u = out.last_hidden_state[0].mean(0)
        y = torch.nn.functional.cosine_similarity(u, target, dim=0)
    return y, out.attentions


def write(kind, model_dir, out_path, text=TEXT):
    torch.manual_seed(0)
    model = load(kind, model_dir)
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(model_dir, "tokenizer.json"))
    ids = torch.tensor([tok(text)["input_ids"]])
    e = model.get_input_embeddings()(ids).detach()
    meta = {"text": text, "kind": kind}
    with torch.no_grad():
        if kind == "classifier":
            target = int(model(input_ids=ids).logits[0].argmax())
            meta["label"] = target
        elif kind == "lm":
            target = int(model(input_ids=ids).logits[0, -1].argmax())
            meta["token"] = target
        else:
            t_ids = torch.tensor([tok(TARGET_TEXT)["input_ids"]])
            target = model(input_ids=t_ids).last_hidden_state[0].mean(0)
            meta["target_text"] = TARGET_TEXT
    tensors = {"ids": ids[0].to(torch.int64), "embeddings": e[0].contiguous()}

    def grad_at(scale, keep_attentions=False):
        x = (scale * e).clone().requires_grad_(True)
        y, attentions = run(model, kind, x, target)
        for a in attentions:
            a.retain_grad()
        y.backward()
        if keep_attentions:
            tensors["attentions"] = torch.stack([a[0] for a in attentions]).detach().contiguous()
            tensors["d_attentions"] = torch.stack([a.grad[0] for a in attentions]).contiguous()
        return float(y.detach()), x.grad[0].detach()

    for s in SCALES:
        y, g = grad_at(s, keep_attentions=(s == 1.0))
        tensors[f"value{s}"] = torch.tensor([y], dtype=torch.float32)
        tensors[f"d_embeddings{s}"] = g.contiguous()
    y1, _ = grad_at(1.0)
    y0, _ = grad_at(0.0)
    for n in STEPS:
        points, weights = np.polynomial.legendre.leggauss(n)
        total = torch.zeros_like(e[0])
        for p, w in zip(points, weights):
            _, g = grad_at(0.5 * (p + 1.0))
            total += 0.5 * w * g
        scores = (e[0] * total).sum(-1)
        tensors[f"ig{n}"] = scores.contiguous()
        tensors[f"ig_gap{n}"] = torch.tensor([abs(float(scores.sum()) - (y1 - y0))], dtype=torch.float32)
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    save_file(tensors, out_path, metadata={k: json.dumps(v) for k, v in meta.items()})


def all_models(minilm_dir, heads_dir, gpt2_dir, out_dir):
    write("embedding", minilm_dir, os.path.join(out_dir, "minilm.safetensors"))
    for name in ["bert-cls", "distilbert-cls", "roberta-cls", "gpt2-cls"]:
        write("classifier", os.path.join(heads_dir, name), os.path.join(out_dir, f"{name}.safetensors"))
    write("lm", gpt2_dir, os.path.join(out_dir, "tiny-gpt2.safetensors"))
