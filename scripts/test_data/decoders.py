"""Small random checkpoints of today's decoder families, and what transformers makes of them.

  llm/<name>/  one checkpoint per family in the Hugging Face layout: config.json,
               model.safetensors (F32, 2 layers, width 32, 4 query heads of 8 dims),
               tokenizer.json and tokenizer_config.json (a byte-level BPE trained on a few
               sentences; llama and mistral put <s> first, as their tokenizers do), and
               expected.safetensors: for each text its ids, logits [T, vocab] and attentions
               [layers, heads, T, T] (eager attention), and `generated` (32 greedy new tokens
               after the first text, EOS not stopping them).

  llama    2 key/value heads (GQA ratio 2), rope_scaling llama3, untied head
  mistral  1 key/value head (ratio 4), sliding_window 5, shorter than the longer texts
  qwen2    4 key/value heads (ratio 1), q/k/v biases, tied embeddings, rope_theta 1e6
  qwen3    2 key/value heads of 16 dims (the query heads together twice the hidden size),
           query and key RMSNorms, tied embeddings
  gemma2   2 key/value heads of 16 dims, query_pre_attn_scalar 12, a window of 5 on layer 0
           (layer 1 full), attention and final logit softcaps of 5 and 3 (small enough to bite),
           tied embeddings

  chat-tokenizer: a tokenizer alone whose tokenizer_config.json adds chat tokens (see
           `chat_tokenizer`).

  llama-bf16, mistral-f16: the llama and mistral checkpoints stored in BF16 and F16 (their
           weights rounded), expected.safetensors from transformers in f32 over those weights
           (which widens them exactly), and, as `bf16_logits0`/`f16_logits0`, transformers'
           own pass in that dtype, which rounds every activation too.
"""
import json, os
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

torch.set_num_threads(2)

TEXTS = ["The cat sat on the mat", "The cat that ate the mouse that lived in the barn ran away",
         "Hello"]
CORPUS = TEXTS + ["Where is the Eiffel Tower? The Eiffel Tower is in Paris.",
                  "I love machine learning", "The movie was good but the ending was terrible"]
NEW_TOKENS = 32

FAMILIES = {
    "llama": dict(num_key_value_heads=2, tie_word_embeddings=False,
                  rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                    high_freq_factor=4.0, original_max_position_embeddings=16)),
    "mistral": dict(num_key_value_heads=1, sliding_window=5, tie_word_embeddings=False),
    "qwen2": dict(num_key_value_heads=4, tie_word_embeddings=True, rope_theta=1e6),
    "qwen3": dict(num_key_value_heads=2, head_dim=16, tie_word_embeddings=True),
    "gemma2": dict(num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=12, sliding_window=5,
                   attn_logit_softcapping=5.0, final_logit_softcapping=3.0, tie_word_embeddings=True),
}


def meta(d):
    return {k: json.dumps(v) for k, v in d.items()}


def tokenizer(out_dir, bos):
    specials = ["<s>", "</s>"]
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(CORPUS * 3, trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if bos:
        bpe.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                           special_tokens=[("<s>", 0)])
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>",
                                   model_max_length=128)
    fast.save_pretrained(out_dir)
    os.remove(os.path.join(out_dir, "special_tokens_map.json"))  # tokenizer_config.json says it all
    return fast


def make(root, name, seed):
    out_dir = os.path.join(root, "llm", name)
    os.makedirs(out_dir, exist_ok=True)
    tok = tokenizer(out_dir, bos=name in ("llama", "mistral", "gemma2"))
    cfg = AutoConfig.for_model(name, vocab_size=len(tok), hidden_size=32, intermediate_size=48,
                               num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128,
                               bos_token_id=0, eos_token_id=1, attn_implementation="eager",
                               architectures=[f"{type(AutoConfig.for_model(name)).__name__[:-6]}ForCausalLM"],
                               **({"attention_bias": False} if name == "llama" else {}),
                               **FAMILIES[name])
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # larger than the default init, so that every part matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model.save_pretrained(out_dir, safe_serialization=True)
    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager").eval()
    save_file(expected(model, tok), os.path.join(out_dir, "expected.safetensors"),
              metadata=meta(dict(texts=TEXTS, new_tokens=NEW_TOKENS)))


