"""Small random checkpoints with task heads, and what transformers makes of them.

  heads/<name>/  one checkpoint per head in the Hugging Face layout: config.json (its
                 `architectures` names the head), model.safetensors (F16, 2 layers, width 8,
                 2 heads), tokenizer.json, tokenizer_config.json (model_max_length 64, the
                 positions the model has, so the question-answering pipeline runs long
                 contexts in windows), and expected.safetensors: for each input, its ids,
                 every layer's attentions and the head's outputs, with the pipeline's answers
                 in the metadata.
  heads/wordpiece/, heads/bpe/, heads/gpt2-bpe/  the tokenizers the checkpoints share
                 (symbolic links): all-MiniLM-L6-v2's WordPiece vocabulary (real ids), a
                 byte-level BPE with RoBERTa's special tokens trained on a few sentences, and
                 tiny-gpt2's.

The references are taken from the checkpoint as written (F16 values widened to f32), so they
are what a reader of the file computes in f32.
"""
import json, os, shutil
import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (AutoConfig, AutoModelForMaskedLM, AutoModelForQuestionAnswering,
                          AutoModelForSequenceClassification, PreTrainedTokenizerFast, pipeline)

torch.set_num_threads(2)

MAX_LEN = 64
LABELS = {0: "negative", 1: "neutral", 2: "positive"}
SENTIMENT = ["The movie was good but the ending was terrible", "I love machine learning"]
PAIR = ("The cat sat on the mat", "A dog lay on the rug")
QUESTIONS = [
    ("Who invented the transformer?",
     "The transformer architecture was invented by Vaswani et al. in 2017 at Google Brain."),
    ("Where is the Eiffel Tower?",
     # Past the model's 64 positions: the pipeline runs it in overlapping windows.
     "The Eiffel Tower is located in Paris, France. It was built for the world fair of 1889 "
     "by the company of Gustave Eiffel, and for forty years it was the tallest structure in "
     "the world. Millions of people visit the tower every year, and from its top one can see "
     "the river, the old city and the hills around Paris on a clear day."),
]
CORPUS = [a for a, _ in QUESTIONS] + [b for _, b in QUESTIONS] + SENTIMENT + list(PAIR) + [
    "The cat that ate the mouse that lived in the barn ran away", "The cat sat", "Hello"]


def meta(d):
    return {k: json.dumps(v) for k, v in d.items()}


