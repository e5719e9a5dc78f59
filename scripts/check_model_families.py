"""attnscope against Hugging Face transformers on one small random checkpoint of each family it
loads: BERT, RoBERTa, XLM-RoBERTa, CamemBERT, DistilBERT (learned and sinusoidal positions).
For each, `attnscope attention --json` on three texts (one holding RoBERTa's pad token "<pad>")
and a pair, against transformers' attentions; `attnscope embed --json` on the three texts as one
padded batch, against the mean of transformers' last hidden state; and RoBERTa at its longest
text (max_position_embeddings - pad_token_id - 1 tokens) with --truncate.

usage: python scripts/check_model_families.py ATTNSCOPE_BINARY [WORK_DIR]
Needs: pip install torch transformers tokenizers numpy, and the default model in attnscope's
cache (any attnscope command fetches it): the BERT-vocabulary families take its tokenizer.json;
the RoBERTa ones get a byte-level BPE trained here. Prints one line per comparison and the worst
difference; exits 1 when it passes 1e-5.
"""
import json, os, subprocess, sys

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (AutoModel, BertConfig, CamembertConfig, DistilBertConfig, RobertaConfig,
                          XLMRobertaConfig)

ATTN = sys.argv[1]
WORK = sys.argv[2] if len(sys.argv) > 2 else "/tmp/attnscope-families"
CACHE = os.environ.get("ATTNSCOPE_CACHE") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "attnscope")
MINILM = os.path.join(CACHE, "all-MiniLM-L6-v2")
TEXTS = ["The cat sat on the mat.", "Where is the Eiffel Tower? It is in Paris, France.", "a <pad> b c"]
PAIR = ("The cat sat", "on the mat")
ROBERTAS = {"roberta": RobertaConfig, "xlm-roberta": XLMRobertaConfig, "camembert": CamembertConfig}
torch.manual_seed(0)


def bpe_tokenizer():
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["The cat sat on the mat. Where is the Eiffel Tower? Paris France"] * 10, trainer)
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return tok


def plain(tok):
    tok.no_padding()
    tok.no_truncation()
    return tok


def make(name, d):
    """A random checkpoint of family `name` in `d`: 2 layers, 4 heads, 32 wide."""
    os.makedirs(d, exist_ok=True)
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
    if name in ROBERTAS:
        tok = bpe_tokenizer()
        cfg = ROBERTAS[name](vocab_size=tok.get_vocab_size(), max_position_embeddings=40, type_vocab_size=1,
                             layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2, **common)
        tok.save(f"{d}/tokenizer.json")
    else:
        if name.startswith("distilbert"):
            cfg = DistilBertConfig(vocab_size=30522, dim=32, n_layers=2, n_heads=4, hidden_dim=48,
                                   max_position_embeddings=64, sinusoidal_pos_embds=name.endswith("sinusoidal"))
            assert cfg.sinusoidal_pos_embds == name.endswith("sinusoidal")
        else:
            cfg = BertConfig(vocab_size=30522, max_position_embeddings=64, **common)
        with open(f"{MINILM}/tokenizer.json", "rb") as src, open(f"{d}/tokenizer.json", "wb") as dst:
            dst.write(src.read())
    model = AutoModel.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():  # larger than the initialisation's weights, so that every layer matters
        for n, p in model.named_parameters():
            if "position_embeddings" not in n or not getattr(cfg, "sinusoidal_pos_embds", False):
                p.add_(torch.randn_like(p) * 0.2)
    if getattr(cfg, "sinusoidal_pos_embds", False):  # the table is sin/cos: row 0 is 0, 1, 0, 1, ...
        row0 = model.embeddings.position_embeddings.weight[0, :4].tolist()
        assert row0 == [0.0, 1.0, 0.0, 1.0], row0
    model.save_pretrained(d, safe_serialization=True)
    return model, plain(Tokenizer.from_file(f"{d}/tokenizer.json"))


def attnscope(*args):
    r = subprocess.run([ATTN, *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"attnscope {' '.join(args)}: {r.stderr}")
    return json.loads(r.stdout)


def attentions(model, ids, **kw):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True, **kw)
    return torch.stack(out.attentions)[:, 0].numpy()


worst = 0.0


def report(what, got, want):
    global worst
    err = float(np.abs(np.asarray(got, dtype=np.float64) - want).max())
    worst = max(worst, err)
    print(f"{what}: max |difference| {err:.1e}")


for name in ["bert", *ROBERTAS, "distilbert", "distilbert-sinusoidal"]:
    d = os.path.join(WORK, name)
    model, tok = make(name, d)
    for text, pair in [(t, None) for t in TEXTS] + [PAIR]:
        enc = tok.encode(text, pair) if pair else tok.encode(text)
        kw = {"token_type_ids": torch.tensor([enc.type_ids])} if name == "bert" else {}
        got = attnscope("attention", text, "--model", d, "--json", *(["--pair", pair] if pair else []))
        assert got["tokens"] == enc.tokens, (name, got["tokens"], enc.tokens)
        report(f"{name:22} attention, {len(enc.ids):2} tokens{' (pair)' if pair else ''}", got["attentions"],
               attentions(model, enc.ids, **kw))
    got = attnscope("embed", *TEXTS, "--model", d, "--json")["embeddings"]
    for i, text in enumerate(TEXTS):
        with torch.no_grad():
            want = model(input_ids=torch.tensor([tok.encode(text).ids])).last_hidden_state[0].mean(0).numpy()
        report(f"{name:22} embed, text {i + 1} of a padded batch of {len(TEXTS)}", got[i], want)

d = os.path.join(WORK, "roberta")
model, tok = AutoModel.from_pretrained(d, attn_implementation="eager").eval(), plain(Tokenizer.from_file(f"{d}/tokenizer.json"))
long = " ".join(["cat"] * 100)
got = attnscope("attention", long, "--model", d, "--json", "--truncate")
n = len(got["tokens"])
assert n == 40 - 1 - 1, n
tok.enable_truncation(n)
report(f"{'roberta':22} attention, --truncate to {n} tokens", got["attentions"], attentions(model, tok.encode(long).ids))
print(f"worst {worst:.1e}")
sys.exit(0 if worst <= 1e-5 else 1)