def expected(model, tok):
    """Each text's ids, logits and attentions, and the greedy continuation of the first."""
    tensors = {}
    for n, text in enumerate(TEXTS):
        ids = tok(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            o = model(input_ids=ids, output_attentions=True)
        tensors[f"ids{n}"] = ids[0].to(torch.int64)
        tensors[f"logits{n}"] = o.logits[0].contiguous()
        tensors[f"attentions{n}"] = torch.stack(o.attentions)[:, 0].contiguous()
    model.generation_config.eos_token_id = None
    ids = tok(TEXTS[0], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=1)
    tensors["generated"] = out[0, ids.shape[1]:].to(torch.int64).contiguous()
    return tensors


def stored_in(root, name, dtype):
    """The checkpoint `name` saved in `dtype`, with what transformers makes of it."""
    label = {torch.bfloat16: "bf16", torch.float16: "f16"}[dtype]
    src, out_dir = os.path.join(root, "llm", name), os.path.join(root, "llm", f"{name}-{label}")
    os.makedirs(out_dir, exist_ok=True)
    AutoModelForCausalLM.from_pretrained(src, dtype=dtype).save_pretrained(out_dir, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        with open(os.path.join(src, f)) as a, open(os.path.join(out_dir, f), "w") as b:
            b.write(a.read())
    tok = PreTrainedTokenizerFast.from_pretrained(out_dir)
    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager").eval()
    tensors = expected(model, tok)
    low = AutoModelForCausalLM.from_pretrained(out_dir, dtype=dtype, attn_implementation="eager").eval()
    with torch.no_grad():
        tensors[f"{label}_logits0"] = low(input_ids=tensors["ids0"][None]).logits[0].float().contiguous()
    save_file(tensors, os.path.join(out_dir, "expected.safetensors"),
              metadata=meta(dict(texts=TEXTS, new_tokens=NEW_TOKENS)))


CHAT = ["<|im_start|>user\nThe cat sat on the mat<|im_end|>\n<|im_start|>assistant\n",
        "Hello<|im_end|><|im_start|>", "<|im_start|> The mat zzq<|im_end|>"]


def chat_tokenizer(root):
    """llm/chat-tokenizer: qwen2's tokenizer.json, without chat tokens, and a
    tokenizer_config.json that adds them as Qwen's does (<|im_start|>, <|im_end|> special, in
    added_tokens_decoder and additional_special_tokens) and one plain added token, zzq; and
    expected.json: transformers' ids for texts that use them, and its special ids."""
    out_dir = os.path.join(root, "llm", "chat-tokenizer")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(root, "llm", "qwen2", "tokenizer.json")) as a:
        tokenizer_json = json.load(a)
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as b:
        json.dump(tokenizer_json, b, ensure_ascii=False)
    n = len(tokenizer_json["model"]["vocab"])
    token = lambda content, special: dict(content=content, lstrip=False, normalized=not special,
                                          rstrip=False, single_word=False, special=special)
    config = {
        "added_tokens_decoder": {"0": token("<s>", True), "1": token("</s>", True),
                                 str(n): token("<|im_start|>", True),
                                 str(n + 1): token("<|im_end|>", True),
                                 str(n + 2): token("zzq", False)},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None, "eos_token": "<|im_end|>",
        "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}",
        "model_max_length": 128, "tokenizer_class": "PreTrainedTokenizerFast",
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    tok = PreTrainedTokenizerFast.from_pretrained(out_dir)
    expected = dict(texts=CHAT, ids=[tok(t)["input_ids"] for t in CHAT],
                    special_ids=sorted(tok.all_special_ids))
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)


def main(root):
    for seed, name in enumerate(FAMILIES):
        make(root, name, seed)
    stored_in(root, "llama", torch.bfloat16)
    stored_in(root, "mistral", torch.float16)
    chat_tokenizer(root)


if __name__ == "__main__":
    import sys
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data")
