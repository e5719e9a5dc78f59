"""A small random encoder-decoder checkpoint and what transformers makes of it.

  s2s/mbart/ the same with MBartForConditionalGeneration (pre-norm, final LayerNorms,
             scale_embedding).

  s2s/bart/  BartForConditionalGeneration in the Hugging Face layout: config.json (2 encoder and
             2 decoder layers, d_model 32, 4 heads, learned positions with BART's offset 2,
             layernorm_embedding, tied head, final_logits_bias), generation_config.json
             (decoder start </s>, forced BOS <s> and EOS </s>), model.safetensors (F32),
             tokenizer.json (a byte-level BPE trained on a few English and French sentences,
             RoBERTa's <s> … </s> template) and expected.safetensors: for each (source, target)
             pair its source ids, decoder ids (the target's labels shifted right, as
             transformers does), logits [T, vocab] and encoder [L, H, S, S], decoder [L, H, T, T]
             and cross [L, H, T, S] attentions (eager attention); and `generated`, `beam4` and
             `beam4_penalty`: 20 new tokens of greedy and 4-beam `generate()` after the first
             source (see `beams`).

  s2s/t5/    T5ForConditionalGeneration as T5 v1.1 and FLAN-T5 are: gated-GELU feed-forward, an
             untied head, 3 heads of 8 dims (inner width 24, not d_model 32), 2 layers a side,
             relative position buckets (8 buckets, max distance 16, so that the
             logarithmic buckets and their cap are reached by short texts); tokenizer.json from a
             SentencePiece unigram model (T5's ids: <pad> 0, </s> 1, <unk> 2, 8 <extra_id_n>).
  s2s/t5-relu/  the same as T5 v1.0 is: ReLU feed-forward, the head tied to the embeddings
             (its input scaled by d_model^-0.5), 4 heads of 8 dims.

  s2s/truncation.json  what the tokenizers of s2s/bart and s2s/marian give a long source and
             target with truncation=True (see `truncation`).
"""
import json, os
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import BartConfig, BartForConditionalGeneration, GenerationConfig, PreTrainedTokenizerFast

torch.set_num_threads(2)

PAIRS = [("I love machine learning", "J'adore l'apprentissage automatique"),
         ("The cat sat on the mat", "Le chat était assis sur le tapis"),
         ("Hello", "Bonjour")]
CORPUS = [s for p in PAIRS for s in p] + ["The cat that ate the mouse ran away", "Le chat a mangé la souris",
                                          "Where is the Eiffel Tower? La tour Eiffel est à Paris."]
NEW_TOKENS = 20


def meta(d):
    return {k: json.dumps(v) for k, v in d.items()}


