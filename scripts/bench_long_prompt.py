"""Long prompts on a decoder LLM: `explain --focus` of one word of an 8,192-token prompt, and a
512-token prefill against transformers, on Qwen2-0.5B shapes with random BF16 weights.

usage: python scripts/bench_long_prompt.py DIR [--tokens 8192] [--prefill 512] [--threads 2]
         [--reps 3] [--transformers-attentions]
       (after: cargo build --release -p attnscope)

DIR is made on first use (nothing downloaded): a Qwen2ForCausalLM with Qwen2-0.5B's shapes
(24 layers, d_model 896, 14 heads, 2 key/value heads, intermediate 4864, vocabulary 151,936,
tied embeddings) and transformers' random initialisation, saved in BF16 (988 MB), with a
byte-level BPE tokenizer trained on the repository's Markdown. The prompt is that Markdown's
words, cut to exactly --tokens tokens, ending in a word found nowhere else ("zigzagged"), the
focus of `explain`.

Prints, for `attnscope explain PROMPT --focus zigzagged --json`: wall seconds and peak RSS
(/usr/bin/time), and what transformers' `output_attentions=True` would hold (layers × heads ×
T² BF16 weights); with --transformers-attentions it also tries that pass under a 24 GB address
space limit and reports how it ends. Then the prefill of the first --prefill tokens: attnscope
(`bench generate --max-new-tokens 1`, its `prefill_ms`) against transformers' forward pass
(`use_cache=True`, `logits_to_keep=1`, SDPA attention, BF16, no attentions), medians of --reps
runs each, alternating, with the same threads.
"""
import argparse, glob, json, os, re, resource, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OURS = os.path.join(ROOT, "target", "release", "attnscope")
FOCUS = "zigzagged"


def make(out_dir):
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    corpus = [open(p, encoding="utf-8").read() for p in markdown()]
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=4000, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")
    cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                      max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, eos_token_id=0, bos_token_id=0,
                      torch_dtype="bfloat16", architectures=["Qwen2ForCausalLM"])
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    fast.save_pretrained(out_dir)


def markdown():
    return sorted(glob.glob(os.path.join(ROOT, "*.md")) + glob.glob(os.path.join(ROOT, "docs", "*.md")))


def prompt(tok, n_tokens):
    """The repository's Markdown words (repeated as needed) cut to `n_tokens` tokens, the last
    word FOCUS."""
    words = [w for p in markdown() for w in re.findall(r"[A-Za-z][A-Za-z,.]*", open(p).read())]
    words = [w for w in words if FOCUS not in w.lower()]
    out, count, i = [], 0, 0
    last = len(tok(" " + FOCUS)["input_ids"])
    while True:
        w = words[i % len(words)]
        i += 1
        n = len(tok((" " if out else "") + w)["input_ids"])
        if count + n + last > n_tokens:
            if count + last == n_tokens:
                break
            continue
        out.append(w)
        count += n
    text = " ".join(out) + " " + FOCUS
    assert len(tok(text)["input_ids"]) == n_tokens, len(tok(text)["input_ids"])
    return text


def timed(cmd, env):
    """Wall seconds, peak RSS (MB) and stdout of `cmd` under /usr/bin/time."""
    out = subprocess.run(["/usr/bin/time", "-f", "%e %M"] + cmd, env=env, capture_output=True,
                         text=True)
    if out.returncode != 0:
        sys.exit(f"{cmd[0]} failed:\n{out.stderr}")
    wall, rss_kb = out.stderr.strip().splitlines()[-1].split()
    return float(wall), int(rss_kb) / 1024, out.stdout


