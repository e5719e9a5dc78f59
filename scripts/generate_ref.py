"""Greedy decoding speed of transformers' GPT2LMHeadModel.generate (KV cache on), to compare with
`attnscope bench generate` on the same checkpoint and prompt in the same run.

usage: python generate_ref.py MODEL_DIR [--prompt TEXT] [--new-tokens N] [--threads 2] [--reps 5] [--no-prefill]
       python generate_ref.py --make-gpt2-small DIR
The first form prints one JSON line, the fields of `attnscope bench generate --json`:
{"engine", "prompt_tokens", "new_tokens", "threads", "prefill_ms", "tokens_per_s", "ids"}.
tokens_per_s is new_tokens / the median wall time of one generate() call (prefill included),
after one warm-up call; prefill_ms is the median time of one forward pass over the prompt.
The prompt is tokenized with the checkpoint's tokenizer.json, as attnscope does.

--make-gpt2-small writes a GPT-2-small-shaped checkpoint (12 layers, 12 heads, 768 wide, 1024
positions, 50257-token vocabulary, random weights from seed 0) with the tokenizer.json of
tests/data/tiny-gpt2: no GPT-2 weights are downloaded, and the shapes, not the weights,
set the speed. Its text is gibberish; ids above the tokenizer's 400 decode to nothing.
Needs: pip install torch transformers tokenizers
"""
import argparse, json, os, shutil, statistics, time

import torch
from tokenizers import Tokenizer
from transformers import GPT2Config, GPT2LMHeadModel

p = argparse.ArgumentParser()
p.add_argument("model_dir", nargs="?")
p.add_argument("--make-gpt2-small", metavar="DIR")
p.add_argument("--prompt", default="The cat sat on the mat because it was tired")
p.add_argument("--new-tokens", type=int, default=32)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--reps", type=int, default=5)
p.add_argument("--no-prefill", action="store_true",
               help="skip the prefill timing (prefill_ms null): each rep is then one generate() call")
a = p.parse_args()

if a.make_gpt2_small:
    here = os.path.dirname(os.path.abspath(__file__))
    tiny = os.path.join(here, "..", "tests", "data", "tiny-gpt2")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config())
    model.save_pretrained(a.make_gpt2_small, safe_serialization=True)
    shutil.copy(os.path.join(tiny, "tokenizer.json"), a.make_gpt2_small)
    print(f"wrote {a.make_gpt2_small}")
    raise SystemExit(0)
if not a.model_dir:
    p.error("give MODEL_DIR or --make-gpt2-small DIR")
if a.new_tokens < 1 or a.reps < 1:
    p.error("--new-tokens and --reps must be at least 1")

torch.set_num_threads(a.threads)
model = GPT2LMHeadModel.from_pretrained(a.model_dir).eval()
ids = Tokenizer.from_file(os.path.join(a.model_dir, "tokenizer.json")).encode(a.prompt).ids
x = torch.tensor([ids])
mask = torch.ones_like(x)


def generate():
    # min_new_tokens = max_new_tokens: like attnscope, the end-of-text token does not stop it.
    return model.generate(x, attention_mask=mask, max_new_tokens=a.new_tokens,
                          min_new_tokens=a.new_tokens, do_sample=False, use_cache=True,
                          pad_token_id=model.config.eos_token_id)


def timed(f):
    start = time.perf_counter()
    out = f()
    return time.perf_counter() - start, out


with torch.inference_mode():
    generate()
    prefill = None if a.no_prefill else statistics.median(
        timed(lambda: model(x, use_cache=True))[0] for _ in range(a.reps))
    runs = [timed(generate) for _ in range(a.reps)]
secs = statistics.median(t for t, _ in runs)
print(json.dumps({
    "engine": "transformers",
    "prompt_tokens": len(ids),
    "new_tokens": a.new_tokens,
    "threads": a.threads,
    "prefill_ms": None if prefill is None else prefill * 1e3,
    "tokens_per_s": a.new_tokens / secs,
    "ids": runs[0][1][0, len(ids):].tolist(),
}))