def tokenizer(out_dir):
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(CORPUS * 3, trainers.BpeTrainer(
        vocab_size=320, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.post_processor = processors.RobertaProcessing(sep=("</s>", 2), cls=("<s>", 0), add_prefix_space=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", pad_token="<pad>",
                                   eos_token="</s>", unk_token="<unk>", model_max_length=64)
    fast.save_pretrained(out_dir)
    os.remove(os.path.join(out_dir, "special_tokens_map.json"))
    return fast


def beams(model, ids, tensors):
    """`generated`: greedy generate() of NEW_TOKENS after `ids`; `beam4`: 4-beam, without its
    start token; `beam4_penalty`: 4 beams with length_penalty 2 and early_stopping true."""
    with torch.no_grad():
        for name, kwargs in (("generated", dict(num_beams=1)), ("beam4", dict(num_beams=4)),
                             ("beam4_penalty", dict(num_beams=4, length_penalty=2.0, early_stopping=True))):
            out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, **kwargs)
            tensors[name] = out[0, 1:].to(torch.int64).contiguous()


def main(root):
    bart(root, "bart")
    bart(root, "mbart")
    marian(root)
    t5(root, "t5")
    t5(root, "t5-relu")
    truncation(root)


def truncation(root):
    """s2s/truncation.json: for bart and marian, a source and a target far past the 64
    positions and the ids transformers' tokenizer gives them with truncation=True (its first
    tokens, then </s>), which `--truncate` must give."""
    from transformers import AutoTokenizer, MarianTokenizer
    source = " ".join(["The cat that ate the mouse ran away."] * 12)
    target = " ".join(["Le chat qui a mangé la souris s'est enfui."] * 12)
    out = {"source": source, "target": target}
    for name in ("bart", "marian"):
        d = os.path.join(root, "s2s", name)
        tok = MarianTokenizer.from_pretrained(d) if name == "marian" else AutoTokenizer.from_pretrained(d)
        enc = tok(source, text_target=target, truncation=True, max_length=64)
        out[name] = {"source_ids": enc["input_ids"], "labels": enc["labels"],
                     "source_len": len(tok(source)["input_ids"]),
                     "target_len": len(tok(text_target=target)["input_ids"])}
    with open(os.path.join(root, "s2s", "truncation.json"), "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)


def bart(root, name):
    """s2s/bart, or s2s/mbart: MBartForConditionalGeneration (pre-norm blocks, a LayerNorm
    after each stack, scaled embeddings) with the same tokenizer."""
    from transformers import MBartConfig, MBartForConditionalGeneration
    out_dir = os.path.join(root, "s2s", name)
    os.makedirs(out_dir, exist_ok=True)
    tok = tokenizer(out_dir)
    Config, Model = {"bart": (BartConfig, BartForConditionalGeneration),
                     "mbart": (MBartConfig, MBartForConditionalGeneration)}[name]
    cfg = Config(vocab_size=len(tok), d_model=32, encoder_layers=2, decoder_layers=2,
                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
                     decoder_ffn_dim=48, max_position_embeddings=64, pad_token_id=1, bos_token_id=0,
                     eos_token_id=2, decoder_start_token_id=2, forced_bos_token_id=0,
                     forced_eos_token_id=2, attn_implementation="eager", scale_embedding=name == "mbart",
                     architectures=[Model.__name__])
    torch.manual_seed(0)
    model = Model(cfg).eval()
    with torch.no_grad():  # larger than the default init, so that every part matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
        model.final_logits_bias.add_(torch.randn_like(model.final_logits_bias) * 0.1)
    model.generation_config = GenerationConfig(decoder_start_token_id=2, forced_bos_token_id=0,
                                               forced_eos_token_id=2, bos_token_id=0, eos_token_id=2,
                                               pad_token_id=1, max_length=64)
    model.save_pretrained(out_dir, safe_serialization=True)
    model = Model.from_pretrained(out_dir, attn_implementation="eager").eval()
    tensors = {}
    teacher_forced(model, tok, PAIRS, tensors)
    ids = tok(PAIRS[0][0], return_tensors="pt")["input_ids"]
    beams(model, ids, tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out_dir, "expected.safetensors"),
              metadata=meta(dict(pairs=PAIRS, new_tokens=NEW_TOKENS)))


MARIAN_EN = ["I love machine learning", "The cat sat on the mat", "Hello", "The cat that ate the mouse ran away",
             "Where is the Eiffel Tower?", "The movie was good but the ending was terrible"]
MARIAN_FR = ["J'adore l'apprentissage automatique", "Le chat était assis sur le tapis", "Bonjour",
             "Le chat qui a mangé la souris s'est enfui", "Où est la tour Eiffel ?",
             "Le film était bon mais la fin était terrible"]
# Accents, punctuation, full-width and compatibility characters (NFKC), runs of spaces, words
# the pieces do not cover, a language code.
MARIAN_TEXTS = MARIAN_EN[:3] + ["Café, naïve résumé!", "  Spaces   everywhere  ", "ｆｕｌｌ width ①",
                                "zebra xylophone qqq", ">>fr<< I love cats"]


def marian(root):
    """s2s/marian: a MarianMTModel (sinusoidal positions, scale_embedding, swish, shared
    embeddings, final_logits_bias), source.spm and target.spm (SentencePiece unigram models
    trained by the sentencepiece package on a few English and French sentences), vocab.json,
    and expected.safetensors: MarianTokenizer's ids of MARIAN_TEXTS (`tokens{n}`), the pairs'
    teacher-forced attentions and logits as for BART, and 20 greedy new tokens."""
    import io
    import sentencepiece as spm
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer
    out_dir = os.path.join(root, "s2s", "marian")
    os.makedirs(out_dir, exist_ok=True)
    pieces = []
    for name, corpus in (("source", MARIAN_EN), ("target", MARIAN_FR)):
        model = io.BytesIO()
        # The source's nmt_nfkc normalisation holds a 240 kB table; the target's identity none.
        rule = "nmt_nfkc" if name == "source" else "identity"
        spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus * 4), model_writer=model,
                                       vocab_size=120, model_type="unigram", character_coverage=1.0,
                                       hard_vocab_limit=False, unk_id=2, bos_id=-1, eos_id=1,
                                       pad_id=-1, minloglevel=2, normalization_rule_name=rule)
        with open(os.path.join(out_dir, f"{name}.spm"), "wb") as f:
            f.write(model.getvalue())
        sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
        pieces += [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    vocab = {"</s>": 0, "<unk>": 1}
    for p in pieces:
        if p not in vocab and p not in ("<s>", "<pad>"):
            vocab[p] = len(vocab)
    vocab["<pad>"] = len(vocab)
    with open(os.path.join(out_dir, "vocab.json"), "w") as f:
        json.dump(vocab, f, ensure_ascii=False, indent=1)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"source_lang": "en", "target_lang": "fr", "model_max_length": 64,
                   "tokenizer_class": "MarianTokenizer"}, f, indent=1)
    tok = MarianTokenizer.from_pretrained(out_dir)
    pad = vocab["<pad>"]
    cfg = MarianConfig(vocab_size=len(vocab), decoder_vocab_size=len(vocab), d_model=32,
                       encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                       decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48,
                       max_position_embeddings=64, pad_token_id=pad, eos_token_id=0,
                       decoder_start_token_id=pad, forced_eos_token_id=0, scale_embedding=True,
                       activation_function="swish", share_encoder_decoder_embeddings=True,
                       attn_implementation="eager", architectures=["MarianMTModel"])
    ids = tok(MARIAN_EN[0], return_tensors="pt")["input_ids"]
    # The first seed whose greedy translation is not over at once.
    for seed in range(1, 100):
        torch.manual_seed(seed)
        model = MarianMTModel(cfg).eval()
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "embed_positions" not in n:
                    p.add_(torch.randn_like(p) * 0.3)
            model.final_logits_bias.add_(torch.randn_like(model.final_logits_bias) * 0.1)
            if model.generate(ids, max_new_tokens=NEW_TOKENS, num_beams=1, do_sample=False).shape[1] > 12:
                break
    model.generation_config = GenerationConfig(decoder_start_token_id=pad, forced_eos_token_id=0,
                                               eos_token_id=0, pad_token_id=pad, max_length=64,
                                               bad_words_ids=[[pad]])
    model.save_pretrained(out_dir, safe_serialization=True)
    model = MarianMTModel.from_pretrained(out_dir, attn_implementation="eager").eval()
    tensors = {f"tokens{n}": torch.tensor(tok(t)["input_ids"]) for n, t in enumerate(MARIAN_TEXTS)}
    pairs = list(zip(MARIAN_EN[:3], MARIAN_FR[:3]))
    teacher_forced(model, tok, pairs, tensors)
    beams(model, ids, tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out_dir, "expected.safetensors"),
              metadata=meta(dict(pairs=pairs, texts=MARIAN_TEXTS, new_tokens=NEW_TOKENS)))