def transformers_attentions(model_dir, text, threads):
    """Tries transformers' forward pass with output_attentions=True under a 24 GB address space
    limit, in a child process; returns how it ended."""
    code = f"""
import resource, time, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
resource.setrlimit(resource.RLIMIT_AS, (24 << 30, 24 << 30))
torch.set_num_threads({threads})
tok = AutoTokenizer.from_pretrained({model_dir!r})
model = AutoModelForCausalLM.from_pretrained({model_dir!r}, torch_dtype=torch.bfloat16,
                                             attn_implementation="eager").eval()
ids = tok(open({text!r}).read(), return_tensors="pt").input_ids
start = time.time()
try:
    with torch.no_grad():
        out = model(ids, output_attentions=True, logits_to_keep=1)
    print("ran in", round(time.time() - start, 1), "s")
except (RuntimeError, MemoryError) as e:
    print("failed after", round(time.time() - start, 1), "s:", str(e).splitlines()[0][:160])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    lines = (out.stdout + out.stderr).strip().splitlines()
    return lines[-1] if lines else f"exit {out.returncode}"


def prefill_transformers(model_dir, ids, threads, model_cache={}):
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(threads)
    if "m" not in model_cache:
        model_cache["m"] = AutoModelForCausalLM.from_pretrained(
            model_dir, torch_dtype=torch.bfloat16, attn_implementation="sdpa").eval()
        with torch.no_grad():
            model_cache["m"](torch.tensor([ids[:16]]), use_cache=True, logits_to_keep=1)
    model = model_cache["m"]
    with torch.no_grad():
        start = time.perf_counter()
        model(torch.tensor([ids]), use_cache=True, logits_to_keep=1)
        return (time.perf_counter() - start) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--transformers-attentions", action="store_true")
    args = ap.parse_args()
    if not os.path.exists(os.path.join(args.dir, "model.safetensors")):
        print(f"making {args.dir} (random BF16 weights, Qwen2-0.5B shapes)", file=sys.stderr)
        make(args.dir)
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(args.dir)
    text = prompt(tok, args.tokens)
    text_file = os.path.join(args.dir, f"prompt-{args.tokens}.txt")
    with open(text_file, "w") as f:
        f.write(text)
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    print(f"load: {os.getloadavg()}; threads {args.threads}")

    wall, rss, out = timed([OURS, "explain", text, "--focus", FOCUS, "--model", args.dir,
                            "--threads", str(args.threads), "--json"], env)
    bars = json.loads(out)
    top = max(bars["rows"], key=lambda r: r["weight"])
    print(f"explain --focus {FOCUS}, {args.tokens} tokens: {wall:.1f} s wall, peak RSS {rss:.0f} MB "
          f"(heaviest word {top['word']!r} {top['weight']:.3f}; {len(bars['rows'])} words)")
    cfg = json.load(open(os.path.join(args.dir, "config.json")))
    need = cfg["num_hidden_layers"] * cfg["num_attention_heads"] * args.tokens ** 2 * 2
    print(f"transformers output_attentions: {need / 2**30:.1f} GiB of BF16 weights "
          f"({cfg['num_hidden_layers']} layers × {cfg['num_attention_heads']} heads × {args.tokens}²)")
    if args.transformers_attentions:
        print("transformers output_attentions under a 24 GB limit:",
              transformers_attentions(args.dir, text_file, args.threads))

    ids = tok(text)["input_ids"][:args.prefill]
    short = tok.decode(ids)
    assert len(tok(short)["input_ids"]) == args.prefill
    ours, theirs = [], []
    for _ in range(args.reps):
        o = subprocess.run([OURS, "bench", "generate", "--model", args.dir, "--prompt", short,
                            "--max-new-tokens", "1", "--reps", "1", "--threads",
                            str(args.threads), "--json"], env=env, capture_output=True, text=True)
        if o.returncode != 0:
            sys.exit(f"bench generate failed:\n{o.stderr}")
        ours.append(json.loads(o.stdout)["prefill_ms"])
        theirs.append(prefill_transformers(args.dir, ids, args.threads))
    med = lambda xs: sorted(xs)[len(xs) // 2]
    print(f"prefill {args.prefill} tokens: attnscope {med(ours):.0f} ms, transformers (BF16, SDPA) "
          f"{med(theirs):.0f} ms → {med(theirs) / med(ours):.2f}×")


if __name__ == "__main__":
    main()