def bpe_tokenizer(out_dir):
    """A byte-level BPE with RoBERTa's special tokens and template, trained on CORPUS."""
    os.makedirs(out_dir, exist_ok=True)
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(CORPUS * 3, trainers.BpeTrainer(
        vocab_size=500, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    bpe.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True,
                                                      add_prefix_space=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>",
                                   sep_token="</s>", cls_token="<s>", unk_token="<unk>",
                                   pad_token="<pad>", mask_token="<mask>", model_max_length=MAX_LEN)
    fast.save_pretrained(out_dir)
    return fast


def copied_tokenizer(src_dir, out_dir):
    """The tokenizer.json of `src_dir` with model_max_length MAX_LEN."""
    os.makedirs(out_dir, exist_ok=True)
    shutil.copy(os.path.join(src_dir, "tokenizer.json"), os.path.join(out_dir, "tokenizer.json"))
    cfg = {}
    if os.path.exists(os.path.join(src_dir, "tokenizer_config.json")):
        with open(os.path.join(src_dir, "tokenizer_config.json")) as f:
            cfg = json.load(f)
    cfg["model_max_length"] = MAX_LEN
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return PreTrainedTokenizerFast.from_pretrained(out_dir)


def config(model_type, vocab, seed_arch, **extra):
    small = dict(bert=dict(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16,
                           max_position_embeddings=MAX_LEN),
                 roberta=dict(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16,
                              max_position_embeddings=MAX_LEN + 2, pad_token_id=1, bos_token_id=0, eos_token_id=2),
                 distilbert=dict(dim=8, n_layers=2, n_heads=2, hidden_dim=16, max_position_embeddings=MAX_LEN),
                 gpt2=dict(n_embd=8, n_layer=2, n_head=2, n_positions=MAX_LEN, bos_token_id=0, eos_token_id=0,
                           pad_token_id=0))[model_type]
    return AutoConfig.for_model(model_type, vocab_size=vocab, architectures=[seed_arch],
                                attn_implementation="eager", **small, **extra)


def make(out_dir, tok_dir, model_class, cfg, seed):
    """A random checkpoint of `model_class` saved in F16 beside links to its tokenizer; returns
    it read back from the file, in f32."""
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(seed)
    model = model_class.from_config(cfg).eval()
    with torch.no_grad():  # make the random weights less uniform than the default init
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model.half().save_pretrained(out_dir, safe_serialization=True)
    for name in os.listdir(tok_dir):
        link = os.path.join(out_dir, name)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(os.path.join("..", os.path.basename(tok_dir), name), link)
    # The reference reads the file back, as a user's transformers would.
    return model_class.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager").eval()


def attentions(o):
    return torch.stack(o.attentions)[:, 0].contiguous()


def classifier(out_dir, tok_dir, tok, model_type, seed):
    cfg = config(model_type, len(tok), f"{type_name(model_type)}ForSequenceClassification",
                 num_labels=3, id2label=LABELS, label2id={v: k for k, v in LABELS.items()})
    model = make(out_dir, tok_dir, AutoModelForSequenceClassification, cfg, seed)
    texts = [(t, None) for t in SENTIMENT] + ([PAIR] if model_type in ("bert", "roberta") else [])
    tensors, info = {}, []
    for n, (a, b) in enumerate(texts):
        enc = tok(a, b, return_tensors="pt") if b else tok(a, return_tensors="pt")
        enc = {k: v for k, v in enc.items() if k in tok.model_input_names}
        with torch.no_grad():
            o = model(**enc, output_attentions=True)
        tensors[f"ids{n}"] = enc["input_ids"][0].to(torch.int64)
        tensors[f"logits{n}"] = o.logits[0].contiguous()
        tensors[f"attentions{n}"] = attentions(o)
        scores = torch.softmax(o.logits[0], -1)
        info.append(dict(text=a, pair=b, labels=[LABELS[int(i)] for i in torch.argsort(scores, descending=True)],
                         scores=sorted(scores.tolist(), reverse=True)))
    save_file(tensors, os.path.join(out_dir, "expected.safetensors"), metadata=meta(dict(inputs=info)))


def masked_lm(out_dir, tok_dir, tok, model_type, seed):
    cfg = config(model_type, len(tok), f"{type_name(model_type)}ForMaskedLM")
    model = make(out_dir, tok_dir, AutoModelForMaskedLM, cfg, seed)
    m = tok.mask_token
    texts = [f"The cat {m} on the mat", f"The {m} that ate the mouse {m} away"]
    tensors, info = {}, []
    for n, text in enumerate(texts):
        enc = tok(text, return_tensors="pt")
        enc = {k: v for k, v in enc.items() if k in tok.model_input_names}
        with torch.no_grad():
            o = model(**enc, output_attentions=True)
        at = (enc["input_ids"][0] == tok.mask_token_id).nonzero()[:, 0]
        probs = torch.softmax(o.logits[0, at], -1)
        top = torch.topk(probs, 10, dim=-1)
        tensors[f"ids{n}"] = enc["input_ids"][0].to(torch.int64)
        tensors[f"attentions{n}"] = attentions(o)
        tensors[f"mask_positions{n}"] = at.to(torch.int64)
        tensors[f"top_ids{n}"] = top.indices.to(torch.int64).contiguous()
        tensors[f"top_probs{n}"] = top.values.contiguous()
        tensors[f"top_logits{n}"] = torch.gather(o.logits[0, at], -1, top.indices).contiguous()
        info.append(dict(text=text))
    save_file(tensors, os.path.join(out_dir, "expected.safetensors"), metadata=meta(dict(inputs=info)))


def question_answering(out_dir, tok_dir, tok, model_type, seed):
    cfg = config(model_type, len(tok), f"{type_name(model_type)}ForQuestionAnswering")
    model = make(out_dir, tok_dir, AutoModelForQuestionAnswering, cfg, seed)
    qa = pipeline("question-answering", model=model, tokenizer=tok, device="cpu")
    tensors, info = {}, []
    for n, (question, context) in enumerate(QUESTIONS):
        answer = qa(question=question, context=context)
        stride = min(MAX_LEN // 2, 128)
        enc = tok(question, context, truncation="only_second", max_length=MAX_LEN, stride=stride,
                  return_overflowing_tokens=True, return_tensors="pt", padding=True)
        enc = {k: v for k, v in enc.items() if k in tok.model_input_names}
        with torch.no_grad():
            o = model(**enc, output_attentions=True)
        tensors[f"ids{n}"] = enc["input_ids"].to(torch.int64).contiguous()
        tensors[f"attention_mask{n}"] = enc["attention_mask"].to(torch.int64).contiguous()
        tensors[f"start_logits{n}"] = o.start_logits.contiguous()
        tensors[f"end_logits{n}"] = o.end_logits.contiguous()
        tensors[f"attentions{n}"] = torch.stack(o.attentions)[:, 0].contiguous()  # the first window
        info.append(dict(question=question, context=context, answer=answer, windows=len(enc["input_ids"])))
    save_file(tensors, os.path.join(out_dir, "expected.safetensors"), metadata=meta(dict(inputs=info)))


def type_name(model_type):
    return dict(bert="Bert", roberta="Roberta", distilbert="DistilBert", gpt2="GPT2")[model_type]


def next_token(out_dir, gpt2_dir, texts):
    """The next token's ten most likely ids and probabilities from tiny-gpt2."""
    from transformers import GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained(gpt2_dir, attn_implementation="eager").eval()
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(gpt2_dir, "tokenizer.json"))
    tensors = {}
    for n, text in enumerate(texts):
        ids = torch.tensor([tok(text)["input_ids"]])
        with torch.no_grad():
            logits = model(ids).logits[0, -1]
        top = torch.topk(torch.softmax(logits.float(), -1).float(), 10)
        tensors[f"ids{n}"] = ids[0].to(torch.int64)
        tensors[f"top_ids{n}"] = top.indices.to(torch.int64).contiguous()
        tensors[f"top_probs{n}"] = top.values.contiguous()
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "next_token.safetensors"), metadata=meta(dict(texts=texts)))