def teacher_forced(model, tok, pairs, tensors):
    """Each pair's source ids, decoder ids (labels shifted right), labels, logits and the three
    kinds of attention (batch dim dropped)."""
    for n, (source, target) in enumerate(pairs):
        enc = tok(source, text_target=target, return_tensors="pt")
        decoder_ids = model.prepare_decoder_input_ids_from_labels(enc["labels"])
        with torch.no_grad():
            o = model(input_ids=enc["input_ids"], decoder_input_ids=decoder_ids, output_attentions=True)
        tensors[f"source_ids{n}"] = enc["input_ids"][0]
        tensors[f"decoder_ids{n}"] = decoder_ids[0]
        tensors[f"labels{n}"] = enc["labels"][0]
        tensors[f"logits{n}"] = o.logits[0].contiguous()
        tensors[f"encoder_attentions{n}"] = torch.stack(o.encoder_attentions)[:, 0].contiguous()
        tensors[f"decoder_attentions{n}"] = torch.stack(o.decoder_attentions)[:, 0].contiguous()
        tensors[f"cross_attentions{n}"] = torch.stack(o.cross_attentions)[:, 0].contiguous()


def t5(root, name):
    """s2s/t5 (gated-GELU, untied) or s2s/t5-relu (ReLU, tied): config.json, generation_config.json
    (decoder start <pad>, </s> ends), model.safetensors, tokenizer.json, and expected.safetensors
    as Marian's: the tokenizer's ids of MARIAN_TEXTS, the pairs' teacher-forced attentions and
    logits, greedy and 4-beam generate()."""
    import io
    import sentencepiece as spm
    from transformers import T5Config, T5ForConditionalGeneration, T5TokenizerFast
    out_dir = os.path.join(root, "s2s", name)
    os.makedirs(out_dir, exist_ok=True)
    proto = io.BytesIO()
    # The identity normalisation: nmt_nfkc's table would make tokenizer.json 320 kB larger.
    spm.SentencePieceTrainer.train(sentence_iterator=iter((MARIAN_EN + MARIAN_FR) * 4), model_writer=proto,
                                   vocab_size=150, model_type="unigram", character_coverage=1.0,
                                   hard_vocab_limit=False, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                   minloglevel=2, normalization_rule_name="identity")
    spiece = os.path.join(out_dir, "spiece.model")
    with open(spiece, "wb") as f:
        f.write(proto.getvalue())
    tok = T5TokenizerFast(vocab_file=spiece, extra_ids=8, model_max_length=64)
    tok.save_pretrained(out_dir)
    for extra in ("spiece.model", "special_tokens_map.json"):
        os.remove(os.path.join(out_dir, extra))
    tok = T5TokenizerFast.from_pretrained(out_dir)
    gated = name == "t5"
    cfg = T5Config(vocab_size=len(tok), d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2,
                   num_heads=3 if gated else 4, relative_attention_num_buckets=8,
                   relative_attention_max_distance=16, feed_forward_proj="gated-gelu" if gated else "relu",
                   tie_word_embeddings=not gated, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                   n_positions=64, attn_implementation="eager", architectures=["T5ForConditionalGeneration"])
    ids = tok(MARIAN_EN[0], return_tensors="pt")["input_ids"]
    # The first seed whose greedy translation is neither over at once nor one token repeated.
    for seed in range(1, 100):
        torch.manual_seed(seed)
        model = T5ForConditionalGeneration(cfg).eval()
        with torch.no_grad():  # each tensor moved by half its spread (the norms' by 0.2)
            for p in model.parameters():
                p.add_(torch.randn_like(p) * (p.std() * 0.5 if p.std() > 0 else 0.2))
            # A tied head reads back mostly the input's embedding, which the residual carries:
            # smaller embeddings leave the layers room to change the next token.
            model.shared.weight.mul_(1.0 if gated else 0.1)
            out = model.generate(ids, max_new_tokens=NEW_TOKENS, num_beams=1, do_sample=False)[0]
            if len(out) > 12 and len(set(out.tolist())) > 5:
                break
    model.generation_config = GenerationConfig(decoder_start_token_id=0, eos_token_id=1, pad_token_id=0)
    model.save_pretrained(out_dir, safe_serialization=True)
    model = T5ForConditionalGeneration.from_pretrained(out_dir, attn_implementation="eager").eval()
    tensors = {f"tokens{n}": torch.tensor(tok(t)["input_ids"]) for n, t in enumerate(MARIAN_TEXTS)}
    pairs = list(zip(MARIAN_EN[:3], MARIAN_FR[:3]))
    teacher_forced(model, tok, pairs, tensors)
    beams(model, ids, tensors)
    # The buckets of every distance from -300 to 300: the real models' settings and these.
    bucket = model.encoder.block[0].layer[0].SelfAttention._relative_position_bucket
    for buckets, max_distance in ((32, 128), (8, 16)):
        for side, bidirectional in (("encoder", True), ("decoder", False)):
            tensors[f"buckets_{buckets}_{max_distance}_{side}"] = bucket(
                torch.arange(-300, 301), bidirectional=bidirectional, num_buckets=buckets,
                max_distance=max_distance).to(torch.int64)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out_dir, "expected.safetensors"),
              metadata=meta(dict(pairs=pairs, texts=MARIAN_TEXTS, new_tokens=NEW_TOKENS)))


if __name__ == "__main__":
    import sys
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data")