def heads(minilm_dir, out_dir, gpt2_dir):
    wp_dir, bpe_dir, gpt2_bpe_dir = (os.path.join(out_dir, d) for d in ["wordpiece", "bpe", "gpt2-bpe"])
    wp, bpe = copied_tokenizer(minilm_dir, wp_dir), bpe_tokenizer(bpe_dir)
    # DistilBERT takes no token types (its tokenizers do not return them).
    wp_distil = PreTrainedTokenizerFast.from_pretrained(wp_dir, model_input_names=["input_ids", "attention_mask"])
    # GPT-2's tokenizers return no token types either (GPT2Model would add wte[0] for them).
    copied_tokenizer(gpt2_dir, gpt2_bpe_dir)
    gpt2_bpe = PreTrainedTokenizerFast.from_pretrained(gpt2_bpe_dir, model_input_names=["input_ids", "attention_mask"])
    seed = 10
    for model_type, tok_dir, tok in [("bert", wp_dir, wp), ("distilbert", wp_dir, wp_distil),
                                     ("roberta", bpe_dir, bpe)]:
        classifier(os.path.join(out_dir, f"{model_type}-cls"), tok_dir, tok, model_type, seed)
        masked_lm(os.path.join(out_dir, f"{model_type}-mlm"), tok_dir, tok, model_type, seed + 1)
        question_answering(os.path.join(out_dir, f"{model_type}-qa"), tok_dir, tok, model_type, seed + 2)
        seed += 3
    classifier(os.path.join(out_dir, "gpt2-cls"), gpt2_bpe_dir, gpt2_bpe, "gpt2", seed)
    next_token(out_dir, gpt2_dir, ["The cat sat on the", "Where is the Eiffel"])
